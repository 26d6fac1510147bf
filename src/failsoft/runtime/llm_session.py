"""An ``llm`` deployment (LUMEN): N LLM worker actors on Ray and the generate gateway before them.

The config (``examples/llm.yaml``)::

    name: llm
    model: {size: tiny, root: null, device: auto}   # built on request when not built yet
    service: {name: bytes, workers: 3, policy: lumen, params: {checkpoint_budget_mb: 64}, spares: 1}
    engine: {kv_pages: 128, page_size: 16, max_batch: 8, torch_threads: 1}
    gateway: {host: 127.0.0.1, port: 8010}

``failsoft llm serve CONFIG`` builds the model pair if it is not built yet (``failsoft llm build``),
starts an embedded Ray, one worker actor per worker (each loads the target and runs its engine in
its own loop), ``spares`` standby worker actors (process started, torch and transformers imported,
no model) and the gateway (:mod:`failsoft.runtime.gateway.llm_app`).

A killed worker is restarted by :meth:`LlmSession.restart_worker`: a standby adopts its name and
loads its model (a fresh process would first spend seconds starting and importing), and a new
standby starts in the background. Standbys are infrastructure, the same under every recovery
policy, so that the policies are compared on what they decide, not on how a process starts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from failsoft.bounds import describe_validation_error
from failsoft.errors import ConfigError
from failsoft.runtime.devices import DEVICE_PATTERN, MAX_GPUS, Placement, check_placement
from failsoft.services import LlmParams

log = logging.getLogger(__name__)
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    size: Literal["tiny", "small"] = "tiny"
    root: str | None = None
    device: str = Field(default="auto", pattern=DEVICE_PATTERN)  # as a server's (runtime/devices.py)
    gpus: float = Field(default=0.0, ge=0, le=MAX_GPUS)  # each worker's (and standby's) GPU share


class ServiceSpec(_Strict):
    name: str = Field(default="bytes", pattern=_NAME, max_length=64)
    workers: int = Field(default=3, ge=1, le=64)
    policy: str = "lumen"
    params: dict[str, Any] = Field(default_factory=dict)
    spares: int = Field(default=1, ge=0, le=8)


class EngineSpec(_Strict):
    kv_pages: int = Field(default=128, ge=1, le=1 << 20)
    page_size: int = Field(default=16, ge=1, le=1024)
    max_batch: int = Field(default=8, ge=1, le=1024)
    torch_threads: int = Field(default=1, ge=0, le=256)


class GatewaySpec(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8010, ge=0, le=65535)
    allow_remote: bool = False


class LlmConfigModel(_Strict):
    name: str = Field(default="llm", pattern=_NAME, max_length=64)
    model: ModelSpec = Field(default_factory=ModelSpec)
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)


@dataclass(frozen=True, slots=True)
class LlmConfig:
    spec: LlmConfigModel
    params: LlmParams
    root: Path

    @property
    def placement(self) -> Placement:
        """Each worker's device and the GPU share it asks Ray for."""
        return Placement(self.spec.model.device, self.spec.model.gpus)

    @property
    def workers(self) -> tuple[str, ...]:
        return tuple(f"w{i}" for i in range(self.spec.service.workers))


