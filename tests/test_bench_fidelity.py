"""The fidelity benchmark's comparison: errors per app and their median, from given observations."""

import json

import pytest

from failsoft.bench.fidelity import compare
from failsoft.errors import ConfigError


def _run(apps):
    return {
        "apps": {
            name: {
                "recovered": True,
                "kind": kind,
                "first_variant": "v",
                "mttr_ms": mttr,
                "first_answer_ms": first,
                "usual_ms": usual,
            }
            for name, (kind, mttr, first, usual) in apps.items()
        },
        "detection_ms": {"a1": 35.0},
        "requests": {"failed": 0},
    }


def test_errors_are_relative_per_app_and_the_median_is_over_apps():
    runs = [_run({"x": ("progressive", 100.0, 150.0, 12.0), "y": ("progressive", 200.0, 260.0, 12.0),
                  "z": ("warm", 1.0, 20.0, 12.0)})]  # fmt: skip
    sims = [{"mttr_ms": {"x": 110.0, "y": 150.0, "z": 0.0},
             "first_answer_ms": {"x": 140.0, "y": 190.0, "z": 5.0},
             "primary_latency_ms": {"x": 10.0, "y": 10.0, "z": 10.0}}]  # fmt: skip
    out = compare("c.yaml", ["a1"], "faillite", runs, sims)
    # the simulated first answer plus the serving path's overhead measured in the run: 12 - 10 ms
    assert out["per_app"]["x"]["sim_first_answer_ms"] == pytest.approx(140 + 2)
    # MTTR errors: x 10 %, y 25 %, z 100 % (a 1 ms warm switch against an instantaneous one)
    assert out["median_abs_error_pct"]["mttr"] == pytest.approx(25.0)
    assert out["abs_error_ms"]["mttr"] == {"median": 10.0, "max": 50.0}
    # per app and per recovery kind: the progressive loads' 10 and 25 %, the warm switch's 1 ms
    assert (out["per_app"]["x"]["mttr_error_pct"], out["per_app"]["z"]["mttr_error_ms"]) == (10.0, 1.0)
    assert out["median_mttr_error_pct_by_kind"] == {"progressive": 17.5, "warm": 100.0}
    assert out["median_mttr_error_ms_by_kind"] == {"progressive": 30.0, "warm": 1.0}
    assert out["serving_overhead_ms"] == pytest.approx(2.0)


def test_the_runtimes_own_spread_is_reported_beside_the_errors():
    apps = [{"x": ("progressive", m, 150.0, 12.0), "z": ("warm", 0.0, 20.0, 12.0)} for m in (80, 100, 120)]
    runs = [_run(a) for a in apps]
    sims = [{"mttr_ms": {"x": 100.0, "z": 0.0}, "first_answer_ms": {"x": 140.0, "z": 5.0},
             "primary_latency_ms": {"x": 10.0, "z": 10.0}}] * 3  # fmt: skip
    out = compare("c.yaml", ["a1"], "faillite", runs, sims)
    # runs 80, 100, 120 ms: the median run is 20 ms (20%) from the mean; the mean's standard error
    # is 20 / sqrt(3) ms (11.5%); a warm switch (~0 ms) has no percentage
    assert out["per_app"]["x"]["runtime_spread_pct"] == {"single_run": 20.0, "mean_of_runs": 11.5}
    assert out["per_app"]["z"]["runtime_spread_pct"] is None
    assert out["runtime_spread_pct"] == {"single_run": 20.0, "mean_of_runs": 11.5}
    one = compare("c.yaml", ["a1"], "faillite", runs[:1], sims[:1])
    assert one["runtime_spread_pct"] == {"single_run": None, "mean_of_runs": None}  # one run: unknown


def test_apps_the_simulator_did_not_recover_are_left_out_of_the_error():
    runs = [_run({"x": ("progressive", 100.0, 150.0, 12.0)})]
    sims = [{"mttr_ms": {}, "first_answer_ms": {}, "primary_latency_ms": {"x": 10.0}}]
    out = compare("c.yaml", ["a1"], "faillite", runs, sims)
    assert out["per_app"]["x"]["sim_mttr_ms"] is None
    assert out["median_abs_error_pct"] == {"mttr": None, "first_answer": None}


