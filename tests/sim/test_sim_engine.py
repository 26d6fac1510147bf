"""One failure event on the hand-checkable tiny cluster: times, metrics and the exact event log."""

from __future__ import annotations

import dataclasses
import math

import pytest
from sim_tiny import BIG, DETECTED_AT, FAILURE_AT, NOTIFY_S, SMALL, tiny_scenario

from failsoft.domain import ActionKind, Family, WarmBackup
from failsoft.errors import ConfigError
from failsoft.sim import Deployer, PageCache, RequestMode, SimConfig, simulate_failure, summarize


def _run(scenario, policy, config, failed=("s0",)):
    return simulate_failure(Deployer().deploy(scenario, policy), failed, config)


def test_faillite_on_the_tiny_cluster_matches_the_hand_computation(tiny, fixed):
    event = _run(tiny, "faillite", fixed)
    # A switches to its warm backup; B loads small on s2 then upgrades to big (s2 has room for
    # both); C loads big on s1 directly (no slack there for a small first variant).
    mttr = {
        "A": NOTIFY_S,
        "B": SMALL.load_ms / 1000 + NOTIFY_S,
        "C": BIG.load_ms / 1000 + NOTIFY_S,
    }
    assert event.detected_at == {"s0": pytest.approx(DETECTED_AT)}
    for app, expected in mttr.items():
        assert event.apps[app].mttr_ms == pytest.approx(expected * 1000)
    # B's upgrade waits until every app of the failover is served (C, big, 1 s), as in the runtime:
    # no upgrade competes with another app's recovery.
    assert event.apps["B"].final_at == pytest.approx(DETECTED_AT + 2 * BIG.load_ms / 1000)
    metrics = summarize([event])
    assert metrics["recovery_rate"] == 1.0
    assert metrics["mttr_ms"] == pytest.approx(sum(mttr.values()) / 3 * 1000)
    assert metrics["detection_ms"] == pytest.approx((DETECTED_AT - FAILURE_AT) * 1000)
    # A serves small: family-normalised accuracy 0.70 / 0.80 against 1.0, B and C serve big.
    assert metrics["accuracy_reduction_pct"] == pytest.approx((1 - 0.70 / 0.80) * 100 / 3)
    assert metrics["oom_loads"] == 0


def test_the_event_log_is_exact(tiny, fixed):
    event = _run(tiny, "faillite", dataclasses.replace(fixed, requests=RequestMode.OFF))
    # A switches to its warm backup at the failure, before the plan (the runtime's order); B's upgrade
    # waits for C (every app of the failover served first); B's small variant is unloaded after the
    # drain period (200 ms) once traffic moved to big.
    t_b, t_c = DETECTED_AT + 0.2, DETECTED_AT + 1.0
    drain = fixed.drain_ms / 1000
    expected = [
        (FAILURE_AT, "crash", "", "s0", ""),
        (DETECTED_AT, "detected", "", "s0", ""),
        (DETECTED_AT, "serving", "A", "s1", "small"),
        (DETECTED_AT, "plan", "", "s0", "faillite"),
        (DETECTED_AT, "load-start", "B", "s2", "small"),
        (DETECTED_AT, "load-start", "C", "s1", "big"),
        (DETECTED_AT + NOTIFY_S, "notified", "A", "s1", ""),
        (t_b, "loaded", "B", "s2", "small"),
        (t_b, "serving", "B", "s2", "small"),
        (t_b + NOTIFY_S, "notified", "B", "s2", ""),
        (t_c, "loaded", "C", "s1", "big"),
        (t_c, "serving", "C", "s1", "big"),
        (t_c, "load-start", "B", "s2", "big"),
        (t_c + NOTIFY_S, "notified", "C", "s1", ""),
        (t_c + 1.0, "loaded", "B", "s2", "big"),
        (t_c + 1.0, "serving", "B", "s2", "big"),
        (t_c + 1.0 + drain, "unloaded", "B", "s2", "small"),
    ]
    got = [(pytest.approx(e.t), e.kind, e.app, e.server, e.variant) for e in event.log]
    assert got == expected


