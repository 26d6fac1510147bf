"""``failsoft bench coding CONFIG``: ParM against Equal-Resources and no redundancy, on a real cluster.

The config must have one ``coded`` service (e.g. ``examples/coded.yaml``). One cluster serves, side by
side, on the same servers:

* ``parm``: the coded service as configured (k data members, r parity members: k + r instances);
* ``equal-resources``: k + r single apps ``er-0..`` serving the data members' variant, one on each
  coded member's server: the same instances, every one serving the deployed model (paper 6.1). The
  bench's client sends each request to the one with the fewest requests in flight (join the shortest
  queue), which stands in for the paper's single queue in front of them;
* ``none``: the first k of those apps only (no redundancy), the same way.

The policies run one after the other under the same load: held-out digits (the zoo's test split, with
labels) sent open-loop at ``rate_rps`` (Poisson arrivals, seeded), and **stragglers made as the paper
makes them** (6.1, "background load"): every ``shuffle_s`` one of the coded members' servers, drawn at
random (seeded, the same sequence for each policy), is slowed by ``slow_ms`` on every batch with
``failsoft chaos slow`` and the previous one restored. Per policy: ``latency_ms.{p50,p99,p999}``,
``reconstructed_fraction``, ``accuracy`` (top-1 on the labels) and ``degraded_accuracy`` (top-1 of the
reconstructed answers), ``encode_us.p50`` and ``decode_us.p50`` (measured in the gateway's dispatcher
under load), requests and failed requests.

``failover``: with ParM serving and no straggler, data member 1's server is killed (SIGKILL); every
request sent from the kill until that member answers again on its new route (its ``coded_recovered``
event) is an *outage request*; ``outage_ms.{p50,max}`` are their latencies (what a client waited),
with failed requests, reconstructions, and the controller's detection time.

``policy_timing``: the encoder and decoder alone (k = 2, one digit each), timed in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import random
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from failsoft.bench.cluster import wait_home
from failsoft.errors import ConfigError, FailsoftError

POLICIES = ("parm", "equal-resources", "none")
DIGITS_SHAPE = (64,)  # the digits families' input: held-out digits with labels; any other: images
IMAGES = 64  # seeded random images sent to a model of another input shape (no labels)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class CodingBenchSettings:
    policies: tuple[str, ...] = POLICIES
    duration_s: float = 24.0  # load per policy
    rate_rps: float = 20.0  # open-loop request rate (what this 2-core box serves without queueing)
    slow_ms: float = 50.0  # the straggler's added latency per batch
    rounds: int = 3  # the policies take turns, each duration_s / rounds at a time (drift spread evenly)
    warmup_s: float = 5.0  # load on every policy before measuring
    shuffle_s: float = 1.0  # a new straggler this often
    timeout_s: float = 5.0
    max_in_flight: int = 64
    failover: bool = True
    failover_window_s: float = 20.0
    seed: int = 0
    root: str | None = None  # model repository (default: the config's, else the default zoo)

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ConfigError(f"unknown coding bench policy {unknown[0]!r} (known: {', '.join(POLICIES)})")
        for name in ("duration_s", "rate_rps", "shuffle_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.slow_ms < 0:
            raise ConfigError(f"slow_ms must not be negative, got {self.slow_ms!r}")


@dataclass(frozen=True, slots=True)
class Shot:
    """One request as the bench's client saw it."""

    sent: float
    latency_ms: float
    ok: bool
    reconstructed: bool = False
    correct: bool | None = None
    error: str | None = None


@dataclass(frozen=True)
class _Plan:
    service: str
    members: tuple[str, ...]
    k: int
    r: int
    servers: tuple[str, ...]  # each member's server, in member order
    er_apps: tuple[str, ...]
    input_shape: tuple[int, ...] = DIGITS_SHAPE  # one query's shape, as the gateway serves it