def test_a_replay_reads_the_runtime_runs_of_an_earlier_output(tmp_path):
    from failsoft.bench.fidelity import replayed
    from failsoft.errors import ConfigError

    runs = [_run({"x": ("progressive", 100.0, 150.0, 12.0)})]
    more = [_run({"x": ("progressive", 90.0, 140.0, 11.0)}), _run({"x": ("progressive", 80.0, 130.0, 9.0)})]
    crash = {"config": "examples/bench.yaml", "failed": ["a1"], "per_app": {}}
    earlier, later = tmp_path / "fidelity.json", tmp_path / "later.json"
    earlier.write_text(json.dumps(crash | {"runtime_runs": runs}))
    later.write_text(json.dumps(crash | {"runtime_runs": more}))
    assert replayed(earlier) == runs
    assert replayed(earlier, later) == runs + more  # more runs of one crash, pooled
    other = tmp_path / "other.json"
    other.write_text(json.dumps(crash | {"failed": ["b1"], "runtime_runs": more}))
    with pytest.raises(ConfigError, match=r"killing b1, not of examples/bench\.yaml killing a1"):
        replayed(earlier, other)
    (tmp_path / "bare.json").write_text(json.dumps({"per_app": {}}))
    with pytest.raises(ConfigError, match="not an output of 'failsoft bench fidelity'"):
        replayed(tmp_path / "bare.json")


B0 = "efficientnet_b0"


def test_a_family_whose_variants_take_different_inputs_is_refused_before_any_build(tmp_path):
    from failsoft.bench.models import ensure_families
    from failsoft.errors import ConfigError
    from failsoft.runtime.config import config_from_dict

    config = config_from_dict(
        {
            "name": "t",
            "repository": str(tmp_path / "zoo"),
            "servers": [{"name": "a1", "site": "a", "memory_mb": 1000, "compute": 8.0}],
            "apps": [{"name": "e", "family": "efficientnet", "primary": {"server": "a1", "variant": B0}}],
        },
        source="test",
    )
    with pytest.raises(ConfigError, match=r"'efficientnet' cannot serve an app.*efficientnet_b7: 600"):
        ensure_families(config, lambda _: None)
    assert not (tmp_path / "zoo").exists()  # minutes of building saved


def test_the_twin_is_told_the_hosts_other_work_as_measured():
    from failsoft.bench.fidelity import host_twin

    steady = {"seconds": 3.0, "busy_cores": 1.9, "own_cores": 1.2, "other_groups": {"/autogroup-2": 0.5}}
    recovery = {"seconds": 2.0, "busy_cores": 1.5, "own_cores": 1.0, "other_groups": {"/autogroup-2": 0.4}}
    shares = {"a": 0.2, "b": 0.4, "c": 0.3}
    run = {
        "host_busy_cores": 1.9,
        "host_cpu": steady | {"load_cpu_share": shares, "recovery": recovery},
        "apps": {"x": {"load_cpu_ms": 600.0}, "y": {"load_cpu_ms": 200.0}, "z": {"load_cpu_ms": None}},
    }
    # during the recovery, less what its loads took (0.8 s of CPU over 2 s)
    assert host_twin(run, 2.0, "recovery") == {
        "host_busy_cores": pytest.approx(0.6),
        "host_other_groups": (0.4,),
    }
    assert host_twin(run, 2.0, "steady") == {"host_busy_cores": 1.2, "host_other_groups": (0.5,)}
    # where the agents counted every load (upgrades too), that is what comes off
    counted = run | {"host_cpu": run["host_cpu"] | {"recovery": recovery | {"loads_cores": 0.7}}}
    assert host_twin(counted, 2.0, "recovery")["host_busy_cores"] == pytest.approx(0.3)
    # the loads' measured share of a core, the median over the servers
    assert host_twin(run, 2.0, "probe") == {"host_load_share": pytest.approx(0.3)}
    # the default: the busy cores before the kill
    assert host_twin(run, 2.0) == host_twin(run, 2.0, "steady")
    # ... less what the recovery does not meet: the killed servers' agents, the share probes' spins
    measured = run | {"host_cpu": run["host_cpu"] | {"failed_agents_cores": 0.5, "probe_cores": 0.2}}
    assert host_twin(measured, 2.0, "steady")["host_busy_cores"] == pytest.approx(0.5)
    assert host_twin(measured, 2.0, "recovery") == host_twin(run, 2.0, "recovery")  # measured after
    # older outputs fall back to what they measured
    older = {"host_busy_cores": 1.9, "host_cpu": steady, "apps": {}}
    assert host_twin(older, 2.0, "recovery") == host_twin(older, 2.0, "steady")
    assert host_twin({"host_busy_cores": 1.9, "apps": {}}, 2.0, "probe") == {"host_busy_cores": 1.9}
    assert host_twin({"apps": {}}, 2.0) == {"host_busy_cores": 0.0}
    with pytest.raises(ConfigError, match="host model"):
        host_twin(run, 2.0, "guess")