def test_unrecovered_apps_count_in_the_rate_but_not_in_mttr_or_accuracy(tiny, fixed):
    event = _run(tiny, "full-warm", fixed)  # no cold backups: B and C stay down
    assert {a: r.recovered for a, r in event.apps.items()} == {"A": True, "B": False, "C": False}
    assert math.isinf(event.apps["B"].mttr_ms)
    metrics = summarize([event])
    assert metrics["recovery_rate"] == pytest.approx(1 / 3)
    assert metrics["mttr_ms"] == pytest.approx(NOTIFY_S * 1000)  # A alone
    assert metrics["accuracy_reduction_pct"] == pytest.approx((1 - 0.70 / 0.80) * 100)  # A alone
    # Their clients' requests after the failure are never served; A's all are.
    assert metrics["req_unserved"] > 0


def test_unaffected_apps_are_not_counted(tiny, fixed):
    event = _run(tiny, "faillite", fixed, failed=("s2",))  # s2 holds no primary
    assert event.apps == {}
    assert math.isnan(summarize([event])["recovery_rate"])


@pytest.mark.parametrize(("slots", "c_mttr_s"), [(1, 2.0 + NOTIFY_S), (2, 1.0 + NOTIFY_S)])
def test_loads_on_one_server_contend_for_its_load_slots(fixed, slots, c_mttr_s):
    # s1 is full with A's warm backup, so full-cold loads B and C (big, 1 s each) both on s2.
    scenario = tiny_scenario(s1_mb=100, s2_mb=700)
    event = _run(scenario, "full-cold", dataclasses.replace(fixed, load_slots=slots))
    assert {r.kind for r in event.apps.values()} == {ActionKind.WARM, ActionKind.COLD}
    assert event.apps["B"].mttr_ms == pytest.approx((1.0 + NOTIFY_S) * 1000)
    assert event.apps["C"].mttr_ms == pytest.approx(c_mttr_s * 1000)


def test_charging_plan_time_delays_recovery_by_the_measured_plan_time(tiny, fixed):
    event = _run(tiny, "faillite", dataclasses.replace(fixed, charge_plan_time=True))
    # A's warm switch happens at the failure, before any plan (as in the runtime); B waits for the plan
    assert event.apps["A"].mttr_ms == pytest.approx(NOTIFY_S * 1000)
    expected_b = event.plan_ms[0] + SMALL.load_ms + NOTIFY_S * 1000
    assert event.apps["B"].mttr_ms == pytest.approx(expected_b)


def test_a_site_failure_is_planned_once_even_when_detection_straddles_a_check(tiny):
    # s0 holds the primaries, s1 A's warm backup: planned apart, A would be switched to a dead backup
    config = SimConfig(requests=RequestMode.OFF)
    plans = set()
    for seed in range(20):
        event = simulate_failure(Deployer().deploy(tiny, "faillite"), ("s0", "s1"), config, seed=seed)
        plans.add(len(event.plan_ms))
        assert set(event.detected_at) == {"s0", "s1"}
        assert event.apps["A"].kind is ActionKind.PROGRESSIVE and event.apps["A"].server == "s2"
    assert plans == {1}


def test_requests_wait_for_the_new_location_and_are_served_where_the_app_runs(fixed):
    scenario = tiny_scenario(rate_rps=20.0)
    event = _run(scenario, "faillite", dataclasses.replace(fixed, requests=RequestMode.ALL))
    assert event.requests is not None and event.requests.unserved == 0  # held requests were reissued
    held = [
        r
        for r in event.request_log
        if r.app == "C" and FAILURE_AT <= r.issued_at < event.apps["C"].serving_at
    ]
    assert len(held) > 5
    for request in held:  # C's outage: served by big on s1 once its client knows, not before
        assert request.done_at >= event.apps["C"].serving_at
        assert request.variant == "big"
    b_variants = {r.variant for r in event.request_log if r.app == "B" and r.issued_at > FAILURE_AT}
    assert b_variants == {"small", "big"}  # served by the first variant, then by the upgrade
    latencies = [r.done_at - r.issued_at for r in event.request_log if r.issued_at < FAILURE_AT - 0.1]
    assert min(latencies) == pytest.approx(BIG.latency_ms / 1000)  # before the failure: big, unqueued


