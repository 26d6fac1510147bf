"""``failsoft bench llm CONFIG``: LUMEN's recovery policies on a real LLM service, one worker killed.

``CONFIG`` is a ``failsoft serve`` config with an ``llm`` service (``examples/llm.yaml``). For each
policy a fresh :class:`~failsoft.runtime.session.Session` of the config (the serve path: the
controller's workers, the one gateway; the service's policy replaced) replays the same trace: the
Azure LLM conversation trace shipped with failsoft (``failsoft/data/llm``), its arrivals compressed
to ``rate_rps`` and its prompt and output lengths rescaled to the model's context (``scale``),
prompts cut from the corpus's held-out text. Every request streams through the gateway
(``generate_stream``) with greedy decoding. After ``kill_at_s`` seconds the busiest worker's process
is killed (SIGKILL: its engine and every KV page are gone). A first run without a failure gives the
reference texts.

The controller detects the death and restarts the worker: a warm standby worker (imports done, the
same for every policy) adopts it and loads the model, ``reload_ms`` later for a larger model
emulated. Under
a policy with progressive recovery (``lumen``) the standby holds the draft already (loaded before
the run starts, its memory counted on its server), drafts for the most loaded survivor at once and
loads its target behind the draft, until its target is back (``draft_ready_ms``, ``assist_rounds``,
``drafts_proposed`` / ``drafts_accepted``); ``reload_window`` is the TTFT of the requests sent
between the kill and the target's return.

Per policy: ``ttft_ms`` and ``tpot_ms`` (mean, p99, client side), the review's failure-impact
metrics (:mod:`failsoft.bench.llm_impact`): ``impact_ttft_ms`` (the mean TTFT of the requests sent
after the kill and the interrupted ones' replays) and ``cluster_recovery_ms`` (the kill to the last
answer a user saw degraded against the no-failure run); ``recovery_ms`` (the kill to the later of
the restarted worker serving and the last interrupted stream's next token; ``restart_ms`` is the
first alone, ``streams_ms`` the second, ``recovery_bound_by`` which one it was),
``recomputed_tokens`` (tokens prefilled again on a survivor), ``restored_requests`` (resumed from a
checkpoint), ``identical_outputs`` (greedy texts equal to the no-failure run's),
``failed_requests``; and where the time went: ``detected_ms``, ``draft_ready_ms``, the restarted
worker's own ``draft_load_ms`` and ``target_load_ms``, ``restored_next_token_ms`` and
``recomputed_next_token_ms`` (the kill to the next token of the requests resumed each way). Worker
steps are slowed by ``slow_ms`` (the chaos of a slower machine) so that a tiny model's requests
last long enough to be interrupted at all.

``rounds`` repeats a reference and every policy, the policies' order rotated from one round to the
next (a shared machine's load then falls on each alike); ``summary`` has each policy's mean over the
rounds and its change against Stop-and-Restart and Fixed-Checkpointing in percent, beside LUMEN's
targets (impact TTFT -44%, recovery -50% against Stop-and-Restart).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

POLICIES = ("lumen", "fixed-checkpointing", "stop-and-restart")


@dataclass(frozen=True, slots=True)
class LlmBenchSettings:
    policies: tuple[str, ...] = POLICIES
    requests: int = 40
    rate_rps: float = 8.0
    kill_at_s: float = 2.0
    slow_ms: float = 10.0
    seed: int = 0
    reload_ms: float = 0.0
    rounds: int = 1


@dataclass(slots=True)
class _Outcome:
    text: str = ""
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    recoveries: int = 0
    error: str | None = None
    times: list[float] = field(default_factory=list)
    sent: float = 0.0


def trace(n: int, rate_rps: float, context: int, seed: int) -> list[tuple[float, str, int]]:
    """(arrival_s, prompt, max_tokens) of ``n`` requests from the conversation trace, rescaled."""
    from failsoft.llm.corpus import load_corpus
    from failsoft.sim.llm.data import load_trace

    arrivals, prompt, output = load_trace("conv")
    rng = np.random.default_rng(seed)
    start = int(rng.integers(0, max(len(arrivals) - n, 1)))
    a = arrivals[start : start + n] - arrivals[start]
    a = a * (n / rate_rps) / max(float(a[-1]), 1e-9)  # mean rate rate_rps, the trace's burstiness
    budget = context // 2
    p_scale = budget / max(float(np.percentile(prompt, 95)), 1.0)
    o_scale = budget / max(float(np.percentile(output, 95)), 1.0)
    held = load_corpus().held_out
    out = []
    for i in range(len(a)):
        plen = int(np.clip(round(prompt[start + i] * p_scale), 4, budget))
        olen = int(np.clip(round(output[start + i] * o_scale), 8, budget - 1))
        at = int(rng.integers(0, len(held) - plen))
        text = held[at : at + plen].decode(errors="ignore") or "def "
        out.append((float(a[i]), text, olen))
    return out


async def _one(url: str, model: str, arrival: float, t0: float, prompt: str, max_tokens: int) -> _Outcome:
    import httpx

    await asyncio.sleep(max(0.0, t0 + arrival - time.monotonic()))
    o = _Outcome(sent=time.monotonic())
    body = {"text_input": prompt, "parameters": {"max_tokens": max_tokens, "temperature": 0}}
    chunks: list[str] = []
    try:
        async with (
            httpx.AsyncClient(timeout=300) as http,
            http.stream("POST", f"{url}/v2/models/{model}/generate_stream", json=body) as r,
        ):
            if r.status_code != 200:
                await r.aread()
                o.error = f"{r.status_code}: {r.text[:200]}"
                return o
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    o.error = str(event["error"])
                    return o
                o.times.append(time.monotonic())
                chunks.append(event["text_output"])
                p = event.get("parameters")
                if p:
                    o.ttft_ms, o.tpot_ms, o.recoveries = p["ttft_ms"], p["tpot_ms"], p["recoveries"]
    except Exception as exc:  # a stream that broke is a failed request, counted
        o.error = f"{type(exc).__name__}: {exc}"
    o.text = "".join(chunks)
    return o


def _stat(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p99": None}
    return {"mean": round(float(np.mean(values)), 2), "p99": round(float(np.percentile(values, 99)), 2)}


def recovery(outcomes: list[_Outcome], killed_at: float | None, restart_ms: float | None) -> dict[str, Any]:
    """``recovery_ms``: the kill to the later of the restarted worker serving (``restart_ms``) and
    the last interrupted stream's next token (``streams_ms``, what the policies' checkpoints and
    dispatch decide; None when no stream was interrupted); ``recovery_bound_by`` names the later."""
    streams: float | None = None
    for o in outcomes:
        after = [t for t in o.times if killed_at is not None and t > killed_at]
        if o.recoveries > 0 and o.error is None and after and killed_at is not None:
            streams = max(streams or 0.0, (after[0] - killed_at) * 1000)
    restart = float(restart_ms or 0.0)
    return {
        "recovery_ms": round(max(restart, streams or 0.0), 1),
        "streams_ms": None if streams is None else round(streams, 1),
        "recovery_bound_by": "streams" if streams is not None and streams > restart else "restart",
    }


def next_tokens(outcomes: list[_Outcome], killed_at: float | None) -> list[float]:
    """Per interrupted stream that completed, the kill to its next token (ms)."""
    out = []
    for o in outcomes:
        after = [t for t in o.times if killed_at is not None and t > killed_at]
        if o.recoveries > 0 and o.error is None and after and killed_at is not None:
            out.append(round((after[0] - killed_at) * 1000, 1))
    return out


def _session_config(config: Any, serving: Any, policy: str | None, settings: LlmBenchSettings) -> Any:
    """The config with one llm service (its policy replaced, the reload emulated), a free port and
    a state directory of its own."""
    import dataclasses
    import tempfile
    from pathlib import Path

    svc = dataclasses.replace(serving, policy=policy or serving.policy, restart_delay_ms=settings.reload_ms)
    state = Path(tempfile.mkdtemp(prefix="failsoft-bench-llm-"))
    return config.replace(llm=(svc,), apps=(), services=(), state_dir=state).with_gateway(port=0)


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _run_one(
    config: Any,
    serving: Any,
    policy: str | None,
    settings: LlmBenchSettings,
    reqs: list[tuple[float, str, int]],
) -> tuple[list[_Outcome], dict[str, Any]]:
    import os
    import signal

    from failsoft.runtime.session import Session

    with Session(_session_config(config, serving, policy, settings)) as session:
        d = session.gateway.served[serving.name].dispatcher
        _wait(lambda: d.ready() and len(d.workers) == len(serving.service.members), 300)
        drafts = _holds_draft(serving, policy)  # standbys up, holding the draft under lumen
        _wait(lambda: len(d._spares) >= 1 and all(_spare_up(s, drafts) for s in d._spares), 300)
        for w in d.workers.values():
            w.set_slow_sync(settings.slow_ms)

        async def drive() -> tuple[list[_Outcome], float | None, str | None]:
            t0 = time.monotonic()
            tasks: list[asyncio.Future[Any]] = [
                asyncio.ensure_future(_one(session.url, serving.name, a, t0, p, m)) for a, p, m in reqs
            ]
            killed_at, victim = None, None
            if policy is not None:
                await asyncio.sleep(settings.kill_at_s)
                in_flight = d.describe()["in_flight"]
                victim = max(in_flight, key=lambda w: (in_flight[w], w))
                killed_at = time.monotonic()
                incarnation = int(d._table[victim]["incarnation"])
                os.kill(int(d._table[victim]["pid"]), signal.SIGKILL)
                tasks.append(asyncio.ensure_future(_slow_restarted(d, victim, incarnation, settings.slow_ms)))
            done = await asyncio.gather(*tasks)
            return [o for o in done if isinstance(o, _Outcome)], killed_at, victim

        outcomes, killed_at, victim = asyncio.run(drive())
        if killed_at is not None:  # the controller's restart, as the gateway saw it
            _wait(lambda: bool(d.stats.restarts) and d.stats.restarts[-1]["serving"] is not None, 600)
        extra = _breakdown(d, killed_at, victim)
    return outcomes, extra


def _holds_draft(serving: Any, policy: str | None) -> bool:
    """Whether the service's standbys preload its draft under ``policy`` (progressive recovery)."""
    from failsoft.policies import registry

    bundle = registry.make("llm_recovery", policy or serving.policy, serving.params)
    return bundle.progressive is not None and serving.draft_name() is not None


