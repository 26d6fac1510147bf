"""The one wrapper that owns every Ray call (Ray Serve's ``ActorReplicaWrapper``).

Ray Core is failsoft's cluster substrate: one controller actor, one agent actor per server, each in
its own process. Nothing else in failsoft imports ``ray``: the controller, the agents and the gateway
hold :class:`AgentRef` / :class:`ControllerRef` objects from here, whose methods are plain ``async``
(or ``*_sync``) calls with a timeout, and whose failures are already failsoft errors:

* the actor's process is dead or restarting -> :class:`~failsoft.errors.ServerUnavailableError`;
* no answer before the timeout -> :class:`~failsoft.errors.DeadlineExceededError`;
* the remote method raised a failsoft error -> that same error, re-raised here;
* anything else the remote code raised -> :class:`~failsoft.errors.ServingError`.

Two modes. *Embedded* (the default): a private Ray instance on 127.0.0.1 that
offers one custom resource ``server:<name>`` per configured server, so agents are placed exactly as in
*cluster* mode (``--address``), where each agent is pinned to the node offering ``server:<name>``.
A server with a GPU share (:mod:`failsoft.runtime.devices`) asks Ray for it as ``num_gpus``; the
embedded node offers the GPUs Ray detects, or ``$FAILSOFT_NUM_GPUS`` (a number: also on a machine
without GPUs, where Ray then grants ids that no device backs, which is how the CPU tests check it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ray
import ray.exceptions as rex
from ray._private import auto_init_hook
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from failsoft.domain import Server
from failsoft.errors import (
    ConfigError,
    DeadlineExceededError,
    FailsoftError,
    ServerUnavailableError,
    ServingError,
)
from failsoft.orchestration.copies import CopyRequest
from failsoft.runtime.dataplane.link import DataPlaneLink, NoDataPlane, transport
from failsoft.runtime.devices import ON_CPU, Placement
from failsoft.runtime.raystart import start_embedded

# A Ray call made after shutdown (a straggling thread) must fail, not start a new Ray instance.
auto_init_hook.enable_auto_connect = False

NAMESPACE = "failsoft"
CONTROLLER_NAME = "failsoft-controller"
OBJECT_STORE_BYTES = 256 * 1024 * 1024
WORKER_NICENESS_ENV = "RAY_worker_niceness"  # read by the raylet an embedded ray.init starts
NUM_GPUS_ENV = "FAILSOFT_NUM_GPUS"  # the GPUs the embedded node offers (default: what Ray detects)
# An agent's inference calls wait on its serving queues in threads of their own, so that a backlog
# of answers never delays a load, an unload, a cancel or a status call (Ray's concurrency groups).
SERVING_GROUP = "serving"
SERVING_THREADS = 256
# With the data plane, inference does not wait in Ray's threads: the group only carries the calls of
# an agent that could not open its socket. Ray starts a group's threads with the actor, and 256 of
# them made a killed agent's teardown (hence its connection's end) take 70-140 ms here.
DATA_PLANE_SERVING_THREADS = 16
SERVING_THREADS_ENV = "FAILSOFT_SERVING_THREADS"  # tells the agent the size of its group
log = logging.getLogger(__name__)


def agent_name(server: str) -> str:
    return f"failsoft-agent-{server}"


def server_resource(server: str) -> str:
    return f"server:{server}"


# ----------------------------------------------------------------------------------------------
# Calls and their errors, mapped once.
# ----------------------------------------------------------------------------------------------


def _map_error(exc: BaseException, what: str, timeout_s: float | None) -> FailsoftError:
    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause
        if isinstance(cause, FailsoftError):
            return cause
        if isinstance(cause, rex.RayActorError):
            return ServerUnavailableError(f"{what}: unavailable ({type(cause).__name__})")
        return ServingError(f"{what} failed: {type(cause).__name__}: {cause}")
    if isinstance(exc, (rex.GetTimeoutError, asyncio.TimeoutError, TimeoutError)):
        return DeadlineExceededError(f"{what}: no answer within {(timeout_s or 0) * 1000:.0f} ms")
    if isinstance(exc, (rex.RayActorError, rex.ObjectLostError, rex.WorkerCrashedError, rex.RaySystemError)):
        return ServerUnavailableError(f"{what}: unavailable ({type(exc).__name__})")
    if isinstance(exc, ValueError) and "Failed to look up actor" in str(exc):
        return ServerUnavailableError(f"{what}: no such actor")
    return ServingError(f"{what} failed: {type(exc).__name__}: {exc}")


class _ActorRef:
    """A handle with failsoft's call conventions; subclasses name the methods."""

    def __init__(self, handle: Any, what: str, name: str) -> None:
        self._handle = handle
        self.what = what
        self.name = name  # the actor's name in Ray (freed a moment after a kill)

    async def _call(
        self, method: str, *args: Any, timeout_s: float | None = 10.0, group: str | None = None
    ) -> Any:
        try:
            remote = getattr(self._handle, method)
            ref = (remote.options(concurrency_group=group) if group else remote).remote(*args)
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise _map_error(exc, f"{self.what}.{method}", timeout_s) from exc

    def _call_sync(self, method: str, *args: Any, timeout_s: float | None = 10.0) -> Any:
        try:
            return ray.get(getattr(self._handle, method).remote(*args), timeout=timeout_s)
        except Exception as exc:
            raise _map_error(exc, f"{self.what}.{method}", timeout_s) from exc

    def _fire(self, method: str, *args: Any) -> None:
        """Send and forget (heartbeats): the result is never read, errors are dropped."""
        getattr(self._handle, method).remote(*args)

    def kill(self, no_restart: bool = True) -> None:
        """Stop the actor for good (shutdown), or let Ray restart it (``no_restart=False``)."""
        try:
            ray.kill(self._handle, no_restart=no_restart)
        except Exception as exc:  # already gone: nothing to stop
            log.debug("kill %s: %s", self.what, exc)


