"""The worker executor of an ``llm`` service: the core's commands for its workers, carried out with Ray.

The orchestration core places an ``llm`` service's workers as member apps, counts their memory,
fails them and decides every restart (:mod:`failsoft.orchestration.llm`). One :class:`LlmFleet`
per service, on the controller's event loop, does what it is told and reports back; it decides
nothing:

* :class:`~failsoft.orchestration.commands.StartLlmWorker`: with ``standby``, a standby on that
  server adopts the worker's name (no process start, no imports; the draft first when the command
  says so), else a new process starts there (a restart's: a standby process, which then adopts, so
  that the draft-first path and the emulated reload delay are the same); reported
  with ``started(..., phase)`` (``draft`` or ``serving``) or ``start_failed``;
* :class:`~failsoft.orchestration.commands.SwitchLlmTarget`: waits until the drafting worker's
  target is loaded (it then serves it), reported as ``started(..., "serving")``;
* :class:`~failsoft.orchestration.commands.StopLlmWorker`: cancels that incarnation's start and
  ends its actor; :class:`~failsoft.orchestration.commands.StartLlmStandby`: a standby process
  (imports done, no target; with ``draft``, the draft loaded, so that a draft-first restart that
  adopts it drafts at once); :class:`~failsoft.orchestration.commands.PublishLlm`: the worker table.

It also gives the core the proof that a worker is gone: every ``probe_s`` it asks each serving
worker for its ``info``, and an actor that is gone (its process died, or its server was killed) is
reported at once (``died``); a slow answer is not a failure. The gateway's dispatcher, which sees a
worker die under a request first, reports to the core the same way (the controller's
``llm_failed``).

The table (:attr:`LlmFleet.table`, a versioned value the gateway long-polls) is the core's records
(server, phase, incarnation) with this executor's actors and processes: each worker's actor, server,
phase, process and incarnation, and the standbys' servers and processes (chaos kills a server's LLM
processes with its agent). A controller that dies takes its fleets' actors with it (Ray kills the
actors an owner leaves); the restarted controller places the service again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from failsoft.clock import AsyncClock
from failsoft.errors import DeadlineExceededError, FailsoftError, ServerUnavailableError
from failsoft.orchestration.commands import (
    LlmCommand,
    PublishLlm,
    StartLlmStandby,
    StartLlmWorker,
    StopLlmWorker,
    SwitchLlmTarget,
)
from failsoft.orchestration.llm_state import LlmGroup, LlmPhase, LlmWorkerRecord
from failsoft.runtime import cluster
from failsoft.runtime.llm_config import LlmServing
from failsoft.runtime.longpoll import VersionedValue
from failsoft.runtime.loop import StepRunner

log = logging.getLogger(__name__)
PROBE_S = 0.25
PROBE_TIMEOUT_S = 5.0
START_TIMEOUT_S = 600.0


class LlmReports(Protocol):
    """What the executor tells the core (the controller feeds each to the core at its clock's now)."""

    def started(
        self, service: str, worker: str, incarnation: int, phase: str, info: dict[str, Any]
    ) -> None: ...

    def start_failed(self, service: str, worker: str, incarnation: int, error: str) -> None: ...

    def died(self, service: str, worker: str, incarnation: int, reason: str) -> bool: ...

    def standby_lost(self, service: str, server: str, reason: str) -> None: ...


@dataclass(slots=True)
class _Proc:
    ref: cluster.LlmWorkerRef
    server: str
    pid: int | None = None
    acceptance: float | None = None


@dataclass(slots=True)
class _Spare:
    server: str
    ref: cluster.LlmWorkerRef
    pid: int | None = None
    draft: str | None = None  # the draft it holds, once loaded
    preload_ms: float | None = None


class LlmFleet:
    """Carries out the core's commands for one ``llm`` service's workers (see the module)."""

    def __init__(
        self,
        serving: LlmServing,
        clock: AsyncClock,
        reports: LlmReports,
        records: Callable[[], list[LlmWorkerRecord]],
        probe_s: float = PROBE_S,
        spawn: Callable[[str, str, Any], Any] | None = None,
        build: bool = True,
    ) -> None:
        """``records()``: the core's records of this service's workers; ``spawn(name, server,
        spec)`` starts a worker actor (spec None: a standby) and returns its ref (default: a Ray
        actor; tests give fakes); ``build``: build the byte pair if needed."""
        from failsoft.policies import registry

        self.serving = serving
        self.clock = clock
        self.reports = reports
        self.records = records
        self.probe_s = probe_s
        self.progressive = (
            registry.make("llm_recovery", serving.policy, serving.params).progressive is not None
        )
        self.procs: dict[tuple[str, int], _Proc] = {}  # (worker, incarnation)
        self.spares: list[_Spare] = []
        self.model: dict[str, Any] = {}
        self.table = VersionedValue(self._snapshot())
        self.ready = asyncio.Event()
        self.steps = StepRunner(slow_s=PROBE_TIMEOUT_S)
        self._spawn = spawn or self._spawn_actor
        self._build = build
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def name(self) -> str:
        return self.serving.name

    # the table --------------------------------------------------------------------------------
    def _snapshot(self) -> dict[str, Any]:
        workers = {}
        for rec in self.records():
            proc = self.procs.get((rec.worker, rec.incarnation))
            workers[rec.worker] = {
                "ref": None if proc is None else proc.ref,
                "server": rec.server,
                "phase": rec.phase.value,
                "pid": None if proc is None else proc.pid,
                "incarnation": rec.incarnation,
                "acceptance": None if proc is None else proc.acceptance,
            }
        return {
            "model": dict(self.model),
            "workers": workers,
            "spares": [
                {"server": s.server, "pid": s.pid, "draft": s.draft, "preload_ms": s.preload_ms}
                for s in self.spares
            ],
        }

    def publish(self) -> None:
        snap = self._snapshot()
        self.table.publish(snap)
        phases = [w["phase"] for w in snap["workers"].values()]
        if phases and all(p == LlmPhase.SERVING.value for p in phases):
            self.ready.set()

    # start: what the core places -----------------------------------------------------------------
    async def prepare(self) -> LlmGroup:
        """Build the byte pair if needed (seconds for ``tiny``), then the service as the core places
        it (each worker's memory from the model's files)."""
        if self._build:
            await asyncio.to_thread(self.serving.build)
        return await asyncio.to_thread(self.serving.group, self.progressive)

    async def run(self) -> None:
        """Probe the workers until cancelled; a failed probe is logged and counted, the loop goes on."""
        while True:
            await self.steps.run("llm-probe", self._probe)
            await self.clock.sleep(self.probe_s)

    # commands -------------------------------------------------------------------------------------
    def execute(self, command: LlmCommand) -> None:
        """Carry out one of the core's commands for this service (returns at once)."""
        if isinstance(command, StartLlmWorker):
            self._task(f"{command.worker}#{command.incarnation}", self._start(command))
        elif isinstance(command, SwitchLlmTarget):
            self._task(f"{command.worker}#{command.incarnation}", self._switch(command))
        elif isinstance(command, StopLlmWorker):
            self._stop(command)
        elif isinstance(command, StartLlmStandby):
            self._spawn_spare(command.server, command.draft)
        elif isinstance(command, PublishLlm):
            self.publish()

    def _task(self, key: str, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._tasks.pop(key, None) if self._tasks.get(key) is t else None)

    async def _start(self, cmd: StartLlmWorker) -> None:
        spec = self._spec(cmd.worker)
        draft = self.serving.draft_name() if cmd.draft_first else None
        spare = self._take_spare(cmd.server) if cmd.standby else None  # the one the core counted
        ref: cluster.LlmWorkerRef | None = None
        try:
            if spare is None and draft is None and cmd.incarnation == 0:
                ref = self._spawn(cmd.worker, cmd.server, spec)  # a first start: the model at once
                first: dict[str, Any] = {}
            else:
                ref = spare.ref if spare is not None else self._spawn("spare", cmd.server, None)
                delay = self.serving.restart_delay_ms
                first = await ref.adopt(spec, draft, delay, timeout_s=START_TIMEOUT_S)
            info = await self._info(ref, START_TIMEOUT_S)
        except asyncio.CancelledError:
            if ref is not None:
                ref.kill()
            raise
        except FailsoftError as exc:
            if ref is not None:
                ref.kill()
            self.reports.start_failed(self.name, cmd.worker, cmd.incarnation, str(exc))
            return
        proc = _Proc(ref, cmd.server, int(info["pid"]), first.get("acceptance"))
        self.procs[(cmd.worker, cmd.incarnation)] = proc
        self._note_model(info)
        phase = LlmPhase.DRAFT if draft is not None else LlmPhase.SERVING
        self.reports.started(
            self.name, cmd.worker, cmd.incarnation, phase.value, {"load_ms": info.get("load_ms")}
        )

    async def _switch(self, cmd: SwitchLlmTarget) -> None:
        proc = self.procs.get((cmd.worker, cmd.incarnation))
        try:
            if proc is None:
                raise ServerUnavailableError(f"llm worker {cmd.worker!r} #{cmd.incarnation}: no process")
            await proc.ref.wait_target(START_TIMEOUT_S)
            info = await self._info(proc.ref, 10.0)
        except FailsoftError as exc:
            self.reports.start_failed(self.name, cmd.worker, cmd.incarnation, str(exc))
            return
        self.reports.started(
            self.name, cmd.worker, cmd.incarnation, "serving", {"load_ms": info.get("load_ms")}
        )

    def _stop(self, cmd: StopLlmWorker) -> None:
        task = self._tasks.pop(f"{cmd.worker}#{cmd.incarnation}", None)
        if task is not None:
            task.cancel()
        proc = self.procs.pop((cmd.worker, cmd.incarnation), None)
        if proc is not None:
            proc.ref.kill()  # gone already, or replaced: it must not serve on

    def _note_model(self, info: dict[str, Any]) -> None:
        if not self.model and "context" in info:
            self.model = {
                "name": info["model"],
                "context": int(info["context"]),
                "kv_mb_per_token": float(info["kv_mb_per_token"]),
                "fingerprint": info["fingerprint"],
            }

    # standbys -------------------------------------------------------------------------------------
    def _spawn_spare(self, server: str, draft: bool = False) -> None:
        """A standby (returns at once: its process starts and imports meanwhile; with ``draft``,
        it then loads the service's draft)."""
        spare = _Spare(server, self._spawn("spare", server, None))
        self.spares.append(spare)
        name = self.serving.draft_name() if draft else None
        self._task(f"spare-{id(spare)}", self._note_spare(spare, name))

    async def _note_spare(self, spare: _Spare, draft: str | None) -> None:
        """A standby's process, once it is up (chaos kills it with its server), and its draft once
        loaded. A restart may adopt it meanwhile: its adopt waits for the draft's load."""
        try:
            spare.pid = int((await self._info(spare.ref, START_TIMEOUT_S))["pid"])
            self.publish()
            if draft is not None:
                info = await spare.ref.preload_draft(self._spec("standby"), draft, START_TIMEOUT_S)
                spare.draft, spare.preload_ms = info.get("draft"), info.get("preload_ms")
        except FailsoftError as exc:
            if spare in self.spares:  # not taken by a restart meanwhile (its adopt wins then)
                log.warning("llm standby on %s did not start: %s", spare.server, exc)
                self._lose_spare(spare, f"did not start: {exc}")
        self.publish()

    def _lose_spare(self, spare: _Spare, reason: str) -> None:
        """A standby gone: out of the pool, and the core told (it counts standbys and replaces
        them), so that both keep the same standbys."""
        with contextlib.suppress(ValueError):
            self.spares.remove(spare)
            self.reports.standby_lost(self.name, spare.server, reason)

    def _take_spare(self, server: str) -> _Spare | None:
        for spare in self.spares:
            if spare.server == server:
                self.spares.remove(spare)
                return spare
        return None

    # detection ------------------------------------------------------------------------------------
    async def _probe(self) -> None:
        # a record without a process of this executor's is a stored one (a resumed controller's)
        watched = [
            (r, p)
            for r in self.records()
            if r.phase in (LlmPhase.SERVING, LlmPhase.DRAFT)
            and (p := self.procs.get((r.worker, r.incarnation))) is not None
        ]
        results = await asyncio.gather(
            *(self._info(p.ref, PROBE_TIMEOUT_S) for _, p in watched), return_exceptions=True
        )
        for (rec, _), result in zip(watched, results, strict=True):
            if isinstance(result, ServerUnavailableError):
                self.reports.died(self.name, rec.worker, rec.incarnation, str(result))
            elif isinstance(result, DeadlineExceededError):
                log.info("llm worker %s answers slowly: %s", rec.worker, result)
        await self._probe_spares()

    async def _probe_spares(self) -> None:
        """A standby that died (with its server, mostly) leaves the pool and the core is told
        (:meth:`_lose_spare`); a start the core sent to its server meanwhile starts a new process."""
        up = [s for s in self.spares if s.pid is not None]
        results = await asyncio.gather(
            *(self._info(s.ref, PROBE_TIMEOUT_S) for s in up), return_exceptions=True
        )
        dead = [(s, r) for s, r in zip(up, results, strict=True) if isinstance(r, ServerUnavailableError)]
        for spare, error in dead:
            self._lose_spare(spare, str(error))  # unless taken by a start meanwhile
        if dead:
            self.publish()

    @staticmethod
    async def _info(ref: cluster.LlmWorkerRef | None, timeout_s: float) -> dict[str, Any]:
        if ref is None:
            raise ServerUnavailableError("no worker")
        return await ref.info(timeout_s=timeout_s)

    # actors -----------------------------------------------------------------------------------------
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

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()


__all__ = ["LlmFleet", "LlmReports"]
