"""The ``llm`` dispatcher: LUMEN's request path over the LLM workers of one service.

* **Routing**: join-shortest-queue over the live workers, by the requests this gateway has in flight
  on each (ties to the first in the service's order).
* **Streaming**: a request is submitted to its worker and its output long-polled; every poll that
  brings tokens is yielded to the caller (the generate endpoints stream them as SSE events).
* **KV checkpoints** (policy ``placement``, within ``checkpoint_budget_mb`` per holder by the
  :class:`~failsoft.policies.llm_recovery.CheckpointLedger`): once a request's first token is out,
  a holder is chosen from the workers' loads; after a poll that brought tokens the pages its worker
  filled since the last export are shipped to the holder (incrementally, up to what the ledger
  allows), in a task beside the stream (one chunk in transit per request, so they arrive in order). A
  finished or abandoned request's checkpoint is dropped on its holder.
* **Recovery**: when a worker dies under a request (its actor is gone), the policy's ``dispatch``
  routes it: to its checkpoint's holder, which restores the pages and recomputes only the tokens
  they do not cover, or to the least loaded worker, which recomputes the prompt and the output the
  client already received. The stream goes on from the token after the last one delivered; with
  greedy decoding the text is the one a run without the failure gives.
* **Cancellation**: when the caller stops iterating (the client left), the request is cancelled on
  its worker (its KV pages are freed) and its checkpoint dropped.

Decisions are the policies' (:mod:`failsoft.policies.llm_recovery`, by name); this module is
mechanism: calls, polls, shipping, retries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from failsoft.errors import InvalidRequestError, NoRouteError, ServerUnavailableError
from failsoft.policies import registry
from failsoft.policies.llm_recovery import (
    CheckpointLedger,
    ClusterView,
    Interrupted,
    WorkerLoad,
)
from failsoft.services import LlmParams

log = logging.getLogger(__name__)
POLL_WAIT_S = 5.0
MAX_PROMPT_BYTES = 1 << 20


@dataclass(slots=True)
class LlmStats:
    """What this dispatcher saw: per finished request, TTFT and TPOT as the client saw them."""

    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)
    recovered: int = 0
    restored: int = 0
    recomputed_tokens: int = 0
    failed: int = 0
    restore_refused: int = 0
    shipped_bytes: int = 0
    assist_rounds: int = 0  # progressive restart: draft-and-verify rounds for a survivor
    drafts_proposed: int = 0
    drafts_accepted: int = 0


class LlmDispatcher:
    """Streams generations over ``workers`` (name -> :class:`~failsoft.runtime.cluster.LlmWorkerRef`,
    in ring order) with the named recovery ``policy``. ``context`` and ``kv_mb_per_token`` are the
    model's (every worker serves the same one)."""

    def __init__(
        self,
        service: str,
        workers: Mapping[str, Any],
        params: LlmParams,
        policy: str,
        context: int,
        kv_mb_per_token: float,
    ) -> None:
        if not workers:
            raise NoRouteError(f"llm service {service!r} has no worker")
        self.service = service
        self.workers = dict(workers)
        self.params = params
        self.policy = registry.make("llm_recovery", policy, params)
        self.policy_name = policy
        self.context = context
        self.kv_mb_per_token = kv_mb_per_token
        self.ledger = CheckpointLedger(kv_mb_per_token, params.checkpoint_budget_mb)
        self.dead: set[str] = set()
        self._outstanding = dict.fromkeys(self.workers, 0)
        self._ids = 0
        self._cleanups: set[asyncio.Task[None]] = set()
        self._shipping: dict[str, asyncio.Task[None]] = {}
        # request id -> (worker, prompt tokens, tokens received so far, max_tokens, greedy):
        # what a drafting peer needs to draft for the requests of a survivor
        self._live: dict[str, tuple[str, list[int], list[int], int, bool]] = {}
        self.stats = LlmStats()

    # ------------------------------------------------------------------ routing
    def view(self) -> ClusterView:
        return ClusterView(
            tuple(
                WorkerLoad(
                    name, self._outstanding[name], self.ledger.held_mb(name), alive=name not in self.dead
                )
                for name in self.workers
            )
        )

    def pick(self) -> str:
        """Join the shortest queue among the live workers."""
        live = [w for w in self.workers if w not in self.dead]
        if not live:
            raise NoRouteError(f"llm service {self.service!r}: no worker is alive")
        return min(live, key=lambda w: self._outstanding[w])

    def ready(self) -> bool:
        return any(w not in self.dead for w in self.workers)

    def mark_dead(self, worker: str) -> None:
        if worker not in self.dead:
            self.dead.add(worker)
            for request in self.ledger.lose_holder(worker):
                log.info("checkpoint of %s lost with its holder %s", request, worker)

    def revive(self, worker: str, ref: Any) -> None:
        """A restarted ``worker`` (a fresh process: no request, no checkpoint) serves again."""
        self.workers[worker] = ref
        self._outstanding.setdefault(worker, 0)
        self.dead.discard(worker)

    # ------------------------------------------------------------------ requests
    def check(self, prompt: Any, sampling: Mapping[str, Any]) -> tuple[list[int], dict[str, Any]]:
        """The prompt's tokens and the sampling fields, or InvalidRequestError naming the value."""
        from failsoft.llm.corpus import encode
        from failsoft.runtime.llm_worker import sampling_params

        if not isinstance(prompt, str):
            raise InvalidRequestError(f"text_input must be a string; got {type(prompt).__name__}")
        if len(prompt) > MAX_PROMPT_BYTES:
            raise InvalidRequestError(f"text_input has {len(prompt)} characters; at most {MAX_PROMPT_BYTES}")
        tokens = encode(prompt)
        if not tokens:
            raise InvalidRequestError("text_input is empty")
        fields = dict(sampling)
        params = sampling_params(fields)
        if len(tokens) > self.context:
            raise InvalidRequestError(
                f"the prompt has {len(tokens)} tokens, longer than the model's context of {self.context}"
            )
        if len(tokens) + params.max_tokens > self.context:
            raise InvalidRequestError(
                f"prompt of {len(tokens)} tokens + max_tokens {params.max_tokens} exceeds the model's "
                f"context of {self.context}"
            )
        return tokens, fields

    async def generate(
        self, prompt: Any, sampling: Mapping[str, Any], request_id: str | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Events of one generation: ``{"tokens": [...]}`` as they come, then a last one with
        ``finished`` true, the finish ``reason``, ``ttft_ms``, ``tpot_ms``, ``worker`` and
        ``recoveries``. Bad input raises before anything is sent to a worker."""
        tokens, fields = self.check(prompt, sampling)
        self._ids += 1
        rid = request_id or f"{self.service}-{self._ids}"
        started = time.perf_counter()
        received: list[int] = []
        times: list[float] = []
        recoveries = 0
        finished = False
        while True:  # a worker that died before anyone noticed: the next shortest queue
            worker = self.pick()
            try:
                await self.workers[worker].submit(rid, tokens, fields)
                break
            except ServerUnavailableError:
                self.mark_dead(worker)
        self._outstanding[worker] += 1
        max_tokens = int(fields.get("max_tokens", 16))
        greedy = float(fields.get("temperature", 0.0) or 0.0) == 0.0
        self._live[rid] = (worker, tokens, received, max_tokens, greedy)
        try:
            while True:
                try:
                    got = await self.workers[worker].poll(rid, len(received), POLL_WAIT_S)
                except ServerUnavailableError:
                    self.mark_dead(worker)
                    recoveries += 1
                    self.stats.recovered += 1
                    await self._shipped(rid)
                    old, worker = worker, await self._recover(rid, worker, tokens, received, fields)
                    self._outstanding[old] -= 1
                    self._outstanding[worker] += 1
                    self._live[rid] = (worker, tokens, received, max_tokens, greedy)
                    continue
                new = [int(t) for t in got["tokens"]]
                if new:
                    now = time.perf_counter()
                    received.extend(new)
                    times.extend([now] * len(new))
                    yield {"tokens": new}
                if got["finished"]:
                    finished = True
                    ttft = (times[0] - started) * 1000 if times else None
                    tpot = (times[-1] - times[0]) * 1000 / (len(times) - 1) if len(times) > 1 else None
                    if ttft is not None:
                        self.stats.ttft_ms.append(ttft)
                    if tpot is not None:
                        self.stats.tpot_ms.append(tpot)
                    yield {
                        "finished": True,
                        "reason": got["reason"],
                        "ttft_ms": ttft,
                        "tpot_ms": tpot,
                        "worker": worker,
                        "recoveries": recoveries,
                        "output_tokens": len(received),
                    }
                    return
                shipping = self._shipping.get(rid)
                if new and self.policy.checkpoints and (shipping is None or shipping.done()):
                    # off the stream's path: the next poll does not wait for the copy
                    self._shipping[rid] = asyncio.get_running_loop().create_task(
                        self._ship(rid, worker, len(tokens) + len(received))
                    )
        finally:
            self._outstanding[worker] -= 1
            self._live.pop(rid, None)
            # in a task of its own: a client that left cancels this coroutine, and the web
            # framework's cancel scope would cancel every await of the clean-up here too
            cleanup = asyncio.get_running_loop().create_task(self._cleanup(rid, worker, finished))
            self._cleanups.add(cleanup)
            cleanup.add_done_callback(self._cleanups.discard)

    async def _cleanup(self, rid: str, worker: str, finished: bool) -> None:
        """Free what a request left: its KV pages on its worker (when it did not finish: the
        client left) and its checkpoint on the holder."""
        if not finished:
            await self._abandon(rid, worker)
        await self._shipped(rid)
        await self._drop_checkpoint(rid)

    async def _shipped(self, rid: str) -> None:
        """Wait for the request's chunk in transit (chunks are shipped one at a time, in order)."""
        task = self._shipping.pop(rid, None)
        if task is not None:
            await asyncio.wait([task])

    # ------------------------------------------------------------------ checkpoints
    async def _ship(self, rid: str, worker: str, tokens_so_far: int) -> None:
        """Ship the pages filled since the last export to the request's holder (placed now if it
        has none), as far as the holder's budget allows. A failure here costs the checkpoint, not
        the request."""
        kv_mb = tokens_so_far * self.kv_mb_per_token
        entry = self.ledger.get(rid)
        placed = entry is None
        if entry is None:
            decision = self.policy.placement.choose(worker, kv_mb, self.view(), self.params)
            if decision.holder is None or self.ledger.assign(rid, worker, decision.holder, 0) is None:
                return
            entry = self.ledger.get(rid)
            assert entry is not None
        upto = self.ledger.extend(rid, tokens_so_far)
        try:
            chunk = await self.workers[worker].export_kv(rid, upto, placed)
        except ServerUnavailableError:
            return  # the worker died: the next poll sees it and recovers the request
        if chunk is None:
            return
        try:
            await self.workers[entry.holder].hold(chunk)
            self.stats.shipped_bytes += len(chunk)
        except ServerUnavailableError as exc:  # the holder died: the checkpoint is lost with it
            log.info("checkpoint of %s lost: %s", rid, exc)
            self.mark_dead(entry.holder)
        except Exception as exc:  # an inconsistent checkpoint is dropped; the request goes on
            log.warning("checkpoint of %s dropped: %s", rid, exc)
            self.ledger.release(rid)
            await self._drop_checkpoint_on(entry.holder, rid)

    async def _drop_checkpoint(self, rid: str) -> None:
        entry = self.ledger.release(rid)
        if entry is not None:
            await self._drop_checkpoint_on(entry.holder, rid)

    async def _drop_checkpoint_on(self, holder: str, rid: str) -> None:
        if holder in self.dead:
            return
        try:
            await self.workers[holder].drop_checkpoint(rid)
        except Exception as exc:
            log.debug("drop checkpoint %s on %s: %s", rid, holder, exc)

    async def _abandon(self, rid: str, worker: str) -> None:
        if worker in self.dead:
            return
        try:
            await self.workers[worker].cancel(rid)
        except Exception as exc:
            log.debug("cancel %s on %s: %s", rid, worker, exc)

    # ------------------------------------------------------------------ recovery
    async def _recover(
        self, rid: str, failed: str, prompt: list[int], received: list[int], fields: dict[str, Any]
    ) -> str:
        """Resume ``rid`` after ``failed`` died: on its checkpoint's holder, or recomputed on the
        worker the policy names; returns the worker now serving it."""
        context = len(prompt) + len(received)
        entry = self.ledger.get(rid)
        item = Interrupted(
            rid,
            context_tokens=context,
            holder=None if entry is None else entry.holder,
            checkpoint_tokens=0 if entry is None else entry.tokens,
            kv_mb=0.0 if entry is None else entry.kv_mb,
        )
        (route,) = self.policy.dispatch.route([item], self.view(), self.params)
        if route.worker is None:
            self.stats.failed += 1
            raise NoRouteError(
                f"llm service {self.service!r}: request {rid} lost its worker and none is alive"
            )
        everything = prompt + received
        if route.restore and entry is not None:
            try:
                out = await self.workers[route.worker].restore(rid, everything, fields)
                self.ledger.release(rid)
                self.stats.restored += 1
                self.stats.recomputed_tokens += context - int(out.get("restored_tokens", 0))
                log.info("%s: %s failed; restored on %s (%s)", rid, failed, route.worker, route.reason)
                return str(route.worker)
            except ServerUnavailableError:
                self.mark_dead(route.worker)
            except InvalidRequestError as exc:  # no usable checkpoint there after all: recompute
                self.stats.restore_refused += 1
                log.warning("%s: restore on %s refused (%s); recomputing", rid, route.worker, exc)
            await self._drop_checkpoint(rid)
            return await self._recover(rid, failed, prompt, received, fields)
        await self._drop_checkpoint(rid)
        target = str(route.worker)
        await self.workers[target].submit(rid, everything, fields, len(prompt))
        self.stats.recomputed_tokens += context
        log.info("%s: %s failed; recomputed on %s (%s)", rid, failed, target, route.reason)
        return target

    # ------------------------------------------------------------------ progressive restart
    async def assist(self, name: str, drafter: Any, stop: Any, acceptance: float | None = None) -> None:
        """LUMEN's Alg. 3 while ``name`` (``drafter``: its worker, draft loaded, target loading)
        recovers: as long as the policy's ``progressive`` decides ``peer-verify``, draft
        ``draft_tokens`` tokens for the greedy requests of the survivor it names and have that
        survivor verify them (its output stays its own greedy output, a few tokens per pass
        sooner); until ``stop()`` is true or the drafter has no draft any more."""
        from failsoft.policies.llm_recovery import Recovering, SpeculationCost

        progressive = self.policy.progressive
        if progressive is None:
            return
        recorded = 0.6 if acceptance is None else acceptance
        k = self.params.draft_tokens
        known: dict[str, list[int]] = {}  # request id -> its tokens as its worker last reported
        round_ms: float | None = None  # a draft-and-verify round, moving average
        step_ms: dict[str, float] = {}  # survivor -> its own decode step
        idle_since: float | None = None
        while not stop():
            try:
                view = self.view()
            except RuntimeError:  # the gateway's loop changed a dict meanwhile: read again
                continue
            proposed, accepted = self.stats.drafts_proposed, self.stats.drafts_accepted
            a = accepted / proposed if proposed >= 8 else recorded
            survivor_step = step_ms.get(str(progressive_target(progressive, name, view, self.params)), 0.0)
            if round_ms is not None and survivor_step > 0:
                # measured: a round (draft, then verification, one after the other, over the
                # network) costs round_ms / survivor_step of the survivor's decode steps
                cost = SpeculationCost(a, draft_step=0.0, verify_step=max(1.0, round_ms / survivor_step))
            else:
                cost = SpeculationCost(acceptance=a)  # the policy's model, until measured
            (decision,) = progressive.decide((Recovering(name, draft_ready=True),), view, self.params, cost)
            survivor = decision.assist
            live = list(self._live.items())
            mine = [(r, v) for r, v in live if v[0] == survivor and v[4]] if survivor is not None else []
            if decision.mode != "peer-verify" or survivor is None or not mine:
                now = time.monotonic()
                idle_since = idle_since or now
                if decision.mode == "idle" and now - idle_since > 2.0:
                    round_ms, idle_since = None, None  # measure again: the load may have changed
                await asyncio.sleep(0.05)
                continue
            idle_since = None
            items = []
            for rid, (_, prompt, received, max_tokens, _) in mine:
                now_tokens = known.get(rid) or prompt + list(received)
                items.append((rid, now_tokens, max_tokens - (len(now_tokens) - len(prompt))))
            started = time.perf_counter()
            try:
                drafts = await drafter.draft_for(items, k)
            except (InvalidRequestError, ServerUnavailableError):
                return  # the target is back (the draft evicted) or the drafter died
            if not drafts:
                await asyncio.sleep(0.02)
                continue
            base = {rid: len(now_tokens) for rid, now_tokens, _ in items}
            try:
                verdicts = await self.workers[survivor].verify_drafts(
                    [(rid, base[rid], d) for rid, d in drafts.items()]
                )
                load = await self.workers[survivor].load()
            except (InvalidRequestError, ServerUnavailableError):
                await asyncio.sleep(0.02)
                continue
            ms = (time.perf_counter() - started) * 1000.0
            round_ms = ms if round_ms is None else 0.7 * round_ms + 0.3 * ms
            if load.get("step_ms"):
                step_ms[survivor] = float(load["step_ms"])
            known = {rid: list(v["tokens"]) for rid, v in verdicts.items() if not v["finished"]}
            self.stats.assist_rounds += 1
            self.stats.drafts_proposed += sum(int(v["proposed"]) for v in verdicts.values())
            self.stats.drafts_accepted += sum(int(v["accepted"]) for v in verdicts.values())

    def describe(self) -> dict[str, Any]:
        live = [w for w in self.workers if w not in self.dead]
        return {
            "name": self.service,
            "mode": "llm",
            "state": "READY" if live else "UNAVAILABLE",
            "reason": "" if live else "no LLM worker is alive",
            "workers": list(self.workers),
            "dead": sorted(self.dead),
            "policy": self.policy_name,
            "in_flight": dict(self._outstanding),
        }


async def collect(events: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    """A whole generation: every token, then the last event's fields."""
    tokens: list[int] = []
    last: dict[str, Any] = {}
    async for event in events:
        tokens.extend(event.get("tokens", ()))
        if event.get("finished"):
            last = event
    return {"tokens": tokens, **last}


def progressive_target(progressive: Any, name: str, view: ClusterView, params: LlmParams) -> str | None:
    """The survivor ``progressive`` would have ``name`` assist (at any gain), for its step time."""
    from failsoft.policies.llm_recovery import Recovering, SpeculationCost

    free = SpeculationCost(acceptance=1.0, draft_step=0.0, verify_step=1.0)
    (decision,) = progressive.decide((Recovering(name, draft_ready=True),), view, params, free)
    return decision.assist


__all__ = ["LlmDispatcher", "LlmStats", "collect"]
