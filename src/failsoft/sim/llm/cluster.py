"""A continuous-batching LLM cluster on SimPy, with worker failures and LUMEN's recovery policies.

Each of ``N`` workers is one model replica (Llama-2-70B on 4 H100s) with its own waiting queue and
a continuous-batching loop: every iteration admits waiting requests while the running batch is
below ``max_batch`` (64, the largest measured batch) and their KV fits, runs up to ``chunk_tokens``
prompt tokens of prefill (chunked prefill, Sarathi-Serve) together with one decode token of every
running request, and lasts :meth:`StepTimes.step_ms` (measured). A gateway sends each arrival to
the up worker with the fewest requests in flight (join-shortest-queue).

Decoding is simulated with a per-worker *token clock* (tokens each running request has gained
since the worker started), so an iteration costs O(1) events whatever the batch: a request
finishes when the clock passes its start plus its remaining tokens. Speculative decoding advances
the clock by the expected accepted tokens per step (Eq. 3), not by a random draw.

At a failure the killed workers' requests are interrupted; after ``detect_s`` the policy's dispatch
routes them (to a checkpoint holder, restoring the checkpointed prefix by a host-to-GPU copy at
``restore_gbps``, or to the least loaded worker, recomputing prompt plus generated tokens) and the
killed workers restart: the full model takes ``target_load_s``; with progressive recovery the draft
model is loaded first (``draft_load_s``) and drafts for the most loaded survivor until then. The
checkpoints are placed when a request's first token is out (its prompt KV is then complete) and
extended every ``sync_s`` of simulated time (the streaming lag: tokens generated since the last
sync are recomputed after a restore). The policies are the pure ones of
:mod:`failsoft.policies.llm_recovery`, fed with frozen :class:`ClusterView` snapshots.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from failsoft.policies.llm_recovery import (
    CheckpointLedger,
    ClusterView,
    Interrupted,
    LlmRecoveryPolicy,
    Recovering,
    SpeculationCost,
    WorkerLoad,
    expected_tokens,
    kv_mb_per_token,
)
from failsoft.sim.llm.data import StepTimes, load_trace, step_times

LLAMA2_70B_KV_MB = kv_mb_per_token(80, 8, 128)  # 0.3125 MB per token (review Eq. 1)


@dataclass(frozen=True)
class LlmSimConfig:
    """One simulated run. Times in seconds unless the name says otherwise."""

    workers: int = 4
    failed: int = 1  # workers killed at once at ``warmup_s``; 0: no failure (the baseline)
    workload: str = "conv"
    rate_per_worker: float = 3.0  # requests/s per worker: 25% fewer workers run at about capacity
    warmup_s: float = 30.0  # the kill time
    arrivals_after_s: float = 90.0  # arrivals go on this long after the kill
    window_s: float = 60.0  # TTFT/TPOT are averaged over requests arriving this long after the kill
    max_batch: int = 64
    chunk_tokens: int = 2048
    kv_mb_per_token: float = LLAMA2_70B_KV_MB
    kv_capacity_mb: float = 150 * 1024.0  # 4 x 80 GB HBM - 140 GB weights - activations
    max_prompt_tokens: int = 8192
    max_output_tokens: int = 2048
    detect_s: float = 1.0  # heartbeat detection
    target_load_s: float = 20.0  # 140 GB of weights at 7 GB/s (NVMe)
    draft_load_s: float = 2.0  # Llama-2-7B, 13.5 GB at 7 GB/s
    restore_gbps: float = 20.0  # host DRAM to GPU (PCIe)
    acceptance: float = 0.6  # draft tokens the target accepts (the review: 0.5-0.7)
    sync_s: float = 1.0
    sample_s: float = 0.5
    monitor_s: float = 0.1  # the load monitor's refresh period (placement reads this view)
    drain_limit_s: float = 900.0  # give up this long after the last arrival


class Req:
    __slots__ = (
        "arrival",
        "base",
        "finish",
        "first_token",
        "generated",
        "id",
        "interrupted",
        "output",
        "prefill_left",
        "prompt",
        "recomputed",
        "replay_first",
        "reserved",
        "restore_mb",
        "restored",
        "start_clock",
    )

    def __init__(self, rid: int, arrival: float, prompt: int, output: int) -> None:
        self.id, self.arrival, self.prompt, self.output = rid, arrival, prompt, output
        self.first_token: float | None = None
        self.finish: float | None = None
        self.generated = 0
        self.prefill_left = prompt
        self.restore_mb = 0.0
        self.interrupted = False
        self.replay_first: float | None = None
        self.start_clock = 0.0
        self.base = 0
        self.reserved = 0.0
        self.recomputed = 0
        self.restored = 0


class Worker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True
        self.serving = True
        self.epoch = 0
        self.waiting: deque[Req] = deque()
        self.prefilling: list[Req] = []
        self.decoding: dict[int, Req] = {}
        self.heap: list[tuple[float, int]] = []
        self.clock = 0.0
        self.kv = 0.0
        self.spec: tuple[str, int] | None = None  # (peer | self, draft tokens)
        self.restore_ms = 0.0
        self.last_sync = 0.0
        self.wake: simpy.Event | None = None

    @property
    def queue(self) -> int:
        return len(self.waiting) + len(self.prefilling) + len(self.decoding)

    def generated_now(self, r: Req) -> int:
        return r.base + int(min(self.clock - r.start_clock + 1e-9, r.output - r.base))


class LlmCluster:
    def __init__(self, config: LlmSimConfig, policy: LlmRecoveryPolicy, seed: int) -> None:
        self.c = config
        self.policy = policy
        self.params = policy.params
        self.steps: StepTimes = step_times()
        self.env = simpy.Environment()
        self.rng = np.random.default_rng(seed)
        self.workers = [Worker(f"w{i}") for i in range(config.workers)]
        self.ledger = CheckpointLedger(config.kv_mb_per_token, self.params.checkpoint_budget_mb)
        self.requests: list[Req] = []
        self.done = 0
        self.arrivals_done = False
        self.all_done = self.env.event()
        self.samples: list[int] = []
        self._view: ClusterView | None = None
        self._view_at = -math.inf
        self.victims: list[Worker] = []
        self.reload_done_at: float | None = None
        self.parked: list[Req] = []
        self.k = self.params.draft_tokens
        self.tokens_per_spec = expected_tokens(config.acceptance, self.k)

    # -- arrivals ---------------------------------------------------------------------------------

    def _arrivals(self) -> list[tuple[float, int, int]]:
        times, prompt, output = load_trace(self.c.workload)
        n = len(times)
        span = float(times[-1] - times[0])
        scale = (n / span) / (self.c.rate_per_worker * self.c.workers)
        start = int(self.rng.integers(0, n))
        end = self.c.warmup_s + self.c.arrivals_after_s
        out: list[tuple[float, int, int]] = []
        i, offset = start, -float(times[start])
        while True:
            if i == n:
                i, offset = 0, offset + span + float(times[1] - times[0])
            t = (float(times[i]) + offset) * scale
            if t > end:
                return out
            out.append(
                (
                    t,
                    min(int(prompt[i]), self.c.max_prompt_tokens),
                    max(1, min(int(output[i]), self.c.max_output_tokens)),
                )
            )
            i += 1

    def _arrive(self, arrivals: list[tuple[float, int, int]]) -> Any:
        for t, prompt, output in arrivals:
            if t > self.env.now:
                yield self.env.timeout(t - self.env.now)
            r = Req(len(self.requests), self.env.now, prompt, output)
            self.requests.append(r)
            self._route_new(r)
        self.arrivals_done = True
        self._check_done()

    def _route_new(self, r: Req) -> None:
        up = [w for w in self.workers if w.alive and w.serving]
        if not up:
            self.parked.append(r)
            return
        target = min(up, key=lambda w: w.queue)
        target.waiting.append(r)
        self._wake(target)

    # -- the view the policies read --------------------------------------------------------------

    def view(self, fresh: bool = False) -> ClusterView:
        if fresh or self._view is None or self.env.now - self._view_at >= self.c.monitor_s:
            self._view = ClusterView(
                tuple(
                    WorkerLoad(w.name, w.queue, self.ledger.held_mb(w.name), w.alive, w.serving)
                    for w in self.workers
                )
            )
            self._view_at = self.env.now
        return self._view

    # -- a worker's continuous batching loop ------------------------------------------------------

    def _wake(self, w: Worker) -> None:
        if w.wake is not None and not w.wake.triggered:
            w.wake.succeed()

    def _admit(self, w: Worker) -> None:
        while w.waiting and len(w.prefilling) + len(w.decoding) < self.c.max_batch:
            r = w.waiting[0]
            need = (r.prompt + r.output) * self.c.kv_mb_per_token
            if w.kv + need > self.c.kv_capacity_mb and (w.prefilling or w.decoding):
                return
            w.waiting.popleft()
            r.reserved = need
            w.kv += need
            if r.restore_mb > 0:
                w.restore_ms += r.restore_mb / 1024.0 / self.c.restore_gbps * 1000.0
                r.restore_mb = 0.0
                self.ledger.release(r.id)  # the checkpoint is now the request's KV on this GPU
            w.prefilling.append(r)

    def _step_ms(self, w: Worker, prefill: int, batch: int) -> tuple[float, float]:
        s = self.steps
        if batch and w.spec is not None:
            mode, k = w.spec
            draft = k * s.draft_ratio * s.decode_ms(batch)
            verify = s.verify_ms(batch, k)
            dec = max(draft, verify) if mode == "peer" else draft + verify
            tokens = self.tokens_per_spec
            batch_tokens = batch * (k + 1)
        else:
            dec = s.decode_ms(batch) if batch else 0.0
            tokens = 1.0
            batch_tokens = batch
        ms = max(dec, s.prefill_ms(prefill + batch_tokens)) if prefill else dec
        return ms, tokens

    def _run(self, w: Worker, epoch: int) -> Any:
        while w.epoch == epoch:
            self._admit(w)
            if not w.prefilling and not w.decoding:
                w.wake = self.env.event()
                yield w.wake
                w.wake = None
                continue
            budget, chunks = self.c.chunk_tokens, []
            for r in w.prefilling:
                take = min(budget, r.prefill_left)
                if take > 0:
                    chunks.append((r, take))
                    budget -= take
                if budget <= 0:
                    break
            prefill = sum(t for _, t in chunks)
            ms, tokens = self._step_ms(w, prefill, len(w.decoding))
            ms += w.restore_ms
            w.restore_ms = 0.0
            yield self.env.timeout(ms / 1000.0)
            if w.epoch != epoch:
                return
            if w.decoding:
                w.clock += tokens
                while w.heap and w.heap[0][0] <= w.clock + 1e-9:
                    _, rid = heapq.heappop(w.heap)
                    self._finish(w, w.decoding.pop(rid))
            for r, take in chunks:
                r.prefill_left -= take
                if r.prefill_left <= 0:
                    w.prefilling.remove(r)
                    self._prefilled(w, r)
            if self.env.now - w.last_sync >= self.c.sync_s:
                self._sync(w)

    def _prefilled(self, w: Worker, r: Req) -> None:
        now = self.env.now
        if r.first_token is None:
            r.first_token = now
        elif r.interrupted and r.replay_first is None:
            r.replay_first = now
        r.generated += 1  # the prefill's last position yields the next token
        if r.generated >= r.output:
            self._finish(w, r)
            return
        r.base, r.start_clock = r.generated, w.clock
        w.decoding[r.id] = r
        heapq.heappush(w.heap, (w.clock + r.output - r.generated, r.id))
        if self.policy.checkpoints and r.id not in self.ledger:
            tokens = r.prompt + r.generated
            decision = self.policy.placement.choose(
                w.name, tokens * self.c.kv_mb_per_token, self.view(), self.params
            )
            if decision.holder is not None and self.ledger.assign(r.id, w.name, decision.holder, tokens):
                assert self._view is not None
                self._view = self._view.with_added(
                    decision.holder, held_kv_mb=tokens * self.c.kv_mb_per_token
                )

    def _finish(self, w: Worker, r: Req) -> None:
        r.finish = self.env.now
        r.generated = r.output
        w.kv -= r.reserved
        self.ledger.release(r.id)
        self.done += 1
        self._check_done()

    def _sync(self, w: Worker) -> None:
        w.last_sync = self.env.now
        extend, clock = self.ledger.extend, w.clock + 1e-9
        for r in w.decoding.values():
            extend(r.id, r.prompt + r.base + int(min(clock - r.start_clock, r.output - r.base)))

    def _check_done(self) -> None:
        if self.arrivals_done and self.done == len(self.requests) and not self.all_done.triggered:
            self.all_done.succeed()

    # -- failure and recovery -------------------------------------------------------------------

    def _kill(self, victims: list[Worker]) -> Any:
        yield self.env.timeout(self.c.warmup_s)
        kill = self.env.now
        orphans: list[Req] = []
        for w in victims:
            for r in w.decoding.values():
                r.generated = w.generated_now(r)
            active = [*w.prefilling, *w.decoding.values()]
            for r in active:
                r.interrupted = True
            orphans += active + list(w.waiting)
            w.alive = w.serving = False
            w.epoch += 1
            w.waiting.clear()
            w.prefilling.clear()
            w.decoding.clear()
            w.heap.clear()
            w.kv, w.spec, w.restore_ms = 0.0, None, 0.0
            self._wake(w)
            self.ledger.lose_holder(w.name)
        self._view = None
        yield self.env.timeout(self.c.detect_s)
        self._recover(orphans)
        for w in victims:
            self.env.process(self._restart(w))
        if self.policy.progressive is not None:
            self.env.process(self._assist(victims, kill))

    def _recover(self, orphans: list[Req]) -> None:
        items = []
        for r in orphans:
            ck = self.ledger.get(r.id)
            items.append(
                Interrupted(
                    r.id,
                    r.prompt + r.generated,
                    ck.holder if ck else None,
                    ck.tokens if ck else 0,
                    ck.kv_mb if ck else 0.0,
                )
            )
        by_id = {r.id: r for r in orphans}
        routes = self.policy.dispatch.route(items, self.view(fresh=True), self.params)
        placed: dict[str, list[Req]] = {}
        for route in routes:
            r = by_id[route.request]  # type: ignore[index]
            ck = self.ledger.get(r.id)
            context = r.prompt + r.generated
            if route.restore and ck is not None:
                # at least the newest token is computed again (its KV was never streamed)
                r.restore_mb, r.prefill_left = ck.kv_mb, max(1, context - ck.tokens)
                r.restored = ck.tokens
            else:
                self.ledger.release(r.id)
                r.restore_mb, r.prefill_left = 0.0, context
            r.recomputed = r.prefill_left if r.interrupted else 0
            if route.worker is None:
                self.parked.append(r)
            else:
                placed.setdefault(route.worker, []).append(r)
        for name, reqs in placed.items():
            w = next(x for x in self.workers if x.name == name)
            w.waiting.extendleft(reversed(reqs))
            self._wake(w)

    def _restart(self, w: Worker) -> Any:
        if self.policy.progressive is not None:
            yield self.env.timeout(self.c.draft_load_s)
        yield self.env.timeout(self.c.target_load_s)
        w.alive = w.serving = True
        w.epoch += 1
        w.clock = 0.0
        w.last_sync = self.env.now
        self._view = None
        self.env.process(self._run(w, w.epoch))
        if self.policy.progressive is not None:
            decision = self.policy.progressive.decide(
                [Recovering(w.name, True, True)], self.view(), self.params, self._cost()
            )
            w.spec = ("self", self.k) if decision[0].mode == "self-draft" else None
        if all(v.serving for v in self.victims):
            self.reload_done_at = self.env.now
        parked, self.parked = self.parked, []
        for r in parked:
            self._route_new(r)

    def _cost(self) -> SpeculationCost:
        b = self.c.max_batch
        verify = self.steps.verify_ms(b, self.k) / self.steps.decode_ms(b)
        return SpeculationCost(self.c.acceptance, self.steps.draft_ratio, max(1.0, verify))

    def _assist(self, victims: list[Worker], kill: float) -> Any:
        """Alg. 3 phase 2: re-decided every second until every victim's full model is back."""
        progressive = self.policy.progressive
        assert progressive is not None
        yield self.env.timeout(self.c.draft_load_s)
        while True:
            recovering = [Recovering(v.name, True, False) for v in victims if not v.serving]
            for w in self.workers:
                if w.serving and w.spec is not None and w.spec[0] == "peer":
                    w.spec = None
            if not recovering:
                return
            for d in progressive.decide(recovering, self.view(fresh=True), self.params, self._cost()):
                if d.mode == "peer-verify" and d.assist is not None:
                    next(w for w in self.workers if w.name == d.assist).spec = ("peer", self.k)
            yield self.env.timeout(1.0)

    def _sample(self) -> Any:
        while not self.all_done.triggered:
            self.samples.append(sum(w.queue for w in self.workers) + len(self.parked))
            yield self.env.timeout(self.c.sample_s)

    # -- a run ---------------------------------------------------------------------------------

    def run(self) -> LlmCluster:
        for w in self.workers:
            self.env.process(self._run(w, w.epoch))
        arrivals = self._arrivals()
        self.env.process(self._arrive(arrivals))
        self.env.process(self._sample())
        if self.c.failed > 0:
            order = self.rng.permutation(len(self.workers))[: self.c.failed]
            self.victims = [self.workers[int(i)] for i in sorted(order)]
            self.env.process(self._kill(self.victims))
        limit = self.c.warmup_s + self.c.arrivals_after_s + self.c.drain_limit_s
        self.env.run(until=simpy.AnyOf(self.env, [self.all_done, self.env.timeout(limit)]))
        return self
