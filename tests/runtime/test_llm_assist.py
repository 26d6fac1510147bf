"""The dispatcher's progressive-restart loop (Alg. 3) with fake workers: it drafts for the most
loaded survivor while drafting pays, and stops when the measured round costs more than it gains
(no cluster: the calls are the workers' async API, answered in this process)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from failsoft.clock import MonotonicClock
from failsoft.runtime.gateway.dispatch import DispatchContext
from failsoft.runtime.gateway.dispatch.llm import LlmDispatcher
from failsoft.runtime.llm_config import LlmServiceModel, llm_serving


class _Survivor:
    def __init__(self, step_ms: float, verify_ms: float) -> None:
        self.step_ms, self.verify_ms = step_ms, verify_ms
        self.verified: list[tuple[str, int, list[int]]] = []

    async def verify_drafts(self, items: list[tuple[str, int, list[int]]]) -> dict[str, dict[str, Any]]:
        await asyncio.sleep(self.verify_ms / 1000)
        self.verified.extend(items)
        return {
            rid: {
                "tokens": [0] * base + list(d),
                "proposed": len(d),
                "accepted": len(d),
                "finished": False,
                "step_ms": self.step_ms,  # no load() here: a round is two calls, draft and verify
            }
            for rid, base, d in items
        }


class _Drafter:
    def __init__(self) -> None:
        self.calls = 0

    async def draft_for(self, items: list[tuple[str, list[int], int]], k: int) -> dict[str, list[int]]:
        self.calls += 1
        return {rid: [7] * k for rid, _, left in items if left > 0}


def _run(step_ms: float, verify_ms: float, seconds: float = 0.6) -> tuple[LlmDispatcher, dict[str, Any]]:
    survivors = {"w0": _Survivor(step_ms, verify_ms), "w1": _Survivor(step_ms, verify_ms)}
    drafter = _Drafter()
    spec = LlmServiceModel(name="bytes", mode="llm", workers=3, model={"root": "unused"})
    serving = llm_serving(spec, "test", ("s1",), Path("."))
    context = DispatchContext(None, lambda s: None, MonotonicClock(), llm={"bytes": serving})  # type: ignore[arg-type]
    d = LlmDispatcher(serving.service, context)
    d.workers.update(survivors)
    d.dead = {"w2"}  # drafting: its target is not back
    d._outstanding.update(w0=1, w1=3)  # w1 is the most loaded survivor
    d._live["a"] = ("w0", [1, 2, 3], [], 60, True)
    d._live["b"] = ("w1", [4, 5], [], 60, True)
    d._live["c"] = ("w1", [6], [], 60, False)  # sampled: never assisted
    deadline = time.monotonic() + seconds
    asyncio.run(d.assist("w2", drafter, lambda: time.monotonic() > deadline, acceptance=0.9))
    return d, {"survivors": survivors, "drafter": drafter}


def test_assist_drafts_for_the_most_loaded_survivors_greedy_requests_while_it_pays() -> None:
    d, fakes = _run(step_ms=50.0, verify_ms=1.0)
    w0, w1 = fakes["survivors"]["w0"], fakes["survivors"]["w1"]
    assert d.stats.assist_rounds >= 5  # it kept going: a round costs far less than a step
    assert not w0.verified and {rid for rid, _, _ in w1.verified} == {"b"}
    assert d.stats.drafts_proposed == d.stats.drafts_accepted == 3 * d.stats.assist_rounds
    # each round drafts from the tokens the survivor reported after the previous one
    bases = [base for _, base, _ in w1.verified]
    assert bases[:3] == [2, 5, 8]


def test_assist_stops_when_a_round_costs_more_than_it_gains() -> None:
    d, fakes = _run(step_ms=1.0, verify_ms=30.0)
    # one measured round (30 ms against 1 ms steps: 30 steps for at most 4 tokens), then idle
    assert d.stats.assist_rounds == 1
    assert fakes["drafter"].calls == 1


class _SlowExporter:
    """A worker whose export answers too late (a saturated machine), then answers."""

    def __init__(self) -> None:
        self.from_start: list[bool] = []

    async def export_kv(self, rid: str, upto: int | None, from_start: bool = False) -> bytes | None:
        from failsoft.errors import DeadlineExceededError

        self.from_start.append(from_start)
        if len(self.from_start) == 2:
            raise DeadlineExceededError("llm worker 'w0'.export_kv: no answer within 5000 ms")
        return None  # nothing new to ship


class _Holder:
    def __init__(self) -> None:
        self.dropped: list[str] = []

    async def drop_checkpoint(self, rid: str) -> bool:
        self.dropped.append(rid)
        return True


def test_an_export_without_answer_drops_the_checkpoint_and_the_next_ship_starts_it_again() -> None:
    """Pages the worker may have exported without the holder getting them would make every later
    chunk refused (out of order): the checkpoint is dropped and placed again from its first page."""
    spec = LlmServiceModel(name="bytes", mode="llm", workers=2, model={"root": "unused"})
    serving = llm_serving(spec, "test", ("s1",), Path("."))
    context = DispatchContext(None, lambda s: None, MonotonicClock(), llm={"bytes": serving})  # type: ignore[arg-type]
    d = LlmDispatcher(serving.service, context)
    d.model = {"name": "m", "context": 256, "kv_mb_per_token": 0.001, "fingerprint": "x"}
    from failsoft.policies.llm_recovery import CheckpointLedger

    d.ledger = CheckpointLedger(0.001, 64)
    worker, holder = _SlowExporter(), _Holder()
    d.workers.update(w0=worker, w1=holder)
    d.dead = set()

    async def ships() -> None:
        for tokens in (20, 40, 60):
            await d._ship("r", "w0", tokens)

    asyncio.run(ships())
    assert worker.from_start == [True, False, True]  # placed, timed out, placed again from page 0
    assert holder.dropped == ["r"] and d.ledger.get("r") is not None