@pytest.mark.parametrize(
    "changes",
    [{"heartbeat_interval_s": 0}, {"load_slots": 0}, {"requests": "sometimes"}, {"batch_cost": 2.0}],
)
def test_bad_settings_are_refused_with_their_name(changes):
    with pytest.raises(ConfigError, match=next(iter(changes))):
        SimConfig(**changes)


def test_unknown_failed_server_is_refused(tiny):
    with pytest.raises(ConfigError, match="s9"):
        _run(tiny, "faillite", SimConfig(), failed=("s9",))


def test_a_scenario_that_overflows_a_server_at_start_is_refused():
    scenario = tiny_scenario(s1_mb=50)  # A's warm backup (100 MB) cannot be on s1
    with pytest.raises(ConfigError, match="s1"):
        _run(scenario, "faillite", SimConfig())


def test_on_a_shared_host_concurrent_loads_share_its_cores(tiny, fixed):
    # B's small (0.2 s) and C's big (1 s) load at once on s2 and s1; with one core for the whole
    # host they share it equally: B ends at 0.4 s, C has 0.8 s of work left and ends at 1.2 s.
    quiet = dataclasses.replace(fixed, requests=RequestMode.OFF)
    event = _run(tiny, "faillite", dataclasses.replace(quiet, host_cores=1.0))
    assert event.apps["B"].mttr_ms == pytest.approx((0.4 + NOTIFY_S) * 1000)
    assert event.apps["C"].mttr_ms == pytest.approx((1.2 + NOTIFY_S) * 1000)
    # two cores: each load has one, as on dedicated servers
    roomy = _run(tiny, "faillite", dataclasses.replace(quiet, host_cores=2.0))
    alone = _run(tiny, "faillite", quiet)
    assert {a: r.mttr_ms for a, r in roomy.apps.items()} == {a: r.mttr_ms for a, r in alone.apps.items()}
    # two cores of which one is busy with what the simulation does not model (measured on a real
    # host): the background keeps its core (nice 0 outweighs the loads' nice 5), the loads share
    # the other, as on a one-core host
    busy = _run(tiny, "faillite", dataclasses.replace(quiet, host_cores=2.0, host_busy_cores=1.0))
    assert busy.apps["B"].mttr_ms == pytest.approx((0.4 + NOTIFY_S) * 1000)
    assert busy.apps["C"].mttr_ms == pytest.approx((1.2 + NOTIFY_S) * 1000)


def test_a_cold_loads_disk_wait_takes_no_core_and_a_warm_cache_skips_it(tiny, fixed):
    # measured split: small is 40 ms of CPU work in its 200 ms cold load, big 400 of 1000; from the
    # page cache they take 50 and 300 ms
    small = dataclasses.replace(SMALL, load_cpu_ms=40.0, warm_load_ms=50.0)
    big = dataclasses.replace(BIG, load_cpu_ms=400.0, warm_load_ms=300.0)
    split = tiny.replace(families=(Family("fam", (small, big)),))
    quiet = dataclasses.replace(fixed, requests=RequestMode.OFF, host_cores=1.0)
    # one core: B waits 160 ms for the disk, works 40 (0.16-0.2 s); C waits 600, works 400 (0.6-1.0 s):
    # their work never overlaps, so each takes its profile, as on dedicated servers (not 0.4 / 1.2 s)
    cold = _run(split, "faillite", quiet)
    assert cold.apps["B"].mttr_ms == pytest.approx((0.2 + NOTIFY_S) * 1000)
    assert cold.apps["C"].mttr_ms == pytest.approx((1.0 + NOTIFY_S) * 1000)
    # warm: all work, from the start: they share the core until B's 50 ms are done (0.1 s), then C
    # runs its remaining 250 ms alone
    warm = _run(split, "faillite", dataclasses.replace(quiet, page_cache=PageCache.WARM))
    assert warm.apps["B"].mttr_ms == pytest.approx((0.1 + NOTIFY_S) * 1000)
    assert warm.apps["C"].mttr_ms == pytest.approx((0.35 + NOTIFY_S) * 1000)
    # a profile without the split (a CSV) loads as before, whatever the cache
    unsplit = _run(tiny, "faillite", dataclasses.replace(quiet, page_cache="warm"))
    assert unsplit.apps["C"].mttr_ms == pytest.approx((1.2 + NOTIFY_S) * 1000)
    with pytest.raises(ConfigError, match="page_cache must be one of cold, warm; got 'hot'"):
        SimConfig(page_cache="hot")


