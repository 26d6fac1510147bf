"""``bench fidelity`` on the mechanism examples, tiny (one runtime run, one simulated seed) on a
real embedded cluster: the graph's killed stateful node is promoted to its pinned backup in the
runtime and in the twin, and the slo service's ladder switches are timed and simulated."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from failsoft.bench.fidelity import run
from tests.zoos import tiny_zoo_of

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits MLPs (slo) and the SP500 GRUs (graph), quickly profiled, each family built once
    per run (:mod:`tests.zoos`)."""
    return tiny_zoo_of(tmp_path_factory, ("digits_mlp", "sp500_gru")).root


def _example(name: str, zoo: Path, tmp_path: Path) -> Path:
    data = yaml.safe_load((EXAMPLES / name).read_text())
    data |= {"repository": str(zoo), "state_dir": str(tmp_path / "state")}
    data["gateway"] = {**data["gateway"], "port": 0}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_graph_example_twins_a_hams_promotion(zoo: Path, tmp_path: Path) -> None:
    out = run(_example("graph-echo-chain.yaml", zoo, tmp_path), kill=("s1",), repeats=1, sim_seeds=1)
    (observed,) = out["runtime_runs"]
    # c2's backup was pinned by the graph driver before the kill, and the twin started from it
    assert any(w["app"] == "c2" and w["pinned"] for w in observed["warm"])
    c2 = out["per_app"]["c2"]
    assert c2["kind"] == "promoted" and c2["runtime_mttr_ms"] is not None and c2["sim_mttr_ms"] is not None
    # the clients asked the service (the gateway serves no member alone), and the gateway logged the
    # chain's recovery by the promoted node the answers crossed
    assert observed["requests"]["total"] > 0 and observed["requests"]["failed"] == 0
    assert c2["runtime_first_answer_ms"] is not None
    # a promotion is a route switch at detection on both sides: its error is in milliseconds
    assert c2["mttr_error_ms"] is not None and out["median_mttr_error_ms_by_kind"]["promoted"] is not None
    assert {"median_abs_error_pct", "abs_error_ms", "not_modelled"} <= out.keys()
    # before the kill, the control probe pinned on each survivor the fastest-loading variant of an
    # app holding no copy there, and timed each pin to publication; the run says its heavy slots
    probe = observed["before_kill"]["control_probe"]
    assert probe["events"] and all(e["runtime_ms"] is not None for e in probe["events"])
    assert all(e["urgent"] for e in probe["events"])  # at a failover load's priority, as a crash's
    assert all(e["server"] != "s1" for e in probe["events"]) and observed["heavy_load_slots"] >= 1
    # ... and what the cluster's processes spent over the pins, with the loads' own part of it
    cpu = probe["cpu"]
    assert cpu["seconds"] > 0 and 0 < cpu["own_cores"] <= cpu["busy_cores"] and cpu["loads_cpu_ms"] > 0


def test_the_slo_example_twins_its_ladder_switches(zoo: Path, tmp_path: Path) -> None:
    out = run(_example("slo.yaml", zoo, tmp_path), kill=("e1",), repeats=1, sim_seeds=1)
    events = out["switches"]["events"]
    # workers 2 and 3 (not on e1) each switched to the family's three other rungs
    assert {(e["app"], e["variant"]) for e in events} == {
        (w, v) for w in ("worker-2", "worker-3") for v in ("mlp_xs", "mlp_s", "mlp_l")
    }
    assert all(e["runtime_ms"] is not None and e["sim_ms"] is not None for e in events)
    assert out["switches"]["median_abs_error_pct"] is not None
    assert out["per_app"]["worker-1"]["kind"] == "warm"
    # the load came from a client registered with the service (it answers no one else), and went on
    # through the kill
    (observed,) = out["runtime_runs"]
    requests = observed["requests"]
    assert requests["total"] > 0 and requests["failed"] == 0, requests["errors"]
    # the switches' control cost came from small pins made on the same calm cluster just before
    # them, at their priority, of other copies than theirs
    calm = observed["before_kill"]["calm_probe"]["events"]
    assert calm and all(e["runtime_ms"] is not None and not e.get("urgent") for e in calm)
    switched = {(e["app"], e["server"], e["variant"]) for e in events}
    assert not {(e["app"], e["server"], e["variant"]) for e in calm} & switched
    assert observed["apps"]["worker-1"]["answer_after_kill_ms"] is not None
