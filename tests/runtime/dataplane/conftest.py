"""The cluster the data plane's crash tests serve: one critical digits app on s1, room for its warm
backup on s2 (both servers sized for three copies), no agent restarts, a sqlite store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from failsoft.runtime.config import RuntimeConfig, config_from_dict


def critical_app_on_s1(zoo: Any, state_dir: Path, name: str) -> RuntimeConfig:
    family = {f.name: f for f in zoo.families()}["digits_mlp"]
    memory = round(3 * family.variant("mlp_l").memory_mb, 3)
    return config_from_dict(
        {
            "name": name,
            "repository": str(zoo.root),
            "servers": [{"name": n, "site": "a", "memory_mb": memory, "compute": 4.0} for n in ("s1", "s2")],
            "apps": [
                {
                    "name": "crit",
                    "family": "digits_mlp",
                    "critical": True,
                    "primary": {"server": "s1", "variant": "mlp_l"},
                }
            ],
            "gateway": {"port": 0},
            "agents": {"restart": False},
            "state_dir": str(state_dir),
            "store": "sqlite",
        },
        source="test",
    )
