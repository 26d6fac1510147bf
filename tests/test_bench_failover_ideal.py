"""``bench failover``'s ideal MTTR: each load's profile in isolation, shortest first per server."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from failsoft.bench.failover import add_ideal, summarize


def _profile(repo: Path, variant: str, load_ms: float) -> None:
    path = repo / "fam" / variant
    path.mkdir(parents=True)
    doc = {
        "memory_mb": 10,
        "load_ms": load_ms,
        "latency_ms": 1,
        "accuracy": 0.9,
        "accuracy_source": "declared",
    }
    (path / "profile.json").write_text(json.dumps(doc))


def _app(kind: str, server: str | None, variant: str | None, mttr_ms: float) -> dict:
    return {"recovered": server is not None, "kind": kind, "server": server, "first_variant": variant,
            "mttr_ms": mttr_ms if server else None, "settled_variant": variant, "first_answer_ms": None,
            "outage_ms": None, "accuracy_primary": None, "accuracy_served": None}  # fmt: skip


def test_loads_on_one_server_queue_shortest_first_and_warm_switches_are_free(tmp_path):
    for variant, load_ms in (("small", 100.0), ("big", 400.0)):
        _profile(tmp_path, variant, load_ms)
    # the runtime config's fields add_ideal reads (a real one needs a whole cluster's description)
    cfg = SimpleNamespace(
        repository=tmp_path,
        apps=[SimpleNamespace(name=n, family="fam") for n in "abcde"],
        agents=SimpleNamespace(max_parallel_loads=1),
    )
    apps = {
        "a": _app("progressive", "s1", "big", 700.0),
        "b": _app("progressive", "s1", "small", 150.0),
        "c": _app("progressive", "s2", "big", 450.0),  # alone on its server
        "d": _app("warm", "s3", "small", 30.0),
        "e": _app("progressive", None, None, 0.0),  # not recovered
    }
    add_ideal(apps, cfg)
    assert {n: a["ideal_ms"] for n, a in apps.items()} == {
        "a": 500.0,
        "b": 100.0,
        "c": 400.0,
        "d": 0.0,
        "e": None,
    }
    requests = {"total": 0, "failed": 0, "failed_affected": 0, "errors": []}
    summary = summarize([{"apps": apps, "detection_ms": {}, "spurious_failures": [], "requests": requests}])
    assert summary["ideal_ms"]["mean"] == pytest.approx(250.0)
    assert summary["mttr_over_ideal"] == pytest.approx((700 + 150 + 450 + 30) / 1000.0, abs=1e-3)
    # each load's phases per run come through to the summary; apps without any are left out
    apps["a"]["load_phases"] = {"slot_wait_ms": 380.0, "agent_ms": 300.0, "route_ms": 20.0}
    summary = summarize([{"apps": apps, "detection_ms": {}, "spurious_failures": [], "requests": requests}])
    assert summary["load_phases"] == {"a": [apps["a"]["load_phases"]]}