def _spare_up(spare: dict[str, Any], draft: bool) -> bool:
    return bool(spare.get("pid")) and (not draft or spare.get("draft") is not None)


async def _slow_restarted(d: Any, victim: str, incarnation: int, slow_ms: float) -> None:
    """The restarted worker (a standby adopting ``victim``'s name) runs as slowly as the others:
    as soon as it is in the table, drafting or serving."""
    for _ in range(6000):  # 10 minutes at most
        w = d._table.get(victim, {})
        if w.get("incarnation", 0) > incarnation and w.get("ref") is not None:
            await asyncio.to_thread(w["ref"].set_slow_sync, slow_ms)
            return
        await asyncio.sleep(0.1)


def _ms(at: float | None, since: float | None) -> float | None:
    return round((at - since) * 1000, 1) if at is not None and since is not None else None


def _breakdown(d: Any, killed_at: float | None, victim: str | None) -> dict[str, Any]:
    """Where a policy run's recovery time went: detection, the draft's and the target's loads in
    the restarted worker, and each recovered request's next token, restored or recomputed."""
    stats = d.stats
    last = stats.restarts[-1] if stats.restarts else {}
    loads: dict[str, Any] = {}
    if victim is not None and victim in d.workers:
        try:
            info = d.workers[victim].info_sync(30.0)
            loads = {"target_load_ms": info.get("load_ms"), "draft_load_ms": info.get("draft_ms")}
        except Exception as exc:  # a figure missing, not a failed run
            loads = {"loads_error": str(exc)}
    by_kind: dict[str, list[float]] = {"restored": [], "recomputed": []}
    for r in stats.recoveries:
        if (gap := _ms(r.get("next_token_at"), killed_at)) is not None:
            by_kind["restored" if r["restored"] else "recomputed"].append(gap)
    return {
        "detected_ms": _ms(last.get("failed"), killed_at),
        "draft_ready_ms": _ms(last.get("draft"), killed_at),
        **{k: None if v is None else round(float(v), 1) for k, v in loads.items() if k != "loads_error"},
        "restored_next_token_ms": _stat(by_kind["restored"])["mean"],
        "recomputed_next_token_ms": _stat(by_kind["recomputed"])["mean"],
        "assist_rounds": stats.assist_rounds,
        "drafts_proposed": stats.drafts_proposed,
        "drafts_accepted": stats.drafts_accepted,
        "recomputed_tokens": stats.recomputed_tokens,
        "restored_requests": stats.restored,
        "recovered_requests": stats.recovered,
        "checkpoint_bytes_shipped": stats.shipped_bytes,
        "killed_at": killed_at,
        "restart_ms": _ms(last.get("serving"), killed_at),
        "restarted_at": last.get("serving"),
    }