def llm_config_from_dict(data: Any, source: str = "config", base_dir: Path | None = None) -> LlmConfig:
    from failsoft.llm.models import default_llm_path
    from failsoft.policies import registry

    try:
        spec = LlmConfigModel.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_validation_error(exc, data)}") from None
    try:
        params = LlmParams(**spec.service.params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: service.params: {exc}") from None
    check_placement(f"{source}: model", spec.model.device, spec.model.gpus)
    known = registry.names("llm_recovery")
    if spec.service.policy not in known:
        raise ConfigError(
            f"{source}: service.policy {spec.service.policy!r} is unknown (known: {', '.join(known)})"
        )
    root = Path(spec.model.root).expanduser() if spec.model.root else default_llm_path()
    if spec.model.root and base_dir is not None and not root.is_absolute():
        root = base_dir / root
    return LlmConfig(spec, params, root)


def load_llm_config(path: str | Path) -> LlmConfig:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {str(p)!r}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{str(p)!r} is not YAML: {exc}") from None
    return llm_config_from_dict(data, str(p), p.parent)


class LlmSession:
    """Start the workers and the gateway; :meth:`kill_worker` is the failure the tests inject."""

    def __init__(
        self, config: LlmConfig, num_cpus: int | None = None, build: bool = True, reload_delay_ms: float = 0.0
    ) -> None:
        """``reload_delay_ms`` is added to every restarted worker's target load (a standby's
        adoption): the reload of a model larger than the one served, emulated, the same for every
        policy."""
        self.config = config
        self.reload_delay_ms = reload_delay_ms
        self.restarts: list[dict[str, Any]] = []
        self.num_cpus = num_cpus
        self.build = build
        self.cluster: Any = None
        self.workers: dict[str, Any] = {}
        self._specs: dict[str, Any] = {}
        self.spares: list[Any] = []
        self._spare_ids = 0
        self.dispatcher: Any = None
        self._server: Any = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.spec.gateway.host}:{self.port}"

    def start(self, background: bool = True) -> LlmSession:
        from failsoft.llm.models import build_pair
        from failsoft.runtime.cluster import RayCluster, spawn_llm_worker
        from failsoft.runtime.gateway.dispatch.llm import LlmDispatcher
        from failsoft.runtime.llm_worker import LlmWorker, LlmWorkerSpec
        from failsoft.runtime.security import check_bind

        cfg, spec = self.config, self.config.spec
        check_bind(spec.gateway.host, spec.gateway.port, spec.gateway.allow_remote)
        device = None if spec.model.device == "auto" else spec.model.device
        if self.build:
            built = build_pair(cfg.root, spec.model.size, device)
            if built.get("built"):
                log.info("built the %s model pair under %s", spec.model.size, cfg.root)
        self.cluster = RayCluster((), None, self.num_cpus)
        try:
            self.cluster.start()
            shares = [*cfg.workers, *(f"spare{i}" for i in range(spec.service.spares))]
            self.cluster.check_gpus(dict.fromkeys(shares, cfg.placement))
            e = spec.engine
            for name in cfg.workers:
                wspec = LlmWorkerSpec(
                    name,
                    cfg.root,
                    f"{spec.model.size}-target",
                    device,
                    e.kv_pages,
                    e.page_size,
                    e.max_batch,
                    e.torch_threads,
                )
                self._specs[name] = wspec
                self.workers[name] = spawn_llm_worker(
                    self.cluster, LlmWorker, spec.service.name, name, wspec, placement=cfg.placement
                )
            for _ in range(spec.service.spares):
                self._spawn_spare()
            infos = {name: w.info_sync(timeout_s=300.0) for name, w in self.workers.items()}
            first = next(iter(infos.values()))
            self.dispatcher = LlmDispatcher(
                spec.service.name,
                self.workers,
                cfg.params,
                spec.service.policy,
                int(first["context"]),
                float(first["kv_mb_per_token"]),
            )
            self._start_gateway(background)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_gateway(self, background: bool) -> None:
        import uvicorn

        from failsoft.runtime.gateway.llm_app import build_llm_app
        from failsoft.runtime.gateway.server import GatewayServer

        g = self.config.spec.gateway
        app = build_llm_app({self.config.spec.service.name: self.dispatcher})
        uv = uvicorn.Config(app, host=g.host, port=g.port, log_level="warning", lifespan="off")
        self._server = GatewayServer(uv)
        if not background:
            self.port = g.port
            self._server.run()
            return
        self.port = self._server.start_in_thread("llm-gateway")

    def wait(self) -> None:
        """Block until the gateway (started in the background) ends: Ctrl-C, or :meth:`stop`."""
        if self._server is not None:
            self._server.wait()

    def kill_worker(self, name: str) -> None:
        """Kill a worker's process for good (a failure: its engine and KV are gone)."""
        self.workers[name].kill()

    def _spawn_spare(self) -> None:
        """Start a standby worker (returns at once: its process starts and imports meanwhile)."""
        from failsoft.runtime.cluster import spawn_llm_worker
        from failsoft.runtime.llm_worker import LlmWorker

        self._spare_ids += 1
        threads = self.config.spec.engine.torch_threads
        spare = spawn_llm_worker(
            self.cluster,
            LlmWorker,
            self.config.spec.service.name,
            f"spare{self._spare_ids}",
            None,
            threads,
            placement=self.config.placement,
        )
        self.spares.append(spare)

    def wait_spares(self, timeout_s: float = 120.0) -> int:
        """Block until every standby has started and imported; how many there are."""
        for spare in self.spares:
            spare.info_sync(timeout_s=timeout_s)
        return len(self.spares)

    def restart_worker(self, name: str, timeout_s: float = 120.0) -> float:
        """Restart a killed worker and let the gateway route to it once it has loaded its model;
        returns the model's load time in ms. A standby adopts the worker (its process and imports
        are ready) and a new standby starts in the background; with none, a fresh process starts
        (stop-and-restart's restart: process, imports, model)."""
        from failsoft.errors import ServerUnavailableError
        from failsoft.runtime.cluster import spawn_llm_worker
        from failsoft.runtime.llm_worker import LlmWorker

        spec = self._specs[name]
        self.dispatcher.mark_dead(name)
        started = time.perf_counter()
        while self.spares:
            spare = self.spares.pop(0)
            self._spawn_spare()
            try:
                if self._progressive():
                    info = self._adopt_progressive(name, spare, spec, timeout_s)
                else:
                    info = spare.adopt_sync(spec, None, self.reload_delay_ms, timeout_s=timeout_s)
            except ServerUnavailableError as exc:  # the standby died too: the next one
                log.warning("standby for %s unavailable: %s", name, exc)
                continue
            self.workers[name] = spare
            self.dispatcher.revive(name, spare)
            self.restarts.append(
                {
                    "worker": name,
                    "started": started,
                    "draft_ready": info.get("draft_ready"),
                    "target_ready": time.perf_counter(),
                }
            )
            return float(info["load_ms"])
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ref = spawn_llm_worker(
                    self.cluster,
                    LlmWorker,
                    self.config.spec.service.name,
                    name,
                    spec,
                    placement=self.config.placement,
                )
                break
            except ValueError:  # the dead actor still holds its name for a moment
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        info = ref.info_sync(timeout_s=timeout_s)
        self.workers[name] = ref
        self.dispatcher.revive(name, ref)
        return float(info["load_ms"])

    def _progressive(self) -> bool:
        """LUMEN's draft-first restart: the policy has progressive recovery and a draft is built."""
        size = self.config.spec.model.size
        has_draft = (self.config.root / "llm" / f"{size}-draft" / "config.json").is_file()
        return self.dispatcher.policy.progressive is not None and has_draft

    def _adopt_progressive(self, name: str, spare: Any, spec: Any, timeout_s: float) -> dict[str, Any]:
        """The standby loads the draft first and drafts for the survivor the policy names (the
        dispatcher's :meth:`assist`, in a thread of its own) until its target is loaded."""
        import asyncio
        import threading

        draft = f"{self.config.spec.model.size}-draft"
        first = spare.adopt_sync(spec, draft, self.reload_delay_ms, timeout_s=timeout_s)
        draft_ready = time.perf_counter()
        done = threading.Event()
        helper = threading.Thread(
            target=lambda: asyncio.run(
                self.dispatcher.assist(name, spare, done.is_set, first.get("acceptance"))
            ),
            name=f"assist-{name}",
            daemon=True,
        )
        helper.start()
        try:
            info = spare.wait_target_sync(timeout_s=timeout_s)
        finally:
            done.set()
            helper.join(timeout=30.0)
        return {**info, "draft_ready": draft_ready}

    def load(self, name: str) -> dict[str, Any]:
        return dict(self.workers[name].load_sync())

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None

    def __enter__(self) -> LlmSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
