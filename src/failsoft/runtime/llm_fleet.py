"""The workers of an ``llm`` service, kept alive by the controller (LUMEN's restart, in production).

One :class:`LlmFleet` per ``llm`` service runs on the controller's event loop and owns its worker
actors (:class:`~failsoft.runtime.llm_worker.LlmWorker`):

* **start**: it builds the byte-level pair if needed, spawns one worker per member on its server
  (the node offering the server's resource) and ``spares`` *standbys* (process started, imports
  done, no model), and publishes the worker table once every worker serves;
* **detection**: every ``probe_s`` it asks each worker for its ``info``; a worker whose actor is
  gone (its process died, or its server was killed) is failed at once. The gateway's dispatcher,
  which sees a worker die under a request first, reports it (:meth:`LlmFleet.report_failed`) so
  that the restart does not wait for the next probe. A slow answer is not a failure;
* **restart**: a standby adopts the failed worker's name and loads its model (no process start, no
  imports), and a new standby is started in its place; with none left, a fresh process starts.
  Under a policy with progressive recovery (``lumen``) and a draft, the standby loads the draft
  first: the table then shows the worker in phase ``draft`` (the dispatcher has it draft for the
  most loaded survivor) until its target is back (phase ``serving``).

Failures, draft switches and recoveries are events (``llm-worker-failed``, ``llm-worker-draft``,
``llm-worker-recovered``) on the controller's event log, hence on the gateway's ``/v2/events``.
The table (:attr:`LlmFleet.table`, a versioned value the gateway long-polls) names each worker's
actor, server, phase, process and incarnation, and the standbys' servers and processes (chaos
kills a server's LLM processes with its agent).

A controller that dies takes its fleets' actors with it (Ray kills the actors an owner leaves); the
restarted controller starts them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from failsoft.clock import AsyncClock
from failsoft.errors import DeadlineExceededError, FailsoftError, ServerUnavailableError
from failsoft.runtime import cluster
from failsoft.runtime.llm_config import LlmServing
from failsoft.runtime.longpoll import VersionedValue
from failsoft.runtime.loop import StepRunner

log = logging.getLogger(__name__)
PROBE_S = 0.25
PROBE_TIMEOUT_S = 5.0
START_TIMEOUT_S = 600.0


class WorkerPhase(StrEnum):
    """A worker's life cycle: starting, serving its target, failed (restart under way), drafting
    (a restarted worker with only its draft loaded), serving again."""

    STARTING = "starting"
    SERVING = "serving"
    FAILED = "failed"
    DRAFT = "draft"


@dataclass(slots=True)
class _Worker:
    name: str
    server: str
    ref: cluster.LlmWorkerRef | None = None
    phase: WorkerPhase = WorkerPhase.STARTING
    pid: int | None = None
    incarnation: int = 0
    acceptance: float | None = None


@dataclass(slots=True)
class _Spare:
    server: str
    ref: cluster.LlmWorkerRef
    pid: int | None = None


class LlmFleet:
    """Starts, watches and restarts the workers of one ``llm`` service (see the module)."""

    def __init__(
        self,
        serving: LlmServing,
        clock: AsyncClock,
        emit: Callable[[str, dict[str, Any]], None],
        probe_s: float = PROBE_S,
        spawn: Callable[[str, str, Any], Any] | None = None,
        build: bool = True,
    ) -> None:
        """``spawn(name, server, spec)`` starts a worker actor (spec None: a standby) and returns
        its ref (default: a Ray actor; tests give fakes); ``build``: build the byte pair if needed."""
        from failsoft.policies import registry

        self.serving = serving
        self.clock = clock
        self.emit = emit
        self.probe_s = probe_s
        self.progressive = (
            registry.make("llm_recovery", serving.policy, serving.params).progressive is not None
        )
        self.workers = {
            w: _Worker(w, s) for w, s in zip(serving.service.members, serving.servers, strict=True)
        }
        self.spares: list[_Spare] = []
        self.model: dict[str, Any] = {}
        self.table = VersionedValue(self._snapshot())
        self.ready = asyncio.Event()
        self.steps = StepRunner(slow_s=PROBE_TIMEOUT_S)
        self._spawn = spawn or self._spawn_actor
        self._build = build
        self._restarts: dict[str, asyncio.Task[None]] = {}
        self._spare_turn = 0

    # the table --------------------------------------------------------------------------------
    def _snapshot(self) -> dict[str, Any]:
        return {
            "model": dict(self.model),
            "workers": {
                w.name: {
                    "ref": w.ref,
                    "server": w.server,
                    "phase": w.phase.value,
                    "pid": w.pid,
                    "incarnation": w.incarnation,
                    "acceptance": w.acceptance,
                }
                for w in self.workers.values()
            },
            "spares": [{"server": s.server, "pid": s.pid} for s in self.spares],
        }

    def _publish(self) -> None:
        self.table.publish(self._snapshot())

    # start ------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Start the workers (again after a second while that fails), then watch them until
        cancelled; a failed probe is logged and counted, and the loop goes on."""
        while not self.ready.is_set():
            try:
                await self._start()
            except Exception:
                log.exception("llm service %s could not start; retrying in 1 s", self.serving.name)
                await self.clock.sleep(1.0)
        while True:
            await self.steps.run("llm-probe", self._probe)
            await self.clock.sleep(self.probe_s)

    def _spec(self, worker: str) -> Any:
        from failsoft.runtime.llm_worker import LlmWorkerSpec

        s, e = self.serving, self.serving.engine
        return LlmWorkerSpec(
            worker,
            s.root,
            s.target_name(),
            s.device,
            e.kv_pages,
            e.page_size,
            e.max_batch,
            e.torch_threads,
            hf=s.hf,
            dtype=s.model.dtype,
        )

    def _spawn_actor(self, name: str, server: str, spec: Any) -> cluster.LlmWorkerRef:
        from failsoft.runtime.llm_worker import LlmWorker

        threads = self.serving.engine.torch_threads
        return cluster.spawn_llm_worker(
            LlmWorker, self.serving.name, name, spec, threads, server=server, placement=self.serving.placement
        )

    async def _start(self) -> None:
        if self._build:
            await asyncio.to_thread(self.serving.build)
        for w in self.workers.values():
            w.ref = self._spawn(w.name, w.server, self._spec(w.name))
        for server in self.serving.spare_servers:
            self._spawn_spare(server)
        infos = await asyncio.gather(*(self._info(w.ref, START_TIMEOUT_S) for w in self.workers.values()))
        for w, info in zip(self.workers.values(), infos, strict=True):
            w.phase, w.pid = WorkerPhase.SERVING, int(info["pid"])
        first = infos[0]
        self.model = {
            "name": first["model"],
            "context": int(first["context"]),
            "kv_mb_per_token": float(first["kv_mb_per_token"]),
            "fingerprint": first["fingerprint"],
        }
        self._publish()
        self.ready.set()
        self.emit("llm-service-ready", {"service": self.serving.name, "workers": list(self.workers)})

    def _spawn_spare(self, server: str | None = None) -> None:
        """A standby (returns at once: its process starts and imports meanwhile)."""
        if server is None:
            servers = self.serving.spare_servers or self.serving.servers
            server = servers[self._spare_turn % len(servers)]
            self._spare_turn += 1
        spare = _Spare(server, self._spawn("spare", server, None))
        self.spares.append(spare)
        task = asyncio.get_running_loop().create_task(self._note_spare(spare))
        self._restarts[f"spare-{id(spare)}"] = task
        task.add_done_callback(lambda _: self._restarts.pop(f"spare-{id(spare)}", None))

    async def _note_spare(self, spare: _Spare) -> None:
        """A standby's process, once it is up (chaos kills it with its server)."""
        with contextlib.suppress(FailsoftError):  # a dead standby is replaced when used
            spare.pid = int((await self._info(spare.ref, START_TIMEOUT_S))["pid"])
            self._publish()

    @staticmethod
    async def _info(ref: cluster.LlmWorkerRef | None, timeout_s: float) -> dict[str, Any]:
        if ref is None:
            raise ServerUnavailableError("no worker")
        return await ref.info(timeout_s=timeout_s)

    # detection ----------------------------------------------------------------------------------
    async def _probe(self) -> None:
        watched = [w for w in self.workers.values() if w.phase in (WorkerPhase.SERVING, WorkerPhase.DRAFT)]
        results = await asyncio.gather(
            *(self._info(w.ref, PROBE_TIMEOUT_S) for w in watched), return_exceptions=True
        )
        for w, result in zip(watched, results, strict=True):
            if isinstance(result, ServerUnavailableError):
                self.report_failed(w.name, w.incarnation, str(result))
            elif isinstance(result, DeadlineExceededError):
                log.info("llm worker %s answers slowly: %s", w.name, result)

    def report_failed(self, worker: str, incarnation: int, reason: str) -> bool:
        """``worker`` (in ``incarnation``) is dead: restart it, unless that is already under way
        (or it is another incarnation). True when this starts a restart."""
        w = self.workers.get(worker)
        if w is None or w.incarnation != incarnation or w.phase in (WorkerPhase.FAILED, WorkerPhase.STARTING):
            return False
        if w.phase is WorkerPhase.DRAFT:
            return False  # the adopting standby is checked when its target is awaited
        w.phase = WorkerPhase.FAILED
        self._publish()
        self.emit(
            "llm-worker-failed",
            {"service": self.serving.name, "worker": worker, "server": w.server, "reason": reason},
        )
        task = asyncio.get_running_loop().create_task(self._restart(w))
        self._restarts[worker] = task
        task.add_done_callback(lambda _: self._restarts.pop(worker, None))
        return True

    def forget_server(self, server: str) -> None:
        """Standbys on a dead server are gone too (found when one is asked to adopt, at the latest)."""
        self.spares = [s for s in self.spares if s.server != server]

    # restart ------------------------------------------------------------------------------------
    async def _restart(self, w: _Worker) -> None:
        while True:  # never silent, never given up
            try:
                await self._restart_once(w)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("restart of llm worker %s failed; retrying in 1 s", w.name)
                await self.clock.sleep(1.0)

    async def _restart_once(self, w: _Worker) -> None:
        failed_at = self.clock.now()
        spec = self._spec(w.name)
        draft = self.serving.draft_name() if self.progressive else None
        delay = self.serving.restart_delay_ms
        while True:
            try:
                ref, server = await self._adopt(spec, draft, delay, w, failed_at)
                break
            except FailsoftError as exc:  # nothing could start: try again shortly
                log.warning("restart of llm worker %s failed: %s; retrying", w.name, exc)
                await self.clock.sleep(1.0)
        info = await self._info(ref, 10.0)
        w.ref, w.server, w.phase, w.pid = ref, server, WorkerPhase.SERVING, int(info["pid"])
        self._publish()
        self.emit(
            "llm-worker-recovered",
            {
                "service": self.serving.name,
                "worker": w.name,
                "server": server,
                "restart_ms": round((self.clock.now() - failed_at) * 1000.0, 1),
                "load_ms": info.get("load_ms"),
                "draft_first": draft is not None,
            },
        )

    async def _adopt(
        self, spec: Any, draft: str | None, delay: float, w: _Worker, failed_at: float
    ) -> tuple[cluster.LlmWorkerRef, str]:
        """A standby takes the worker's name (draft first under progressive recovery), else a fresh
        process; the actor and its server once its target serves."""
        while self.spares:
            spare = self.spares.pop(0)
            self._spawn_spare()
            try:
                first = await spare.ref.adopt(spec, draft, delay, timeout_s=START_TIMEOUT_S)
                if draft is not None:
                    w.incarnation += 1
                    w.ref, w.server, w.phase = spare.ref, spare.server, WorkerPhase.DRAFT
                    w.acceptance = first.get("acceptance")
                    self._publish()
                    self.emit(
                        "llm-worker-draft",
                        {
                            "service": self.serving.name,
                            "worker": w.name,
                            "server": spare.server,
                            "draft_ms": round((self.clock.now() - failed_at) * 1000.0, 1),
                        },
                    )
                    await spare.ref.wait_target(START_TIMEOUT_S)
                else:
                    w.incarnation += 1
                return spare.ref, spare.server
            except ServerUnavailableError as exc:  # the standby died too: the next one
                log.warning("standby for %s unavailable: %s", w.name, exc)
        server = next((s for s in self.serving.servers if s != w.server), w.server)
        ref = self._spawn(w.name, server, spec)
        await self._info(ref, START_TIMEOUT_S)
        w.incarnation += 1
        return ref, server

    async def close(self) -> None:
        for task in list(self._restarts.values()):
            task.cancel()


__all__ = ["LlmFleet", "WorkerPhase"]