def run(
    config_path: str | Path, settings: CodingBenchSettings, progress: Progress | None = None
) -> dict[str, Any]:
    from failsoft.client import Client
    from failsoft.runtime.config import config_from_dict
    from failsoft.runtime.session import Session

    say = progress or (lambda _: None)
    path = Path(config_path)
    data, plan = _bench_config(path, settings)
    with tempfile.TemporaryDirectory(prefix="failsoft-bench-coding-") as state:
        data["state_dir"] = state
        config = config_from_dict(data, source=str(path), base_dir=path.parent)
        say("starting the cluster")
        with Session(config, num_cpus=2) as session:
            assert session.prepared is not None
            url, token = session.url, session.prepared.admin_token
            client = Client(url, token=token, timeout=20.0)
            try:
                wait_home(client)
                plan = replace(plan, input_shape=_input_shape(client, plan.er_apps[0]))
                result: dict[str, Any] = {"config": str(path), "settings": asdict(settings)}
                result["load"] = _load_description(plan)
                result["stragglers"] = {
                    "how": (
                        f"every {settings.shuffle_s} s one of the servers {sorted(set(plan.servers))} "
                        f"(drawn at random, seed {settings.seed}, the same sequence for each policy) is "
                        f"slowed by {settings.slow_ms} ms per batch (failsoft chaos slow), the previous one "
                        "restored"
                    ),
                    "slow_ms": settings.slow_ms,
                    "shuffle_s": settings.shuffle_s,
                    "servers": sorted(set(plan.servers)),
                }
                say(f"warm-up: {settings.warmup_s:.0f} s")
                warm = replace(settings, duration_s=settings.warmup_s / len(settings.policies))
                for policy in settings.policies:
                    asyncio.run(_drive(url, token, _targets(plan, policy), warm, plan, stragglers=False))
                shots: dict[str, list[Shot]] = {p: [] for p in settings.policies}
                turn = replace(settings, duration_s=settings.duration_s / settings.rounds)
                for n in range(settings.rounds):
                    for policy in settings.policies:
                        say(f"round {n + 1}/{settings.rounds}, policy {policy}: {turn.duration_s:.0f} s")
                        seeded = replace(turn, seed=settings.seed + n)  # the same stragglers per policy
                        targets = _targets(plan, policy)
                        shots[policy] += asyncio.run(
                            _drive(url, token, targets, seeded, plan, stragglers=True)
                        )
                policies: dict[str, Any] = {}
                for policy in settings.policies:
                    policies[policy] = {"instances": _instances(plan, policy), **_summary(shots[policy])}
                    if policy == "parm":
                        coding = _coding(client, plan.service)
                        policies[policy]["encode_us"] = {"p50": coding.get("encode_us_p50")}
                        policies[policy]["decode_us"] = {"p50": coding.get("decode_us_p50")}
                        policies[policy]["coding"] = coding
                result["policies"] = policies
                if settings.failover:
                    say("failover: killing data member 1's server under load")
                    result["failover"] = asyncio.run(_failover(url, token, client, plan, settings))
            finally:
                client.close()
    result["policy_timing"] = policy_timing()
    result["targets"] = _targets_met(result)
    return result


# the cluster ---------------------------------------------------------------------------------------
def _bench_config(path: Path, settings: CodingBenchSettings) -> tuple[dict[str, Any], _Plan]:
    from failsoft.scenario import read_document

    data = yaml.safe_load(read_document(path, "config"))
    if not isinstance(data, dict):
        raise ConfigError(f"{str(path)!r}: expected a mapping at the top level")
    data = copy.deepcopy(data)
    coded = [s for s in data.get("services") or [] if s.get("mode") == "coded"]
    if len(coded) != 1:
        raise ConfigError(f"{str(path)!r}: bench coding needs exactly one coded service; found {len(coded)}")
    (service,) = coded
    params = service.get("params") or {}
    k, r = int(params.get("k", 2)), int(params.get("r", 1))
    members = tuple(service["members"])
    apps = {a["name"]: a for a in data.get("apps") or []}
    missing = [m for m in members if m not in apps or not apps[m].get("primary")]
    if missing:
        raise ConfigError(f"{str(path)!r}: coded member {missing[0]!r} needs an app with a primary placement")
    lead = apps[members[0]]
    servers = tuple(apps[m]["primary"]["server"] for m in members)
    taken = set(apps)
    er_apps = tuple(f"er-{i}" for i in range(k + r))
    clash = [a for a in er_apps if a in taken]
    if clash:
        raise ConfigError(
            f"{str(path)!r}: app name {clash[0]!r} is reserved for the Equal-Resources baseline"
        )
    for name, server in zip(er_apps, servers, strict=True):
        data["apps"].append(
            {
                "name": name,
                "family": lead["family"],
                "rate_rps": lead.get("rate_rps", 1),
                "primary": {"server": server, "variant": lead["primary"]["variant"]},
            }
        )
    if settings.root is not None:
        data["repository"] = settings.root
    data["gateway"] = {**(data.get("gateway") or {}), "port": 0}
    data["agents"] = {**(data.get("agents") or {}), "restart": False}
    return data, _Plan(service["name"], members, k, r, servers, er_apps)


