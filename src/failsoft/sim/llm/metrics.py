"""What one simulated run measured, per request and for the cluster.

* ``ttft_ms``: arrival to first token; ``tpot_ms``: (finish - first token) / (output tokens - 1),
  so a stream stalled by a failure counts its stall. Both are averaged (mean, p99) over the
  *failure-impact window*: the requests arriving from the kill to ``window_s`` after it, plus every
  interrupted request (the same window for every policy).
* ``replay_ttft_ms``: for interrupted requests, kill to the first token after they resume.
* ``recovery_ms``: kill to the time after which the cluster's requests in flight stay within 10%
  (plus 2 requests) of the same run without a failure (same arrivals): the review's "cluster
  metrics back within 10% of the no-failure baseline".
* ``reload_ms``: kill to every killed worker serving with its full model again.
* ``recomputed_tokens``: prompt and generated tokens the interrupted requests prefilled again;
  ``restored_tokens``: those restored from checkpoints instead; ``failed_requests``: never finished.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from failsoft.sim.llm.cluster import LlmCluster

RECOVERY_SLACK = 0.10
RECOVERY_SLACK_REQUESTS = 2


def _stat(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    arr = np.asarray(values)
    return float(arr.mean()), float(np.percentile(arr, 99))


def recovery_ms(run: LlmCluster, baseline: LlmCluster | None) -> float:
    if baseline is None or not run.victims:
        return math.nan
    c = run.c
    start = int(c.warmup_s / c.sample_s)
    end = int((c.warmup_s + c.arrivals_after_s) / c.sample_s)
    failed, base = run.samples, baseline.samples
    last_bad = start
    for i in range(start, min(end, len(failed))):
        ref = base[i] if i < len(base) else 0
        if failed[i] > ref * (1 + RECOVERY_SLACK) + RECOVERY_SLACK_REQUESTS:
            last_bad = i + 1
    return (last_bad - start) * c.sample_s * 1000.0


def measure(run: LlmCluster, baseline: LlmCluster | None = None) -> dict[str, Any]:
    c = run.c
    kill = c.warmup_s
    window = [r for r in run.requests if (kill <= r.arrival < kill + c.window_s) or r.interrupted]
    ttft = [(r.first_token - r.arrival) * 1000 for r in window if r.first_token is not None]
    tpot = [
        (r.finish - r.first_token) * 1000 / (r.output - 1)
        for r in window
        if r.finish is not None and r.first_token is not None and r.output > 1
    ]
    interrupted = [r for r in run.requests if r.interrupted]
    replay = [(r.replay_first - kill) * 1000 for r in interrupted if r.replay_first is not None]
    ttft_mean, ttft_p99 = _stat(ttft)
    tpot_mean, tpot_p99 = _stat(tpot)
    reload = (run.reload_done_at - kill) * 1000 if run.reload_done_at is not None else math.nan
    return {
        "ttft_ms_mean": ttft_mean,
        "ttft_ms_p99": ttft_p99,
        "tpot_ms_mean": tpot_mean,
        "tpot_ms_p99": tpot_p99,
        "recovery_ms": recovery_ms(run, baseline),
        "reload_ms": reload,
        "replay_ttft_ms_mean": _stat(replay)[0],
        "interrupted": len(interrupted),
        "restored_requests": sum(1 for r in interrupted if r.restored > 0),
        "recomputed_tokens": sum(r.recomputed for r in interrupted),
        "restored_tokens": sum(r.restored for r in interrupted),
        "requests": len(run.requests),
        "window_requests": len(window),
        "failed_requests": sum(1 for r in run.requests if r.finish is None),
        "leaked_checkpoint_mb": run.ledger.total_mb(),
        "sim_end_s": run.env.now,
    }