def _llm_service(config: Any) -> Any:
    from failsoft.errors import ConfigError

    if not config.llm:
        raise ConfigError(f"{config.source}: no llm service to benchmark (a services entry with mode: llm)")
    return config.llm[0]


def _context(serving: Any) -> int:
    if serving.hf:
        from transformers import AutoConfig

        from failsoft.llm.models import serving_context

        return serving_context(AutoConfig.from_pretrained(serving.root, local_files_only=True))
    from failsoft.llm.models import load_lm

    return load_lm(serving.root, serving.target_name(), "cpu").context


def _client_ttfts(outcomes: list[_Outcome]) -> list[float]:
    return [(o.times[0] - o.sent) * 1000 for o in outcomes if o.times]


def _policy_row(outcomes: list[_Outcome], reference: list[_Outcome], extra: dict[str, Any]) -> dict[str, Any]:
    from failsoft.bench.llm_impact import cluster_recovery, impact_ttft

    killed_at = extra.pop("killed_at")
    restarted_at = extra.pop("restarted_at")
    during = [
        o.ttft_ms
        for o in outcomes
        if o.ttft_ms is not None
        and killed_at is not None
        and restarted_at is not None
        and killed_at <= o.sent <= restarted_at
    ]
    impact = {} if killed_at is None else {
        **impact_ttft(outcomes, killed_at), **cluster_recovery(outcomes, reference, killed_at)
    }  # fmt: skip
    # requests sent after the worker was back: without them a cluster recovery bound by the
    # reload cannot show (negative: the trace ended before it; see --requests)
    tail = None if restarted_at is None else round(max(o.sent for o in outcomes) - restarted_at, 2)
    return {
        "ttft_ms": _stat([o.ttft_ms for o in outcomes if o.ttft_ms is not None]),
        "tpot_ms": _stat([o.tpot_ms for o in outcomes if o.tpot_ms is not None]),
        **impact,
        "trace_after_restart_s": tail,
        **recovery(outcomes, killed_at, extra["restart_ms"]),
        "kill_to_next_token_ms": next_tokens(outcomes, killed_at),
        "reload_window": {"requests": len(during), "ttft_ms": _stat(during)},
        "identical_outputs": sum(
            o.error is None and o.text == r.text for o, r in zip(outcomes, reference, strict=True)
        ),
        "failed_requests": sum(o.error is not None for o in outcomes),
        **extra,
    }


