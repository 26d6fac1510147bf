"""GPU placement in the config and inside an agent's process, without a GPU (pure: no Ray).

The Ray side (the share requested, the GPU id granted, ``CUDA_VISIBLE_DEVICES`` in the actor) is
in ``test_gpu_placement.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from failsoft.errors import ConfigError
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.devices import NOSET_ENV, VISIBLE_ENV, Placement, check_placement, local_device


def _config(servers: list[dict[str, Any]], agents: dict[str, Any] | None = None) -> Any:
    return config_from_dict(
        {
            "servers": [{"site": "a", "memory_mb": 100, **s} for s in servers],
            "apps": [{"name": "x", "family": "digits_mlp"}],
            "agents": agents or {},
        },
        source="gpus.yaml",
    )


def test_each_server_gets_its_own_share_or_the_agents_default() -> None:
    cfg = _config(
        [
            {"name": "g1"},
            {"name": "g2", "gpus": 0.5},
            {"name": "c1", "device": "cpu", "gpus": 0},
            {"name": "p1", "device": "cuda:1", "gpus": 0.25},
        ],
        agents={"device": "cuda", "gpus": 0.2},
    )
    assert cfg.placement("g1") == Placement("cuda", 0.2)
    assert cfg.placement("g2") == Placement("cuda", 0.5)
    assert cfg.placement("c1") == Placement("cpu", 0.0)
    assert cfg.placement("p1") == Placement("cuda:1", 0.25)
    assert cfg.placement("p1").pinned_gpu == 1
    assert cfg.placement("p1").actor_env() == {VISIBLE_ENV: "1", NOSET_ENV: "1"}
    assert cfg.placement("g1").actor_env() == {}  # Ray sets it from its grant
    assert cfg.placement("c1").actor_env() == {VISIBLE_ENV: ""}  # no share: no GPU, whatever Ray does


def test_a_config_without_gpus_keeps_every_agent_off_the_gpu() -> None:
    cfg = _config([{"name": "s1"}])
    assert cfg.placement("s1") == Placement("auto", 0.0)


@pytest.mark.parametrize(
    ("server", "agents", "message"),
    [
        ({"device": "cuda"}, {}, "servers[0] ('s1'): device 'cuda' needs a share of a GPU from Ray"),
        ({"gpus": 1.5}, {"device": "cuda"}, "gpus 1.5: Ray grants a fraction of one GPU"),
        ({"device": "cpu", "gpus": 0.5}, {}, "gpus 0.5 with device 'cpu' would hold a GPU"),
        ({"device": "cuda:0", "gpus": 2}, {}, "device 'cuda:0' pins one GPU; gpus 2 asks for several"),
        ({"device": "gpu"}, {}, "servers[0] ('s1').device: String should match pattern"),
        ({"gpus": -1}, {}, "servers[0] ('s1').gpus: Input should be greater than or equal to 0"),
        ({}, {"device": "cuda:x"}, "agents.device: String should match pattern"),
    ],
)
def test_a_placement_ray_cannot_grant_is_one_error_naming_the_server(
    server: dict[str, Any], agents: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _config([{"name": "s1", **server}], agents)
    assert message in str(err.value)
    assert "gpus.yaml" in str(err.value)


def test_a_machine_gpu_number_maps_to_its_place_among_the_visible_ones() -> None:
    assert local_device("auto", {}) is None
    assert local_device("cpu", {}) == "cpu"
    assert local_device("cuda", {VISIBLE_ENV: "3"}) == "cuda"
    assert local_device("cuda:3", {VISIBLE_ENV: "3"}) == "cuda:0"  # pinned: the only one it sees
    assert local_device("cuda:5", {VISIBLE_ENV: "2,5"}) == "cuda:1"  # a grant of two GPUs
    assert local_device("cuda:1", {}) == "cuda:1"  # nothing hidden: the machine's numbering
    with pytest.raises(ConfigError, match=r"GPU 2 is not visible to this process \(CUDA_VISIBLE_DEVICES=0\)"):
        local_device("cuda:2", {VISIBLE_ENV: "0"})


def test_llm_workers_take_a_share_the_same_way() -> None:
    from failsoft.runtime.config import config_from_dict

    def cfg(model):
        return config_from_dict(
            {
                "servers": [{"name": "s1", "site": "a", "memory_mb": 64}],
                "services": [{"name": "bytes", "mode": "llm", "model": model}],
            },
            source="llm.yaml",
        )

    assert cfg({"device": "cuda", "gpus": 0.25}).llm[0].placement == Placement("cuda", 0.25)
    with pytest.raises(
        ConfigError, match=r"llm.yaml: services\[0\] \('bytes'\).model: device 'cuda' needs a share"
    ):
        cfg({"device": "cuda"})
    assert check_placement("x", "auto", 0.5) == Placement("auto", 0.5)


class _FakeNvml:
    """NVML's handle lookups, faked: this machine has no NVIDIA driver (the real NVML runs in
    ``tools/gpu-check`` on a GPU). Handles are the machine's GPU numbers."""

    def __init__(self, uuids: dict[str, int]) -> None:
        self.uuids = uuids

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        if uuid not in self.uuids:
            raise LookupError(uuid)
        return self.uuids[uuid]

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index


def test_nvml_finds_the_process_gpu_by_uuid_else_by_its_visible_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from failsoft.runtime.devices import _nvml_handle

    nvml = _FakeNvml({"GPU-abc": 5})
    assert _nvml_handle(nvml, "abc", 0) == 5  # torch's uuid has no "GPU-" prefix
    assert _nvml_handle(nvml, "GPU-abc", 0) == 5
    monkeypatch.setenv(VISIBLE_ENV, "3,7")
    assert _nvml_handle(nvml, "", 1) == 7  # NVML ignores CUDA_VISIBLE_DEVICES: torch's cuda:1 is GPU 7
    monkeypatch.delenv(VISIBLE_ENV)
    assert _nvml_handle(nvml, "unknown", 2) == 2
