"""The serve side of a deploy and of Triton's load (``runtime/redeploy.py``) with the real core.

No Ray here: the controller is stood in for by :class:`CoreController`, which answers
``deployment()`` and ``deploy()`` as ``Controller`` does, from a real orchestration core (the
planner and its memory check are the real ones; only the actor call is not made). The repository
is a copy of the tiny zoo with a version 2 of ``mlp_l``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from typing import Any

import pytest

from failsoft.domain import Placement, WarmBackup
from failsoft.errors import ConfigError, UnknownNameError
from failsoft.orchestration import ClusterState, OrchestrationSettings, Orchestrator
from failsoft.orchestration.deploy import Desired, MemoryRefused, plan_deploy
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.deployment import resolve
from failsoft.runtime.redeploy import Redeployer
from failsoft.zoo import ModelRepository


class CoreController:
    """``Controller.deployment`` and ``Controller.deploy`` over a real core, without the actor."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.core = Orchestrator(state, OrchestrationSettings(replan_warm=False, gc_s=None), 0.0)
        self.core.assume_deployed(0.0)
        self.dry_runs: list[str] = []

    async def deployment(self) -> dict[str, Any]:
        warm = [w.backup for w in self.state.warm.values()]
        return {"deployment": self.state.deployment, "policy": "faillite", "replan_delay_s": 3.0,
                "version": self.core.deploys.version, "warm": warm}  # fmt: skip

    async def deploy(self, desired: Desired, digest: str | None, dry_run: bool = False) -> dict[str, Any]:
        if dry_run:
            self.dry_runs.append(next(a for a in desired.deployment.apps if a.name == "cam").primary.server)
            plan = plan_deploy(self.core.running("faillite"), desired)
            return {"changed": False, "version": self.core.deploys.version, "plan": plan.to_dict()}
        plan, _ = self.core.apply_deploy(desired, "faillite", digest, 1.0)
        return {"changed": not plan.empty, "version": self.core.deploys.version, "plan": plan.to_dict()}


class Gateway:
    def __init__(self) -> None:
        self.applied: list[Any] = []

    async def apply_deployment(self, deployment: Any, models: Any, variants: Any) -> dict[str, list[str]]:
        self.applied.append(deployment)
        return {}


@pytest.fixture
def setup(tiny_zoo, tmp_path):
    root = tmp_path / "zoo"
    shutil.copytree(tiny_zoo.root, root)
    shutil.copytree(root / "digits_mlp" / "mlp_l", root / "digits_mlp" / "mlp_l" / "2")
    large = ModelRepository(root).variant("digits_mlp", "mlp_l").memory_mb
    config = config_from_dict(
        {
            "repository": str(root),
            "servers": [  # s1: room for one mlp_l only; s2 holds cam's warm backup; s3 is roomy
                {"name": "s1", "site": "a", "memory_mb": large * 1.5},
                {"name": "s2", "site": "b", "memory_mb": large * 2.5},
                {"name": "s3", "site": "c", "memory_mb": large * 4},
            ],
            "apps": [
                {"name": "cam", "family": "digits_mlp", "primary": {"server": "s1", "variant": "mlp_l"}}
            ],
            "state_dir": str(tmp_path / "state"),
        },
        source="test",
    )
    deployment = resolve(config, ModelRepository(root).families())
    state = ClusterState.deployed(deployment.replace(warm=(WarmBackup("cam", "mlp_l", "s2"),)))
    controller, gateway = CoreController(state), Gateway()
    return Redeployer(config, controller, gateway), controller, gateway  # type: ignore[arg-type]


def test_a_new_version_goes_to_a_warm_backups_server_when_its_own_has_no_room(setup):
    redeployer, controller, gateway = setup
    answer = asyncio.run(redeployer.load_model("cam", None))  # None: the latest, version 2
    assert controller.dry_runs == ["s1", "s2"]  # s1 was refused for memory, s2 has cam's backup
    (step,) = answer["plan"]["steps"]
    assert step["kind"] == "move" and step["new"] == {"server": "s2", "variant": "mlp_l@2"}
    assert gateway.applied and controller.state.apps["cam"].home.variant == "mlp_l@2"


def test_the_planner_refuses_s1_for_memory(setup):
    redeployer, controller, _ = setup
    desired = asyncio.run(controller.deployment())["deployment"]
    cam = desired.app("cam")
    moved = dataclasses.replace(cam, primary=Placement("s1", "mlp_l@2"))
    families = ModelRepository(redeployer.running.repository).families(["digits_mlp"])
    wanted = Desired(desired.replace(apps=(moved,), families=families), "faillite", 3.0)
    with pytest.raises(MemoryRefused, match="on server 's1'"):
        plan_deploy(controller.core.running("faillite"), wanted)


def test_unknown_apps_and_versions_are_refused(setup):
    redeployer, _, _ = setup
    with pytest.raises(UnknownNameError, match="no app 'nope'"):
        asyncio.run(redeployer.load_model("nope", None))
    with pytest.raises(UnknownNameError, match="no version 5"):
        asyncio.run(redeployer.load_model("cam", 5))
    with pytest.raises(ConfigError, match="name differs"):
        data = {"name": "other", "servers": [{"name": "s1", "site": "a", "memory_mb": 1}], "apps": []}
        data["apps"] = [{"name": "x", "family": "digits_mlp"}]
        data["repository"] = str(redeployer.running.repository)
        asyncio.run(redeployer.deploy(data, "other.yaml", None, False))