SUMMARY_KEYS = ("impact_ttft_ms", "cluster_recovery_ms", "restart_ms", "recomputed_tokens")


def summarize(rounds: list[dict[str, Any]], policies: tuple[str, ...]) -> dict[str, Any]:
    """Per policy the mean over rounds of the summary figures, and the change against
    Stop-and-Restart and against Fixed-Checkpointing (percent), as LUMEN's targets are stated."""
    from failsoft.bench.llm_impact import vs_baseline

    means: dict[str, dict[str, Any]] = {}
    for policy in policies:
        rows = [r["policies"][policy] for r in rounds if policy in r["policies"]]
        means[policy] = {}
        for key in SUMMARY_KEYS:
            vals = [float(row[key]) for row in rows if row.get(key) is not None]
            means[policy][key] = round(sum(vals) / len(vals), 1) if vals else None
    return {
        "mean_over_rounds": means,
        "vs_stop_and_restart_pct": vs_baseline(means, "stop-and-restart", SUMMARY_KEYS),
        "vs_fixed_checkpointing_pct": vs_baseline(means, "fixed-checkpointing", SUMMARY_KEYS),
        "targets": {"lumen_vs_stop_and_restart_pct": {"impact_ttft_ms": -44.0, "cluster_recovery_ms": -50.0}},
    }


