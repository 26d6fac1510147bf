"""LLM workers as member apps of their ``llm`` service: placed, counted, failed and restarted by the core.

The cluster of :mod:`tests.orchestration.test_core`: ``s0`` (1000 MB) serves A, B and C on ``big``
(300 MB each); A has a warm ``small`` (100 MB) backup on ``s1`` (400 MB); ``s2`` (450 MB) is empty.
The ``llm`` service ``chat`` has workers w0, w1, w2 on s0, s1, s2 (50 MB each); the executor's
reports (a worker serves its draft or its target) are fed by hand, at explicit times.
"""

from __future__ import annotations

import pytest

from failsoft.errors import CapacityError, UnknownNameError
from failsoft.orchestration.commands import (
    PlanFailover,
    PublishLlm,
    StartLlmStandby,
    StartLlmWorker,
    StopLlmWorker,
    SwitchLlmTarget,
)
from failsoft.orchestration.llm import RETRY_S
from failsoft.orchestration.llm_state import LlmGroup, LlmPhase, LlmWorkerRecord
from tests.orchestration.test_core import Harness, cluster

WORKERS = ("w0", "w1", "w2")


def group(memory_mb: float = 50, standbys: tuple[str, ...] = (), draft_first: bool = False) -> LlmGroup:
    return LlmGroup("chat", WORKERS, ("s0", "s1", "s2"), standbys, memory_mb, draft_first, 2.0, 0.5)


def placed(standbys: tuple[str, ...] = (), draft_first: bool = False, **kw: object) -> Harness:
    """The service placed and every worker serving (its first start reported at 0.01)."""
    h = Harness(cluster(**kw))  # type: ignore[arg-type]
    h.take(h.core.place_llm(group(standbys=standbys, draft_first=draft_first), 0.0))
    for w in WORKERS:
        h.take(h.core.llm_started("chat", w, 0, "serving", 0.01))
    return h


def llm(h: Harness, out: list[object] | None = None) -> list[object]:
    kinds = (StartLlmWorker, SwitchLlmTarget, StopLlmWorker, StartLlmStandby)
    return [c for c in (h.commands if out is None else out) if isinstance(c, kinds)]


def record(h: Harness, worker: str) -> LlmWorkerRecord:
    return h.state.llm.workers[("chat", worker)]


def test_placement_starts_each_worker_on_its_server_counts_its_memory_and_stores_it():
    h = Harness(cluster())
    before = {s: h.state.used_mb(s) for s in ("s0", "s1", "s2")}
    out = h.take(h.core.place_llm(group(standbys=("s2",)), 0.0))
    assert llm(h, out) == [
        StartLlmWorker("chat", "w0", "s0", 0),
        StartLlmWorker("chat", "w1", "s1", 0),
        StartLlmWorker("chat", "w2", "s2", 0),
        StartLlmStandby("chat", "s2"),
    ]
    assert PublishLlm("chat") in out
    assert {s: h.state.used_mb(s) - before[s] for s in before} == {"s0": 50, "s1": 50, "s2": 50}
    # the failover policies plan on what is left
    assert {s.name: s.memory_mb for s in h.state.snapshot().servers} == {"s0": 950, "s1": 350, "s2": 400}
    assert h.state.to_docs()["llm"]["chat/w1"] == {
        "service": "chat", "worker": "w1", "server": "s1", "memory_mb": 50,
        "phase": "starting", "incarnation": 0, "restarts": 0,
    }  # fmt: skip
    for w in WORKERS:
        h.take(h.core.llm_started("chat", w, 0, "serving", 0.01))
    assert [e["workers"] for e in h.events("llm-service-ready")] == [list(WORKERS)]
    status = h.state.status()
    assert [(r["worker"], r["server"], r["phase"]) for r in status["llm_workers"]] == [
        ("w0", "s0", "serving"), ("w1", "s1", "serving"), ("w2", "s2", "serving"),
    ]  # fmt: skip
    assert next(s for s in status["servers"] if s["name"] == "s2")["used_mb"] == 50


def test_workers_that_do_not_fit_are_refused_naming_the_server_and_nothing_is_placed():
    h = Harness(cluster())
    with pytest.raises(CapacityError, match=r"server 's0' has 100.0 MB free of 1000.0 MB.*need 150.0 MB"):
        h.core.place_llm(group(memory_mb=150), 0.0)
    assert not h.state.llm.workers and not llm(h)
    assert h.state.used_mb("s2") == 0
    with pytest.raises(UnknownNameError, match="s9"):
        h.core.place_llm(LlmGroup("chat", ("w0",), ("s9",), (), 10), 0.0)