class AgentRef(_ActorRef):
    """The calls the controller, the gateway and chaos make to one server's agent."""

    def __init__(self, handle: Any, server: str) -> None:
        super().__init__(handle, f"server {server!r}", agent_name(server))
        self.server = server
        # inference travels over the agent's data plane (failsoft.runtime.dataplane), not Ray
        self.data_plane = DataPlaneLink(server, self.what, self._data_plane_info)
        self._transport = transport()

    @property
    def uses_data_plane(self) -> bool:
        """Inference goes over the data plane (``$FAILSOFT_DATA_PLANE`` is not ``ray``)."""
        return self._transport == "zmq" and not self.data_plane.absent

    async def _data_plane_info(self, timeout_s: float) -> dict[str, Any]:
        return dict(await self._call("data_plane", timeout_s=timeout_s))

    async def load(
        self, app: str, family: str, variant: str, background: bool = False, timeout_s: float = 600.0
    ) -> dict[str, Any]:
        return await self._call("load", app, family, variant, background, timeout_s=timeout_s)

    async def unload(self, app: str, variant: str, timeout_s: float = 30.0) -> bool:
        return await self._call("unload", app, variant, timeout_s=timeout_s)

    async def infer(
        self,
        app: str,
        variant: str,
        batch: Any,
        timeout_s: float,
        request_id: str | None = None,
        meta: dict[str, str] | None = None,
        transport: str | None = None,
    ) -> Any:
        """Answer ``batch`` within ``timeout_s`` (the request's time left, which the agent's serving
        queue turns into a deadline on its own clock, less the time the call took to reach it, from
        the wall-clock time it was sent); ``request_id`` lets :meth:`cancel_nowait` withdraw it from
        the queue; ``meta`` (plain strings) travels with it: the trace context. Over the data plane
        unless ``$FAILSOFT_DATA_PLANE=ray`` (or ``transport``, for a benchmark that compares both,
        says otherwise)."""
        if (transport or self._transport) == "zmq" and not self.data_plane.absent:
            with contextlib.suppress(NoDataPlane):  # it could not bind: Ray, as before
                return await self.data_plane.infer(app, variant, batch, timeout_s, request_id, meta)
        args = (app, variant, batch, timeout_s, request_id, time.time(), meta)
        return await self._call("infer", *args, timeout_s=timeout_s, group=SERVING_GROUP)

    def infer_started(
        self,
        app: str,
        variant: str,
        batch: Any,
        timeout_s: float,
        request_id: str | None = None,
        meta: dict[str, str] | None = None,
    ) -> asyncio.Future[Any] | None:
        """:meth:`infer` sent at once over the data plane's open connection: the future of its
        outputs, with no task or timer of its own (the caller keeps the deadline, and cancels the
        future to give up); None when there is no open connection (or Ray carries inference):
        await :meth:`infer` instead."""
        if self._transport != "zmq" or self.data_plane.absent:
            return None
        return self.data_plane.start(app, variant, batch, timeout_s, request_id, meta)

    async def state(self, app: str, variant: str, timeout_s: float = 10.0) -> bytes:
        """A stateful model's state as bytes (HAMS: what a primary ships to its backup)."""
        return bytes(await self._call("state", app, variant, timeout_s=timeout_s))

    async def apply_state(self, app: str, variant: str, data: bytes, timeout_s: float = 10.0) -> int:
        """Swap another copy's state in (HAMS: a backup applying what its primary shipped); its seq."""
        return int(await self._call("apply_state", app, variant, data, timeout_s=timeout_s))

    def cancel_nowait(self, request_id: str) -> None:
        """Withdraw a request from the server's queue (it timed out, moved, or its client left)."""
        if not self.data_plane.cancel_nowait(request_id):
            self._fire("cancel", request_id)

    async def holdings(self, timeout_s: float = 5.0) -> dict[str, Any]:
        return await self._call("holdings", timeout_s=timeout_s)

    async def info(self, timeout_s: float = 5.0) -> dict[str, Any]:
        return await self._call("info", timeout_s=timeout_s)

    async def metrics(self, timeout_s: float = 2.0) -> bytes:
        """The agent's Prometheus figures as text (what the gateway's ``/metrics`` serves)."""
        return bytes(await self._call("metrics", timeout_s=timeout_s))

    async def set_slow(self, ms: float, load_ms: float | None = None, timeout_s: float = 5.0) -> None:
        await self._call("set_slow", ms, load_ms, timeout_s=timeout_s)

    async def set_broken(self, broken: bool, timeout_s: float = 5.0) -> None:
        await self._call("set_broken", broken, timeout_s=timeout_s)

    async def evict(self, app: str, timeout_s: float = 5.0) -> list[str]:
        """The agent loses its models of ``app`` (``Agent.evict``, chaos); the variants dropped."""
        return list(await self._call("evict", app, timeout_s=timeout_s))

    def crash_nowait(self) -> None:
        self._fire("crash")

    def holdings_sync(self, timeout_s: float = 10.0) -> dict[str, Any]:
        return self._call_sync("holdings", timeout_s=timeout_s)

    def info_sync(self, timeout_s: float = 10.0) -> dict[str, Any]:
        return self._call_sync("info", timeout_s=timeout_s)

    def load_cpu_share_sync(self, seconds: float = 0.3) -> float:
        """The share of a core a recovery load would get on this server now (see the agent)."""
        return float(self._call_sync("load_cpu_share", seconds, timeout_s=seconds + 10.0))