def test_the_page_cache_is_set_for_the_configs_weights_and_each_run_tells_the_twin(tmp_path):
    from failsoft.bench.failover import BenchSettings, set_page_cache
    from failsoft.bench.fidelity import run_page_cache
    from failsoft.runtime.config import config_from_dict
    from failsoft.zoo.layout import CONFIG_FILE, WEIGHTS_FILE
    from failsoft.zoo.pagecache import resident_fraction

    files = []
    for family, variant in (("fam", "v1"), ("fam", "v2"), ("other", "w1")):
        folder = tmp_path / "zoo" / family / variant
        folder.mkdir(parents=True)
        (folder / CONFIG_FILE).write_text("{}")
        (folder / WEIGHTS_FILE).write_bytes(bytes(range(256)) * 4096)  # 1 MiB
        files.append(folder / WEIGHTS_FILE)
    config = config_from_dict(
        {
            "name": "t",
            "repository": str(tmp_path / "zoo"),
            "servers": [{"name": "a1", "site": "a", "memory_mb": 1000, "compute": 8.0}],
            "apps": [{"name": "x", "family": "fam", "primary": {"server": "a1", "variant": "v1"}}],
        },
        source="test",
    )
    assert set_page_cache(config, warm=False) == 2  # the config's family only
    cold = resident_fraction(files[:2])
    assert set_page_cache(config, warm=True) == 2
    if cold is not None and not _on_tmpfs(tmp_path):  # fincore (util-linux) says what is cached
        assert cold == 0.0  # (tmpfs pages cannot be dropped: they are the file)
        assert resident_fraction(files[:2]) == 1.0
    with pytest.raises(ConfigError, match="page cache must be one of warm, cold; got 'hot'"):
        BenchSettings(page_cache="hot")
    assert run_page_cache({"page_cache": "cold"}) == "cold"
    assert run_page_cache({}) == "warm"  # runs recorded before the state was set


def _on_tmpfs(path):
    """Whether ``path`` is on a tmpfs (the longest mount point above it, from /proc/mounts)."""
    from pathlib import Path

    best, kind = "", ""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and str(path).startswith(fields[1]) and len(fields[1]) > len(best):
            best, kind = fields[1], fields[2]
    return kind == "tmpfs"


def test_the_control_path_cost_is_the_median_gap_of_the_probes_and_never_negative():
    from failsoft.bench.fidelity_switch import control_ms

    probes = [
        {"runtime_ms": 20.0, "sim_ms": 2.0},
        {"runtime_ms": 15.0, "sim_ms": 3.0},
        {"runtime_ms": 30.0, "sim_ms": 8.0},
        {"runtime_ms": None, "sim_ms": 2.0},  # never published within the timeout: left out
    ]
    assert control_ms(probes) == 18.0
    assert control_ms([{"runtime_ms": 1.0, "sim_ms": 5.0}]) == 0.0  # a twin slower than the runtime
    assert control_ms([]) == 0.0  # not measured: not modelled


