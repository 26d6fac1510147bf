"""A running failsoft: Ray, the controller, an agent per server and the gateway, started and stopped together.

:class:`Session` is what ``failsoft serve``, ``failsoft demo``, the failover benchmark and the tests
run. Its life cycle is explicit:

1. :meth:`Session.prepare`: everything that can be wrong with the input is checked *before any
   process starts*: the model repository exists and has the apps' families, every primary fits,
   the store is reachable. A problem is one :class:`~failsoft.errors.ConfigError` (or StoreError).
2. :meth:`Session.start`: start (or join) Ray, spawn the controller and the agents, wait until the
   controller has deployed every primary and warm backup, then start the gateway (uvicorn) in a
   thread, or :meth:`Session.serve_forever` in the main thread (Ctrl-C stops it).
3. :meth:`Session.stop`: stop the gateway, kill the actors this session spawned, stop Ray if it was
   embedded, remove the state directory's ``gateway.json``. Safe to call twice; ``with`` calls it.

The gateway serves two planes: inference (``gateway.host:port``) and, on its own port, the admin
API (``gateway.admin_host:admin_port``), each over HTTPS when its ``tls`` is set.
``<state_dir>/gateway.json`` tells ``failsoft infer``, ``failsoft status`` and ``failsoft chaos``
where both are (``url``, ``admin_url``, and the admin certificate to trust); ``<state_dir>/admin_token``
(mode 0600) holds the admin token unless the config or ``$FAILSOFT_ADMIN_TOKEN`` gives one.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from failsoft.domain import Scenario
from failsoft.errors import ConfigError, FailsoftError, ServingError
from failsoft.runtime import telemetry
from failsoft.runtime.config import RuntimeConfig
from failsoft.runtime.deployment import resolve
from failsoft.runtime.discovery import Target
from failsoft.runtime.gateway.protocol import ModelMeta
from failsoft.runtime.metadata import checked_models
from failsoft.runtime.security import (
    check_bind,
    check_tls,
    checked_token,
    note_inference_bind,
    read_token_file,
)
from failsoft.runtime.store import open_store

if TYPE_CHECKING:
    from failsoft.client import Client

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 600.0
TOKEN_ENV = "FAILSOFT_ADMIN_TOKEN"
# How long the gateway keeps an idle client connection: longer than clients keep theirs (httpx and
# the openai package: 5 s), so that the client, not the gateway, closes an idle one, and a request
# never meets a connection the gateway closes as it is sent (a reset no POST can retry safely)
GATEWAY_KEEP_ALIVE_S = 30


@dataclass(frozen=True)
class Prepared:
    """What :meth:`Session.prepare` found valid: the deployment and the gateway's model metadata."""

    deployment: Scenario
    models: dict[str, ModelMeta]
    variants: dict[str, list[str]]
    repository: Path
    admin_token: str = field(repr=False)