class ControllerRef(_ActorRef):
    """The calls agents, the gateway, the CLI and tests make to the controller."""

    def __init__(self, handle: Any) -> None:
        super().__init__(handle, "controller", CONTROLLER_NAME)

    async def wait_routes(self, epoch: str, version: int, timeout_s: float) -> dict[str, Any]:
        return await self._call("wait_routes", epoch, version, timeout_s, timeout_s=timeout_s + 5.0)

    async def wait_events(self, epoch: str, seq: int, timeout_s: float) -> dict[str, Any]:
        return await self._call("wait_events", epoch, seq, timeout_s, timeout_s=timeout_s + 5.0)

    async def status(self, timeout_s: float = 5.0) -> dict[str, Any]:
        return await self._call("status", timeout_s=timeout_s)

    async def stats(self, timeout_s: float = 2.0) -> dict[str, Any]:
        return await self._call("stats", timeout_s=timeout_s)

    async def report_unhealthy(self, server: str, reason: str, timeout_s: float = 5.0) -> bool:
        return await self._call("report_unhealthy", server, reason, timeout_s=timeout_s)

    async def report_ongoing(self, counts: dict[str, int], timeout_s: float = 2.0) -> None:
        """The gateway's requests in flight per autoscaled app (``Controller.report_ongoing``)."""
        await self._call("report_ongoing", counts, timeout_s=timeout_s)

    async def report_link(
        self, server: str, incarnation: str | None, up: bool, reason: str, timeout_s: float = 5.0
    ) -> bool:
        return bool(await self._call("report_link", server, incarnation, up, reason, timeout_s=timeout_s))

    async def pin(self, request: CopyRequest, timeout_s: float = 5.0) -> str:
        """Ask the core for a mechanism's copy (``Controller.pin``); the server it is pinned on."""
        return str(await self._call("pin", request, timeout_s=timeout_s))

    async def unpin(self, app: str, server: str, owner: str, timeout_s: float = 5.0) -> None:
        await self._call("unpin", app, server, owner, timeout_s=timeout_s)

    async def report_model_lost(self, app: str, server: str, variant: str, timeout_s: float = 5.0) -> None:
        """``server`` lives but no longer holds ``app``'s ``variant`` (``Controller.report_model_lost``)."""
        await self._call("report_model_lost", app, server, variant, timeout_s=timeout_s)

    async def deployment(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """What runs (``Controller.deployment``): the deployment, policy and config version."""
        return await self._call("deployment", timeout_s=timeout_s)

    async def deploy(
        self, desired: Any, digest: str | None, dry_run: bool = False, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """Plan a new deployment and carry it out (``Controller.deploy``)."""
        return await self._call("deploy", desired, digest, dry_run, timeout_s=timeout_s)

    async def deploy_status(self, timeout_s: float = 5.0) -> dict[str, Any]:
        return await self._call("deploy_status", timeout_s=timeout_s)

    async def wait_llm(self, service: str, epoch: str, version: int, timeout_s: float) -> dict[str, Any]:
        """An llm service's worker table once newer than ``(epoch, version)`` (``Controller.wait_llm``)."""
        return await self._call("wait_llm", service, epoch, version, timeout_s, timeout_s=timeout_s + 5.0)

    async def llm_failed(
        self, service: str, worker: str, incarnation: int, reason: str, timeout_s: float = 5.0
    ) -> bool:
        return bool(await self._call("llm_failed", service, worker, incarnation, reason, timeout_s=timeout_s))

    def wait_ready_sync(self, timeout_s: float) -> bool:
        return self._call_sync("wait_ready", timeout_s, timeout_s=timeout_s + 10.0)

    def info_sync(self, timeout_s: float = 10.0) -> dict[str, Any]:
        return self._call_sync("info", timeout_s=timeout_s)


# ----------------------------------------------------------------------------------------------
# Lookups from inside actors (no driver needed).
# ----------------------------------------------------------------------------------------------


def find_agent(server: str) -> AgentRef:
    try:
        return AgentRef(ray.get_actor(agent_name(server), namespace=NAMESPACE), server)
    except Exception as exc:
        raise _map_error(exc, f"server {server!r}", None) from exc


def node_address() -> str:
    """Inside an actor: the address of its node (127.0.0.1 in an embedded cluster), where the
    agent serves its data plane; 127.0.0.1 outside Ray (an agent in a test's process)."""
    if not ray.is_initialized():
        return "127.0.0.1"
    return str(ray.util.get_node_ip_address())


def actor_was_restarted() -> bool:
    """True inside an actor that Ray re-created after its process died."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


def granted_resources() -> dict[str, Any]:
    """Inside an actor: what Ray granted it (resources and GPU ids), for reports."""
    ctx = ray.get_runtime_context()
    return {
        "resources": dict(ctx.get_assigned_resources()),
        "gpu_ids": [str(i) for i in ctx.get_accelerator_ids().get("GPU", [])],
    }


def configure_actor_logging(
    level: int = logging.INFO, fmt: str = "text", component: str = "failsoft"
) -> None:
    """Inside an actor: failsoft's log records go to the worker's stderr file in Ray's log directory,
    as text or JSON lines (``fmt``, ``FAILSOFT_LOG_FORMAT`` first: :mod:`failsoft.runtime.logs`)."""
    from failsoft.runtime import logs

    logs.configure(fmt, component, level)


# ----------------------------------------------------------------------------------------------
# The cluster: start or join Ray, spawn the actors, stop what was started.
# ----------------------------------------------------------------------------------------------


def _quiet_injected_crashes() -> None:
    """Drop the raylet's "A worker died or was killed" notice from the driver's console.

    Killing an agent is how failsoft injects (and how it survives) a server crash; Ray reports every
    such death to the driver with a long troubleshooting text. The controller reports the failure
    properly (events, metrics), so this notice is dropped; every other Ray message is printed as before.
    """
    from ray._private import worker

    original = worker.print_to_stdstream
    if getattr(original, "_failsoft_quiet", False):
        return

    def printer(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        lines = [ln for ln in data.get("lines", []) if "A worker died or was killed" not in ln]
        if lines:
            original({**data, "lines": lines}, *args, **kwargs)

    printer._failsoft_quiet = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = printer


@dataclass(frozen=True, slots=True)
class ActorOptions:
    restart: bool
    env: dict[str, str]
    placement: Placement = ON_CPU  # the GPU share asked of Ray (and a pinned GPU's environment)


@contextlib.contextmanager
def _loopback_bootstrap(address: str | None) -> Iterator[None]:
    """Keep Ray on 127.0.0.1: an embedded instance (``address`` None), or a cluster whose head
    listens on 127.0.0.1 only.

    Ray resolves a loopback node or bootstrap address to this machine's outward IP (so that the
    address it records is reachable from other machines). Embedded, that made every Ray process
    listen beyond loopback although ``_node_ip_address="127.0.0.1"`` was asked for: GCS, raylet,
    object manager and workers on all interfaces, the runtime-env agent on the outward address
    (Ray 2.60, measured). Joining a head started with ``--node-ip-address 127.0.0.1``, the driver
    waited forever on an address the head does not listen on. Ray is told for the duration of the
    call that this is a single-machine cluster, which makes it keep 127.0.0.1; its servers then
    bind 127.0.0.1 only. Other addresses are untouched.
    """
    host = (address or "").rpartition(":")[0]
    if address is not None and host not in {"127.0.0.1", "localhost", "::1", "[::1]"}:
        yield
        return
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


# An embedded instance kept running between the clusters of one process (keep_embedded): the
# ``ray.init`` arguments it was started with and the environment its processes inherited (a variable
# set later reaches no worker of it), or None when there is none.
_kept_init: dict[str, Any] | None = None
_keep = False
_ignored_env: tuple[str, ...] = ()  # prefixes of variables that do not tell instances apart
NAME_RELEASE_TIMEOUT_S = 10.0  # how long a kept instance's shutdown waits for its actors' names


def keep_embedded(keep: bool = True, ignore_env: Sequence[str] = ()) -> None:
    """Keep the embedded Ray instance running when a cluster stops, for the next cluster this
    process starts with the same settings and environment (its workers inherit the environment of
    the start: a changed variable needs a new instance). Ray's start is 3-5 s and about 5 s of a
    core (its GCS, raylet and five Python helpers): a test session or a notebook that starts
    cluster after cluster pays it once. ``ignore_env``: prefixes of variables that change between
    clusters but that no process of a cluster reads (a test runner's ``PYTEST_``). ``keep=False``
    stops a kept instance now."""
    global _keep, _ignored_env
    _keep, _ignored_env = keep, tuple(ignore_env)
    if not keep:
        release_embedded()


def release_embedded() -> None:
    """Stop the kept embedded instance, if there is one (before a ``ray.init`` of other settings)."""
    global _kept_init
    if _kept_init is not None:
        _kept_init = None
        if ray.is_initialized():
            ray.shutdown()


class RayCluster:
    """Starts an embedded Ray (or joins ``address``), spawns actors, and stops what it started
    (an embedded instance stays up for the next cluster with :func:`keep_embedded`)."""

    def __init__(
        self,
        servers: Sequence[Server],
        address: str | None = None,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        node_ip: str | None = None,
    ):
        self.servers = tuple(servers)
        self.address = address
        # cluster mode: the address of this machine's Ray node (its `ray start --node-ip-address`);
        # Ray's own guess is the default route's source, which a machine on a private network
        # without one (or with several networks) does not have right
        self.node_ip = node_ip
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self._spawned: list[_ActorRef] = []
        self._started = False
        self._kept = False  # on a kept embedded instance: stop actors only, leave Ray up

    @property
    def embedded(self) -> bool:
        return self.address is None

    def heartbeat_host(self) -> str:
        """The address agents reach this node at: 127.0.0.1 when embedded, the node's IP otherwise."""
        return "127.0.0.1" if self.embedded else ray.util.get_node_ip_address()

    def start(self, log_to_driver: bool = False) -> None:
        _quiet_injected_crashes()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")
        if self.embedded:
            # Ray starts its workers at nice 15 (below the raylet): agents would then answer behind
            # the gateway and the clients, and their recovery loads (nice +5, set relative to it
            # in the agent) would run *ahead* of inference. Our workers are the servers: nice 0.
            os.environ.setdefault(WORKER_NICENESS_ENV, "0")
        logging.getLogger("ray").setLevel(logging.ERROR)
        kwargs: dict[str, Any] = dict(
            namespace=NAMESPACE,
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=log_to_driver,
        )
        if self.embedded:
            kwargs.update(
                # no server resources: one node runs every agent (they place agents in cluster mode)
                _node_ip_address="127.0.0.1",
                num_cpus=self.num_cpus or max(2, os.cpu_count() or 2),
                object_store_memory=OBJECT_STORE_BYTES,
            )
            gpus = self.num_gpus if self.num_gpus is not None else _env_gpus()
            if gpus is not None:
                kwargs["num_gpus"] = gpus
        elif self.node_ip is not None:
            kwargs["_node_ip_address"] = self.node_ip

        def init() -> None:
            # new for each try: Ray writes its session's paths into the one it is given
            system = _embedded_system_config() if self.embedded else {}
            with _loopback_bootstrap(self.address):
                # embedded: "local" always starts our own instance; with None, Ray would join a
                # cluster another process on this machine started with `ray start`
                ray.init(address=self.address or "local", **kwargs, **system)

        global _kept_init
        settings = {"init": kwargs, "env": _inherited_env()}
        if self.embedded and _keep and _kept_init == settings and ray.is_initialized():
            self._kept = True  # the instance the last cluster left running, started with these
            return
        release_embedded()
        try:
            if self.embedded:
                # again, once, if Ray's own start times out on a busy host
                start_embedded(init, ray_home=os.path.dirname(ray.__file__))
            else:
                init()
        except Exception as exc:
            where = f"Ray cluster at {self.address!r}" if self.address else "an embedded Ray instance"
            raise ServingError(f"cannot start {where}: {exc}") from exc
        if self.embedded and _keep:
            # the environment as Ray's start left it (it sets variables of its own in it)
            _kept_init, self._kept = {**settings, "env": _inherited_env()}, True
            return
        self._started = True
        if not self.embedded:
            self._check_resources()

    def _check_resources(self) -> None:
        offered = ray.cluster_resources()
        missing = [s.name for s in self.servers if offered.get(server_resource(s.name), 0) < 1]
        if missing:
            raise ConfigError(
                f"no node of the Ray cluster at {self.address!r} offers resource "
                f"{server_resource(missing[0])!r} (start it with: ray start --address ... "
                f"--resources '{{\"{server_resource(missing[0])}\": 1}}')"
            )

    def check_gpus(self, placements: dict[str, Placement]) -> None:
        """Refuse, before any agent waits forever for it, a GPU share Ray cannot grant: more GPUs in
        all than the embedded node offers (or than the whole cluster has), or a pinned GPU it lacks."""
        offered = float(ray.cluster_resources().get("GPU", 0.0))
        asked = {name: p.gpus for name, p in placements.items() if p.gpus > 0}
        total = sum(asked.values()) if self.embedded else max(asked.values(), default=0.0)
        hint = f" (set {NUM_GPUS_ENV} to offer more, or lower the servers' gpus)" if self.embedded else ""
        if total > offered + 1e-6:
            shares = ", ".join(f"{n}: {g:g}" for n, g in sorted(asked.items()))
            where = "this machine's Ray node offers" if self.embedded else "the Ray cluster has"
            raise ConfigError(f"servers ask for {total:g} GPUs ({shares}); {where} {offered:g}{hint}")
        for name, p in sorted(placements.items()):
            pinned = p.pinned_gpu
            if self.embedded and pinned is not None and pinned >= offered:
                raise ConfigError(
                    f"server {name!r}: device {p.device!r}, but this machine's Ray node has "
                    f"{offered:g} GPUs (numbered from 0)"
                )

    def spawn_controller(self, cls: type, *args: Any, restart: bool = True) -> ControllerRef:
        """The controller runs on this (the driver's) node, where agents send their heartbeats."""
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        handle: Any = (  # an actor handle: its methods are made at runtime
            ray.remote(cls)
            .options(
                name=CONTROLLER_NAME,
                namespace=NAMESPACE,
                num_cpus=0,
                max_restarts=-1 if restart else 0,
                max_concurrency=1000,
                scheduling_strategy=here,
            )
            .remote(*args)
        )
        ref = ControllerRef(handle)
        self._spawned.append(ref)
        return ref

    def spawn_agent(self, cls: type, server: str, *args: Any, options: ActorOptions) -> AgentRef:
        """A new agent actor; ServingError while a dead agent of that server still holds the name."""
        try:
            return self._spawn_agent(cls, server, *args, options=options)
        except ValueError as exc:  # ActorAlreadyExistsError
            raise ServingError(f"server {server!r} already has an agent: {exc}") from exc

    def _spawn_agent(self, cls: type, server: str, *args: Any, options: ActorOptions) -> AgentRef:
        threads = SERVING_THREADS if transport() == "ray" else DATA_PLANE_SERVING_THREADS
        env = options.env | options.placement.actor_env() | {SERVING_THREADS_ENV: str(threads)}
        handle = (
            # Ray's overloads omit ``concurrency_groups``, a documented actor option
            ray.remote(concurrency_groups={SERVING_GROUP: threads})(cls)  # type: ignore[call-overload]
            .options(
                name=agent_name(server),
                namespace=NAMESPACE,
                num_cpus=0,
                num_gpus=options.placement.gpus,
                # cluster mode: on the node that offers the server (embedded: the one node)
                resources={} if self.embedded else {server_resource(server): 1.0},
                max_restarts=-1 if options.restart else 0,
                max_task_retries=0,
                max_concurrency=32,
                runtime_env={"env_vars": env},
            )
            .remote(*args)
        )
        ref = AgentRef(handle, server)
        self._spawned.append(ref)
        return ref

    def shutdown(self) -> None:
        """Kill the actors this cluster spawned (by handle), then disconnect (and stop, if embedded)."""
        names = [ref.name for ref in self._spawned]
        for ref in reversed(self._spawned):
            ref.kill()
        self._spawned.clear()
        if self._kept:  # Ray stays up: the next cluster needs the names these actors held
            self._kept = False
            _await_released(names)
        if self._started:
            ray.shutdown()
            self._started = False


def _inherited_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_ignored_env)}