def test_the_control_work_is_what_makes_the_probes_twins_as_slow_as_the_runtime():
    from failsoft.bench.fidelity_switch import control_work_ms

    def twin(stretch):  # a twin in which a millisecond of work takes ``stretch`` (its pins share a core)
        return lambda work: [
            {"runtime_ms": 20.0, "sim_ms": 2.0 + stretch * work},
            {"runtime_ms": 30.0, "sim_ms": 4.0 + stretch * work},
            {"runtime_ms": 300.0, "sim_ms": 100.0 + work, "heavy": True},  # left out, as by control_ms
        ]

    assert control_work_ms(twin(1.0)) == pytest.approx(22.0, abs=0.01)  # the median gap, at a core
    assert control_work_ms(twin(2.0)) == pytest.approx(11.0, abs=0.01)  # half the work closes it
    assert control_work_ms(twin(0.5)) == pytest.approx(44.0, abs=0.05)  # beyond the gap: the range grows
    assert control_work_ms(lambda work: [{"runtime_ms": 1.0, "sim_ms": 5.0 + work}]) == 0.0  # slower already


def test_the_twin_runs_heavy_loads_as_the_run_did_and_older_runs_in_every_slot():
    from failsoft.bench.fidelity import twin_config
    from failsoft.runtime.config import load_config

    config = load_config("examples/bench.yaml")
    run = {"host_busy_cores": 0.5, "apps": {}}
    assert twin_config(config, run).heavy_load_slots is None  # recorded before heavy slots existed
    assert twin_config(config, run | {"heavy_load_slots": 1}).heavy_load_slots == 1
    # ... per server, or on the whole host as the run recorded (older runs: per server)
    assert twin_config(config, run).heavy_loads_per_host is False
    assert twin_config(config, run | {"heavy_loads_per_host": True}).heavy_loads_per_host is True


def test_the_pin_model_fits_the_share_at_which_the_twins_heavy_probe_takes_as_long_as_the_runtimes():
    from failsoft.bench.fidelity import fit_share

    def twin(share: float) -> tuple[float, float | None]:  # 60 ms of work, 5 ms of control
        return 5.0, 5.0 + 60.0 / share

    share, control = fit_share(twin, 245.0)  # 240 ms of it at a quarter of a core
    assert share == pytest.approx(0.25, abs=1e-3) and control == 5.0
    assert fit_share(twin, 40.0) == (1.0, 5.0)  # faster than a whole core: a whole core
    assert fit_share(lambda share: (0.0, None), 100.0) is None  # a twin that never ends: no fit


def test_the_heavy_probe_pins_the_lightest_heavy_variant_where_it_fits_and_no_copy_is():
    from failsoft.bench.fidelity_switch import _heavy_probe
    from failsoft.domain import App, Family, Placement, PolicyParams, Scenario, Server, Variant

    tiny = Variant("tiny", 10, 0.6, load_ms=3.0, latency_ms=1.0)  # 3 ms of work: not heavy
    small, big = Variant("small", 100, 0.7, 200.0, 5.0), Variant("big", 300, 0.8, 1000.0, 10.0)
    servers = (Server("s0", "a", 1000, 10), Server("s1", "b", 400, 10), Server("s2", "b", 50, 10))
    apps = tuple(App(n, "fam", Placement("s0", "big"), False, 1.0, 100.0) for n in "AB")
    scenario = Scenario(servers, (Family("fam", (tiny, small, big)),), apps, PolicyParams(), ())
    routes = {a.name: {"server": "s0", "variant": "big"} for a in scenario.apps}
    # the lightest heavy variant (small, 200 ms), for A, on s1: s2 is too small for it
    assert _heavy_probe(scenario, routes, [], ["s0"]) == {"app": "A", "server": "s1", "variant": "small"}
    # A's copy is on s1 already: B's
    copies = [{"app": "A", "server": "s1", "variant": "small"}]
    assert _heavy_probe(scenario, routes, copies, ["s0"]) == {"app": "B", "server": "s1", "variant": "small"}
    assert _heavy_probe(scenario, routes, [], ["s0", "s1"]) is None  # nowhere it fits
    # beside what a server holds: s1 with B's copy of big (300 of 400 MB) and A's tiny one
    full = [{"app": "B", "server": "s1", "variant": "big"}, {"app": "A", "server": "s1", "variant": "tiny"}]
    assert _heavy_probe(scenario, routes, full, ["s0"]) is None


