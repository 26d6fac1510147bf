"""Agents ask Ray for their GPU share and see what Ray granted, on a real embedded Ray.

On a machine without a GPU the embedded node offers one that no device backs (``num_gpus=1``, as
``$FAILSOFT_NUM_GPUS`` does), so Ray's accounting, its GPU ids and the ``CUDA_VISIBLE_DEVICES`` it
sets in each actor are real, while torch finds no CUDA and models load on the CPU (``device:
auto``). On a machine with a GPU the same test runs for real: the granted GPU is GPU 0, the agent
sees it, its model loads on it and its CUDA context is created at start (``tools/gpu-check``'s
placement check covers more).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from failsoft.errors import ConfigError
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.devices import Placement
from failsoft.runtime.session import Session

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def session(tiny_zoo, tmp_path_factory):
    config = config_from_dict(
        {
            "name": "gpu-test",
            "repository": str(tiny_zoo.root),
            "servers": [
                {"name": "g1", "site": "a", "memory_mb": 50, "gpus": 0.5},  # device auto: CPU here
                {"name": "c1", "site": "a", "memory_mb": 50, "device": "cpu"},
                {"name": "p0", "site": "b", "memory_mb": 50, "device": "cuda:0", "gpus": 0.25},
            ],
            "apps": [
                {"name": "on-gpu", "family": "digits_mlp", "primary": {"server": "g1", "variant": "mlp_s"}},
                {"name": "on-cpu", "family": "digits_mlp", "primary": {"server": "c1", "variant": "mlp_s"}},
            ],
            "gateway": {"port": 0},
            "state_dir": str(tmp_path_factory.mktemp("state")),
        },
        source="test",
    )
    session = Session(config, num_cpus=2, num_gpus=1).start()
    try:
        yield session
    finally:
        session.stop()


def test_an_agent_with_a_share_is_granted_a_gpu_and_sees_only_it(session: Session) -> None:
    device = session.agents["g1"].info_sync()["device"]
    assert device["granted"]["resources"] == {"GPU": 0.5}  # embedded: no server resource to place by
    assert device["granted"]["gpu_ids"] == ["0"]
    assert device["visible"] == "0"  # set by Ray from the grant
    assert device["configured"] == "auto"
    assert device["accounted_mb"] > 0  # its primary, at its profiled memory
    assert session.agents["g1"].holdings_sync()["models"] == [["on-gpu", "mlp_s"]]
    loaded = asyncio.run(session.agents["g1"].load("on-gpu", "digits_mlp", "mlp_s"))  # held: a no-op
    if CUDA:
        assert device["memory"]["cuda"] is True and device["memory"]["total_mb"] > 0
        assert loaded["device"].startswith("cuda")
    else:  # no CUDA behind the id: it serves on the CPU
        assert device["memory"] == {"cuda": False}
        assert loaded["device"] == "cpu"


def test_an_agent_on_the_cpu_asks_for_no_gpu(session: Session) -> None:
    device = session.agents["c1"].info_sync()["device"]
    assert device["granted"]["resources"] == {}
    assert device["granted"]["gpu_ids"] == []
    assert device["visible"] == ""  # hidden by failsoft: Ray 2.60 would leave it every GPU of the node


def test_a_pinned_gpu_is_reserved_from_ray_and_made_the_only_visible_one(session: Session) -> None:
    info = session.agents["p0"].info_sync()
    device = info["device"]
    assert device["granted"]["resources"]["GPU"] == 0.25
    assert device["visible"] == "0"  # cuda:0 of the machine, by failsoft, not Ray's pick
    assert device["torch_device"] == "cuda:0"  # its index among the visible GPUs
    assert device["error"] is None
    startup = info["startup"]
    assert startup["process_started_at"] <= startup["init_at"] <= startup["ready_at"]
    assert startup["imports_ms"] > 0
    assert (startup["cuda_context_ms"] > 0) == CUDA  # created at start, where there is CUDA


def test_more_gpus_than_the_node_offers_is_refused_before_any_agent_waits(session: Session) -> None:
    too_many = {"a": Placement("cuda", 0.75), "b": Placement("cuda", 0.5)}
    with pytest.raises(ConfigError, match=r"servers ask for 1.25 GPUs \(a: 0.75, b: 0.5\); this machine's"):
        session.cluster.check_gpus(too_many)
    with pytest.raises(ConfigError, match=r"server 'x': device 'cuda:1', but this machine's Ray node has 1"):
        session.cluster.check_gpus({"x": Placement("cuda:1", 0.5)})