def _targets(plan: _Plan, policy: str) -> tuple[str, ...]:
    if policy == "parm":
        return (plan.service,)
    return plan.er_apps if policy == "equal-resources" else plan.er_apps[: plan.k]


def _instances(plan: _Plan, policy: str) -> int:
    return plan.k if policy == "none" else plan.k + plan.r


def _input_shape(client: Any, app: str) -> tuple[int, ...]:
    """One query's shape, from the gateway's model metadata (KServe v2)."""
    shape = client.model(app)["inputs"][0]["shape"]
    return tuple(int(d) for d in shape[1:])


def _load_description(plan: _Plan) -> str:
    if plan.input_shape == DIGITS_SHAPE:
        return "held-out digits (the zoo's test split) with their labels"
    return (
        f"{IMAGES} seeded random float32 inputs of shape {list(plan.input_shape)} (no labels: accuracy is "
        "not measured; for latency work, e.g. random-weight ResNet-18 parity models)"
    )


def _queries(plan: _Plan) -> tuple[np.ndarray, np.ndarray | None]:
    """The inputs the load draws from, and their labels (digits) or None."""
    if plan.input_shape == DIGITS_SHAPE:
        from failsoft.zoo.digits import load_digits_split

        split = load_digits_split()
        return np.asarray(split.x_test, dtype=np.float32), np.asarray(split.y_test)
    images = np.random.default_rng(0).standard_normal((IMAGES, *plan.input_shape), dtype=np.float32)
    return images, None


def _coding(client: Any, service: str) -> dict[str, Any]:
    for entry in client.repository_index():
        if entry["name"] == service:
            return dict(entry.get("coding") or {})
    return {}


# the load ------------------------------------------------------------------------------------------
async def _drive(
    url: str,
    token: str,
    targets: Sequence[str],
    settings: CodingBenchSettings,
    plan: _Plan,
    stragglers: bool,
    until: asyncio.Event | None = None,
) -> list[Shot]:
    """Open-loop Poisson load on ``targets`` (the one with fewest in flight) until the duration ends
    or ``until`` is set; with ``stragglers``, the shuffled slowdowns run meanwhile."""
    from failsoft.client import AsyncClient

    inputs, labels = _queries(plan)
    rng = np.random.default_rng(settings.seed)
    client = AsyncClient(url, timeout=settings.timeout_s, token=token, max_connections=settings.max_in_flight)
    in_flight = dict.fromkeys(targets, 0)
    shots: list[Shot] = []
    tasks: set[asyncio.Task[None]] = set()
    stop = until or asyncio.Event()
    shuffler = asyncio.ensure_future(_shuffle(client, plan, settings, stop)) if stragglers else None

    async def one(target: str, i: int) -> None:
        in_flight[target] += 1
        sent = time.time()
        began = time.perf_counter()
        try:
            result = await client.infer(target, inputs[i : i + 1], timeout=settings.timeout_s)
            ms = (time.perf_counter() - began) * 1000
            correct = None if labels is None else bool(int(result.predictions[0]) == int(labels[i]))
            shots.append(Shot(sent, ms, True, bool(result.reconstructed), correct))
        except FailsoftError as exc:
            ms = (time.perf_counter() - began) * 1000
            shots.append(Shot(sent, ms, False, error=f"{type(exc).__name__}: {exc}"[:200]))
        finally:
            in_flight[target] -= 1

    try:
        ends = time.monotonic() + (settings.failover_window_s * 3 if until else settings.duration_s)
        turn = 0
        next_at = time.monotonic()
        while time.monotonic() < ends and not stop.is_set():
            next_at += float(rng.exponential(1.0 / settings.rate_rps))
            await asyncio.sleep(max(next_at - time.monotonic(), 0.0))
            if sum(in_flight.values()) >= settings.max_in_flight:
                continue
            fewest = min(in_flight.values())
            ties = [t for t in targets if in_flight[t] == fewest]
            target = ties[turn % len(ties)]
            turn += 1
            task = asyncio.ensure_future(one(target, int(rng.integers(len(inputs)))))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        stop.set()
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        if shuffler is not None:
            await asyncio.gather(shuffler, return_exceptions=True)
        await client.aclose()
    return shots