def run(
    config_path: Any,
    settings: LlmBenchSettings,
    progress: Callable[[str], None] = print,
    save: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """``rounds`` rounds, each a no-failure reference and then every policy (their order rotated
    from round to round, so that a machine's load changes fall on every policy alike). ``save``
    gets the results so far after every run that completed (the CLI writes them to ``--out``: a
    crash or a kill later loses nothing measured); ``complete`` says whether every run is in."""
    import os

    from failsoft.runtime.config import load_config

    config = load_config(config_path)
    serving = _llm_service(config)
    serving.build()
    reqs = trace(settings.requests, settings.rate_rps, _context(serving), settings.seed)
    results: dict[str, Any] = {
        "config": str(config_path),
        "model": serving.target_name(),
        "draft": serving.draft_name(),
        "workers": len(serving.service.members),
        "settings": {
            "requests": settings.requests,
            "rate_rps": settings.rate_rps,
            "kill_at_s": settings.kill_at_s,
            "slow_ms": settings.slow_ms,
            "seed": settings.seed,
            "reload_ms": settings.reload_ms,
            "rounds": settings.rounds,
        },
        "rounds": [],
        "complete": False,
    }

    def saved() -> None:
        if save is not None:
            results["summary"] = summarize(results["rounds"], settings.policies)
            save(results)

    for i in range(settings.rounds):
        k = i % len(settings.policies)
        order = settings.policies[k:] + settings.policies[:k]
        load = [round(os.getloadavg()[0], 2)]
        progress(f"round {i + 1}: no-failure reference, {len(reqs)} requests")
        reference, _ = _run_one(config, serving, None, settings, reqs)
        ref_ttft = _client_ttfts(reference)
        one: dict[str, Any] = {
            "order": list(order),
            "no-failure": {
                "ttft_ms": _stat([o.ttft_ms for o in reference if o.ttft_ms is not None]),
                "client_ttft_ms": _stat(ref_ttft),
                "tpot_ms": _stat([o.tpot_ms for o in reference if o.tpot_ms is not None]),
                "failed_requests": sum(o.error is not None for o in reference),
            },
            "policies": {},
            "load_average_1m": load,
        }
        results["rounds"].append(one)
        saved()
        for policy in order:
            progress(f"round {i + 1}: policy {policy}: kill the busiest worker at {settings.kill_at_s} s")
            outcomes, extra = _run_one(config, serving, policy, settings, reqs)
            one["policies"][policy] = _policy_row(outcomes, reference, extra)
            load.append(round(os.getloadavg()[0], 2))
            saved()
    results["summary"] = summarize(results["rounds"], settings.policies)
    results["complete"] = True
    if settings.rounds == 1:  # the earlier layout too: one reference and one row per policy
        results["no-failure"] = results["rounds"][0]["no-failure"]
        results["policies"] = results["rounds"][0]["policies"]
    return results