def _embedded_system_config() -> dict[str, Any]:
    # no idle workers started ahead (one per CPU): every agent asks for its own environment, so none
    # would take one, and each is a Python start (about a second of a core) while the cluster comes up
    return {"_system_config": {"enable_worker_prestart": False, "prestart_worker_first_driver": False}}


def _await_released(names: Sequence[str]) -> None:
    """Wait until killed actors no longer hold their names (Ray frees a name once the GCS has the
    actor dead, a moment after ``ray.kill``)."""
    deadline = time.monotonic() + NAME_RELEASE_TIMEOUT_S
    for name in names:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                break
            time.sleep(0.02)


# ----------------------------------------------------------------------------------------------
# LLM workers (LUMEN): one actor per worker, each running failsoft.llm's engine in its own loop.
# ----------------------------------------------------------------------------------------------


def llm_worker_name(service: str, worker: str) -> str:
    return f"failsoft-llm-{service}-{worker}"


class LlmWorkerRef(_ActorRef):
    """An LLM worker (:class:`failsoft.runtime.llm_worker.LlmWorker`) with failsoft's call conventions."""

    def __init__(self, handle: Any, worker: str, actor: str) -> None:
        super().__init__(handle, f"llm worker {worker!r}", actor)
        self.worker = worker

    async def info(self, timeout_s: float = 10.0) -> dict[str, Any]:
        return dict(await self._call("info", timeout_s=timeout_s))

    async def metrics(self, timeout_s: float = 2.0) -> bytes:
        """The worker's Prometheus figures as text (:mod:`failsoft.runtime.llm_metrics`); a gateway
        serves them with ``FleetFigures.add_source("worker", ...)``."""
        return bytes(await self._call("metrics", timeout_s=timeout_s))

    async def submit(
        self,
        request_id: str,
        tokens: list[int],
        sampling: dict[str, Any],
        prompt_len: int | None = None,
        timeout_s: float = 10.0,
    ) -> dict[str, Any]:
        return dict(await self._call("submit", request_id, tokens, sampling, prompt_len, timeout_s=timeout_s))

    async def restore(
        self, request_id: str, tokens: list[int], sampling: dict[str, Any], timeout_s: float = 10.0
    ) -> dict[str, Any]:
        return dict(await self._call("restore", request_id, tokens, sampling, timeout_s=timeout_s))

    async def poll(self, request_id: str, since: int, wait_s: float) -> dict[str, Any]:
        return dict(await self._call("poll", request_id, since, wait_s, timeout_s=wait_s + 10.0))

    async def cancel(self, request_id: str, timeout_s: float = 5.0) -> bool:
        return bool(await self._call("cancel", request_id, timeout_s=timeout_s))

    async def export_kv(
        self, request_id: str, upto_tokens: int | None, from_start: bool = False, timeout_s: float = 5.0
    ) -> bytes | None:
        out = await self._call("export_kv", request_id, upto_tokens, from_start, timeout_s=timeout_s)
        return None if out is None else bytes(out)

    async def hold(self, chunk: bytes, timeout_s: float = 5.0) -> int:
        return int(await self._call("hold", chunk, timeout_s=timeout_s))

    async def drop_checkpoint(self, request_id: str, timeout_s: float = 5.0) -> bool:
        return bool(await self._call("drop_checkpoint", request_id, timeout_s=timeout_s))

    async def load(self, timeout_s: float = 5.0) -> dict[str, Any]:
        return dict(await self._call("load", timeout_s=timeout_s))

    def set_slow_sync(self, ms: float, timeout_s: float = 10.0) -> None:
        self._call_sync("set_slow", ms, timeout_s=timeout_s)

    def load_sync(self, timeout_s: float = 10.0) -> dict[str, Any]:
        return dict(self._call_sync("load", timeout_s=timeout_s))

    def info_sync(self, timeout_s: float = 120.0) -> dict[str, Any]:
        return dict(self._call_sync("info", timeout_s=timeout_s))

    def wait_target_sync(self, timeout_s: float = 120.0) -> dict[str, Any]:
        return dict(self._call_sync("wait_target", timeout_s, timeout_s=timeout_s + 10.0))

    async def draft_for(
        self, items: list[tuple[str, list[int], int]], k: int, timeout_s: float = 10.0
    ) -> dict[str, list[int]]:
        return dict(await self._call("draft_for", items, k, timeout_s=timeout_s))

    async def verify_drafts(
        self, items: list[tuple[str, int, list[int]]], timeout_s: float = 10.0
    ) -> dict[str, dict[str, Any]]:
        return dict(await self._call("verify_drafts", items, timeout_s=timeout_s))

    async def preload_draft(self, spec: Any, draft: str, timeout_s: float = 600.0) -> dict[str, Any]:
        """A standby loads ``draft`` (as ``spec`` says) before any restart needs it; its info."""
        return dict(await self._call("preload_draft", spec, draft, timeout_s=timeout_s))

    async def adopt(
        self, spec: Any, draft: str | None = None, target_delay_ms: float = 0.0, timeout_s: float = 600.0
    ) -> dict[str, Any]:
        """A standby worker takes ``spec.name`` (loads its model, serves; with ``draft``, loads
        the draft first and returns, the target loading on); its info. The handle is named after
        the worker it now is."""
        info = dict(await self._call("adopt", spec, draft, target_delay_ms, timeout_s=timeout_s))
        self.worker, self.what = spec.name, f"llm worker {spec.name!r}"
        return info

    def adopt_sync(
        self, spec: Any, draft: str | None = None, target_delay_ms: float = 0.0, timeout_s: float = 120.0
    ) -> dict[str, Any]:
        info = dict(self._call_sync("adopt", spec, draft, target_delay_ms, timeout_s=timeout_s))
        self.worker, self.what = spec.name, f"llm worker {spec.name!r}"
        return info

    async def wait_target(self, timeout_s: float = 600.0) -> dict[str, Any]:
        return dict(await self._call("wait_target", timeout_s, timeout_s=timeout_s + 10.0))

    async def set_slow(self, ms: float, timeout_s: float = 10.0) -> None:
        await self._call("set_slow", ms, timeout_s=timeout_s)