async def _shuffle(client: Any, plan: _Plan, settings: CodingBenchSettings, stop: asyncio.Event) -> None:
    """Slow one random server at a time (seeded), each for ``shuffle_s``; all restored at the end."""
    servers = sorted(set(plan.servers))
    draw = random.Random(settings.seed)
    current: str | None = None
    try:
        while not stop.is_set():
            chosen = draw.choice(servers)
            if chosen != current:
                if current is not None:
                    await client.admin("slow", server=current, ms=0)
                await client.admin("slow", server=chosen, ms=settings.slow_ms)
                current = chosen
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.shuffle_s)
    finally:
        for server in servers:
            await client.admin("slow", server=server, ms=0)


# the failover --------------------------------------------------------------------------------------
async def _failover(
    url: str, token: str, client: Any, plan: _Plan, settings: CodingBenchSettings
) -> dict[str, Any]:
    stop = asyncio.Event()
    victim = plan.servers[1]  # data member 1's server
    marks: dict[str, float] = {}

    async def kill_and_watch() -> None:
        await asyncio.sleep(2.0)
        marks["kill"] = (await asyncio.to_thread(client.admin, "kill", server=victim))["killed"][0]["at"]
        ends = time.monotonic() + settings.failover_window_s
        while time.monotonic() < ends:
            events = (await asyncio.to_thread(client.recoveries))["events"]
            back = [e for e in events if e["type"] == "coded_recovered" and e["timestamp"] >= marks["kill"]]
            if back:
                marks["recovered"] = back[0]["timestamp"]
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        stop.set()

    watcher = asyncio.ensure_future(kill_and_watch())
    shots = await _drive(url, token, (plan.service,), settings, plan, stragglers=False, until=stop)
    await watcher
    t_kill = marks["kill"]
    t_back = marks.get("recovered", max(s.sent for s in shots))
    window = [s for s in shots if t_kill <= s.sent <= t_back]
    events = [e for e in client.recoveries()["events"] if e.get("timestamp", 0) >= t_kill]
    detected = [e for e in events if e["type"] == "failure" and e.get("server") == victim]
    recovered = [e for e in events if e["type"] == "coded_recovered"]
    latencies = [s.latency_ms for s in window if s.ok]
    before = [s.latency_ms for s in shots if s.ok and t_kill - 1.5 <= s.sent < t_kill]
    after = [s.latency_ms for s in shots if s.ok and s.sent > t_back]
    return {
        "killed": victim,
        "member": plan.members[1],
        "outage_ms": {
            "p50": _round(np.percentile(latencies, 50)) if latencies else None,
            "max": _round(max(latencies)) if latencies else None,
        },
        "outage_requests": len(window),
        "outage_detail": [
            {
                "sent_after_kill_ms": _round((s.sent - t_kill) * 1000),
                "latency_ms": _round(s.latency_ms),
                "reconstructed": s.reconstructed,
                "ok": s.ok,
            }
            for s in sorted(window, key=lambda s: s.sent)
        ],
        "before_kill_ms": {
            "p50": _round(np.percentile(before, 50)) if before else None,
            "requests": len(before),
        },
        "after_recovery_ms": {
            "p50": _round(np.percentile(after, 50)) if after else None,
            "requests": len(after),
        },
        "failed_requests": sum(not s.ok for s in shots),
        "reconstructed_in_window": sum(s.reconstructed for s in window),
        "recovered": bool(recovered),
        "window_ms": _round((t_back - t_kill) * 1000),
        "detection_ms": _round((detected[0]["detected_at"] - t_kill) * 1000) if detected else None,
        "events": [
            {k: e.get(k) for k in ("type", "app", "reconstructed", "message")}
            for e in events
            if e["type"] in ("coded_failover", "coded_recovered")
        ],
        "definition": (
            "outage requests: those sent from the kill until the member answers again on its new route "
            "(its coded_recovered event); outage_ms: their latencies as the client measured them"
        ),
    }


