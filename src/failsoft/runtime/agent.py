"""The agent: one per server, in its own process, holding the server's models (FailLite 4).

FailLite's agent sits on each edge server next to Triton: it loads and unloads model variants from
the server's local model repository (the *cold* replicas are the files on disk), the server answers
inference with whatever is loaded, and the agent pushes a keep-alive to the controller every 20 ms.
failsoft's agent is a Ray actor doing the same with :class:`failsoft.zoo.ModelRepository`:

* :meth:`Agent.load` loads ``family/variant`` for an app (up to a first answer, as the zoo's
  profiler times a load), accounting the variant's profiled
  ``memory_mb`` against the server's configured capacity; a load that would exceed it is refused
  (:class:`~failsoft.errors.CapacityError`) before any byte is read. Loads run in parallel threads;
  a load already done is a no-op, so the controller may safely repeat one.
  Before a load returns, the model answers a few warm-up inferences (Triton's ``model_warmup``: at
  batch 1 and at the serving queue's max batch), so the first request routed to it costs the
  model's usual latency, not a first call's kernel selection and allocations. A *recovery* load
  (not ``background``) of a zoo model returns after the first of them (the batch-1 answer: what
  the first request needs) and runs the rest after its route is published, at the lowest priority
  (:mod:`failsoft.runtime.deferred`); and it builds no module skeleton when one was prepared ahead
  (:mod:`failsoft.zoo.skeletons`: the agent keeps one of each family's smallest variant, the first
  one a progressive failover loads, and replaces it after each load).
* :meth:`Agent.infer` queues a request on the model's serving queue (:mod:`failsoft.runtime.serving`:
  one queue and one worker thread per loaded model, batching, deadlines, admission, cancellation by
  :meth:`Agent.cancel`) and waits for its answer; :meth:`Agent.set_slow` injects latency into every
  batch and, optionally, into model loads (``failsoft chaos slow``). A model is held by reference
  while it answers: an unload lets its running batch finish and answers its queued requests
  :class:`~failsoft.errors.ModelNotLoadedError`, which the gateway retries elsewhere.
* its sidecar (:mod:`failsoft.runtime.pulse`) pushes a heartbeat datagram to the controller every
  ``interval_s`` while this process is alive, running, and refreshing its liveness stamp from a
  background thread; the datagram carries the server's name and *incarnation*. The incarnation is
  new in every process, so the controller can tell a restarted server (it holds nothing) from one that
  hung and came back (it still holds its models). A hung process (SIGSTOP) stops heartbeating, which
  is how it is detected; a killed one (SIGKILL) stops everything.
* on a GPU (:mod:`failsoft.runtime.devices`) it loads on the device Ray granted it (``cuda:N`` of
  the config mapped to its index among the visible GPUs), creates its CUDA context while it starts,
  before the first heartbeat (so a restarted server's first load does not pay it), refuses a load
  the device has no free memory for, and reports device memory as the device does
  (:meth:`Agent.info`'s ``device``: free, total, this process's use with its context). Where its
  start's time goes (process, imports, CUDA context) is in :meth:`Agent.info`'s ``startup``.

The class is plain Python: :mod:`failsoft.runtime.cluster` turns it into an actor.
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from failsoft.domain import Server, Variant
from failsoft.errors import CapacityError, ConfigError, ModelNotLoadedError, OverloadedError, ServingError
from failsoft.orchestration.loads import BACKGROUND_NICE, LOAD_NICE, load_nice
from failsoft.policies import registry
from failsoft.policies.queueing import QueueParams, ServiceModel, warmup_budget_ms, warmup_sizes
from failsoft.runtime import devices, telemetry
from failsoft.runtime.agent_metrics import AgentMetrics
from failsoft.runtime.deferred import Deferred, warm_rest
from failsoft.runtime.heartbeat import HeartbeatEndpoint
from failsoft.runtime.load_phases import LoadPhases
from failsoft.runtime.priority import lower_niceness
from failsoft.runtime.pulse import Pulse
from failsoft.runtime.serving import ServingQueue, calibrated, warm_up
from failsoft.zoo.formats.model import import_code as import_user_code
from failsoft.zoo.loaded import LoadedModel
from failsoft.zoo.skeletons import Skeletons, skeleton_targets
from failsoft.zoo.state import Stateful

log = logging.getLogger(__name__)
SWITCH_INTERVAL_S = 0.001  # the liveness thread gets the interpreter within ~1 ms (default 5 ms)
# An interpreter silent this long stops the heartbeats (see failsoft.runtime.pulse). Not shorter:
# with both cores oversubscribed, the stamp thread was measured waiting up to ~0.5 s for the GIL
# behind a loading thread, which is a busy server, not a failed one; and the GIL's holder may be a
# background load thread (warm backups, upgrades: nice +15) that a busy host hardly runs (the stamp
# thread, at nice -10, then waits on it: a priority inversion), so on a host shared with other work
# (load average 14-16 on two cores) waits of seconds are a busy server too. At 2 s, such a wait
# declared a healthy server failed and "up again" 53 ms later. A stopped or dead process is caught
# at once by other means (the sidecar reads /proc); this only covers an interpreter wedged while its
# process runs, which is rare, so it may be detected in 10 s rather than 40 ms.
WEDGE_S = 10.0
# CPU priorities on a shared machine, as offsets from the agent's own niceness: answering first,
# then loads that recover apps, then background loads (upgrades, warm backups). Lowering needs no
# privilege; raising would, hence offsets (Ray starts its workers at nice 15 unless told otherwise).
# The values live in orchestration.loads, where the simulator's shared CPU reads them too.
UNLOAD_DRAIN_S = 20.0  # an unload waits this long for the model's running batch before returning
SPARE_SERVING_THREADS = 4  # Ray threads kept free to refuse requests fast when the rest are waiting


@dataclass(frozen=True, slots=True)
class AgentSpec:
    server: Server
    repository: Path
    heartbeat: HeartbeatEndpoint
    heartbeat_interval_s: float = 0.020
    device: str = "auto"  # auto, cpu, cuda or cuda:N (the machine's numbering)
    families: tuple[str, ...] = ()  # the families it may serve (warmed up at start); () = all
    torch_threads: int = 1  # torch's intra-op threads per agent; 0 = one per core of the host
    queue: QueueParams = field(default_factory=QueueParams)  # each loaded model's serving queue
    telemetry: telemetry.TelemetrySettings = field(default_factory=telemetry.TelemetrySettings)


@dataclass(slots=True)
class _Held:
    model: Any  # failsoft.zoo.LoadedModel
    memory_mb: float
    load_ms: float
    queue: ServingQueue
    load_cpu_ms: float = 0.0  # the loading thread's own CPU time: load_ms minus it is waiting for a core
    phases: dict[str, Any] = field(default_factory=dict)  # where the load's time went (load_phases)


class Agent:
    """A server's agent. Thread-safe: Ray runs its methods on a pool of threads."""

    def __init__(self, spec: AgentSpec) -> None:
        from failsoft.runtime.cluster import SERVING_THREADS, SERVING_THREADS_ENV, configure_actor_logging
        from failsoft.zoo import ModelRepository

        init_at = time.time()
        configure_actor_logging(fmt=spec.telemetry.log_format, component=f"agent {spec.server.name}")
        telemetry.configure(spec.telemetry, "failsoft-agent")
        self.spec = spec
        self.server = spec.server
        self._metrics = AgentMetrics(spec.server.name, self._metrics_snapshot)
        self.incarnation = uuid.uuid4().hex[:12]
        self.started_at = time.time()
        self._repo = ModelRepository(spec.repository)
        self._profiles = {(f.name, v.name): v for f in self._repo.families() for v in f.variants}
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], _Held] = {}
        self._loading: dict[tuple[str, str], threading.Event] = {}
        self._recovering = 0  # recovery (not background) loads running: deferred work waits for them
        self._skeletons = Skeletons()
        self._deferred = Deferred(spec.server.name, lambda: self._recovering > 0, BACKGROUND_NICE)
        self._reserved_mb = 0.0
        self._releasing_mb = 0.0  # unloaded models whose last batch is still running
        self._loads_total = 0
        self._loads_cpu_ms = 0.0  # every load's thread CPU, summed (what recoveries cost the host)
        self._in_flight = 0  # infer calls holding one of Ray's serving threads
        self._serving_threads = int(os.environ.get(SERVING_THREADS_ENV, SERVING_THREADS))  # Ray's group
        self._slow_s = 0.0
        self._slow_load_s = 0.0
        self._broken = False  # injected: every inference fails (failsoft chaos break)
        self._infer_calls, self._infer_s = 0, 0.0  # admitted calls, and their time in this process
        try:
            self._device: str | None = devices.local_device(spec.device)
            self._device_error: str | None = None
        except ConfigError as exc:  # refused at load, where the controller hears of it
            self._device, self._device_error = None, f"server {spec.server.name!r}: {exc}"
        self.startup: dict[str, float] = {"process_started_at": _process_started_at(), "init_at": init_at}
        self.warmup_ms = self.startup["imports_ms"] = self._warm_up()
        self._cuda = self._device_error is None and devices.uses_cuda(self._device)
        self.startup["cuda_context_ms"] = self._init_cuda()
        self.startup["ready_at"] = time.time()
        gc.freeze()  # the imports' ~400k objects leave the collector: no 400 ms pauses on unload
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._data_plane, self._data_plane_error = self._serve_data_plane()
        families = spec.families or self._repo.family_names()
        self._skeleton_targets = skeleton_targets(((f, v) for (f, _), v in self._profiles.items()), families)
        for family, variant in self._skeleton_targets:
            self._deferred.submit("skeleton", self._prepare_skeleton, family, variant)
        hb = spec.heartbeat
        self._pulse = Pulse(
            hb.host, hb.port, hb.key, spec.server.name, self.incarnation, spec.heartbeat_interval_s, WEDGE_S,
            watch_host=self._data_plane.host if self._data_plane is not None else None,
        ).start()  # fmt: skip

    def _warm_up(self) -> float:
        """Import torch and the families' modeling code now, before heartbeats start.

        A first load would otherwise pay seconds of imports (not FailLite's load time), while
        holding the interpreter long enough to starve the heartbeat thread. The imported objects are
        then frozen out of the garbage collector, whose full passes over them take hundreds of
        milliseconds: long enough for two missed heartbeats.
        """
        started = time.perf_counter()
        import torch

        from failsoft.zoo import hf

        torch.set_num_threads(threads_for(self.spec.torch_threads))

        for family in self.spec.families or self._repo.family_names():
            variants = self._repo.variant_names(family)
            if variants:
                config = self._repo.config(family, variants[0])
                if config.arch == "transformers":
                    hf.import_model_class(config.architecture)
            for variant in variants:  # a user's family may mix formats: each one's library
                config = self._repo.config(family, variant)
                if config.model_format != "builtin":
                    import_user_code(self._repo.variant_dir(family, variant), config)
        return (time.perf_counter() - started) * 1000.0

    def _serve_data_plane(self) -> tuple[Any, str | None]:
        """The data plane's socket (:mod:`failsoft.runtime.dataplane`), on this node's address;
        (None, why) when it cannot bind: the gateway then calls over Ray."""
        from failsoft.runtime.cluster import node_address
        from failsoft.runtime.dataplane import DataPlaneServer

        try:
            server = DataPlaneServer(self, node_address())
            server.start()
            return server, None
        except Exception as exc:
            log.warning("server %s: no data plane (%s); inference goes over Ray", self.server.name, exc)
            return None, f"{type(exc).__name__}: {exc}"

    def data_plane(self) -> dict[str, Any]:
        """Where this agent serves inference (the gateway asks once per connection)."""
        endpoint = None if self._data_plane is None else self._data_plane.endpoint
        return {
            "endpoint": endpoint,
            "incarnation": self.incarnation,
            "error": self._data_plane_error,
            "watch": self._pulse.watch,  # the sidecar's: it tells of this process's death at once
        }

    def _init_cuda(self) -> float:
        """The CUDA context, now: its milliseconds (0 on the CPU, or when it fails: the first load
        then reports why)."""
        if not self._cuda:
            return 0.0
        try:
            return devices.init_cuda(self._device)
        except Exception as exc:
            log.warning("server %s: CUDA context not created at start: %s", self.server.name, exc)
            return 0.0

    # models ----------------------------------------------------------------------------------
    def load(self, app: str, family: str, variant: str, background: bool = False) -> dict[str, Any]:
        """Load ``family/variant`` for ``app`` (idempotent); returns what the gateway needs to know.

        Loads run in a thread of lower CPU priority than inference (answers of recovered apps come
        first on a busy machine), and ``background`` loads (upgrades, warm backups) lower still, so
        they also yield to the loads that recover apps; a recovery load of a few milliseconds' work
        runs here at the agent's own priority (``load_nice``: it would wait longer for its turn than
        it works). The model's serving queue starts here, in this thread, whose priority its worker
        inherits: inference runs at the agent's own.
        """
        key = (app, variant)
        profile = self._profile_of(family, variant)
        memory = profile.memory_mb
        phases = LoadPhases()
        with phases.phase("reserve"):
            step, event = self._reserve(key, family, variant, memory)
        if step != "load":  # already held, or the same load is running in another thread
            event.wait()
            return self._describe(key, cached=True)
        started = time.perf_counter()
        with self._lock:
            self._recovering += not background
        try:
            nice = load_nice(profile, background)
            model, service, later = _run_at_priority(
                nice, self._read, family, profile, phases, started, background
            )
            with phases.phase("serving_queue"):
                queue = self._serving_queue(app, variant, model, service)
        except BaseException:
            with self._lock:
                self._reserved_mb -= memory
                self._recovering -= not background
                self._loading.pop(key).set()
            raise
        load_ms = (time.perf_counter() - started) * 1000.0
        cpu_ms = phases.cpu_ms("read", "warm_up")
        with self._lock:
            self._reserved_mb -= memory
            self._held[key] = _Held(model, memory, load_ms, queue, cpu_ms, phases.report())
            self._loads_total += 1
            self._loads_cpu_ms += cpu_ms
            self._recovering -= not background
            self._loading.pop(key).set()
        self._metrics.loaded(family, variant, load_ms / 1000.0)
        if later:  # after the reply and the route: the warm-up the first answer did not need
            self._deferred.submit("warm_up", warm_rest, model, queue, later)
        if (family, variant) in self._skeleton_targets:  # the next load of it finds one again
            self._deferred.submit("skeleton", self._prepare_skeleton, family, variant)
        return self._describe(key, cached=False)

    def _prepare_skeleton(self, family: str, variant: str) -> None:
        config = self._repo.config(family, variant)
        if config.model_format == "builtin":  # a user's format has no skeleton to build ahead
            self._skeletons.build(config)

    def _read(
        self, family: str, profile: Variant, phases: LoadPhases, handed_at: float, background: bool
    ) -> tuple[Any, ServiceModel, tuple[int, ...]]:
        """Disk to a model that answers its first request at its usual speed. Returns the model, its
        service time (calibrated by the warm-up when it ran here) and the warm-up's batch sizes left
        for after the route (a recovery load of a zoo model runs only the batch-1 first answer
        here: :func:`defers_warm_up`). ``phases`` gets the hand-over to this thread (``start``:
        from ``handed_at``), the read (an injected slow disk included; ``skeleton``: whether one
        prepared ahead was used) and the warm-up, each with this thread's CPU and waits (torch runs
        one thread per agent: its compute is counted)."""
        phases.gap("start", handed_at)
        with phases.phase("read"):
            if self._slow_load_s > 0:  # injected: a slow disk or a remote repository
                time.sleep(self._slow_load_s)
            if self._device_error is not None:
                raise ConfigError(self._device_error)
            skeleton = self._skeletons.take(self._repo.config(family, profile.name))
            model = self._repo.load(family, profile.name, self._device, skeleton)
        phases.note("skeleton", "prepared" if skeleton is not None else "built")
        with phases.phase("warm_up"):
            service = ServiceModel(profile)
            sizes = warmup_sizes(service, self.spec.queue.max_batch, warmup_budget_ms(profile.load_ms))
            now, later = (sizes[:1], sizes[1:]) if defers_warm_up(model, background) else (sizes, ())
            service = calibrated(service, warm_up(model.predict, model.input_shape, now))
            if isinstance(model, Stateful):  # warm-up inferences are no requests: from the initial state
                model.reset()
        phases.note("warm_up_sizes", ",".join(map(str, now)))  # batch sizes answered before the route
        phases.note("warm_up_after_route", ",".join(map(str, later)))
        return model, service, later

    def _serving_queue(self, app: str, variant: str, model: Any, service: ServiceModel) -> ServingQueue:
        params = self.spec.queue
        discipline = registry.make("queueing", params.discipline, params.max_batch, params.max_queue)
        queue = ServingQueue(
            f"{self.server.name}/{app}/{variant}",
            model.predict,
            model.input_shape,
            discipline,
            service,
            delay_s=self._delay_s,
            on_batch=self._metrics.batch_observer(app, variant),
        )
        return queue.start()

    def _delay_s(self) -> float:
        return self._slow_s

    def _reserve(
        self, key: tuple[str, str], family: str, variant: str, memory: float
    ) -> tuple[str, threading.Event]:
        """Claim memory for a load: ("load", event), or ("wait", event) / ("held", set event)."""
        with self._lock:
            if key in self._loading:
                return "wait", self._loading[key]
            if key in self._held:
                done = threading.Event()
                done.set()
                return "held", done
            free = self.server.memory_mb - self._used_mb() - self._reserved_mb
            if memory > free + 1e-9:
                raise CapacityError(
                    f"server {self.server.name!r}: loading {family}/{variant} for {key[0]!r} needs "
                    f"{memory:g} MB, only {max(free, 0):g} of {self.server.memory_mb:g} MB free"
                )
            self._check_device_free(key, family, variant, memory)
            self._reserved_mb += memory
            event = self._loading[key] = threading.Event()
            return "load", event

    def _check_device_free(self, key: tuple[str, str], family: str, variant: str, memory: float) -> None:
        """On a GPU, the device's own free memory (other processes, this one's CUDA context and
        allocator cache all take from it) must also hold the load, less the loads under way."""
        if not self._cuda:
            return
        import torch

        free_mb = torch.cuda.mem_get_info(self._device)[0] / 2**20 - self._reserved_mb
        if memory > free_mb + 1e-9:
            raise CapacityError(
                f"server {self.server.name!r}: loading {family}/{variant} for {key[0]!r} needs "
                f"{memory:g} MB, the device ({self._device or 'cuda'}) has {max(free_mb, 0):.0f} MB free"
            )

    def _profile_of(self, family: str, variant: str) -> Variant:
        profile = self._profiles.get((family, variant))
        if profile is None:  # profiled since this agent started
            profile = self._profiles[(family, variant)] = self._repo.variant(family, variant)
        return profile

    def _used_mb(self) -> float:
        """Memory of the models held, and of unloaded ones still finishing their last batch."""
        return sum(h.memory_mb for h in self._held.values()) + self._releasing_mb

    def _describe(self, key: tuple[str, str], cached: bool) -> dict[str, Any]:
        with self._lock:
            held = self._held.get(key)
        if held is None:
            raise ServingError(f"server {self.server.name!r}: load of {key[1]!r} for {key[0]!r} failed")
        m = held.model
        return {
            "app": key[0],
            "variant": key[1],
            "server": self.server.name,
            "load_ms": 0.0 if cached else held.load_ms,
            "load_cpu_ms": 0.0 if cached else held.load_cpu_ms,
            "phases": {} if cached else held.phases,
            "cached": cached,
            "memory_mb": held.memory_mb,
            "input_shape": list(m.input_shape),
            "num_classes": int(m.num_classes),
            "device": str(m.device),
        }

    def unload(self, app: str, variant: str) -> bool:
        """Drop a model; False when it was not held.

        New requests for it are refused at once and queued ones are answered ModelNotLoadedError;
        the batch running finishes first (up to :data:`UNLOAD_DRAIN_S`), then the weights are freed.
        Its memory stays accounted until they are.
        """
        with self._lock:
            held = self._held.pop((app, variant), None)
            if held is None:
                return False
            self._releasing_mb += held.memory_mb
        if held.queue.close(UNLOAD_DRAIN_S):
            self._release(held)
        else:  # a batch longer than the drain: free the weights when it ends, not under it
            log.warning("unload of %s/%s: a batch is still running; freeing it afterwards", app, variant)
            threading.Thread(target=self._release_after, args=(held,), daemon=True).start()
        return True

    def _release(self, held: _Held) -> None:
        try:
            held.model.close()
        finally:
            with self._lock:
                self._releasing_mb -= held.memory_mb

    def _release_after(self, held: _Held) -> None:
        held.queue.close()
        self._release(held)

    def cancel(self, request_id: str) -> bool:
        """Withdraw a queued request; False when it is not queued (done, running or unknown)."""
        with self._lock:
            queues = [h.queue for h in self._held.values()]
        return any(queue.cancel(request_id) for queue in queues)

    def infer(
        self,
        app: str,
        variant: str,
        batch: np.ndarray,
        timeout_s: float | None = None,
        request_id: str | None = None,
        sent_at: float | None = None,
        meta: dict[str, str] | None = None,
    ) -> np.ndarray:
        """Answer ``batch`` through the model's serving queue, within ``timeout_s`` (None: no deadline).

        ``sent_at`` (wall-clock seconds) is when the caller sent it: the time the call took to get
        here is taken off ``timeout_s`` (under a burst, the gateway's event loop and Ray's queues
        were measured holding calls for a quarter of a second). Refused at once
        (:class:`~failsoft.errors.OverloadedError`) when the queue cannot answer in time, or when
        nearly all of Ray's serving threads already wait on answers. ``meta`` is the call's
        per-request metadata (the trace context: :func:`failsoft.runtime.telemetry.serve`).
        """
        entered = time.perf_counter()
        timeout_s = self._time_left(app, variant, timeout_s, sent_at)
        with self._lock:
            held = self._held.get((app, variant))
            busy = self._in_flight >= self._serving_threads - SPARE_SERVING_THREADS
            if held is not None and not busy:
                self._in_flight += 1
        if held is None:
            raise ModelNotLoadedError(f"server {self.server.name!r} does not hold {variant!r} for {app!r}")
        if busy:
            raise OverloadedError(
                f"server {self.server.name!r}: {self._in_flight} requests already waiting", 0.05
            )
        try:
            return telemetry.serve(held.queue, batch, timeout_s, request_id, meta, self._where(app, variant))
        finally:
            with self._lock:
                self._in_flight -= 1
                self._infer_calls += 1
                self._infer_s += time.perf_counter() - entered

    def submit_infer(
        self,
        app: str,
        variant: str,
        batch: np.ndarray,
        timeout_s: float | None = None,
        request_id: str | None = None,
        sent_at: float | None = None,
        meta: dict[str, str] | None = None,
        wake: bool = True,
    ) -> concurrent.futures.Future[np.ndarray]:
        """The data plane's :meth:`infer`: queue ``batch`` and return the future its answer will
        complete (in the queue's worker thread, or the caller's: :meth:`run_queued`), with no thread
        waiting on it. Refusals, a model not held and bad input are raised here, at once. ``meta``:
        the call's per-request metadata (plain strings), as the header carried it. ``wake`` False:
        the caller calls :meth:`run_queued` once it has queued what it read."""
        entered = time.perf_counter()
        timeout_s = self._time_left(app, variant, timeout_s, sent_at)
        with self._lock:
            held = self._held.get((app, variant))
        if held is None:
            raise ModelNotLoadedError(f"server {self.server.name!r} does not hold {variant!r} for {app!r}")
        try:
            future: concurrent.futures.Future[np.ndarray] = telemetry.submit(
                held.queue, batch, timeout_s, request_id, meta, self._where(app, variant), wake
            )
        except BaseException:
            self._count_call(entered)
            raise
        future.add_done_callback(lambda _: self._count_call(entered))
        return future

    def run_queued(self) -> None:
        """Run what :meth:`submit_infer` queued with ``wake`` False: in the calling thread when a
        queue's worker is idle and its model quick, else in its worker
        (:meth:`~failsoft.runtime.serving.ServingQueue.run_here`)."""
        with self._lock:
            queues = [h.queue for h in self._held.values()]
        for queue in queues:
            queue.run_here()

    def _where(self, app: str, variant: str) -> dict[str, str]:
        """The span attributes of a call to this agent (for telemetry.serve and telemetry.submit)."""
        return {"failsoft.server": self.server.name, "failsoft.app": app, "failsoft.variant": variant}

    def _time_left(
        self, app: str, variant: str, timeout_s: float | None, sent_at: float | None
    ) -> float | None:
        """``timeout_s`` less the time the call took to get here; refuses a broken server's work."""
        if self._broken:
            raise ServingError(
                f"server {self.server.name!r} failed to compute {variant!r} for {app!r} "
                "(injected fault: failsoft chaos break)"
            )
        if timeout_s is not None and sent_at is not None:  # clocks of two machines: never below 0
            timeout_s -= min(max(time.time() - sent_at, 0.0), timeout_s)
        return timeout_s

    def _count_call(self, entered: float) -> None:
        with self._lock:
            self._infer_calls += 1
            self._infer_s += time.perf_counter() - entered

    # stateful models (HAMS) ------------------------------------------------------------------
    def state(self, app: str, variant: str) -> bytes:
        """The state of a stateful model held for ``app`` as bytes (:meth:`ModelState.to_bytes`:
        arrays, model id and ``seq``, the requests it folded in), taken atomically between requests."""
        return bytes(self._stateful(app, variant).state().to_bytes())

    def apply_state(self, app: str, variant: str, data: bytes) -> int:
        """Swap ``data`` (another copy's :meth:`state`) in, atomically; returns its ``seq``. A state
        of another model is refused (:class:`~failsoft.errors.StateMismatchError`)."""
        model = self._stateful(app, variant)
        model.apply_state(data)
        return int(model.seq)

    def _stateful(self, app: str, variant: str) -> Stateful:
        """The held model's state interface (the zoo's stateful models and users' stateful handlers)."""
        with self._lock:
            held = self._held.get((app, variant))
        if held is None:
            raise ModelNotLoadedError(f"server {self.server.name!r} does not hold {variant!r} for {app!r}")
        if not isinstance(held.model, Stateful):
            raise ServingError(f"server {self.server.name!r}: {variant!r} for {app!r} has no state")
        return held.model

    # reports and chaos -----------------------------------------------------------------------
    def holdings(self) -> dict[str, Any]:
        with self._lock:
            models = sorted(self._held)
            used = self._used_mb()
        return {
            "server": self.server.name,
            "incarnation": self.incarnation,
            "models": [list(k) for k in models],
            "used_mb": used,
            "memory_mb": self.server.memory_mb,
            "loads_total": self._loads_total,
            "loads_cpu_ms": round(self._loads_cpu_ms, 3),
            "pid": os.getpid(),
        }

    def info(self) -> dict[str, Any]:
        return {
            "server": self.server.name,
            "site": self.server.site,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "incarnation": self.incarnation,
            "started_at": self.started_at,
            "sidecar_pid": self._pulse.sidecar.pid if self._pulse.sidecar else None,
            "slow_ms": self._slow_s * 1000.0,
            "slow_load_ms": self._slow_load_s * 1000.0,
            "torch_threads": _torch_threads(),
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "queues": self.queue_stats(),
            "startup": dict(self.startup),
            "skeletons": self._skeletons.stats(),  # prepared ahead of loads (failsoft.zoo.skeletons)
            "deferred": self._deferred.stats(),  # warm-ups and skeletons left for after (runtime.deferred)
            "device": self.device_report(),
            # admitted infer calls and their summed time here, entry to return (the request path's
            # agent phase; the queues split it into wait, batch, predict and answer)
            "infer_calls": self._infer_calls,
            "infer_s": self._infer_s,
        }

    def metrics(self) -> bytes:
        """This agent's Prometheus figures as text (:mod:`failsoft.runtime.agent_metrics`)."""
        return self._metrics.render()

    def _metrics_snapshot(self) -> dict[str, Any]:
        import psutil

        with self._lock:
            models = {key: h.memory_mb for key, h in self._held.items()}
            accounted = self._used_mb()
        return {
            "queues": self.queue_stats(),
            "models_mb": models,
            "budget_mb": self.server.memory_mb,
            "accounted_mb": accounted,
            "rss_bytes": float(psutil.Process().memory_info().rss),
            "device": devices.device_memory(self._device) if self._cuda else None,
        }

    def device_report(self) -> dict[str, Any]:
        """The device models load on and its memory as the device reports it, beside what this
        agent accounts (profiled ``memory_mb`` of what it holds), and what Ray granted."""
        from failsoft.runtime.cluster import granted_resources

        with self._lock:
            accounted = self._used_mb()
        report: dict[str, Any] = {
            "configured": self.spec.device,
            "torch_device": self._device,
            "error": self._device_error,
            "visible": os.environ.get(devices.VISIBLE_ENV),
            "accounted_mb": round(accounted, 1),
            "memory": devices.device_memory(self._device) if self._cuda else {"cuda": False},
        }
        try:
            report["granted"] = granted_resources()
        except Exception as exc:  # an agent outside Ray (tests that build one in their process)
            report["granted"] = {"error": f"{type(exc).__name__}: {exc}"}
        return report

    def queue_stats(self) -> dict[str, dict[str, Any]]:
        """Each loaded model's serving queue (``app/variant``): counters, calibration, worker niceness."""
        with self._lock:
            held = dict(self._held)
        return {f"{app}/{variant}": h.queue.stats() for (app, variant), h in sorted(held.items())}

    def load_cpu_share(self, seconds: float = 0.3) -> float:
        """The share of a core a recovery load would get here now: a thread at the loads' priority
        spins for ``seconds`` and reports its CPU time over its wall time. It meets what a load
        meets (the host's other work, this process's inference at a higher priority, the
        interpreter lock), so the simulator's twin of a run can be given the host as it was."""
        seconds = min(max(float(seconds), 0.01), 5.0)
        return float(_run_at_priority(LOAD_NICE, _spin_share, seconds))

    def set_slow(self, ms: float, load_ms: float | None = None) -> None:
        """Add ``ms`` milliseconds to every batch a serving queue runs and, if given, ``load_ms`` to
        every model load (a slow disk); 0 restores normal speed. Admission counts it in."""
        self._slow_s = max(float(ms), 0.0) / 1000.0
        if load_ms is not None:
            self._slow_load_s = max(float(load_ms), 0.0) / 1000.0

    def set_broken(self, broken: bool) -> None:
        """Fail every inference (``True``) while heartbeats go on: a server that is up but does not
        serve, which only the gateway's app-level health can see; ``False`` mends it."""
        self._broken = bool(broken)

    def evict(self, app: str) -> list[str]:
        """Lose every variant held for ``app`` while the server lives on (``failsoft chaos evict``:
        a model runtime that crashed, an out-of-memory eviction). The controller is not told: it
        learns of it from the gateway's next call for it (ModelNotLoadedError) or from its periodic
        inspection of what the server holds. The variants dropped (empty: none was held)."""
        with self._lock:
            variants = sorted(v for a, v in self._held if a == app)
        log.warning("chaos: %s loses its models of %s (%s)", self.server.name, app, ", ".join(variants))
        return [v for v in variants if self.unload(app, v)]

    def shutdown(self) -> None:
        """Unload every model and stop the heartbeat sidecar (an agent living in a test's process)."""
        with self._lock:
            keys = list(self._held)
        for app, variant in keys:
            self.unload(app, variant)
        self._pulse.stop()
        self._deferred.close()
        if self._data_plane is not None:
            self._data_plane.close()

    def crash(self) -> None:
        """Die at once, like a server losing power (used where the caller cannot signal the process)."""
        os.kill(os.getpid(), signal.SIGKILL)