def spawn_llm_worker(
    cls: type, service: str, name: str, *args: Any, server: str | None = None, placement: Placement = ON_CPU
) -> LlmWorkerRef:
    """A new LLM worker actor of ``service`` (``name``: the worker it serves, or a standby's), on
    the node that offers ``server``'s resource (any node when that one is gone), with its GPU share
    as an agent's; with none it is left as Ray starts it: no runtime environment of its own, so
    that Ray's pool of started worker processes serves its restarts. The actor is owned by the
    caller (the controller): it goes when its owner goes."""
    env = placement.actor_env() if placement.gpus > 0 else {}
    strategy = _node_of(server) if server is not None else None
    actor = f"{llm_worker_name(service, name)}-{os.getpid()}-{next(_LLM_IDS)}"
    handle: Any = (
        ray.remote(cls)
        .options(
            name=actor,
            namespace=NAMESPACE,
            num_cpus=0,
            num_gpus=placement.gpus,
            **({"runtime_env": {"env_vars": env}} if env else {}),
            **({"scheduling_strategy": strategy} if strategy is not None else {}),
            max_restarts=0,
            max_task_retries=0,
            max_concurrency=64,
        )
        .remote(*args)
    )
    return LlmWorkerRef(handle, name, actor)


_LLM_IDS = itertools.count()


def _node_of(server: str) -> Any:
    """Where ``server``'s agent runs: the live node offering its resource (soft: another node when
    it has none)."""
    for node in ray.nodes():
        if node.get("Alive") and node.get("Resources", {}).get(server_resource(server), 0) > 0:
            return NodeAffinitySchedulingStrategy(node["NodeID"], soft=True)
    return None


def _env_gpus() -> int | None:
    value = os.environ.get(NUM_GPUS_ENV)
    if value is None or not value.strip():
        return None
    try:
        gpus = int(value)
    except ValueError:
        raise ConfigError(f"${NUM_GPUS_ENV}={value!r}: expected a whole number of GPUs") from None
    if not 0 <= gpus <= 1024:
        raise ConfigError(f"${NUM_GPUS_ENV}={value!r}: expected 0 to 1024 GPUs")
    return gpus