# numbers -------------------------------------------------------------------------------------------
def _accuracy(shots: Sequence[Shot]) -> float | None:
    """Top-1 over the shots with a label (None without any: random images carry none)."""
    marked = [s.correct for s in shots if s.correct is not None]
    return round(float(np.mean(marked)), 4) if marked else None


def _summary(shots: Sequence[Shot]) -> dict[str, Any]:
    ok = [s for s in shots if s.ok]
    latencies = np.array([s.latency_ms for s in ok]) if ok else np.array([np.nan])
    rebuilt = [s for s in ok if s.reconstructed]
    return {
        "latency_ms": {
            "p50": _round(np.percentile(latencies, 50)),
            "p99": _round(np.percentile(latencies, 99)),
            "p999": _round(np.percentile(latencies, 99.9)),
        },
        "reconstructed_fraction": round(len(rebuilt) / len(ok), 4) if ok else 0.0,
        "accuracy": _accuracy(ok),
        "degraded_accuracy": _accuracy(rebuilt),
        "requests": len(shots),
        "failed_requests": len(shots) - len(ok),
        "errors": sorted({s.error or "" for s in shots if not s.ok})[:3],
    }


def policy_timing(repeats: int = 20_000) -> dict[str, Any]:
    """The encoder and decoder alone at k = 2, r = 1, one 64-value digit per query (microseconds)."""
    from failsoft.policies.registry import get_decoder, get_encoder

    rng = np.random.default_rng(0)
    queries = [rng.random((1, 64), dtype=np.float32) for _ in range(2)]
    outputs = {0: rng.random((1, 10), dtype=np.float32), 2: rng.random((1, 10), dtype=np.float32)}
    encoder, decoder = get_encoder("add", 2, 1, (64,)), get_decoder(2, 1)

    def per_call_us(fn: Callable[[], object]) -> float:
        runs = [timeit.timeit(fn, number=repeats) / repeats * 1e6 for _ in range(5)]
        return round(float(np.median(runs)), 2)

    return {
        "encode_us": {"p50": per_call_us(lambda: encoder.encode(queries))},
        "decode_us": {"p50": per_call_us(lambda: decoder.decode(outputs))},
        "how": f"median of 5 timeit runs of {repeats} calls in this process; k=2, r=1, (1, 64) float32",
    }


def _targets_met(result: dict[str, Any]) -> dict[str, Any]:
    policies = result.get("policies", {})
    out: dict[str, Any] = {}
    parm, er = policies.get("parm"), policies.get("equal-resources")
    if parm and er:
        cut = 1 - parm["latency_ms"]["p999"] / er["latency_ms"]["p999"]
        median = parm["latency_ms"]["p50"] / er["latency_ms"]["p50"] - 1
        out["p999_below_er_pct"] = round(100 * cut, 1)
        out["p999_at_least_35pct_below_er"] = bool(cut >= 0.35)
        out["median_vs_er_pct"] = round(100 * median, 1)
        out["median_within_10pct_of_er"] = bool(abs(median) <= 0.10)
    if parm:
        enc, dec = parm["encode_us"]["p50"], parm["decode_us"]["p50"]
        out["encode_le_50us"] = enc is not None and enc <= 50
        out["decode_le_10us"] = dec is not None and dec <= 10
    timing = result.get("policy_timing")
    if timing:
        out["policy_encode_le_50us"] = timing["encode_us"]["p50"] <= 50
        out["policy_decode_le_10us"] = timing["decode_us"]["p50"] <= 10
    failover = result.get("failover")
    if failover:
        p50 = failover["outage_ms"]["p50"]
        out["failover_outage_p50_le_20ms"] = p50 is not None and p50 <= 20
        out["failover_zero_failed"] = failover["failed_requests"] == 0
    return out


def _round(value: Any) -> float:
    return round(float(value), 2)