def defers_warm_up(model: Any, background: bool) -> bool:
    """Whether a load leaves its warm-up beyond the first answer for after its route: a recovery
    load (its app waits for the route) of a zoo model without state. A stateful model's warm-up
    must end before it serves (it is reset after it), and a user's handler is not known to answer
    two calls at once; background loads (warm backups, upgrades) have no app waiting on them."""
    return not background and type(model) is LoadedModel


def _process_started_at() -> float:
    """When this process started (wall clock): a restart's time before the agent's code ran."""
    import psutil

    return float(psutil.Process().create_time())


def threads_for(torch_threads: int) -> int:
    """Torch's intra-op thread count for the ``agents.torch_threads`` setting (0: one per core)."""
    return torch_threads if torch_threads > 0 else max(os.cpu_count() or 1, 1)


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _spin_share(seconds: float) -> float:
    """Spin in Python for ``seconds`` of wall time; the CPU this thread got, per second."""
    cpu, wall = time.thread_time(), time.perf_counter()
    while time.perf_counter() - wall < seconds:
        sum(range(200))
    return (time.thread_time() - cpu) / max(time.perf_counter() - wall, 1e-9)


def _run_at_priority(nice: int, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, in a fresh thread ``nice`` steps below this one when ``nice > 0`` (else here).

    Lowering a thread's priority needs no privilege, raising it back would: hence a throwaway thread.
    """
    if nice <= 0:
        return fn(*args)
    result: list[Any] = []
    error: list[BaseException] = []

    def work() -> None:
        lower_niceness(nice)  # below the calling thread, whose priority this one inherited
        try:
            result.append(fn(*args))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=work, name="background-load", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
