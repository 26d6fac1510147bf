"""The controller's picture of the cluster, and the snapshot of it that policies plan on.

Per app the controller keeps three placements (FailLite 3.4's workflow):

* ``home``: the primary the app was deployed with; traffic returns there once its server is back;
* ``route``: where its requests go *now* (the home, a warm backup, a progressive or cold replica),
  or ``None`` while it has no live server;
* ``final``: during a progressive failover, where the app is being upgraded to (the plan's
  ``final_variant``) while the small ``first_variant`` already serves.

Per server: its health (:class:`~failsoft.domain.ServerState`, ``None`` until its first heartbeat),
the agent's incarnation, and what the controller believes it holds. Warm backups are kept with their
life cycle (:class:`~failsoft.domain.BackupState`: loading, then warm).

:meth:`ClusterState.snapshot` turns this into the :class:`~failsoft.domain.Scenario` the policies
read, where an app's ``primary`` is the capacity it takes now: its upgrade target when one is under
way, else its route, else its home (an app without a route thus counts as affected by its home
server's failure, and is planned again). The state serialises to the store's documents and back.

Times. The orchestration core runs on the clock its driver gives it (monotonic seconds in the
runtime, simulated seconds in the simulator); every time kept here is on that clock. What leaves the
core for people and other processes (the routing table, status, stored documents) is wall-clock
time: :attr:`ClusterState.wall_offset` (wall minus core time; 0 in the simulator) converts. The
runtime's driver keeps it fresh through :meth:`ClusterState.sync_wall`, which moves it only when
the two clocks have drifted apart by more than :data:`WALL_DRIFT_S`: re-reading the offset at every
tick would give one core time (a failure's detection) a slightly different wall time in every
publish, and the gateway, which tells failures apart by that time, would count one recovery twice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from failsoft.domain import App, BackupState, Placement, Scenario, Server, ServerState, Variant, WarmBackup
from failsoft.orchestration.llm_state import LlmRecords
from failsoft.services import Service


class RouteKind(StrEnum):
    PRIMARY = "primary"  # served by its home placement
    WARM = "warm"  # switched to a warm backup
    PROGRESSIVE = "progressive"  # a replica loaded by progressive failover (maybe upgrading)
    COLD = "cold"  # a full-size replica loaded from disk (baselines)
    PROMOTED = "promoted"  # a mechanism's pinned copy took over (HAMS: it holds the state): it stays


LIVE = (ServerState.UP, ServerState.SUSPECT)
REPLICA_OWNER = "replica"  # the owner of a pinned copy that is one of its app's replicas
WALL_DRIFT_S = 0.05  # how far the wall clock may drift from the core's before the offset follows it


@dataclass
class AppRecord:
    app: App  # app.primary is the home placement
    route: Placement | None = None
    kind: RouteKind = RouteKind.PRIMARY
    final: Placement | None = None
    detected_at: float | None = None  # core time of the failure the current route answers
    route_at: float | None = None  # core time the current route was published
    last_failover: dict[str, Any] | None = None  # {"at" (core time), "kind", "server", "variant"}

    @property
    def home(self) -> Placement:
        assert self.app.primary is not None
        return self.app.primary

    def to_doc(self, wall: float) -> dict[str, Any]:
        return {
            "route": _placement_doc(self.route),
            "kind": self.kind.value,
            "final": _placement_doc(self.final),
            "detected_at": _shift(self.detected_at, wall),
            "route_at": _shift(self.route_at, wall),
            "last_failover": _shift_at(self.last_failover, wall),
        }

    def load_doc(self, doc: dict[str, Any], wall: float) -> None:
        self.route = _placement(doc.get("route"))
        self.kind = RouteKind(doc.get("kind", "primary"))
        self.final = _placement(doc.get("final"))
        self.detected_at = _shift(doc.get("detected_at"), -wall)
        self.route_at = _shift(doc.get("route_at"), -wall)
        self.last_failover = _shift_at(doc.get("last_failover"), -wall)


@dataclass
class ServerRecord:
    server: Server
    state: ServerState | None = None  # None: not heard from yet
    incarnation: str | None = None
    holdings: set[tuple[str, str]] = field(default_factory=set)  # (app, variant)
    failed_at: float | None = None  # core time of the last detected failure
    pid: int | None = None  # of the agent's process, as last reported (not persisted)
    restarts: int = 0  # new agent processes seen after the first one

    @property
    def live(self) -> bool:
        return self.state in LIVE

    def to_doc(self, wall: float) -> dict[str, Any]:
        return {
            "state": self.state.value if self.state else None,
            "incarnation": self.incarnation,
            "holdings": sorted([a, v] for a, v in self.holdings),
            "failed_at": _shift(self.failed_at, wall),
            "restarts": self.restarts,
        }


@dataclass
class WarmRecord:
    """A warm backup and its life cycle. A pinned one (``backup.pinned``) is a mechanism's copy:
    ``owner`` names who pinned it (``slo:<service>``, ``graph:<service>``), and ``previous`` is the
    variant it replaces on the same server, unloaded once this one is warm (make before break)."""

    backup: WarmBackup
    state: BackupState = BackupState.LOADING
    owner: str | None = None
    previous: str | None = None


class ClusterState:
    """Servers, apps, warm backups: mutated by the controller only, from its event loop."""

    def __init__(self, deployment: Scenario) -> None:
        self.deployment = deployment
        self.families = {f.name: f for f in deployment.families}
        self.servers = {s.name: ServerRecord(s) for s in deployment.servers}
        self.apps = {a.name: AppRecord(a) for a in deployment.apps}
        self.warm: dict[tuple[str, str], WarmRecord] = {}  # (app, server)
        # replicas each app should have (its route included): its config's, then the autoscaler's
        self.scale: dict[str, int] = {a.name: a.min_replicas for a in deployment.apps}
        # replicas dropped by a scale-in, until their drain period ends: (app, server) -> variant;
        # the gateway sends them nothing new but lets the requests they hold finish (not persisted)
        self.draining: dict[tuple[str, str], str] = {}
        self.llm = LlmRecords()  # llm services' workers: member apps the core places (llm_state.py)
        self.wall_offset = 0.0  # wall-clock seconds minus core seconds (see the module docstring)
        self._wall_synced = False

    @classmethod
    def deployed(cls, deployment: Scenario) -> ClusterState:
        """A cluster in steady state: every server up, every app at home, the deployment's warm
        backups loaded (the simulator starts here; the runtime gets here by deploying)."""
        state = cls(deployment)
        for rec in state.servers.values():
            rec.state = ServerState.UP
        servers = state.servers
        for name, rec in state.apps.items():
            rec.route = home = rec.home
            servers[home.server].holdings.add((name, home.variant))
        for backup in deployment.warm or ():
            state.warm[(backup.app, backup.server)] = WarmRecord(backup, BackupState.WARM)
            state.servers[backup.server].holdings.add((backup.app, backup.variant))
        return state

    def adopt(self, deployment: Scenario) -> list[str]:
        """A deploy's new deployment: apps it adds get a record (no route yet), apps it keeps take
        their new settings and home; the names added. Records of apps it drops stay until the deploy
        retires them (:meth:`retire`): their routes serve the requests still on their way. Families
        are kept for them meanwhile."""
        self.deployment = deployment
        self.families.update({f.name: f for f in deployment.families})
        added = []
        for app in deployment.apps:
            rec = self.apps.get(app.name)
            if rec is None:
                self.apps[app.name] = AppRecord(app)
                added.append(app.name)
            else:
                rec.app = app
        return added

    def retire(self, app: str) -> None:
        """A removed app's drain is over: forget it (its models are being unloaded)."""
        self.apps.pop(app, None)
        for key in [k for k in self.warm if k[0] == app]:
            del self.warm[key]

    def reset_deployment(self, deployment: Scenario) -> None:
        """Start from another deployment (a restarted controller resuming the deployed config)."""
        self.deployment = deployment
        self.families = {f.name: f for f in deployment.families}
        self.apps = {a.name: AppRecord(a) for a in deployment.apps}

    def retiring(self, app: str) -> bool:
        """Whether ``app`` was removed by a deploy and is draining (served, planned no more)."""
        return app in self.apps and not self.deployment.has_app(app)

    @property
    def services(self) -> dict[str, Service]:
        """Every service by name (apps in none are served alone)."""
        return {s.name: s for s in self.deployment.all_services()}

    def sync_wall(self, wall_now: float, core_now: float) -> None:
        """Follow the wall clock, moving the offset only when it drifted past :data:`WALL_DRIFT_S`."""
        offset = wall_now - core_now
        if not self._wall_synced or abs(offset - self.wall_offset) > WALL_DRIFT_S:
            self.wall_offset, self._wall_synced = offset, True

    def wall(self, t: float | None) -> float | None:
        """A core time as wall-clock time."""
        return _shift(t, self.wall_offset)

    # lookups ---------------------------------------------------------------------------------
    def variant(self, app: str, variant: str) -> Variant:
        return self.families[self.apps[app].app.family].variant(variant)

    def live(self, server: str) -> bool:
        return self.servers[server].live

    def down(self) -> set[str]:
        """Servers that are failed or recovering (not to be planned on, their apps affected)."""
        return {n for n, r in self.servers.items() if r.state in (ServerState.FAILED, ServerState.RECOVERING)}

    def warm_of(self, app: str) -> list[WarmRecord]:
        return [w for (a, _), w in self.warm.items() if a == app]

    def needed_on(self, server: str) -> set[tuple[str, str]]:
        """What ``server`` must keep: routes, upgrade targets and warm backups placed on it (a pinned
        copy's previous variant too, until the new one is warm)."""
        need = {(w.backup.app, w.backup.variant) for (_, s), w in self.warm.items() if s == server}
        need |= {(w.backup.app, w.previous) for (_, s), w in self.warm.items() if s == server and w.previous}
        for name, rec in self.apps.items():
            for p in (rec.route, rec.final):
                if p is not None and p.server == server:
                    need.add((name, p.variant))
        return need

    def used_mb(self, server: str) -> float:
        """Memory the core counts on ``server``: what it holds and what it must keep or is loading."""
        models = self.servers[server].holdings | self.needed_on(server)
        held = sum(self.variant(a, v).memory_mb for a, v in models if a in self.apps)
        return held + self.llm.used_mb(server) if self.llm.workers else held

    def pinned_of(self, app: str) -> list[WarmRecord]:
        return [w for w in self.warm_of(app) if w.backup.pinned]

    def replicas_of(self, app: str) -> list[WarmRecord]:
        """``app``'s replicas besides its route (pinned copies owned by :data:`REPLICA_OWNER`)."""
        return [w for w in self.warm_of(app) if w.backup.pinned and w.owner == REPLICA_OWNER]

    def serving(self, app: str) -> list[Placement]:
        """Where ``app`` serves now: its route, then its loaded replicas (by server)."""
        rec = self.apps[app]
        out = [] if rec.route is None else [rec.route]
        for w in sorted(self.replicas_of(app), key=lambda w: w.backup.server):
            if w.state is BackupState.WARM and self.live(w.backup.server):
                out.append(Placement(w.backup.server, w.backup.variant))
        return out

    # the policies' view ----------------------------------------------------------------------
    def snapshot(self, with_warm: bool = True, live_only: bool = False) -> Scenario:
        """The scenario policies plan on.

        ``with_warm=False`` leaves warm backups to the policy (proactive planning), except pinned
        ones, which are a mechanism's and stay: their memory and compute are taken off their servers'
        capacity. ``live_only`` keeps only live servers and the apps placed on them (warm backups are
        planned there only).
        """
        apps = tuple(self._as_placed(r) for n, r in self.apps.items() if self.deployment.has_app(n))
        servers = self.deployment.servers
        if self.llm.workers:  # LLM workers' memory is not the policies' to plan with
            servers = _less_memory(servers, self.llm.taken())
        if not with_warm:
            servers = self._less_pinned(servers)
        if live_only:
            servers = tuple(s for s in servers if self.live(s.name))
            apps = tuple(a for a in apps if a.primary is not None and self.live(a.primary.server))
        warm = None
        if with_warm:
            live = {name for name, rec in self.servers.items() if rec.state in LIVE}
            warm = tuple(w.backup for w in self.warm.values() if w.state is BackupState.WARM)
            warm = tuple(b for b in warm if b.server in live)
        return self.deployment.replace(servers=servers, apps=apps, warm=warm)

    def _less_pinned(self, servers: tuple[Server, ...]) -> tuple[Server, ...]:
        taken: dict[str, tuple[float, float]] = {}
        for w in self.warm.values():
            if w.backup.pinned:
                app = self.apps[w.backup.app].app
                d = self.variant(app.name, w.backup.variant).demand(app.rate_rps)
                m, c = taken.get(w.backup.server, (0.0, 0.0))
                taken[w.backup.server] = (m + d.memory_mb, c + d.compute)
        if not taken:
            return servers
        return tuple(
            dataclasses.replace(
                s,
                memory_mb=max(s.memory_mb - taken[s.name][0], 0.0),
                compute=max(s.compute - taken[s.name][1], 0.0),
            )
            if s.name in taken
            else s
            for s in servers
        )

    def _as_placed(self, rec: AppRecord) -> App:
        app = rec.app
        if rec.final is None and (rec.route is None or rec.route is app.primary):
            return app  # at home (most apps of every snapshot): nothing to compute
        reserved = self._reserved(rec)
        return rec.app if reserved == rec.app.primary else dataclasses.replace(rec.app, primary=reserved)

    def _reserved(self, rec: AppRecord) -> Placement:
        if rec.final is not None and self.live(rec.final.server):
            return rec.final
        if rec.route is not None:
            return rec.route
        return rec.home

    # what the gateway and the CLI see --------------------------------------------------------
    def route_entry(self, name: str) -> dict[str, Any]:
        rec = self.apps[name]
        entry: dict[str, Any] = {
            "family": rec.app.family,
            "critical": rec.app.critical,
            "slo_ms": rec.app.slo_ms,
            "home": _placement_doc(rec.home),
            "route": None,
            "pinned": [
                {
                    "server": w.backup.server,
                    "variant": w.backup.variant,
                    "owner": w.owner,
                    "ready": w.state is BackupState.WARM,
                }
                for w in self.pinned_of(name)
            ],
            "replicas": {
                "wanted": self.scale.get(name, 1),
                "autoscaling": rec.app.autoscaling is not None,
                "serving": [
                    {
                        "server": p.server,
                        "variant": p.variant,
                        "accuracy": self.variant(name, p.variant).accuracy,
                    }
                    for p in self.serving(name)[1:]
                ],
                "draining": sorted(s for (a, s) in self.draining if a == name and self.live(s)),
            },
            # loaded warm backups on live servers: where the gateway moves a call whose server's
            # connection ended before this table moves the route (docs/runtime.md, "The next route")
            "warm": [
                {
                    "server": w.backup.server,
                    "variant": w.backup.variant,
                    "degraded": self._degraded(rec, w.backup.variant),
                    "accuracy": self.variant(name, w.backup.variant).accuracy,
                }
                for w in self.warm_of(name)
                if not w.backup.pinned and w.state is BackupState.WARM and self.live(w.backup.server)
            ],
        }
        if rec.route is not None:
            entry["route"] = {
                "server": rec.route.server,
                "variant": rec.route.variant,
                "kind": rec.kind.value,
                "degraded": self._degraded(rec, rec.route.variant),
                "accuracy": self.variant(name, rec.route.variant).accuracy,
                "detected_at": self.wall(rec.detected_at),
                "route_at": self.wall(rec.route_at),
            }
        return entry

    def _degraded(self, rec: AppRecord, variant: str) -> bool:
        """Whether ``variant`` of ``rec``'s app is smaller or less accurate than its home variant."""
        served, home = self.variant(rec.app.name, variant), self.variant(rec.app.name, rec.home.variant)
        return served.memory_mb < home.memory_mb or served.accuracy < home.accuracy

    def routes(self) -> dict[str, Any]:
        return {name: self.route_entry(name) for name in self.apps}

    def status(self) -> dict[str, Any]:
        servers = []
        for name, rec in self.servers.items():
            used = sum(self.variant(a, v).memory_mb for a, v in rec.holdings if a in self.apps)
            used += self.llm.used_mb(name)
            servers.append(
                {
                    "name": name,
                    "site": rec.server.site,
                    "state": rec.state.value if rec.state else "starting",
                    "memory_mb": rec.server.memory_mb,
                    "used_mb": round(used, 3),
                    "models": len(rec.holdings),
                    "restarts": rec.restarts,
                    "last_failure": self.wall(rec.failed_at),
                }
            )
        apps = []
        for name, rec in self.apps.items():
            route = self.route_entry(name)["route"]
            apps.append(
                {
                    "name": name,
                    "family": rec.app.family,
                    "critical": rec.app.critical,
                    "primary": _placement_doc(rec.home),
                    "route": None
                    if route is None
                    else {"server": route["server"], "variant": route["variant"]},
                    "variant": None if route is None else route["variant"],
                    "accuracy": None if route is None else route["accuracy"],
                    "primary_accuracy": self.variant(name, rec.home.variant).accuracy,
                    "kind": None if route is None else route["kind"],
                    "degraded": bool(route and route["degraded"]),
                    "upgrading_to": _placement_doc(rec.final),
                    "warm_backups": [
                        {
                            "server": w.backup.server,
                            "variant": w.backup.variant,
                            "state": w.state.value,
                            "pinned": w.backup.pinned,  # a mechanism's copy (HAMS, Jellyfish)
                        }
                        for w in self.warm_of(name)
                        if w.owner != REPLICA_OWNER
                    ],
                    "replicas": {
                        "wanted": self.scale.get(name, 1),
                        "serving": [p.server for p in self.serving(name)],
                        "loading": sorted(
                            w.backup.server for w in self.replicas_of(name) if w.state is BackupState.LOADING
                        ),
                    },
                    "last_failover": _shift_at(rec.last_failover, self.wall_offset),
                }
            )
        return {"servers": servers, "apps": apps, "llm_workers": self.llm.status()}

    # persistence -----------------------------------------------------------------------------
    def to_docs(self) -> dict[str, dict[str, dict[str, Any]]]:
        wall = self.wall_offset
        return {
            "apps": {n: r.to_doc(wall) for n, r in self.apps.items()},
            "servers": {n: r.to_doc(wall) for n, r in self.servers.items()},
            "warm": {
                f"{a}@{s}": {
                    "app": a,
                    "server": s,
                    "variant": w.backup.variant,
                    "state": w.state.value,
                    "pinned": w.backup.pinned,
                    "owner": w.owner,
                }
                for (a, s), w in self.warm.items()
            },
            "scale": {a: {"replicas": n} for a, n in self.scale.items()},
            "llm": self.llm.to_docs(),
        }

    def load_docs(self, docs: dict[str, dict[str, dict[str, Any]]]) -> None:
        """Restore what a previous controller persisted (entries for unknown apps/servers are dropped)."""
        wall = self.wall_offset
        for name, doc in docs.get("apps", {}).items():
            if name in self.apps:
                self.apps[name].load_doc(doc, wall)
        for name, doc in docs.get("servers", {}).items():
            if name in self.servers:
                rec = self.servers[name]
                rec.state = ServerState(doc["state"]) if doc.get("state") else None
                rec.incarnation = doc.get("incarnation")
                rec.holdings = {(a, v) for a, v in doc.get("holdings", [])}
                rec.failed_at = _shift(doc.get("failed_at"), -wall)
                rec.restarts = int(doc.get("restarts", 0))
        self.warm = {}
        for doc in docs.get("warm", {}).values():
            if doc["app"] in self.apps and doc["server"] in self.servers:
                backup = WarmBackup(doc["app"], doc["variant"], doc["server"], bool(doc.get("pinned")))
                record = WarmRecord(backup, BackupState(doc["state"]), doc.get("owner"))
                self.warm[(backup.app, backup.server)] = record
        for name, doc in docs.get("scale", {}).items():
            if name in self.scale:
                self.scale[name] = int(doc["replicas"])
        self.llm.load_docs(docs.get("llm", {}), set(self.servers))


def _less_memory(servers: tuple[Server, ...], taken: dict[str, float]) -> tuple[Server, ...]:
    return tuple(
        dataclasses.replace(s, memory_mb=max(s.memory_mb - taken[s.name], 0.0)) if taken.get(s.name) else s
        for s in servers
    )


def _shift(t: float | None, by: float) -> float | None:
    return None if t is None else t + by


def _shift_at(doc: dict[str, Any] | None, by: float) -> dict[str, Any] | None:
    return None if doc is None else {**doc, "at": _shift(doc.get("at"), by)}


def _placement_doc(p: Placement | None) -> dict[str, str] | None:
    return None if p is None else {"server": p.server, "variant": p.variant}


def _placement(doc: dict[str, str] | None) -> Placement | None:
    return None if doc is None else Placement(doc["server"], doc["variant"])