def test_warm_up_and_first_answers_are_modelled_as_the_runtime_does_them(tiny, fixed):
    config = dataclasses.replace(
        fixed, requests=RequestMode.OFF, warm_up=True, max_batch=1, first_answer=True
    )
    event = _run(tiny, "faillite", config)
    # small's warm-up: five batch-1 inferences of 5 ms (within the 200 ms minimum budget), the first
    # of them already in the profiled load (which ends with a first answer); B's is a recovery load,
    # which leaves the four others for after its route, as the runtime does: its MTTR is the load
    assert event.apps["B"].mttr_ms == pytest.approx(SMALL.load_ms + NOTIFY_S * 1000)
    # the first answer is one batch-1 inference on the new route, from when it is published
    assert event.apps["A"].first_answer_ms == pytest.approx(SMALL.latency_ms)  # warm: at detection
    b = event.apps["B"]
    assert b.first_answer_ms == pytest.approx(b.mttr_ms - NOTIFY_S * 1000 + SMALL.latency_ms)
    assert math.isinf(_run(tiny, "faillite", fixed).apps["B"].first_answer_ms)  # not modelled: none


def test_a_pinned_copy_is_promoted_at_detection_as_in_the_runtime(fixed):
    """HAMS's backup twinned: B's pinned big copy on s2 takes B over the moment s0 is declared
    failed (a switch, like A's warm backup: no load), and counts against s2's memory meanwhile."""
    scenario = tiny_scenario().replace(
        warm=(WarmBackup("A", "small", "s1"), WarmBackup("B", "big", "s2", pinned=True))
    )
    event = _run(scenario, "faillite", fixed)
    assert event.apps["B"].mttr_ms == pytest.approx(NOTIFY_S * 1000)
    assert event.apps["B"].final_at == pytest.approx(DETECTED_AT)
    assert event.apps["A"].mttr_ms == pytest.approx(NOTIFY_S * 1000)


def test_a_pinned_rung_is_ready_after_its_load_and_warm_up_as_in_the_runtime(tiny, fixed):
    """A Jellyfish ladder switch twinned: the rung pinned on the worker's server is published ready
    when its load (warm-up included) ends, on the host's shared cores like any load."""
    from failsoft.orchestration import CopyRequest
    from failsoft.sim import simulate_pin

    deployment = Deployer().deploy(tiny, "faillite")
    request = CopyRequest("B", "small", "slo:test", "s2")
    assert simulate_pin(deployment, request, fixed) == pytest.approx(SMALL.load_ms)
    warm = dataclasses.replace(fixed, warm_up=True, max_batch=1)
    # small's warm-up: four more batch-1 inferences of 5 ms after the profiled load's first one
    assert simulate_pin(deployment, request, warm) == pytest.approx(SMALL.load_ms + 20)
    shared = dataclasses.replace(fixed, host_cores=1.0, host_busy_cores=0.5)
    assert simulate_pin(deployment, request, shared) > SMALL.load_ms  # half a core: slower