class Session:
    def __init__(
        self,
        config: RuntimeConfig,
        address: str | None = None,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        node_ip: str | None = None,
    ) -> None:
        self.config = config
        self.address = address
        self.node_ip = node_ip  # cluster mode: this machine's address in the Ray cluster (None: Ray's guess)
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus  # the GPUs an embedded Ray offers (None: detected, or $FAILSOFT_NUM_GPUS)
        self.prepared: Prepared | None = None
        self.cluster: Any = None
        self.controller: Any = None
        self.agents: dict[str, Any] = {}
        self.gateway: Any = None
        self._server: Any = None
        self.port: int | None = None
        self.admin_port: int | None = None
        self.heartbeat: Any = None

    # 1. validation -----------------------------------------------------------------------------
    def prepare(self) -> Prepared:
        if self.prepared is None:
            self.prepared = prepare(self.config)
        return self.prepared

    # 2. start ------------------------------------------------------------------------------------
    def start(self, background: bool = True) -> Session:
        """Start everything; with ``background`` the gateway runs in a thread (else call serve_forever)."""
        from failsoft.runtime.cluster import RayCluster
        from failsoft.runtime.controller import Controller
        from failsoft.runtime.heartbeat import HeartbeatEndpoint

        p = self.prepare()
        cfg = self.config
        # this process's spans (off by default); a bad FAILSOFT_TRACES is refused before anything starts
        telemetry.configure(cfg.telemetry, "failsoft-gateway")
        self.cluster = RayCluster(cfg.servers, self.address, self.num_cpus, self.num_gpus, self.node_ip)
        try:
            self.cluster.start()
            self.cluster.check_gpus({s.name: cfg.placement(s.name) for s in cfg.servers})
            self.heartbeat = HeartbeatEndpoint.make(self.cluster.heartbeat_host())
            self.controller = self.cluster.spawn_controller(Controller, cfg, p.deployment, self.heartbeat)
            for server in cfg.servers:
                self._spawn_agent(server.name)
            if not self.controller.wait_ready_sync(READY_TIMEOUT_S):
                raise ServingError(f"the controller did not deploy within {READY_TIMEOUT_S:.0f} s")
            self._start_gateway(background)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn_agent(self, server: str) -> None:
        from failsoft.runtime.agent import Agent, AgentSpec
        from failsoft.runtime.cluster import ActorOptions

        p, cfg = self.prepare(), self.config
        # OpenMP/MKL outside torch get the same count; 0 (one per core) leaves them to the agent's
        # host, which in cluster mode is not this one
        threads = cfg.agents.torch_threads
        env = {k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")} if threads > 0 else {}
        env.update(telemetry.forwarded_env())  # where spans go, and the log format
        placement = cfg.placement(server)
        options = ActorOptions(restart=cfg.agents.restart, env=env, placement=placement)
        spec = AgentSpec(
            cfg.server(server),
            p.repository,
            self.heartbeat,
            cfg.heartbeat.interval_s,
            placement.device,
            torch_threads=cfg.agents.torch_threads,
            queue=cfg.agents.queue,
            telemetry=cfg.telemetry,
            # warm up only what this deployment can load here (any app may fail over to any server),
            # not every family of the repository: a restart imported transformers for nothing
            families=tuple(f.name for f in p.deployment.families),
        )
        self.agents[server] = self.cluster.spawn_agent(Agent, server, spec, options=options)

    def revive(self, server: str) -> None:
        """Start a fresh (empty) agent for a server whose agent is dead, like a rebooted machine.

        Only needed when ``agents.restart`` is off (Ray restarts agents by itself otherwise). The
        controller notices the new incarnation from its heartbeats and restores the server.
        """
        old = self.agents.pop(server, None)
        if old is not None:
            old.kill()  # it is dead already; this drops our handle, which frees its name
        del old
        if self.gateway is not None:
            self.gateway.chaos.forget(server)
        deadline = time.monotonic() + 30.0
        while True:
            try:
                self._spawn_agent(server)
                return
            except ServingError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)  # the controller may still hold the dead actor's handle for a moment

    def _start_gateway(self, background: bool) -> None:
        import uvicorn

        from failsoft.runtime.chaos import Chaos
        from failsoft.runtime.gateway import Gateway
        from failsoft.runtime.gateway.server import GatewayServer

        p, cfg = self.prepare(), self.config
        chaos = Chaos(cfg.servers, self.agents)
        apps = {a.name: a for a in p.deployment.apps}
        self.gateway = Gateway(
            cfg.gateway,
            self.controller,
            self.agents,
            chaos,
            apps,
            p.models,
            p.variants,
            p.admin_token,
            services=p.deployment.all_services(),
            families={f.name: f for f in p.deployment.families},
            llm=cfg.llm,
        )
        from failsoft.runtime.redeploy import Redeployer

        self.gateway.deployer = Redeployer(cfg, self.controller, self.gateway)  # failsoft deploy
        for name, agent in self.agents.items():  # PIDs now, while every agent answers
            try:
                chaos.remember(name, agent.info_sync(timeout_s=10.0))
            except FailsoftError as exc:
                log.warning("no PID for server %s yet: %s", name, exc)
        g = cfg.gateway
        uv = uvicorn.Config(
            self.gateway.app,
            host=g.host,
            port=g.port,
            log_level="warning",
            lifespan="on",
            ws_ping_interval=20.0,
            timeout_keep_alive=GATEWAY_KEEP_ALIVE_S,
            timeout_graceful_shutdown=5,
            ssl_certfile=g.tls.certfile if g.tls else None,
            ssl_keyfile=g.tls.keyfile if g.tls else None,
        )
        admin = uvicorn.Config(
            self.gateway.admin_app,
            host=g.admin_host,
            port=g.admin_bind_port,
            log_level="warning",
            lifespan="off",  # the inference app's lifespan runs the gateway's background work
            timeout_graceful_shutdown=5,
            ssl_certfile=g.admin_tls.certfile if g.admin_tls else None,
            ssl_keyfile=g.admin_tls.keyfile if g.admin_tls else None,
        )
        self._server = GatewayServer(uv, admin)  # a Ctrl-C ends serving; it is not raised again
        self.admin_port = self._server.admin_port()
        if background:
            self._server.start_in_thread("gateway")
            self._note_port()

    def _note_port(self) -> None:
        self.port = self._server.bound_port()
        self._write_gateway_file()

    def serve_forever(self, on_started: Callable[[str], None] | None = None) -> None:
        """Run the gateway in this thread until Ctrl-C (SIGINT) or SIGTERM, then stop everything."""
        try:
            threading.Thread(target=self._note_port_when_started, args=(on_started,), daemon=True).start()
            self._server.run()
            if not self._server.started:
                raise ServingError(
                    f"the gateway could not start on {self.config.gateway.host}:{self.config.gateway.port} "
                    "(is the port in use?)"
                )
        finally:
            self.stop()

    def _note_port_when_started(self, on_started: Callable[[str], None] | None) -> None:
        while self._server is not None and not self._server.started and not self._server.should_exit:
            time.sleep(0.05)
        if self._server is not None and self._server.started:
            self._note_port()
            if on_started is not None:
                on_started(self.url)

    @property
    def url(self) -> str:
        """The inference plane's URL (``https`` with ``gateway.tls``)."""
        return self.config.with_gateway(port=self.port or self.config.gateway.port).gateway.url

    @property
    def admin_url(self) -> str:
        """The admin plane's URL (``https`` with ``gateway.admin_tls``)."""
        g = self.config.gateway
        return self.config.with_gateway(admin_port=self.admin_port or g.admin_bind_port).gateway.admin_url

    def target(self) -> Target:
        """Both planes, the admin token, and the configured certificates to trust (a self-signed
        one is its own authority): what a client of this session needs."""
        g = self.config.gateway
        return Target(
            self.url,
            self.prepare().admin_token,
            self.config.state_dir,
            self.admin_url,
            str(g.tls.certfile) if g.tls else True,
            str(g.admin_tls.certfile) if g.admin_tls else True,
        )

    def client(self, timeout: float = 30.0) -> Client:
        """A client of both planes (:meth:`target`)."""
        return self.target().client(timeout)

    def _write_gateway_file(self) -> None:
        path = self.config.state_dir / "gateway.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        g = self.config.gateway
        where = {
            "url": self.url,
            "admin_url": self.admin_url,
            "certfile": str(g.tls.certfile) if g.tls else None,
            "admin_certfile": str(g.admin_tls.certfile) if g.admin_tls else None,
            "pid": os.getpid(),
            "cluster": self.config.name,
        }
        path.write_text(json.dumps(where))

    # 3. stop -------------------------------------------------------------------------------------
    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None
        (self.config.state_dir / "gateway.json").unlink(missing_ok=True)

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def prepare(config: RuntimeConfig) -> Prepared:
    """Check the config against the repository and the store, before any process starts."""
    from failsoft.zoo import ModelRepository

    g = config.gateway
    check_bind(g.admin_host, g.admin_bind_port, g.allow_remote, g.admin_tls is not None)  # opt-in only
    note_inference_bind(g.host, g.port, g.tls is not None)
    check_tls(g.tls, f"{config.source}: gateway.tls")
    check_tls(g.admin_tls, f"{config.source}: gateway.admin_tls")
    token = admin_token(config)
    root = config.repository
    repo = ModelRepository(root)
    if not config.apps:  # only llm services: their models are not the repository's
        deployment = resolve(config, ())
        with open_store(config.store_url, config.state_dir, config.name):
            pass
        return Prepared(deployment, {}, {}, repo.root, token)
    if not repo.root.is_dir():
        raise ConfigError(
            f"model repository {str(root)!r} does not exist: build it with 'failsoft zoo build --out {root}'"
        )
    deployment = resolve(config, repo.families(), repository=f"model repository {str(root)!r}")
    models, variants = checked_models(repo, deployment)
    with open_store(config.store_url, config.state_dir, config.name):
        pass  # reachable (Redis) and writable (SQLite), or a StoreError now rather than later
    return Prepared(deployment, models, variants, repo.root, token)


def admin_token(config: RuntimeConfig) -> str:
    """The config's token, else ``$FAILSOFT_ADMIN_TOKEN``, else the state directory's (made once).

    Each is refused when shorter than ``MIN_TOKEN_CHARS`` (a ConfigError naming where it came from).
    """
    if config.admin_token:
        return checked_token(config.admin_token, f"{config.source}'s admin_token")
    if env := os.environ.get(TOKEN_ENV):
        return checked_token(env, f"${TOKEN_ENV}")
    path = config.state_dir / "admin_token"
    if path.is_file():
        return read_token_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return token
