"""``bench failover``'s clients ask what the gateway serves: a service's members only through the
service, at its front app's shape and rate; an slo service only for a client registered with it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from failsoft.bench.failover import Endpoints
from failsoft.runtime.config import RuntimeConfig, load_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _asked(cfg: RuntimeConfig, **shapes: tuple[int, ...]) -> Endpoints:
    metas = {a.name: SimpleNamespace(input_shape=shapes.get(a.name, (1,))) for a in cfg.apps}
    return Endpoints.of(cfg, metas, {a.name: 1.0 / a.rate_rps for a in cfg.apps if a.rate_rps > 0})


def test_a_graph_is_asked_by_its_service_with_its_entry_nodes_input() -> None:
    cfg = load_config(EXAMPLES / "graph-echo-chain.yaml")
    asked = _asked(cfg, c1=(3,))
    assert asked.endpoint == dict.fromkeys(("c1", "c2", "c3", "c4", "c5"), "chain")
    assert asked.shapes == {"chain": (3,)} and asked.periods == {"chain": 1 / 20}  # c1: the entry node
    assert asked.asked(["c2", "c1"]) == ["chain"] and asked.slo == ()


def test_an_slo_service_is_asked_as_one_and_said_to_need_registered_clients() -> None:
    asked = _asked(load_config(EXAMPLES / "slo.yaml"))
    assert set(asked.endpoint.values()) == {"digits"} and asked.slo == ("digits",)
    assert asked.periods == {"digits": 1 / 25}


def test_apps_served_alone_are_asked_by_their_own_names() -> None:
    cfg = load_config(EXAMPLES / "bench.yaml")
    asked = _asked(cfg)
    assert asked.endpoint == {a.name: a.name for a in cfg.apps} and asked.slo == ()
    assert asked.asked([a.name for a in cfg.apps]) == [a.name for a in cfg.apps]
