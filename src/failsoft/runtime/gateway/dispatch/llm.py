"""The ``llm`` dispatcher: LUMEN's request path over the LLM workers of one service.

It serves the same :class:`~.interface.Dispatcher` contract as every mode, on the gateway's event
loop and its injected clock, and is the service's :class:`~failsoft.runtime.gateway.llm_backend.LlmBackend`:
token ids in (the gateway tokenizes with the model's tokenizer), token events out. Its endpoints
(Triton's ``generate`` / ``generate_stream``) are :mod:`failsoft.runtime.gateway.llm_routes`.

* **Workers** are the controller's (:class:`~failsoft.runtime.llm_fleet.LlmFleet`): the dispatcher
  long-polls their table (actor, server, phase, incarnation). A worker that dies under a request is
  reported to the controller, which restarts it (a warm standby adopts its name); the table then
  brings it back. A restarted worker in phase ``draft`` (LUMEN's progressive recovery) drafts for
  the most loaded survivor (:meth:`LlmDispatcher.assist`) until its target serves.
* **Routing**: join-shortest-queue over the serving workers, by the requests this gateway has in
  flight on each (ties to the first in the service's order).
* **Streaming**: a request is submitted to its worker and its output long-polled; every poll that
  brings tokens is yielded to the caller.
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
  greedy decoding the text is the one a run without the failure gives. Each is an event
  (``llm-request-recovered``) on ``/v2/events``.
* **Cancellation**: when the caller stops iterating (the client left), the request is cancelled on
  its worker (its KV pages are freed) and its checkpoint dropped.

Decisions are the policies' (:mod:`failsoft.policies.llm_recovery`, by name); this module is
mechanism: calls, polls, shipping, retries.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from failsoft.errors import (
    ConfigError,
    FailsoftError,
    InvalidRequestError,
    NoRouteError,
    ServerUnavailableError,
)
from failsoft.policies import registry
from failsoft.policies.llm_recovery import (
    CheckpointLedger,
    ClusterView,
    Interrupted,
    WorkerLoad,
)
from failsoft.runtime.gateway.dispatch.interface import Answer, DispatchContext, Dispatcher, Request
from failsoft.runtime.loop import spawn
from failsoft.services import LlmParams, Service, ServiceMode

if TYPE_CHECKING:
    from fastapi import APIRouter

    from failsoft.llm.tokens import Tokenizer

log = logging.getLogger(__name__)
POLL_WAIT_S = 5.0
TABLE_WAIT_S = 30.0
MAX_PROMPT_TOKENS = 1 << 20


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
    # per restart seen in the worker table, on the dispatcher's clock: failed, draft, serving
    restarts: list[dict[str, Any]] = field(default_factory=list)
    # per recovered request: restored or recomputed, and on the clock when it was routed
    # (``routed_at``) and when its next token came (``next_token_at``): where a replay's time goes
    recoveries: list[dict[str, Any]] = field(default_factory=list)


class LlmDispatcher(Dispatcher):
    """Streams generations over the workers of one ``llm`` service with its recovery policy."""

    mode = ServiceMode.LLM

    def __init__(self, service: Service, context: DispatchContext) -> None:
        super().__init__(service, context)
        serving = context.llm.get(service.name)
        if serving is None:
            raise ConfigError(f"llm service {service.name!r} has no settings in the dispatch context")
        assert isinstance(service.params, LlmParams)
        self.serving = serving
        self.params: LlmParams = service.params
        self.policy_name = serving.policy
        self.policy = registry.make("llm_recovery", serving.policy, service.params)
        self._tokenizer: Tokenizer = serving.tokenizer()
        self.workers: dict[str, Any] = {}  # name -> LlmWorkerRef, in ring order
        self._table: dict[str, dict[str, Any]] = {}
        self._spares: list[dict[str, Any]] = []
        self.model: dict[str, Any] = {}
        self.dead: set[str] = set(service.members)  # until the table says they serve
        self._outstanding = dict.fromkeys(service.members, 0)
        self.ledger = CheckpointLedger(1e-6, self.params.checkpoint_budget_mb)  # sized with the model
        self._ids = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._assisting: dict[str, asyncio.Task[None]] = {}
        self._shipping: dict[str, asyncio.Task[None]] = {}
        # request id -> (worker, prompt tokens, tokens received so far, max_tokens, greedy):
        # what a drafting peer needs to draft for the requests of a survivor
        self._live: dict[str, tuple[str, list[int], list[int], int, bool]] = {}
        self._changed = asyncio.Event()
        self.stats = LlmStats()

    # ------------------------------------------------------------------ the backend seam
    @property
    def backend(self) -> LlmServiceBackend:
        """This service as the OpenAI endpoints see it (an ``LlmBackend``, ``gateway/llm_backend.py``)."""
        return LlmServiceBackend(self)

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def context_tokens(self) -> int:
        """The model's context in tokens (0 until the workers first serve)."""
        return int(self.model.get("context", 0))

    @property
    def kv_mb_per_token(self) -> float:
        return float(self.model.get("kv_mb_per_token", 0.0))

    # ------------------------------------------------------------------ the dispatch contract
    async def dispatch(self, request: Request) -> Answer:
        raise InvalidRequestError(
            f"{self.service.name!r} is an llm service: send it generate or generate_stream requests"
        )

    def front_app(self) -> str | None:
        return None

    @classmethod
    def http_routes(cls, dispatchers: Mapping[str, Dispatcher]) -> APIRouter | None:
        from failsoft.runtime.gateway.llm_routes import llm_router

        return llm_router({n: d.backend for n, d in dispatchers.items() if isinstance(d, LlmDispatcher)})

    async def start(self) -> None:
        self._spawn(self._follow(), f"llm-table-{self.service.name}")

    async def close(self) -> None:
        tasks = [*self._tasks, *self._assisting.values(), *self._shipping.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        return spawn(coro, name, self._tasks)

    def processes_on(self, server: str) -> list[int]:
        pids = [w.get("pid") for w in self._table.values() if w.get("server") == server]
        pids += [s.get("pid") for s in self._spares if s.get("server") == server]
        return [int(p) for p in pids if p is not None]

    def worker_figures(self) -> dict[str, Callable[[], Awaitable[bytes]]]:
        return {name: ref.metrics for name, ref in self.workers.items()}

    # ------------------------------------------------------------------ the worker table
    async def _follow(self) -> None:
        """Mirror the controller's worker table (long-poll), for as long as the gateway runs."""
        epoch, version = "", -1
        while True:
            try:
                snap = await self.context.fleet.wait_llm(self.service.name, epoch, version, TABLE_WAIT_S)
            except FailsoftError as exc:
                log.warning("llm service %s: worker table: %s", self.service.name, exc)
                await self.context.clock.sleep(0.5)
                continue
            if snap.get("value") is not None and (snap["epoch"], snap["version"]) != (epoch, version):
                self._apply(snap["value"])
            epoch, version = snap["epoch"], snap["version"]

    def _apply(self, table: Mapping[str, Any]) -> None:
        """A new worker table: revive restarted workers, fail the failed, assist with drafts."""
        if table.get("model") and not self.model:
            self.model = dict(table["model"])
            self.ledger = CheckpointLedger(self.kv_mb_per_token, self.params.checkpoint_budget_mb)
        now = self.context.clock.now()
        for name, w in table["workers"].items():
            before = self._table.get(name, {})
            phase, incarnation = w["phase"], w["incarnation"]
            if phase != before.get("phase"):
                self._note_phase(name, phase, now)
            if phase == "serving":
                if name in self.dead or incarnation != before.get("incarnation"):
                    self._revive(name, w["ref"])
            else:
                self._lose(name)
            if phase == "draft" and name not in self._assisting and w["ref"] is not None:
                stop = self._drafting_ends(name, incarnation)
                task = self._spawn(self.assist(name, w["ref"], stop, w.get("acceptance")), f"assist-{name}")
                self._assisting[name] = task
                task.add_done_callback(functools.partial(self._assisted, name))
        self._table = {n: dict(w) for n, w in table["workers"].items()}
        self._spares = list(table.get("spares", ()))
        self._changed.set()
        self._changed = asyncio.Event()

    def _assisted(self, worker: str, task: asyncio.Task[Any]) -> None:
        self._assisting.pop(worker, None)

    def _drafting_ends(self, worker: str, incarnation: int) -> Callable[[], bool]:
        """Whether ``worker``'s drafting (in ``incarnation``) is over: its target serves, or it died."""

        def ended() -> bool:
            w = self._table.get(worker, {})
            return w.get("phase") != "draft" or w.get("incarnation") != incarnation

        return ended

    def _note_phase(self, worker: str, phase: str, now: float) -> None:
        if phase == "failed":
            self.stats.restarts.append({"worker": worker, "failed": now, "draft": None, "serving": None})
            return
        mine = [r for r in self.stats.restarts if r["worker"] == worker]
        if mine and phase in ("draft", "serving") and mine[-1][phase] is None:
            mine[-1][phase] = now

    def _revive(self, worker: str, ref: Any) -> None:
        """A (re)started ``worker`` (a fresh engine: no request, no checkpoint) serves."""
        self.workers[worker] = ref
        self._outstanding.setdefault(worker, 0)
        self.dead.discard(worker)

    def _lose(self, worker: str) -> None:
        if worker not in self.dead:
            self.dead.add(worker)
            for request in self.ledger.lose_holder(worker):
                log.info("checkpoint of %s lost with its holder %s", request, worker)

    def mark_dead(self, worker: str, reason: str = "its actor is gone") -> None:
        """A worker died under a request: stop routing to it, and have the controller restart it."""
        if worker in self.dead:
            return
        self._lose(worker)
        incarnation = int(self._table.get(worker, {}).get("incarnation", 0))
        self._spawn(self._report(worker, incarnation, reason), f"llm-report-{worker}")

    async def _report(self, worker: str, incarnation: int, reason: str) -> None:
        try:
            await self.context.fleet.llm_failed(self.service.name, worker, incarnation, reason)
        except FailsoftError as exc:  # the controller's own probe finds it anyway
            log.warning("could not report llm worker %s: %s", worker, exc)

    # ------------------------------------------------------------------ routing
    def view(self) -> ClusterView:
        return ClusterView(
            tuple(
                WorkerLoad(
                    name, self._outstanding[name], self.ledger.held_mb(name), alive=name not in self.dead
                )
                for name in self.service.members
            )
        )

    async def pick(self, deadline: float) -> str:
        """Join the shortest queue among the serving workers; while none serves (all restarting),
        wait for the table until ``deadline``."""
        while True:
            live = [w for w in self.service.members if w not in self.dead]
            if live:
                return min(live, key=lambda w: self._outstanding[w])
            left = deadline - self.context.clock.now()
            if left <= 0:
                raise NoRouteError(f"llm service {self.service.name!r}: no worker is serving")
            changed = self._changed
            waiter = asyncio.ensure_future(changed.wait())
            try:
                await asyncio.wait([waiter], timeout=min(left, 0.5))
            finally:
                waiter.cancel()

    def ready(self) -> bool:
        return any(w not in self.dead for w in self.service.members)

    # ------------------------------------------------------------------ requests
    def check(self, tokens: Sequence[int], sampling: Mapping[str, Any]) -> tuple[list[int], dict[str, Any]]:
        """The prompt's tokens and the sampling fields, or InvalidRequestError naming the value."""
        from failsoft.runtime.llm_worker import sampling_params

        if not self.model:
            raise NoRouteError(f"llm service {self.service.name!r} is starting: no worker serves yet")
        if len(tokens) > MAX_PROMPT_TOKENS:
            raise InvalidRequestError(f"the prompt has {len(tokens)} tokens; at most {MAX_PROMPT_TOKENS}")
        ids = [int(t) for t in tokens]
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        fields = dict(sampling)
        params = sampling_params(fields)
        if len(ids) > self.context_tokens:
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens, longer than the model's context of {self.context_tokens}"
            )
        if len(ids) + params.max_tokens > self.context_tokens:
            raise InvalidRequestError(
                f"prompt of {len(ids)} tokens + max_tokens {params.max_tokens} exceeds the model's "
                f"context of {self.context_tokens}"
            )
        return ids, fields

    def generate(
        self, tokens: Sequence[int], sampling: Mapping[str, Any], request_id: str | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Events of one generation: ``{"tokens": [...]}`` as they come, then a last one with
        ``finished`` true, the finish ``reason``, ``ttft_ms``, ``tpot_ms``, ``worker``,
        ``recoveries`` and ``output_tokens``. Bad input raises here, before anything is sent."""
        ids, fields = self.check(tokens, sampling)
        self._ids += 1
        return self._generate(ids, fields, request_id or f"{self.service.name}-{self._ids}")

    async def _generate(
        self, tokens: list[int], fields: dict[str, Any], rid: str
    ) -> AsyncGenerator[dict[str, Any], None]:
        clock = self.context.clock
        started = clock.now()
        received: list[int] = []
        times: list[float] = []
        recoveries = 0
        resumed: dict[str, Any] | None = None  # the last recovery, until its next token comes
        finished = False
        while True:  # a worker that died before anyone noticed: the next shortest queue
            worker = await self.pick(started + 60.0)
            try:
                await self.workers[worker].submit(rid, tokens, fields)
                break
            except ServerUnavailableError as exc:
                self.mark_dead(worker, str(exc))
        self._outstanding[worker] += 1
        max_tokens = int(fields.get("max_tokens", 16))
        greedy = float(fields.get("temperature", 0.0) or 0.0) == 0.0
        self._live[rid] = (worker, tokens, received, max_tokens, greedy)
        try:
            while True:
                try:
                    got = await self.workers[worker].poll(rid, len(received), POLL_WAIT_S)
                except ServerUnavailableError as exc:
                    self.mark_dead(worker, str(exc))
                    recoveries += 1
                    self.stats.recovered += 1
                    await self._shipped(rid)
                    old, worker = worker, await self._recover(rid, worker, tokens, received, fields)
                    resumed = next((r for r in reversed(self.stats.recoveries) if r["request"] == rid), None)
                    self._outstanding[old] -= 1
                    self._outstanding[worker] += 1
                    self._live[rid] = (worker, tokens, received, max_tokens, greedy)
                    continue
                new = [int(t) for t in got["tokens"]]
                if new:
                    now = clock.now()
                    received.extend(new)
                    times.extend([now] * len(new))
                    if resumed is not None:
                        resumed["next_token_at"], resumed = now, None
                    yield {"tokens": new}
                if got["finished"]:
                    finished = True
                    yield self._finished(got["reason"], started, times, worker, recoveries, len(received))
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
            self._spawn(self._cleanup(rid, worker, finished), f"llm-cleanup-{rid}")

    def _finished(
        self, reason: str, started: float, times: list[float], worker: str, recoveries: int, n: int
    ) -> dict[str, Any]:
        ttft = (times[0] - started) * 1000 if times else None
        tpot = (times[-1] - times[0]) * 1000 / (len(times) - 1) if len(times) > 1 else None
        if ttft is not None:
            self.stats.ttft_ms.append(ttft)
        if tpot is not None:
            self.stats.tpot_ms.append(tpot)
        return {
            "finished": True,
            "reason": reason,
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "worker": worker,
            "recoveries": recoveries,
            "output_tokens": n,
        }

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
        except FailsoftError as exc:
            # no answer in time: the worker may have exported pages the holder never got, so the
            # checkpoint is dropped and the next ship places it again from its first page
            log.info("checkpoint of %s dropped: export: %s", rid, exc)
            self.ledger.release(rid)
            await self._drop_checkpoint_on(entry.holder, rid)
            return
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
        if route.worker is None:  # every worker is down: wait for a restart
            try:
                await self.pick(self.context.clock.now() + 120.0)
            except NoRouteError:
                self.stats.failed += 1
                raise
            return await self._recover(rid, failed, prompt, received, fields)
        everything = prompt + received
        if route.restore and entry is not None:
            try:
                out = await self.workers[route.worker].restore(rid, everything, fields)
                self.ledger.release(rid)
                self.stats.restored += 1
                self.stats.recomputed_tokens += context - int(out.get("restored_tokens", 0))
                log.info("%s: %s failed; restored on %s (%s)", rid, failed, route.worker, route.reason)
                self._recovered(
                    rid, failed, str(route.worker), True, context - int(out.get("restored_tokens", 0))
                )
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
        try:
            await self.workers[target].submit(rid, everything, fields, len(prompt))
        except ServerUnavailableError as exc:  # that one died too: route again
            self.mark_dead(target, str(exc))
            return await self._recover(rid, failed, prompt, received, fields)
        self.stats.recomputed_tokens += context
        log.info("%s: %s failed; recomputed on %s (%s)", rid, failed, target, route.reason)
        self._recovered(rid, failed, target, False, context)
        return target

    def _recovered(self, rid: str, failed: str, worker: str, restored: bool, recomputed: int) -> None:
        self.stats.recoveries.append(
            {
                "request": rid,
                "restored": restored,
                "recomputed_tokens": recomputed,
                "routed_at": self.context.clock.now(),
                "next_token_at": None,
            }
        )
        self.context.event(
            {
                "type": "llm-request-recovered",
                "service": self.service.name,
                "request_id": rid,
                "failed": failed,
                "worker": worker,
                "restored": restored,
                "recomputed_tokens": recomputed,
            }
        )

    # ------------------------------------------------------------------ progressive restart
    async def assist(
        self, name: str, drafter: Any, stop: Callable[[], bool], acceptance: float | None = None
    ) -> None:
        """LUMEN's Alg. 3 while ``name`` recovers with only its draft (``llm_assist.assist``)."""
        from failsoft.runtime.gateway.dispatch.llm_assist import assist

        await assist(self, name, drafter, stop, acceptance)

    def describe(self) -> dict[str, Any]:
        live = [w for w in self.service.members if w not in self.dead]
        return {
            "state": "READY" if live else "UNAVAILABLE",
            "reason": "" if live else "no LLM worker serves",
            "workers": {
                n: {"server": w.get("server"), "phase": w.get("phase")} for n, w in self._table.items()
            },
            "dead": sorted(self.dead),
            "model": self.model.get("name"),
            "policy": self.policy_name,
            "in_flight": dict(self._outstanding),
        }


class LlmServiceBackend:
    """An ``llm`` service as an :class:`~failsoft.runtime.gateway.llm_backend.LlmBackend` (the
    OpenAI endpoints' seam): its dispatcher's tokenizer, context and generations."""

    def __init__(self, dispatcher: LlmDispatcher) -> None:
        self._d = dispatcher

    @property
    def model_id(self) -> str:
        return self._d.service.name

    @property
    def tokenizer(self) -> Tokenizer:
        return self._d.tokenizer

    @property
    def context(self) -> int:
        return self._d.context_tokens

    def generate(
        self, tokens: Sequence[int], sampling: Mapping[str, Any], request_id: str
    ) -> AsyncIterator[dict[str, Any]]:
        return self._d.generate(tokens, sampling, request_id)


async def collect(events: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    """A whole generation: every token, then the last event's fields."""
    tokens: list[int] = []
    last: dict[str, Any] = {}
    async for event in events:
        tokens.extend(event.get("tokens", ()))
        if event.get("finished"):
            last = event
    return {"tokens": tokens, **last}


__all__ = ["LlmDispatcher", "LlmServiceBackend", "LlmStats", "collect"]
