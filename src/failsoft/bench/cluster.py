"""What the cluster benchmarks share: deriving a policy's config from the user's, waiting for a
started cluster to be home (every app on its primary, warm backups warm, every server up), reading
the user's config once for them."""

from __future__ import annotations

import contextlib
import copy
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from failsoft.errors import ConfigError, FailsoftError
from failsoft.runtime.config import RuntimeConfig


def read_bench_config(path: Path, root: str | Path | None) -> dict[str, Any]:
    """The config at ``path`` as a fresh dict for a benchmark to derive its clusters from: the
    gateway on a free port, and the repository ``root`` when one is given (a relative one as typed,
    from the working directory; the config's own resolves against the config's directory)."""
    from failsoft.scenario import read_document

    data = yaml.safe_load(read_document(path, "config"))
    if not isinstance(data, dict):
        raise ConfigError(f"{str(path)!r}: expected a mapping at the top level")
    data = copy.deepcopy(data)
    if root is not None:
        data["repository"] = str(Path(root).expanduser().resolve())
    data["gateway"] = {**(data.get("gateway") or {}), "port": 0}
    return data


@contextlib.contextmanager
def private_state(config: RuntimeConfig, prefix: str) -> Iterator[RuntimeConfig]:
    """``config`` for a benchmark's own cluster: a fresh state directory (removed afterwards), the
    SQLite store, a generated admin token and the gateway on a free port."""
    state = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield config.replace(state_dir=state, store_url="sqlite", admin_token=None).with_gateway(port=0)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def with_service_params(data: Mapping[str, Any], service: str, **params: Any) -> dict[str, Any]:
    """A deep copy of the config ``data`` whose service ``service`` has ``params`` set over its own."""
    out = copy.deepcopy(dict(data))
    for s in out.get("services") or []:
        if s.get("name") == service:
            s["params"] = {**(s.get("params") or {}), **params}
    return out


def wait_home(client: Any, timeout_s: float = 120.0) -> None:
    """Block until the cluster is home (FailsoftError naming the timeout when it is not)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with _quiet():
            status = client.status()
            home = all(a["route"] == a["primary"] for a in status["apps"])
            warm = all(w["state"] == "warm" for a in status["apps"] for w in a["warm_backups"])
            if home and warm and all(s["state"] == "up" for s in status["servers"]) and client.ready():
                return
        time.sleep(0.2)
    raise FailsoftError(f"the cluster did not deploy within {timeout_s:.0f} s")


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, FailsoftError)
