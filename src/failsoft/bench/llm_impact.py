"""The review's failure-impact metrics on ``bench llm``'s client-side timings (pure: no I/O).

LUMEN's review measures a failure by what the cluster's users see, not by when the failed worker is
back (its evaluation, "Evaluation Metrics"):

* **impact TTFT** (``impact_ttft_ms``): the mean time to first token over the *failure-impact
  window*: every request sent after the kill (their TTFT, send to first token) and every request the
  kill interrupted (its *replay* TTFT: the kill to its next token). The same requests for every
  policy, since every policy replays the same trace and kills at the same time.
* **cluster recovery** (``cluster_recovery_ms``): "time from failure detection until cluster
  metrics return to pre-failure levels", within 10% of the no-failure baseline: the kill to the last
  moment a user saw a degraded answer, i.e. the latest of the interrupted streams' next tokens and
  the first tokens of the requests whose TTFT exceeded ``1.1 x`` (plus ``slack_ms``) the same
  request's TTFT in the no-failure run, *at this run's pre-failure level*: the no-failure run's
  TTFTs are scaled by ``reference_scale``, this run's mean TTFT of the requests answered before the
  kill over the same requests' in the no-failure run (:func:`reference_scale`). A worker's reload
  counts only as far as its missing capacity degrades answers, which is what a policy can shorten
  (the reload itself it cannot).

  Why the scale: on a shared machine the no-failure run and a policy's run see different loads, and
  a reference measured at twice a run's load hides every degraded answer of that run (a
  Stop-and-Restart run once "recovered" in 247 ms, its first interrupted stream's next token,
  while its worker was down for 6.4 s: the reference's TTFTs, at twice the load, were above all
  of its own). Scaling by the requests before the kill compares each run with its own pre-failure
  level, the review's words; the same requests of the same trace, so the trace's burstiness stays
  per request.

``Timed`` is what these need of a request: when it was sent, when each piece came, whether a
failure interrupted it, and whether it failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

RECOVERY_SLACK = 0.10  # the review's "within 10% of the no-failure baseline"
RECOVERY_SLACK_MS = 100.0  # absolute slack: the no-failure run's own jitter on a shared machine


class Timed(Protocol):
    sent: float
    times: list[float]
    recoveries: int
    error: str | None


def _ttft(o: Timed) -> float | None:
    return (o.times[0] - o.sent) * 1000.0 if o.times else None


def _next_after(o: Timed, at: float) -> float | None:
    return next((t for t in o.times if t > at), None)


def impact_ttft(outcomes: Sequence[Timed], killed_at: float) -> dict[str, Any]:
    """Mean and count of the failure-impact window's TTFTs (see the module), split into the
    requests sent after the kill and the interrupted ones' replays."""
    sent_after = [t for o in outcomes if o.sent >= killed_at and (t := _ttft(o)) is not None]
    replays = []
    for o in outcomes:
        if o.recoveries > 0 and o.error is None and (n := _next_after(o, killed_at)) is not None:
            replays.append((n - killed_at) * 1000.0)
    both = sent_after + replays
    return {
        "impact_ttft_ms": _mean(both),
        "impact_requests": len(both),
        "sent_after_kill_ttft_ms": _mean(sent_after),
        "replay_ttft_ms": _mean(replays),
        "interrupted": len(replays),
    }


def reference_scale(outcomes: Sequence[Timed], reference: Sequence[Timed], killed_at: float) -> float:
    """This run's pre-failure level against the no-failure run's: the mean TTFT of the requests
    whose first token came before the kill, over the same requests' mean TTFT in the no-failure run
    (1.0 when no request was answered before the kill)."""
    mine, theirs = [], []
    for o, ref in zip(outcomes, reference, strict=True):
        a, b = _ttft(o), _ttft(ref)
        if a is not None and b is not None and o.times[0] < killed_at:
            mine.append(a)
            theirs.append(b)
    if not mine or sum(theirs) <= 0:
        return 1.0
    return sum(mine) / sum(theirs)


def cluster_recovery(
    outcomes: Sequence[Timed],
    reference: Sequence[Timed],
    killed_at: float,
    slack: float = RECOVERY_SLACK,
    slack_ms: float = RECOVERY_SLACK_MS,
) -> dict[str, Any]:
    """``cluster_recovery_ms`` (see the module) and what bound it: ``bound_by`` is ``replay`` (an
    interrupted stream's next token) or ``ttft`` (a degraded first token), ``degraded`` the
    requests whose TTFT was over the baseline, ``reference_scale`` the factor the no-failure run's
    TTFTs were scaled by. ``outcomes[i]`` and ``reference[i]`` are the same request of the trace,
    with and without the failure."""
    scale = reference_scale(outcomes, reference, killed_at)
    last, bound_by, degraded = killed_at, None, 0
    for o, ref in zip(outcomes, reference, strict=True):
        if o.error is not None:
            continue
        if o.recoveries > 0 and (n := _next_after(o, killed_at)) is not None and n > last:
            last, bound_by = n, "replay"
        ttft, base = _ttft(o), _ttft(ref)
        if ttft is None or base is None or not o.times or o.times[0] < killed_at:
            continue
        if ttft > base * scale * (1 + slack) + slack_ms:
            degraded += 1
            if o.times[0] > last:
                last, bound_by = o.times[0], "ttft"
    return {
        "cluster_recovery_ms": round((last - killed_at) * 1000.0, 1),
        "cluster_recovery_bound_by": bound_by,
        "degraded_requests": degraded,
        "reference_scale": round(scale, 3),
    }


def vs_baseline(policies: dict[str, dict[str, Any]], baseline: str, keys: Sequence[str]) -> dict[str, Any]:
    """Each policy's change against ``baseline`` in percent, per key (None where either is None)."""
    base = policies.get(baseline)
    if base is None:
        return {}
    out: dict[str, Any] = {}
    for name, row in policies.items():
        out[name] = {}
        for key in keys:
            a, b = row.get(key), base.get(key)
            out[name][key] = None if a is None or not b else round((float(a) / float(b) - 1.0) * 100.0, 1)
    return out


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


__all__ = [
    "RECOVERY_SLACK",
    "RECOVERY_SLACK_MS",
    "cluster_recovery",
    "impact_ttft",
    "reference_scale",
    "vs_baseline",
]
