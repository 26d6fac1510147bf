"""``failsoft bench failover CONFIG``: the same real failure under each failover policy (FailLite 5.2).

For every policy (``faillite``, ``full-warm-k``, ``full-warm``, ``full-cold``) and every repeat, a
fresh cluster is served from the config (agents are *not* restarted by Ray, so the failed server stays
down, as in FailLite's testbed). Client load runs against the digits apps throughout and against the
ImageNet-style apps during the warm-up (their baseline); then the chosen server(s) are killed
(SIGKILL) and a client asks every affected app once, right away. Measured, in milliseconds (FailLite
5.1's metrics):

* ``detection_ms``: kill to the controller's detection (the gateway's data-plane connection ending,
  or two missed 20 ms heartbeats: ``detected_by`` says which, per killed server); with
  ``kill_offset_ms``, each server's kill after the first (all are killed in one call: 1-2 ms apart
  on a busy 2-core host, up to 12);
* ``rerouted_ms``: per affected app, the kill to the first answer on the app's new route as the
  gateway saw it: how long requests in flight at the kill took to be on their next route, plus
  that answer's inference (for a warm switch, nothing is loaded); ``connection_end_ms``, per
  killed server, the kill to the gateway seeing its data-plane connection end: at the word of the
  agent's heartbeat sidecar, which looks for the death every 5 ms and tells the gateways watching
  it, or at the socket's close, which the kernel does only at the end of the dying process's
  teardown, once its memory is freed (``connection_end_by``: ``sidecar`` or ``socket``, whichever
  came first), and ``rerouted_after_end_ms``
  per app, ``rerouted_ms`` less that: from the connection's end to the answer on the next route;
* ``in_flight``: per request that met a killed server (in flight on it at the kill, or sent while
  its route still named it; ``failsoft bench failover`` slows the servers to kill ``--hold-ms``, 300
  ms by default, before the kill so that the steady load's requests are waiting there), the kill (or
  its later arrival) to its call on the next route (``next_route_ms``, the issue's 10 ms target) and
  to that call's answer (``answer_ms``), with the timeline of each step from the kill (connection
  end, call failed, the controller's route published and seen, sent, answered) and how the next
  route was found (:mod:`.next_route`);
* ``mttr_ms``: per affected app, FailLite's MTTR (5.1): detection to the clients being told the new
  location (the route published to the gateway and the ``failover`` event), model loading included;
* ``first_answer_ms``: per affected app, detection to the first answer on the new route as the
  gateway saw it, which adds that answer's inference (on CPUs shared by every server of an embedded
  cluster, ImageNet inference under contention can dominate it);
* ``outage_ms``: per affected app, what a client saw: the first successful answer after the kill,
  minus the kill time, minus the app's usual latency (``warm`` / ``progressive`` / ``cold``: the
  same, by how the app was recovered);
* ``ideal_ms``: per affected app, the MTTR its recovery allows in isolation: 0 for a warm switch;
  for a load, its first variant's profiled ``load_ms``, queued shortest first behind the other
  loads sent to the same server (``max_parallel_loads`` at once), as
  :func:`~failsoft.orchestration.loads.shortest_first_finish_ms` computes; ``mttr_ms`` beside it
  (``mttr_over_ideal``) is what the calls, the controller and a busy host add;
* ``recovery_rate``: affected apps answering again within the window, over affected apps;
* ``accuracy_reduction_pct``: mean over recovered apps of ``(a_primary - a_served) / a_primary`` with
  the variant each app settled on (after progressive upgrades), in percent.

The JSON also says which apps were affected, how requests fared, whether heartbeats misfired
(``spurious_failures``), and checks the targets: detection p50 <= 50 ms, warm outage p50 <= 100 ms,
faillite's mean MTTR at least 3x lower than full-warm-k's with a 100 % recovery rate.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from failsoft.bench.models import ensure_models
from failsoft.bench.next_route import moved_requests, summarize_moves
from failsoft.errors import ConfigError, RepositoryError
from failsoft.policies.adaptation.network import MAX_FPS
from failsoft.runtime.config import RuntimeConfig, load_config
from failsoft.runtime.gateway.metrics import first_recoveries
from failsoft.runtime.load_phases import timeline
from failsoft.runtime.loadgen import LoadProcess, LoadSpec, Sample
from failsoft.services import ServiceMode
from failsoft.zoo.machine import HostCpu

POLICIES = ("faillite", "full-warm-k", "full-warm", "full-cold")
Progress = Callable[[str], None]
log = logging.getLogger(__name__)
BUSY_WINDOW_S = 3.0  # the host's busy cores are measured over the last seconds of steady load


PAGE_CACHE_STATES = ("warm", "cold")
HOLD_SLOW_MS = 10_000.0  # a held server's slowdown: longer than any hold, it dies first


@dataclass(frozen=True)
class BenchSettings:
    policies: tuple[str, ...] = POLICIES
    kill: tuple[str, ...] = ()  # servers to kill (empty: the one hosting most primaries)
    site: str | None = None  # or a whole site
    repeats: int = 3
    warmup_s: float = 5.0  # steady load before measuring anything
    window_s: float = 30.0  # how long affected apps get to recover
    settle_s: float = 2.0  # after the last recovery, to see upgrades land
    period_s: float | None = None  # None: every app at its config's rate_rps; else this period for all
    usual_requests: int = 3  # per affected app, alone, before the kill: its usual latency
    max_in_flight: int = 4  # per app, steady load
    timeout_s: float = 30.0  # per request: clients wait through a recovery
    # the killed servers are slowed (chaos slow) this long before the kill, so that the steady
    # load's requests to them are in flight there at the kill (``in_flight``); 0: killed as found
    # (``failsoft bench failover`` holds 300 ms by default)
    hold_ms: float = 0.0
    # the weights' page-cache state at the kill: "warm" (every variant of the config's families read
    # into memory before the cluster starts), "cold" (evicted once the cluster is up: failover loads
    # read the disk), None (as found)
    page_cache: str | None = None

    def __post_init__(self) -> None:
        if self.page_cache not in (None, *PAGE_CACHE_STATES):
            raise ConfigError(
                f"page cache must be one of {', '.join(PAGE_CACHE_STATES)}; got {self.page_cache!r}"
            )


def run(config_path: str | Path, settings: BenchSettings, progress: Progress | None = None) -> dict[str, Any]:
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    base = load_config(config_path)
    ensure_models(base, say)
    failed = victims(base, settings)
    out: dict[str, Any] = {"config": str(config_path), "failed": failed, "policies": {}}
    for policy in settings.policies:
        runs = []
        for repeat in range(settings.repeats):
            say(f"[{policy}] run {repeat + 1}/{settings.repeats}: deploying ...")
            cfg = bench_config(base, policy)
            try:
                runs.append(run_once(cfg, failed, settings, say))
            finally:
                shutil.rmtree(cfg.state_dir, ignore_errors=True)  # a throwaway store per run
        out["policies"][policy] = summarize(runs)
    out["targets"] = check_targets(out["policies"])
    out["settings"] = dataclasses.asdict(settings) | {
        "heartbeat_interval_ms": base.heartbeat.interval_s * 1000
    }
    return out


def contended_profiles(config: RuntimeConfig) -> list[str]:
    """``family/variant`` of the config's families whose profiles were measured while other work
    crowded the host (their times are inflated: the simulator's twin would be slowed with them)."""
    from failsoft.zoo import ModelRepository
    from failsoft.zoo.profiler import contended

    repo = ModelRepository(config.repository)
    out = []
    for family in sorted({a.family for a in config.apps}):
        for variant in repo.variant_names(family):
            try:
                if contended(repo.profile(family, variant)):
                    out.append(f"{family}/{variant}")
            except RepositoryError:  # not profiled
                continue
    return out


def set_page_cache(config: RuntimeConfig, warm: bool) -> int:
    """Read every weight file of the config's families into the page cache (``warm``) or ask the
    kernel to drop them (pages a loaded model still maps stay); returns the files touched."""
    from failsoft.zoo import ModelRepository, pagecache
    from failsoft.zoo.layout import WEIGHTS_FILE

    repo = ModelRepository(config.repository)
    files = [
        path
        for family in sorted({a.family for a in config.apps})
        for variant in repo.variant_names(family)
        if (path := repo.variant_dir(family, variant) / WEIGHTS_FILE).is_file()
    ]
    for path in files:
        if warm:
            pagecache.prefetch(path)
        else:
            pagecache.evict(path)
    return len(files)


def victims(config: RuntimeConfig, settings: BenchSettings) -> list[str]:
    if settings.site is not None:
        names = [s.name for s in config.servers if s.site == settings.site]
        if not names:
            raise ConfigError(f"unknown site {settings.site!r} (sites: {', '.join(config.sites)})")
        return names
    if settings.kill:
        for name in settings.kill:
            config.server(name)
        return list(settings.kill)
    from failsoft.runtime.session import prepare

    deployment = prepare(config).deployment
    counts = {s.name: 0 for s in config.servers}
    for app in deployment.apps:
        if app.primary is not None:
            counts[app.primary.server] += 1
    return [max(counts, key=lambda s: (counts[s], -list(counts).index(s)))]


def bench_config(base: RuntimeConfig, policy: str) -> RuntimeConfig:
    state = Path(tempfile.mkdtemp(prefix=f"failsoft-bench-{policy}-"))
    return (
        base.replace(policy=policy, state_dir=state, store_url="sqlite", admin_token=None)
        .with_gateway(port=0)
        .with_agents(restart=False)
    )


# ----------------------------------------------------------------------------------------------
# One run: deploy, load, kill, watch.
# ----------------------------------------------------------------------------------------------


def run_once(
    cfg: RuntimeConfig,
    failed: Sequence[str],
    settings: BenchSettings,
    say: Progress,
    before_kill: Callable[[Any, Any], dict[str, Any]] | None = None,
    under_load: Callable[[Any, Any], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One deployment, steady load, the kill and its recoveries. ``before_kill(session, client)``
    runs once the cluster is stable, before the load starts, ``under_load(session, client)`` once
    the steady load runs, before the host is measured; what they return is kept as
    ``before_kill`` (``bench fidelity`` times its mechanism twins and its probes there)."""
    from failsoft.runtime.session import Session

    if settings.page_cache == "warm":
        set_page_cache(cfg, warm=True)
    with Session(cfg) as session:
        client = session.client(timeout=30.0)
        wait_stable(client, 120.0)
        extra = before_kill(session, client) if before_kill is not None else None
        if extra is not None:
            wait_stable(client, 120.0)
        if settings.page_cache == "cold":
            set_page_cache(cfg, warm=False)
        before = client.status()
        affected = [a["name"] for a in before["apps"] if a["route"] and a["route"]["server"] in failed]
        asked = Endpoints.of(cfg, _shapes(session), _periods(cfg, settings))
        probed: dict[str, Any] = {}
        kill_at, samples, usual, busy = _fail_under_load(
            session.url, client, asked, affected, failed, settings,
            agents=AgentProbes([s.name for s in cfg.servers]),
            under_load=None if under_load is None else lambda: probed.update(under_load(session, client)),
        )  # fmt: skip
        if probed:
            extra = (extra or {}) | probed
        say(f"[{cfg.policy}] killed {', '.join(kill_at)}; {len(affected)} apps affected")
        report = client.recoveries()
        client.close()
    result = measure(before, affected, kill_at, samples, report, usual, asked.endpoint)
    add_ideal(result["apps"], cfg)
    # under steady load, before the kill: the host's busy cores, and whose they were
    result["host_busy_cores"] = busy["busy_cores"]
    result["host_cpu"] = busy
    result["page_cache"] = settings.page_cache
    if extra is not None:
        result["before_kill"] = extra
    result["warm"] = loaded_copies(before)  # at the kill: the simulator's twin starts from them
    return result


def loaded_copies(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The warm backups and the mechanisms' pinned copies loaded in a controller status."""
    return [
        {"app": a["name"], "variant": w["variant"], "server": w["server"], "pinned": bool(w.get("pinned"))}
        for a in status["apps"]
        for w in a["warm_backups"]
        if w["state"] == "warm"
    ]


def _periods(cfg: RuntimeConfig, settings: BenchSettings) -> dict[str, float]:
    """Seconds between two requests of each app with load: the config's rates, or one period for all."""
    if settings.period_s is not None:
        return {a.name: settings.period_s for a in cfg.apps}
    return {a.name: 1.0 / a.rate_rps for a in cfg.apps if a.rate_rps > 0}


@dataclass(frozen=True)
class Endpoints:
    """What the clients ask: each app's *endpoint*, the name the gateway serves it under (its
    service's, where a service groups it: the gateway serves no member alone), and each endpoint's
    input shape and request period (those of the member a request enters by, its front app)."""

    endpoint: dict[str, str]  # app -> endpoint
    shapes: dict[str, tuple[int, ...]]  # endpoint -> its requests' input shape
    periods: dict[str, float]  # endpoint -> seconds between two of its steady requests
    slo: tuple[str, ...] = ()  # the slo services among the endpoints: they answer registered clients
    # endpoint -> its requests' further parameters (an slo service's registered client)
    parameters: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, cfg: RuntimeConfig, metas: dict[str, Any], periods: dict[str, float]) -> Endpoints:
        """``metas``: each app's model metadata (its ``input_shape``); ``periods``: each app's."""
        from failsoft.runtime.gateway.dispatch.graph import front_app

        endpoint = {a.name: a.name for a in cfg.apps}
        front = {a.name: a.name for a in cfg.apps}
        for service in cfg.services:
            endpoint |= dict.fromkeys(service.members, service.name)
            front = {k: v for k, v in front.items() if k not in service.members}
            front[service.name] = front_app(service)
        return cls(
            endpoint,
            {e: metas[app].input_shape for e, app in front.items()},
            {e: periods[app] for e, app in front.items() if app in periods},
            tuple(s.name for s in cfg.services if s.mode is ServiceMode.SLO),
        )

    def register(self, url: str) -> Endpoints:
        """One client registered with each slo service, at its steady rate, its id on every request
        (Jellyfish maps clients to workers; an slo service answers no one else)."""
        import httpx

        from failsoft.client import checked_body

        parameters = dict(self.parameters)
        for name in self.slo:
            fps = min(1.0 / self.periods.get(name, 1.0), MAX_FPS)
            body = {"service": name, "fps": fps}
            parameters[name] = {
                "client": checked_body(httpx.post(f"{url}/v2/clients", json=body, timeout=30.0))["client"]
            }
        return dataclasses.replace(self, parameters=parameters)

    def asked(self, apps: Sequence[str]) -> list[str]:
        """The endpoints of ``apps``, each once, in their order."""
        return list(dict.fromkeys(self.endpoint[a] for a in apps))


def _fail_under_load(
    url: str,
    client: Any,
    asked: Endpoints,
    affected: list[str],
    failed: Sequence[str],
    settings: BenchSettings,
    agents: AgentProbes | None = None,
    under_load: Callable[[], None] | None = None,
) -> tuple[dict[str, float], list[Sample], list[Sample], dict[str, Any]]:
    """Steady load; each affected app's usual latency; kill; ask each affected app at once; watch.
    Also returns the host's busy cores over the last seconds of steady load, split by scheduling
    group (:class:`HostCpu`), and what the ``agents`` measured in that window (the share of a core a
    recovery load got on each server: ``load_cpu_share``); under ``recovery``, the same split from
    the kill until every affected app answered again, with the CPU the agents' loads took meanwhile
    (``loads_cores``: recoveries and upgrades, which a simulation runs as work of its own).

    Every client runs in its own process (its CPU is not the gateway's interpreter's), and the
    requests sent at the kill come from a client made ready beforehand, so they leave within a
    millisecond of the kill call's return.
    """
    span = settings.warmup_s + 60.0 + settings.window_s + settings.settle_s
    steady = LoadProcess(
        LoadSpec(
            url, {e: asked.shapes[e] for e in asked.periods}, 1.0, settings.timeout_s, span,
            max_in_flight=settings.max_in_flight, periods=asked.periods, stagger=True, gated=True,
        )
    ).start()  # fmt: skip
    only_affected = {e: asked.shapes[e] for e in asked.asked(affected)}
    usual = LoadProcess(
        LoadSpec(
            url, only_affected, 3600.0, settings.timeout_s, 600.0, sequential=settings.usual_requests,
            gated=True,
        )
    ).start()  # fmt: skip
    at_kill = LoadProcess(
        LoadSpec(url, only_affected, 3600.0, settings.window_s, 0.01, max_in_flight=1, gated=True)
    ).start()
    # the slo services' clients, registered once the steady load can keep them alive at once (a
    # service forgets a client silent for 10 s; a child process can take that long to start)
    steady.wait_ready()
    asked = asked.register(url)
    steady.go(asked.parameters)
    if under_load is not None:  # probes of the loaded cluster, done before the window below
        under_load()
    time.sleep(max(settings.warmup_s - BUSY_WINDOW_S, 0.0))
    doomed = AgentProbes(failed).pids() if agents is not None else {}
    meter, window_ends = HostCpu(), time.monotonic() + min(settings.warmup_s, BUSY_WINDOW_S)
    shares = agents.load_cpu_shares() if agents is not None else None
    time.sleep(max(window_ends - time.monotonic(), 0.0))
    busy = meter.read(doomed) | ({"load_cpu_share": shares} if shares else {})
    busy |= _not_after_the_kill(busy, shares or {}, failed)
    usual.wait_ready()
    usual.go(asked.parameters)
    usual_samples = usual.join(600.0)
    at_kill.wait_ready()
    loads_before = agents.loads_cpu_ms() if agents is not None else {}
    during = HostCpu()
    _hold(client, failed, settings.hold_ms)
    kill_at = _kill(client, failed, settings.site)
    at_kill.go(asked.parameters)
    _wait_recovered(client, affected, asked.endpoint, min(kill_at.values()), settings.window_s)
    busy["recovery"] = during.read()  # the same, from the kill until every affected app answered
    if agents is not None:
        loads_s = agents.loads_cpu_ms_since(loads_before, leave_out=list(kill_at)) / 1000.0
        busy["recovery"]["loads_cores"] = round(loads_s / max(busy["recovery"]["seconds"], 1e-3), 3)
    time.sleep(settings.settle_s)
    return kill_at, steady.stop() + at_kill.stop(), usual_samples, busy


def _not_after_the_kill(
    busy: dict[str, Any], shares: dict[str, float], failed: Sequence[str]
) -> dict[str, Any]:
    """What of the steady window's own busy cores a recovery will not meet: the killed servers'
    agents (their serving stops with them: ``failed_agents_cores``) and the agents' load-share
    probes, which spin in the window (``probe_cores``: their share times their spin, the killed
    servers' left out as counted already)."""
    spun = sum(share * PROBE_SPIN_S for server, share in shares.items() if server not in failed)
    return {
        "failed_agents_cores": round(sum((busy.get("processes") or {}).values()), 3),
        "probe_cores": round(spun / max(float(busy["seconds"]), 1e-3), 3),
    }


PROBE_SPIN_S = 0.3  # each agent's load-share probe spins this long (AgentProbes.load_cpu_shares)


class AgentProbes:
    """What the benchmark asks the agents directly (the driver's Ray handles): how much of a core a
    recovery load would get now, and how much CPU their loads have taken so far."""

    def __init__(self, servers: Sequence[str]) -> None:
        self.servers = list(servers)

    def _each(self, ask: Callable[[Any], float]) -> dict[str, float]:
        from failsoft.runtime.cluster import find_agent

        out = {}
        for server in self.servers:  # one at a time: the probes never meet each other
            try:
                out[server] = round(ask(find_agent(server)), 3)
            except Exception as exc:  # a server down at the moment: no figure for it
                log.debug("probing %s: %s", server, exc)
        return out

    def load_cpu_shares(self, seconds: float = PROBE_SPIN_S) -> dict[str, float]:
        return self._each(lambda agent: agent.load_cpu_share_sync(seconds))

    def pids(self) -> dict[str, int]:
        """The agent processes' pids (of the servers that answer)."""
        return {s: int(p) for s, p in self._each(lambda agent: agent.holdings_sync()["pid"]).items()}

    def loads_cpu_ms(self) -> dict[str, float]:
        return self._each(lambda agent: float(agent.holdings_sync()["loads_cpu_ms"]))

    def loads_cpu_ms_since(self, before: dict[str, float], leave_out: Sequence[str] = ()) -> float:
        """The CPU (ms) the agents' loads took since ``before`` (a :meth:`loads_cpu_ms`), all of
        them but ``leave_out``'s."""
        after = self.loads_cpu_ms()
        return sum(after[s] - before.get(s, 0.0) for s in after if s not in leave_out)


def _hold(client: Any, failed: Sequence[str], hold_ms: float) -> None:
    """Slow every server about to be killed so that requests wait there for ``hold_ms``: at a
    few requests per second of millisecond models, hardly any is in flight at a random instant,
    and the requests in flight at the kill are what ``in_flight`` measures."""
    if hold_ms <= 0:
        return
    for name in failed:
        client.admin("slow", server=name, ms=HOLD_SLOW_MS)
    time.sleep(hold_ms / 1000.0)


def _kill(client: Any, failed: Sequence[str], site: str | None) -> dict[str, float]:
    """Kill the victims at one instant (a whole site, or every server named, in one call: one call
    each would put the second kill tens of milliseconds after the first, behind the gateway's look
    at each agent's process, where a config says they die at once); the wall time each one died at."""
    body = (
        {"site": site} if site else {"server": failed[0]} if len(failed) == 1 else {"servers": list(failed)}
    )
    return {k["server"]: k["at"] for k in client.admin("kill", **body)["killed"]}


def _shapes(session: Any) -> dict[str, Any]:
    models = session.prepared.models
    return {a.name: models[a.family] for a in session.prepared.deployment.apps}


def wait_stable(client: Any, timeout_s: float) -> dict[str, Any]:
    """Until every app is served at home and every warm backup is loaded (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.status()
        home = all(a["route"] == a["primary"] for a in status["apps"])
        warm = all(w["state"] == "warm" for a in status["apps"] for w in a["warm_backups"])
        up = all(s["state"] == "up" for s in status["servers"])
        if (home and warm and up) or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def _wait_recovered(
    client: Any, affected: list[str], endpoint: dict[str, str], since: float, window_s: float
) -> None:
    """Until every affected app's endpoint answered again (the gateway's recoveries name
    endpoints), or the controller gave the app up, or ``window_s``. A service's member is waited
    for until its failover is published: the service may answer through its other members (an slo
    service's clients move to the survivors), and so log no recovery of its own."""
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        report = client.recoveries()
        done = {r["app"] for r in report["recoveries"] if r["detected_at"] >= since - 1.0}
        given_up = {
            e["app"] for e in report["events"] if e["type"] == "unrecovered" and e["timestamp"] >= since
        }
        moved = {e["app"] for e in report["events"] if e["type"] == "failover" and e["timestamp"] >= since}
        members_moved = {a for a in moved if endpoint.get(a, a) != a}
        if all(endpoint.get(a, a) in done or a in given_up | members_moved for a in affected):
            return
        time.sleep(0.1)


# ----------------------------------------------------------------------------------------------
# From raw observations to the benchmark's JSON.
# ----------------------------------------------------------------------------------------------


def measure(
    before: dict[str, Any],
    affected: list[str],
    kill_at: dict[str, float],
    samples: list[Sample],
    report: dict[str, Any],
    usual: Sequence[Sample] = (),
    endpoint: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``endpoint``: the name each app was asked under (its service's; its own by default); an app's
    answers are its endpoint's."""
    asked = {app: (endpoint or {}).get(app, app) for app in affected}
    first_kill = min(kill_at.values())
    events = [e for e in report["events"] if e["timestamp"] >= first_kill - 0.5]
    detected, detected_by = {}, {}
    for e in events:
        if e["type"] == "failure" and e.get("server") in kill_at and e["server"] not in detected:
            detected[e["server"]] = e["detected_at"]
            detected_by[e["server"]] = e.get("cause", "heartbeats")
    ended, ended_by = {}, {}  # the gateway's connection_lost events: when it saw each killed agent die
    for e in events:
        if e["type"] == "connection_lost" and e.get("server") in kill_at and e["server"] not in ended:
            ended[e["server"]] = e["timestamp"]
            ended_by[e["server"]] = "sidecar" if "sidecar" in e.get("reason", "") else "socket"
    spurious = sorted(
        {e["server"] for e in events if e["type"] == "failure" and e.get("server") not in kill_at}
    )
    answers = first_recoveries(report["recoveries"], first_kill - 0.5)
    primary_acc = {a["name"]: _accuracy(before, a["name"]) for a in before["apps"]}
    apps = {
        app: _app_result(
            app, events, answers.get(asked[app]), samples, kill_at, first_kill, primary_acc.get(app),
            _usual_ms(usual, asked[app]), asked[app],
        )
        for app in affected
    }  # fmt: skip
    if ended:
        end = min(ended.values())
        for a in apps.values():
            moved = a["rerouted_ms"]
            a["rerouted_after_end_ms"] = None if moved is None else moved - (end - first_kill) * 1000.0
    failed_requests = [s for s in samples if not s.ok and not s.dropped]
    return {
        "detection_ms": {s: (detected[s] - kill_at[s]) * 1000.0 for s in detected},
        "detected_by": detected_by,
        "kill_offset_ms": {s: (at - first_kill) * 1000.0 for s, at in kill_at.items()},  # one kill each
        "connection_end_ms": {s: (ended[s] - kill_at[s]) * 1000.0 for s in ended},
        "connection_end_by": ended_by,
        "apps": apps,
        "affected": affected,
        "in_flight": moved_requests(report.get("moves", []), kill_at, affected),
        "spurious_failures": spurious,
        "requests": {
            "total": len(samples),
            "failed": len(failed_requests),
            "failed_affected": sum(1 for s in failed_requests if s.app in asked.values()),
            "dropped": sum(1 for s in samples if s.dropped),
            "errors": sorted({(s.error or "")[:120] for s in failed_requests})[:5],
        },
    }


def _app_result(
    app: str,
    events: list[dict[str, Any]],
    answer: dict[str, Any] | None,
    samples: list[Sample],
    kill_at: dict[str, float],
    first_kill: float,
    accuracy_primary: float | None,
    usual_ms: float | None = None,
    endpoint: str | None = None,
) -> dict[str, Any]:
    failover = next((e for e in events if e["type"] == "failover" and e["app"] == app), None)
    waited = _answer_after_kill_ms(samples, endpoint or app, kill_at, first_kill)
    return {
        "recovered": failover is not None,
        "kind": None if failover is None else failover["kind"],
        "first_variant": None if failover is None else failover["variant"],
        "settled_variant": _settled(events, app, "variant"),
        "mttr_ms": None if failover is None else failover["route_ms"],
        "server": None if failover is None else failover.get("server"),
        # the first load as the agent timed it (warm-up included); MTTR minus it is waiting for a
        # load slot, the calls and the controller
        "load_ms": None if failover is None else failover.get("load_ms"),
        "load_cpu_ms": None if failover is None else failover.get("load_cpu_ms"),  # the agent's thread
        # the MTTR cut at its first load's stamps (runtime.load_phases.timeline)
        "load_phases": _load_phases(failover),
        "first_answer_ms": None if answer is None else answer["first_answer_ms"],
        "rerouted_ms": None
        if answer is None
        else (answer["detected_at"] - first_kill) * 1000.0 + answer["first_answer_ms"],
        "rerouted_after_end_ms": None,  # set by measure() when the gateway saw the connection end
        "answer_after_kill_ms": waited,
        "usual_ms": usual_ms,
        "outage_ms": None if waited is None or usual_ms is None else max(waited - usual_ms, 0.0),
        "accuracy_primary": accuracy_primary,
        "accuracy_served": _settled(events, app, "accuracy"),
    }


def _load_phases(failover: dict[str, Any] | None) -> dict[str, Any] | None:
    """Where the MTTR of a failover by a load went (None: a switch, or no stamps recorded)."""
    if failover is None or not failover.get("load_phases") or failover.get("detected_at") is None:
        return None
    return timeline(failover["load_phases"], failover["detected_at"], failover["route_ms"])


def _accuracy(status: dict[str, Any], app: str) -> float | None:
    for a in status["apps"]:
        if a["name"] == app:
            return a.get("primary_accuracy")
    return None


def _settled(events: list[dict[str, Any]], app: str, key: str) -> Any:
    """``key`` of the last failover or upgrade of ``app``: what it settled on."""
    value = None
    for e in events:
        if e.get("app") == app and e["type"] in ("failover", "upgrade"):
            value = e.get(key)
    return value


def _answer_after_kill_ms(
    samples: list[Sample], name: str, kill_at: dict[str, float], first_kill: float
) -> float | None:
    """The kill to the first successful answer of ``name`` (an app or service) any client got afterwards."""
    answers = [
        s.done for s in samples if s.app == name and s.ok and s.server not in kill_at and s.done > first_kill
    ]
    return (min(answers) - first_kill) * 1000.0 if answers else None


def _usual_ms(usual: Sequence[Sample], app: str) -> float | None:
    """The median latency of ``app`` asked alone before the kill (under the steady load)."""
    latencies = [s.latency_ms for s in usual if s.app == app and s.ok]
    return statistics.median(latencies) if latencies else None


def add_ideal(apps: dict[str, dict[str, Any]], cfg: RuntimeConfig) -> None:
    """Set each recovered app's ``ideal_ms`` (module docstring) from the repository's profiles."""
    from failsoft.orchestration.loads import shortest_first_finish_ms
    from failsoft.zoo.repository import ModelRepository

    repo = ModelRepository(cfg.repository)
    family = {a.name: a.family for a in cfg.apps}
    loads: dict[str, list[tuple[str, float]]] = {}
    for name, a in apps.items():
        a["ideal_ms"] = 0.0 if a["kind"] == "warm" else None
        if a["recovered"] and a["kind"] != "warm" and a["server"] and a["first_variant"]:
            load_ms = repo.variant(family[name], a["first_variant"]).load_ms
            loads.setdefault(a["server"], []).append((name, load_ms))
    for queued in loads.values():
        ends = shortest_first_finish_ms([ms for _, ms in queued], cfg.agents.max_parallel_loads)
        for (name, _), end in zip(queued, ends, strict=True):
            apps[name]["ideal_ms"] = round(end, 2)


REQUEST_COUNTS = ("total", "failed", "failed_affected", "dropped")  # summed over runs (older: no drops)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    flat = [a for r in runs for a in r["apps"].values()]
    recovered = [a for a in flat if a["recovered"]]
    per_app: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        for app, a in r["apps"].items():
            per_app.setdefault(app, []).append(a)
    reductions = [
        (a["accuracy_primary"] - a["accuracy_served"]) / a["accuracy_primary"] * 100.0
        for a in recovered
        if a["accuracy_primary"] and a["accuracy_served"] is not None
    ]
    by_kind = {k: [a for a in recovered if a["kind"] == k] for k in _KINDS}
    return {
        "detection_ms": _stats([v for r in runs for v in r["detection_ms"].values()], ("p50", "max")),
        "mttr_ms": _stats([a["mttr_ms"] for a in recovered], ("mean", "p50", "max"))
        | {"per_app": _per_app(per_app, "mttr_ms")},
        "ideal_ms": _stats(_values(recovered, "ideal_ms"), ("mean", "p50", "max"))
        | {"per_app": _per_app(per_app, "ideal_ms")},
        "mttr_over_ideal": _over_ideal(recovered),
        "first_answer_ms": _stats(_values(recovered, "first_answer_ms"), ("mean", "p50", "max"))
        | {"per_app": _per_app(per_app, "first_answer_ms")},
        "outage_ms": _stats(_values(flat, "outage_ms"), ("p50", "max"))
        | {k: _stats(_values(v, "outage_ms"), ("p50", "max")) for k, v in by_kind.items() if v}
        | {"per_app": _per_app(per_app, "outage_ms")},
        "rerouted_ms": _stats(_values(recovered, "rerouted_ms"), ("p50", "max"))
        | {k: _stats(_values(v, "rerouted_ms"), ("p50", "max")) for k, v in by_kind.items() if v}
        | {"per_app": _per_app(per_app, "rerouted_ms")},
        "detected_by": sorted({how for r in runs for how in r.get("detected_by", {}).values()}),
        "connection_end_ms": _stats(
            [v for r in runs for v in r.get("connection_end_ms", {}).values()], ("p50", "max")
        ),
        "connection_end_by": sorted({how for r in runs for how in r.get("connection_end_by", {}).values()}),
        "rerouted_after_end_ms": _stats(_values(recovered, "rerouted_after_end_ms"), ("p50", "max"))
        | {"per_app": _per_app(per_app, "rerouted_after_end_ms")},
        "in_flight": summarize_moves([m for r in runs for m in r.get("in_flight", [])]),
        "mttr_by_kind_ms": {
            k: _stats(_values(v, "mttr_ms"), ("mean", "p50", "max")) for k, v in by_kind.items() if v
        },
        "recovery_rate": round(len(recovered) / len(flat), 4) if flat else None,
        "accuracy_reduction_pct": round(statistics.fmean(reductions), 3) if reductions else None,
        "recovered_as": {
            app: [
                f"{a['kind']}:{a['first_variant']}->{a['settled_variant']}" if a["recovered"] else None
                for a in v
            ]
            for app, v in per_app.items()
        },
        # where each recovery load's MTTR went, per run (the miss against ``ideal_ms`` explained)
        "load_phases": {
            app: [a.get("load_phases") for a in v]
            for app, v in per_app.items()
            if any(a.get("load_phases") for a in v)
        },
        "spurious_failures": sorted({s for r in runs for s in r["spurious_failures"]}),
        "requests": {k: sum(r["requests"].get(k, 0) for r in runs) for k in REQUEST_COUNTS},
        "request_errors": sorted({e for r in runs for e in r["requests"]["errors"]})[:5],
        "runs": len(runs),
    }


def _warm_light(summary: dict[str, Any]) -> set[str]:
    """Apps recovered by a warm switch whose model answers in milliseconds (the digits families)."""
    return {
        app
        for app, runs in summary["recovered_as"].items()
        if any(r and r.startswith("warm:") and r.split(":")[1].startswith(("mlp_", "cnn_")) for r in runs)
    }


def _values(apps: list[dict[str, Any]], key: str) -> list[float]:
    return [a[key] for a in apps if a.get(key) is not None]


def _per_app(per_app: dict[str, list[dict[str, Any]]], key: str) -> dict[str, float | None]:
    return {app: _mean(_values(v, key)) for app, v in per_app.items()}


_KINDS = ("warm", "progressive", "cold")


def _stats(values: list[float], which: tuple[str, ...]) -> dict[str, float | None]:
    if not values:
        return {k: None for k in which}
    funcs: dict[str, Callable[[list[float]], float]] = {
        "p50": statistics.median,
        "mean": statistics.fmean,
        "max": max,
    }
    return {k: round(funcs[k](values), 1) for k in which}


def _over_ideal(apps: list[dict[str, Any]]) -> float | None:
    """Mean MTTR over mean ideal, of the apps with both (None when no ideal is above zero)."""
    pairs = [(a["mttr_ms"], a["ideal_ms"]) for a in apps if a.get("ideal_ms") is not None]
    ideal = sum(i for _, i in pairs)
    return round(sum(m for m, _ in pairs) / ideal, 3) if ideal > 0 else None


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 1) if values else None


def check_targets(policies: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, checked on what was measured (faillite's numbers against full-warm-k's)."""
    out: dict[str, Any] = {}
    fl = policies.get("faillite")
    if fl is None:
        return out
    detection = [p["detection_ms"]["p50"] for p in policies.values() if p["detection_ms"]["p50"] is not None]
    out["detection_p50_ms"] = round(statistics.median(detection), 1) if detection else None
    out["detection_p50_ms<=50"] = bool(detection) and statistics.median(detection) <= 50
    warm = fl["outage_ms"].get("warm", {}).get("p50")
    out["warm_outage_p50_ms"] = warm
    out["warm_outage_p50_ms<=100"] = warm is not None and warm <= 100
    light = [v for app, v in fl["outage_ms"]["per_app"].items() if v is not None and app in _warm_light(fl)]
    out["warm_outage_p50_ms_small_models"] = round(statistics.median(light), 1) if light else None
    # requests in flight at the kill, on their next route (a warm switch, a model answering in ms),
    # from the kill and from the connection's end (which the dying process's teardown sets)
    for key in ("rerouted_ms", "rerouted_after_end_ms"):
        per = fl[key]["per_app"]
        moved = [v for app, v in per.items() if v is not None and app in _warm_light(fl)]
        out[f"warm_{key}_p50_small_models"] = round(statistics.median(moved), 1) if moved else None
    after_end = out["warm_rerouted_after_end_ms_p50_small_models"]
    out["warm_rerouted_after_end_ms_p50_small_models<=10"] = after_end is not None and after_end <= 10
    # each request that met the killed server: from the kill (or its arrival) to its next route
    next_route = fl["in_flight"]["next_route_ms"]["p50"]
    out["in_flight_next_route_ms_p50"] = next_route
    out["in_flight_next_route_ms_p50<=10"] = next_route is not None and next_route <= 10
    fk = policies.get("full-warm-k")
    if fk is None:
        return out
    for key in ("mttr_ms", "first_answer_ms"):
        if fl[key]["mean"] and fk[key]["mean"]:
            out[f"{key}_ratio_full_warm_k_over_faillite"] = round(fk[key]["mean"] / fl[key]["mean"], 2)
    ratio = out.get("mttr_ms_ratio_full_warm_k_over_faillite")
    out["faillite_mttr_3x_lower_at_full_recovery"] = bool(
        ratio and ratio >= 3.0 and fl["recovery_rate"] == 1.0
    )
    return out
