"""LUMEN's speculation-assisted progressive recovery at runtime (review, Mechanism 3, Alg. 3).

While a restarted worker has only its draft loaded (phase ``draft`` in the controller's worker
table), the ``llm`` dispatcher runs :func:`assist` as a task on the gateway's event loop: the
policy's ``ProgressiveRecovery.decide`` names the survivor to help (the most loaded by ``L``), and
rounds of ``draft_for`` on the recovering worker and ``verify_drafts`` on that survivor advance its
greedy requests a few tokens per pass (its output stays its own greedy output). The cost model the
policy decides on is measured: a round's time over the survivor's own decode step, and the
acceptance rate seen so far (the survivor's step time comes with its verdicts: a round is two
calls). Times come from the dispatcher's injected clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from failsoft.errors import InvalidRequestError, ServerUnavailableError
from failsoft.policies.llm_recovery import ClusterView
from failsoft.services import LlmParams


class Host(Protocol):
    """What :func:`assist` uses of the ``llm`` dispatcher: its policy, params, clock (``context``),
    stats, worker refs, the cluster view and the requests in flight
    (``_live``: request id -> worker, prompt, tokens received, max_tokens, greedy)."""

    policy: Any
    params: LlmParams
    context: Any
    stats: Any
    workers: dict[str, Any]
    _live: dict[str, tuple[str, list[int], list[int], int, bool]]

    def view(self) -> ClusterView: ...


async def assist(
    d: Host, name: str, drafter: Any, stop: Callable[[], bool], acceptance: float | None = None
) -> None:
    """LUMEN's Alg. 3 while ``name`` (``drafter``: its worker, draft loaded, target loading)
    recovers: as long as the policy's ``progressive`` decides ``peer-verify``, draft
    ``draft_tokens`` tokens for the greedy requests of the survivor it names and have that
    survivor verify them (its output stays its own greedy output, a few tokens per pass
    sooner); until ``stop()`` is true or the drafter has no draft any more."""
    from failsoft.policies.llm_recovery import Recovering, SpeculationCost

    progressive = d.policy.progressive
    if progressive is None:
        return
    clock = d.context.clock
    recorded = 0.6 if acceptance is None else acceptance
    k = d.params.draft_tokens
    known: dict[str, list[int]] = {}  # request id -> its tokens as its worker last reported
    round_ms: float | None = None  # a draft-and-verify round, moving average
    step_ms: dict[str, float] = {}  # survivor -> its own decode step
    idle_since: float | None = None
    while not stop():
        view = d.view()
        proposed, accepted = d.stats.drafts_proposed, d.stats.drafts_accepted
        a = accepted / proposed if proposed >= 8 else recorded
        survivor_step = step_ms.get(str(progressive_target(progressive, name, view, d.params)), 0.0)
        if round_ms is not None and survivor_step > 0:
            # measured: a round (draft, then verification, one after the other, over the
            # network) costs round_ms / survivor_step of the survivor's decode steps
            cost = SpeculationCost(a, draft_step=0.0, verify_step=max(1.0, round_ms / survivor_step))
        else:
            cost = SpeculationCost(acceptance=a)  # the policy's model, until measured
        (decision,) = progressive.decide((Recovering(name, draft_ready=True),), view, d.params, cost)
        survivor = decision.assist
        live = list(d._live.items())
        mine = [(r, v) for r, v in live if v[0] == survivor and v[4]] if survivor is not None else []
        if decision.mode != "peer-verify" or survivor is None or not mine:
            now = clock.now()
            idle_since = idle_since or now
            if decision.mode == "idle" and now - idle_since > 2.0:
                round_ms, idle_since = None, None  # measure again: the load may have changed
            await clock.sleep(0.05)
            continue
        idle_since = None
        items = []
        for rid, (_, prompt, received, max_tokens, _) in mine:
            now_tokens = known.get(rid) or prompt + list(received)
            items.append((rid, now_tokens, max_tokens - (len(now_tokens) - len(prompt))))
        started = clock.now()
        try:
            drafts = await drafter.draft_for(items, k)
        except (InvalidRequestError, ServerUnavailableError):
            return  # the target is back (the draft evicted) or the drafter died
        if not drafts:
            await clock.sleep(0.02)
            continue
        base = {rid: len(now_tokens) for rid, now_tokens, _ in items}
        try:  # the verdicts carry the survivor's step time: a round is two calls, not three
            verdicts = await d.workers[survivor].verify_drafts(
                [(rid, base[rid], d) for rid, d in drafts.items()]
            )
        except (InvalidRequestError, ServerUnavailableError):
            await clock.sleep(0.02)
            continue
        ms = (clock.now() - started) * 1000.0
        round_ms = ms if round_ms is None else 0.7 * round_ms + 0.3 * ms
        step = next((v["step_ms"] for v in verdicts.values() if v.get("step_ms")), None)
        if step is not None:
            step_ms[survivor] = float(step)
        known = {rid: list(v["tokens"]) for rid, v in verdicts.items() if not v["finished"]}
        d.stats.assist_rounds += 1
        d.stats.drafts_proposed += sum(int(v["proposed"]) for v in verdicts.values())
        d.stats.drafts_accepted += sum(int(v["accepted"]) for v in verdicts.values())


def progressive_target(progressive: Any, name: str, view: ClusterView, params: LlmParams) -> str | None:
    """The survivor ``progressive`` would have ``name`` assist (at any gain), for its step time."""
    from failsoft.policies.llm_recovery import Recovering, SpeculationCost

    free = SpeculationCost(acceptance=1.0, draft_step=0.0, verify_step=1.0)
    (decision,) = progressive.decide((Recovering(name, draft_ready=True),), view, params, free)
    return decision.assist


__all__ = ["assist", "progressive_target"]