def test_a_copy_pinned_at_a_failover_loads_priority_loads_as_a_recovery_does(tiny, fixed):
    """``bench fidelity``'s control probe pins at the failover priority: the twin then loads it as a
    recovery load (ready at the first answer, the rest of the warm-up after, at the recovery's CPU
    priority), not as a background copy (warm-up first, at the lowest priority)."""
    from failsoft.orchestration import CopyRequest
    from failsoft.orchestration.loads import Priority
    from failsoft.sim import simulate_pin

    deployment = Deployer().deploy(tiny, "faillite")
    urgent = CopyRequest("B", "small", "slo:test", "s2", priority=Priority.FAILOVER)
    background = CopyRequest("B", "small", "slo:test", "s2")
    warm = dataclasses.replace(fixed, warm_up=True, max_batch=1)
    assert simulate_pin(deployment, urgent, warm) == pytest.approx(SMALL.load_ms)  # warm-up after
    assert simulate_pin(deployment, background, warm) == pytest.approx(SMALL.load_ms + 20)
    busy = dataclasses.replace(warm, host_cores=1.0, host_busy_cores=0.9)  # nice 0 beside the load
    assert simulate_pin(deployment, urgent, busy) < simulate_pin(deployment, background, busy)


def test_pins_asked_at_their_offsets_overlap_on_the_hosts_cores_as_they_did(tiny, fixed):
    """``bench fidelity``'s probe pins small copies while a heavy one loads: the twin asks each at
    its recorded offset on one cluster, so that their loads share the cores as they did."""
    from failsoft.orchestration import CopyRequest
    from failsoft.orchestration.loads import Priority
    from failsoft.sim import simulate_pin, simulate_pins

    deployment = Deployer().deploy(tiny, "faillite")
    big = CopyRequest("B", "big", "slo:test", "s2", priority=Priority.FAILOVER)
    small = CopyRequest("C", "small", "slo:test", "s1", priority=Priority.FAILOVER)
    one_core = dataclasses.replace(fixed, host_cores=1.0)
    alone = [simulate_pin(deployment, r, one_core) for r in (big, small)]
    assert alone == [pytest.approx(BIG.load_ms), pytest.approx(SMALL.load_ms)]
    # small asked 100 ms into big's load: both share the one core until small is done
    big_ms, small_ms = simulate_pins(deployment, [(0.0, big), (0.1, small)], one_core)
    assert small_ms == pytest.approx(2 * SMALL.load_ms)
    assert big_ms == pytest.approx(BIG.load_ms + SMALL.load_ms)
    # ... and asked after big is ready, each alone
    late = simulate_pins(deployment, [(0.0, big), (BIG.load_ms / 1000 + 0.1, small)], one_core)
    assert late == [pytest.approx(BIG.load_ms), pytest.approx(SMALL.load_ms)]


def test_the_control_path_holds_every_load_and_its_slot_longer_and_takes_no_core(tiny, fixed):
    base = dataclasses.replace(fixed, requests=RequestMode.OFF, host_cores=1.0)
    plain = _run(tiny, "faillite", base)
    slow = _run(tiny, "faillite", dataclasses.replace(base, control_ms=25.0))
    for app in ("B", "C"):  # loads on two servers at once: the 25 ms waits overlap, no core shared
        assert slow.apps[app].mttr_ms == pytest.approx(plain.apps[app].mttr_ms + 25.0)
    assert slow.apps["A"].mttr_ms == plain.apps["A"].mttr_ms  # a warm switch loads nothing
    with pytest.raises(ConfigError, match="control_ms"):
        SimConfig(control_ms=-1.0)