def test_a_dead_worker_restarts_in_place_and_stale_reports_change_nothing():
    h = placed()
    began, out = h.core.llm_died("chat", "w1", 0, "actor gone", 1.0)
    h.take(out)
    assert began
    assert llm(h, out) == [StopLlmWorker("chat", "w1", 0), StartLlmWorker("chat", "w1", "s1", 1)]
    assert h.events("llm-worker-failed") == [
        {"service": "chat", "worker": "w1", "server": "s1", "reason": "actor gone"}
    ]
    assert h.state.used_mb("s1") == 150  # A's backup and the worker being restarted
    assert h.core.llm_died("chat", "w1", 0, "again", 1.1) == (False, [])  # the same death
    h.take(h.core.llm_started("chat", "w1", 1, "serving", 3.5))
    (recovered,) = h.events("llm-worker-recovered")
    assert recovered["restart_ms"] == 2500.0 and recovered["draft_first"] is False
    assert record(h, "w1").phase is LlmPhase.SERVING and record(h, "w1").incarnation == 1
    # a late report of a start nobody waits for is stopped
    out = h.take(h.core.llm_started("chat", "w1", 7, "serving", 3.6))
    assert llm(h, out) == [StopLlmWorker("chat", "w1", 7)]


def test_a_standby_adopts_a_dead_worker_draft_first_then_switches_to_its_target():
    h = placed(standbys=("s2",), draft_first=True)
    h.take(h.core.llm_died("chat", "w0", 0, "killed", 1.0)[1])
    assert llm(h)[-3:] == [
        StopLlmWorker("chat", "w0", 0),
        StartLlmStandby("chat", "s2", draft=True),  # replaced on its server, holding the draft
        StartLlmWorker("chat", "w0", "s2", 1, draft_first=True, standby=True),
    ]
    out = h.take(h.core.llm_started("chat", "w0", 1, "draft", 1.5))
    assert llm(h, out) == [SwitchLlmTarget("chat", "w0", 1)]
    assert record(h, "w0").phase is LlmPhase.DRAFT
    assert (
        h.events("llm-worker-draft")[0] | {"server": "s2", "draft_ms": 500.0}
        == h.events("llm-worker-draft")[0]
    )
    h.take(h.core.llm_started("chat", "w0", 1, "serving", 3.5))
    (recovered,) = h.events("llm-worker-recovered")
    assert (recovered["server"], recovered["restart_ms"], recovered["draft_first"]) == ("s2", 2500.0, True)


def test_a_failed_start_is_placed_again_after_the_retry_delay():
    h = placed()
    h.take(h.core.llm_died("chat", "w2", 0, "killed", 1.0)[1])
    out = h.take(h.core.llm_start_failed("chat", "w2", 1, "no process", 1.2))
    assert llm(h, out) == [StopLlmWorker("chat", "w2", 1)]
    assert h.core.next_wakeup() == pytest.approx(1.2 + RETRY_S)
    out = h.take(h.core.advance(1.2 + RETRY_S))
    assert llm(h, out) == [StartLlmWorker("chat", "w2", "s2", 2)]
    assert len(h.events("llm-worker-failed")) == 1  # one outage


def test_a_workers_server_failing_is_one_failure_and_it_restarts_on_the_roomiest_live_server():
    h = placed()
    out = h.fail_s0()  # heartbeats: s0 silent, the detector fails it
    assert h.events("llm-worker-failed") == [
        {"service": "chat", "worker": "w0", "server": "s0", "reason": "server s0 failed"}
    ]
    # s1: 400 - 100 (A's backup, now its route) - 50 (w1) = 250 free; s2: 450 - 50 = 400
    assert llm(h, out) == [StopLlmWorker("chat", "w0", 0), StartLlmWorker("chat", "w0", "s2", 1)]
    assert h.of(PlanFailover, out)  # B and C are planned on what the workers leave
    (request,) = h.of(PlanFailover, out)
    assert {s.name: s.memory_mb for s in request.scenario.servers}["s2"] == 350