def test_a_control_probe_is_pinned_at_a_failover_loads_priority_and_a_ladder_switch_is_not():
    from failsoft.bench.fidelity_switch import request
    from failsoft.orchestration.loads import Priority

    probe = {"app": "A", "server": "s1", "variant": "small", "urgent": True}
    assert request(probe).priority is Priority.FAILOVER
    switch = {"app": "A", "server": "s1", "variant": "small"}  # and probes recorded before urgent ones
    assert request(switch).priority is Priority.WARM


def test_the_steady_window_counts_what_a_recovery_will_not_meet():
    from failsoft.bench.failover import PROBE_SPIN_S, _not_after_the_kill

    busy = {"seconds": 3.0, "own_cores": 1.5, "processes": {"a1": 0.4, "a2": 0.1}}
    shares = {"a1": 0.5, "b1": 0.6, "b2": 0.9}  # a1's spin is in its process's CPU already
    out = _not_after_the_kill(busy, shares, ["a1", "a2"])
    assert out["failed_agents_cores"] == pytest.approx(0.5)
    assert out["probe_cores"] == pytest.approx(round(1.5 * PROBE_SPIN_S / 3.0, 3))
    assert _not_after_the_kill({"seconds": 3.0}, {}, ["a1"]) == {
        "failed_agents_cores": 0.0,
        "probe_cores": 0.0,
    }


def test_the_small_probes_take_the_survivors_in_turn_with_the_fastest_apps_holding_no_copy_there():
    from failsoft.bench.fidelity_switch import PROBE_PINS, _small_probes
    from failsoft.domain import App, Family, Placement, PolicyParams, Scenario, Server, Variant

    tiny, small = Variant("tiny", 10, 0.6, load_ms=3.0, latency_ms=1.0), Variant("small", 20, 0.7, 5.0, 1.0)
    big = Variant("big", 300, 0.8, 1000.0, 10.0)  # heavy: never a small probe
    families = (Family("fam", (tiny, small)), Family("heavy", (big,)))
    servers = tuple(Server(n, "a", 1000, 10) for n in ("s0", "s1", "s2"))
    apps = (
        *(App(n, "fam", Placement("s0", "small"), False, 1.0, 100.0) for n in "ABCD"),
        App("H", "heavy", Placement("s0", "big"), False, 1.0, 100.0),
    )
    scenario = Scenario(servers, families, apps, PolicyParams(), ())
    holders = {"A": {"s0", "s1"}, "B": {"s0"}, "C": {"s0"}, "D": {"s0"}, "H": {"s0"}}
    picks = _small_probes(scenario, ["s1", "s2"], holders, skip="D")
    # in turn: s1 (A held there: B first), s2 (A), s1 (C); each in its fastest variant, H never
    assert [(p["server"], p["app"], p["variant"]) for p in picks] == [
        ("s1", "B", "tiny"), ("s2", "A", "tiny"), ("s1", "C", "tiny"),
    ]  # fmt: skip
    assert len(picks) == PROBE_PINS and all(p["urgent"] for p in picks)
    # one survivor: still several pins there, of different apps
    alone = _small_probes(scenario, ["s2"], holders, skip=None)
    assert [p["app"] for p in alone] == ["A", "B", "C"]
    assert _small_probes(scenario, ["s1"], {a: {"s1"} for a in "ABCDH"}, skip=None) == []


def test_the_controllers_reaction_is_half_what_the_probes_pins_took_longer_seen_from_outside():
    from failsoft.bench.fidelity_switch import hop_ms

    events = [
        {"runtime_ms": 30.0, "seen_ms": 50.0},
        {"runtime_ms": 20.0, "seen_ms": 32.0},
        {"runtime_ms": 25.0, "seen_ms": 41.0},
        {"runtime_ms": 300.0, "seen_ms": 400.0, "heavy": True},  # the heavy pin: left out
        {"runtime_ms": 25.0},  # recorded before both times were: left out
    ]
    assert hop_ms(events) == 8.0
    assert hop_ms([]) == 0.0 and hop_ms([{"runtime_ms": 9.0, "seen_ms": 5.0}]) == 0.0