def test_the_control_path_as_work_costs_the_wait_alone_and_more_where_loads_overlap(tiny, fixed):
    base = dataclasses.replace(fixed, requests=RequestMode.OFF)
    for cores, overlap in ((2.0, False), (1.0, True)):  # B's and C's loads run at once on two servers
        host = dataclasses.replace(base, host_cores=cores)
        wait = _run(tiny, "faillite", dataclasses.replace(host, control_ms=25.0))
        work = _run(tiny, "faillite", dataclasses.replace(host, control_work_ms=25.0))
        for app in ("B", "C"):
            if overlap:  # the two controls share the one core (and the loads beside them)
                assert work.apps[app].mttr_ms > wait.apps[app].mttr_ms + 10.0
            else:  # a core each: the work takes what the wait does
                assert work.apps[app].mttr_ms == pytest.approx(wait.apps[app].mttr_ms, abs=0.01)
        assert work.apps["A"].mttr_ms == wait.apps["A"].mttr_ms  # a warm switch loads nothing
    with pytest.raises(ConfigError, match="control_work_ms"):
        SimConfig(control_work_ms=-1.0)


def test_the_control_path_ahead_of_the_loads_waits_only_for_other_control_work(tiny, fixed):
    # one core, half of it busy: control work at its share is stretched by the background, ahead not
    base = dataclasses.replace(fixed, requests=RequestMode.OFF, host_cores=1.0, host_busy_cores=0.5)
    wait = _run(tiny, "faillite", dataclasses.replace(base, control_ms=25.0))
    work = _run(tiny, "faillite", dataclasses.replace(base, control_work_ms=25.0))
    ahead = _run(tiny, "faillite", dataclasses.replace(base, control_work_ms=25.0, control_ahead=True))
    for app in ("B", "C"):  # B's and C's controls start together: they share the core, ahead or not
        assert ahead.apps[app].mttr_ms == pytest.approx(wait.apps[app].mttr_ms + 25.0)
        assert work.apps[app].mttr_ms > ahead.apps[app].mttr_ms + 10.0
    assert ahead.apps["A"].mttr_ms == wait.apps["A"].mttr_ms  # a warm switch loads nothing


def test_the_controllers_reaction_delays_the_plan_and_every_load_after_it(tiny, fixed):
    base = dataclasses.replace(fixed, requests=RequestMode.OFF)
    plain = _run(tiny, "faillite", base)
    slow = _run(tiny, "faillite", dataclasses.replace(base, plan_wait_ms=12.0))
    for app in ("B", "C"):  # loaded after the plan: 12 ms later
        assert slow.apps[app].mttr_ms == pytest.approx(plain.apps[app].mttr_ms + 12.0)
    assert slow.apps["A"].mttr_ms == plain.apps["A"].mttr_ms  # a warm switch needs no plan
    with pytest.raises(ConfigError, match="plan_wait_ms"):
        SimConfig(plan_wait_ms=-1.0)


def test_the_hosts_heavy_limit_holds_over_every_server_as_in_the_runtime(tiny, fixed):
    """B's first variant (s2) and C's big one (s1) are heavy loads on two survivors: per server they
    run at once; on the host's one heavy slot (an embedded cluster's servers share its cores) C
    starts when B's ends, and B's upgrade when C's ends (the core's queue, as in the runtime)."""
    base = dataclasses.replace(fixed, requests=RequestMode.OFF, load_slots=2, heavy_load_slots=1, trace=True)

    def loads(per_host: bool) -> list[tuple[float, str, str, str]]:
        event = _run(tiny, "faillite", dataclasses.replace(base, heavy_loads_per_host=per_host))
        return [(e.t, e.kind, e.app, e.variant) for e in event.log if e.kind in ("load-start", "loaded")]

    apart, shared = loads(False), loads(True)
    assert [(k, a) for _, k, a, _ in apart[:2]] == [("load-start", "B"), ("load-start", "C")]
    assert [(k, a) for _, k, a, _ in shared[:4]] == [
        ("load-start", "B"), ("loaded", "B"), ("load-start", "C"), ("loaded", "C")
    ]  # fmt: skip
    assert shared[1][0] == shared[2][0] and shared[3][0] - shared[2][0] == pytest.approx(BIG.load_ms / 1000)