def test_a_restart_whose_server_then_fails_moves_again_as_the_same_outage():
    h = placed(standbys=("s0",))
    h.take(h.core.llm_died("chat", "w1", 0, "killed", 0.05)[1])  # the standby on s0 adopts it
    assert llm(h)[-1] == StartLlmWorker("chat", "w1", "s0", 1, standby=True)
    out = h.fail_s0()
    starts = [c for c in llm(h, out) if isinstance(c, StartLlmWorker)]
    # w0 to the roomiest live server; w1 back to its home
    assert {(c.worker, c.server, c.incarnation) for c in starts} == {("w0", "s2", 1), ("w1", "s1", 2)}
    assert StopLlmWorker("chat", "w1", 1) in out  # the start on the dead server is withdrawn
    assert StartLlmStandby("chat", "s1") in out  # and the lost standby replaced on a live server
    assert [e["worker"] for e in h.events("llm-worker-failed")] == ["w1", "w0"]
    out = h.take(h.core.llm_start_failed("chat", "w1", 1, "its server died", 0.2))
    assert not llm(h, out)  # stale: the restart moved on


def test_a_worker_with_no_room_anywhere_waits_and_is_tried_again():
    h = placed(s1_mb=160, s2_mb=60)  # s1: 100 backup + 50 w1; s2: 50 w2
    h.take(h.core.llm_died("chat", "w1", 0, "killed", 0.05)[1])
    assert llm(h)[-1] == StartLlmWorker("chat", "w1", "s1", 1)  # its own memory was freed: in place
    out = h.fail_s0()  # w0 has nowhere to go (s0 down, s1 and s2 full)
    assert not [c for c in llm(h, out) if isinstance(c, StartLlmWorker)]
    assert record(h, "w0").phase is LlmPhase.FAILED and not record(h, "w0").holds_memory
    assert h.core.next_wakeup() is not None


def test_a_worker_in_its_first_start_is_judged_by_that_start_not_by_its_servers_silence():
    h = Harness(cluster())
    h.take(h.core.place_llm(group(), 0.0))
    h.take(h.core.llm_started("chat", "w1", 0, "serving", 0.01))
    h.take(h.core.llm_started("chat", "w2", 0, "serving", 0.01))
    out = h.fail_s0()  # w0's server goes silent while w0 still loads
    assert not llm(h, out) and not h.events("llm-worker-failed")
    out = h.take(h.core.llm_start_failed("chat", "w0", 0, "its server died", 0.2))
    assert llm(h, out) == [StopLlmWorker("chat", "w0", 0)]
    out = h.take(h.core.advance(0.2 + RETRY_S))  # placed again, on a live server
    assert llm(h, out) == [StartLlmWorker("chat", "w0", "s2", 1)]


def test_under_progressive_recovery_each_standby_holds_the_draft_and_its_memory_is_counted():
    h = Harness(cluster())
    g = LlmGroup("chat", WORKERS, ("s0", "s1", "s2"), ("s2",), 50, True, 2.0, 0.5, standby_mb=20)
    before = h.state.used_mb("s2")
    out = h.take(h.core.place_llm(g, 0.0))
    assert StartLlmStandby("chat", "s2", draft=True) in out  # the executor loads the draft into it
    assert h.state.used_mb("s2") == before + 50 + 20  # w2 and the standby's draft
    h2 = Harness(cluster(s2_mb=60))  # room for w2 (50 MB) but not beside the standby's draft
    with pytest.raises(CapacityError, match=r"'s2' has 60.0 MB free .* 1 standby\(s\) need 70.0 MB"):
        h2.core.place_llm(g, 0.0)
    assert not h2.state.llm.standbys  # nothing placed


def test_a_lost_standby_is_no_longer_counted_and_is_replaced_a_retry_later():
    h = Harness(cluster())
    g = LlmGroup("chat", WORKERS, ("s0", "s1", "s2"), ("s2",), 50, True, 2.0, 0.5, standby_mb=20)
    h.take(h.core.place_llm(g, 0.0))
    used = h.state.used_mb("s2")
    assert h.take(h.core.llm_standby_lost("chat", "s2", "actor died", 1.0)) == []
    assert h.state.llm.standbys["chat"] == [] and h.state.used_mb("s2") == used - 20
    h.take(h.core.llm_standby_lost("chat", "s2", "reported twice", 1.1))  # not counted: ignored
    out = h.take(h.core.advance(1.0 + RETRY_S))
    assert llm(h, out) == [StartLlmStandby("chat", "s2", draft=True)]
    assert h.state.llm.standbys["chat"] == ["s2"] and h.state.used_mb("s2") == used
