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
makes them** (6.1, "background load"): every ``shuffle_s``, ``stragglers`` of the coded members'
servers (one, or a random pair as one background shuffle slows two instances), drawn at random
(seeded, the same sequence for each policy), are slowed by ``slow_ms`` on every batch with
``failsoft chaos slow`` and the previous ones restored. Per policy: ``latency_ms.{p50,p99,p999}``,
``reconstructed_fraction``, ``accuracy`` (top-1 on the labels) and ``degraded_accuracy`` (top-1 of the
reconstructed answers), requests and failed requests; for ``parm`` also ``encode_us`` and
``decode_us`` (from ``policy_timing``, the quantity the paper's 6.2.5 reports) and ``in_gateway_us``
(the same calls as the gateway timed them under this load).

**A sweep**: with ``sweep`` (several ``--rate-rps`` or ``--slow-ms`` values), every (rate, straggler)
level is measured in turn on the same cluster, each as one run above; the output's ``sweep`` lists
them, each with its policies and ``targets.parm_over_er_p999``.

``failover``: with ParM serving and no straggler, data member 1's server is killed (SIGKILL); every
request sent from the kill until that member answers again on its new route (its ``coded_recovered``
event) is an *outage request*; ``outage_ms.{p50,max}`` are their latencies (what a client waited),
with failed requests, reconstructions, and the controller's detection time.

``policy_timing``: ParM's encode and decode at k = 2 as the gateway times them (the decode being the
answer tracker's report of the k-th answer, decoder included), each call alone, median of 20 000,
in this process before the cluster starts (:func:`policy_timing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from failsoft.bench.cluster import read_bench_config, wait_home
from failsoft.bench.models import ensure_config_models
from failsoft.errors import ConfigError, FailsoftError

if TYPE_CHECKING:
    from failsoft.runtime.discovery import Target

POLICIES = ("parm", "equal-resources", "none")
DIGITS_SHAPE = (64,)  # the digits families' input: held-out digits with labels; any other: images
COLD_BYTES = 16 << 20  # policy_timing's cold calls: this much other memory read before each
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
    stragglers: int = 1  # servers slowed at once (2: a random pair, as one background shuffle)
    fill_timeout_ms: float | None = None  # overrides the coded service's (its params, else 100 ms)
    # a sweep: (rate_rps, slow_ms) levels, each measured like one run on the same cluster; when
    # empty, the one level (rate_rps, slow_ms)
    sweep: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ConfigError(f"unknown coding bench policy {unknown[0]!r} (known: {', '.join(POLICIES)})")
        for name in ("duration_s", "shuffle_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)!r}")
        seen: set[tuple[float, float]] = set()
        for rate, slow in self.levels():
            if not rate > 0:  # also refuses NaN
                raise ConfigError(f"rate_rps must be positive, got {rate!r}")
            if not slow >= 0:
                raise ConfigError(f"slow_ms must not be negative, got {slow!r}")
            if (rate, slow) in seen:
                raise ConfigError(f"sweep level rate_rps={rate!r}, slow_ms={slow!r} is given twice")
            seen.add((rate, slow))
        if not 1 <= self.stragglers <= 4:
            raise ConfigError(f"stragglers must be 1..4 servers slowed at once, got {self.stragglers!r}")
        if self.fill_timeout_ms is not None and not 0 < self.fill_timeout_ms <= 10_000:
            raise ConfigError(f"fill_timeout_ms must be in (0, 10000], got {self.fill_timeout_ms!r}")

    def levels(self) -> tuple[tuple[float, float], ...]:
        """The (rate_rps, slow_ms) levels measured, in order."""
        return self.sweep or ((self.rate_rps, self.slow_ms),)


RATE_RANGE = (1.0, 1000.0)  # --rate-rps: requests per second
SLOW_RANGE = (0.0, 10_000.0)  # --slow-ms: added ms per batch


def sweep_levels(
    rates_rps: Sequence[str | float], slows_ms: Sequence[str | float]
) -> tuple[tuple[float, float], ...]:
    """Every rate with every straggler level (rates outer), from the command line's values.

    Each bad value is refused by name: not a number, out of range, or given twice.
    """
    rates = _values("--rate-rps", rates_rps, RATE_RANGE)
    slows = _values("--slow-ms", slows_ms, SLOW_RANGE)
    return tuple((rate, slow) for rate in rates for slow in slows)


def _values(option: str, raw: Sequence[str | float], bounds: tuple[float, float]) -> list[float]:
    if not raw:
        raise ConfigError(f"{option} needs at least one value")
    low, high = bounds
    values: list[float] = []
    for item in raw:
        try:
            value = float(item)
        except (TypeError, ValueError):
            raise ConfigError(f"{option} {item!r} is not a number") from None
        if not low <= value <= high:  # NaN fails too
            raise ConfigError(f"{option} {item!r} is out of range: it must be in {low:g}..{high:g}")
        if value in values:
            raise ConfigError(f"{option} {item!r} is given twice")
        values.append(value)
    return values


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
    from failsoft.runtime.config import config_from_dict
    from failsoft.runtime.session import Session

    say = progress or (lambda _: None)
    path = Path(config_path)
    data, plan = _bench_config(path, settings)
    ensure_config_models(path, data, say)
    timing = policy_timing()  # before the cluster starts: its processes would share the cores
    with tempfile.TemporaryDirectory(prefix="failsoft-bench-coding-") as state:
        data["state_dir"] = state
        config = config_from_dict(data, source=str(path), base_dir=path.parent)
        say("starting the cluster")
        with Session(config, num_cpus=2) as session:
            assert session.prepared is not None
            gateway = session.target()
            client = gateway.client(timeout=20.0)
            try:
                wait_home(client)
                plan = replace(plan, input_shape=_input_shape(client, plan.er_apps[0]))
                result: dict[str, Any] = {"config": str(path), "settings": asdict(settings)}
                result["load"] = _load_description(plan)
                say(f"warm-up: {settings.warmup_s:.0f} s")
                rate = settings.levels()[0][0]
                warm = replace(settings, rate_rps=rate, duration_s=settings.warmup_s / len(settings.policies))
                for policy in settings.policies:
                    asyncio.run(_drive(gateway, _targets(plan, policy), warm, plan, stragglers=False))
                levels = []
                for rate, slow in settings.levels():
                    level = replace(settings, rate_rps=rate, slow_ms=slow, sweep=())
                    levels.append(_measure(gateway, client, plan, level, timing, say))
                    say(_level_line(levels[-1]))
                if settings.sweep:
                    result["sweep"] = levels
                else:
                    result.update(levels[0])
                if settings.failover:
                    say("failover: killing data member 1's server under load")
                    result["failover"] = asyncio.run(_failover(gateway, client, plan, settings))
            finally:
                client.close()
    result["policy_timing"] = timing
    if settings.sweep:
        if "failover" in result:
            result["failover_targets"] = _targets_met({"failover": result["failover"]})
    else:
        result["targets"] = _targets_met(result)
    return result


def _measure(
    gateway: Target,
    client: Any,
    plan: _Plan,
    settings: CodingBenchSettings,
    timing: dict[str, Any],
    say: Progress,
) -> dict[str, Any]:
    """One level (``settings.rate_rps``, ``settings.slow_ms``): every policy in turns, summarised."""
    servers = sorted(set(plan.servers))
    at_once = "one of the servers" if settings.stragglers == 1 else f"{settings.stragglers} of the servers"
    out: dict[str, Any] = {"rate_rps": settings.rate_rps, "slow_ms": settings.slow_ms}
    out["stragglers"] = {
        "how": (
            f"every {settings.shuffle_s} s {at_once} {servers} (drawn at random, seed {settings.seed}, "
            f"the same sequence for each policy) slowed by {settings.slow_ms} ms per batch (failsoft "
            "chaos slow), the previous ones restored"
        ),
        "slow_ms": settings.slow_ms,
        "shuffle_s": settings.shuffle_s,
        "at_once": settings.stragglers,
        "servers": servers,
    }
    before = _coding(client, plan.service) if "parm" in settings.policies else {}
    load = [round(os.getloadavg()[0], 2)]
    shots: dict[str, list[Shot]] = {p: [] for p in settings.policies}
    turn = replace(settings, duration_s=settings.duration_s / settings.rounds)
    for n in range(settings.rounds):
        for policy in settings.policies:
            say(
                f"rate {settings.rate_rps:g} rps, slow {settings.slow_ms:g} ms: round {n + 1}/"
                f"{settings.rounds}, policy {policy}: {turn.duration_s:.0f} s"
            )
            seeded = replace(turn, seed=settings.seed + n)  # the same stragglers per policy
            shots[policy] += asyncio.run(
                _drive(gateway, _targets(plan, policy), seeded, plan, stragglers=True)
            )
    policies: dict[str, Any] = {}
    for policy in settings.policies:
        policies[policy] = {"instances": _instances(plan, policy), **_summary(shots[policy])}
        if policy == "parm":
            coding = _coding(client, plan.service)
            policies[policy]["encode_us"] = {"p50": timing["encode_us"]["p50"], "how": "policy_timing"}
            policies[policy]["decode_us"] = {"p50": timing["decode_us"]["p50"], "how": "policy_timing"}
            policies[policy]["in_gateway_us"] = {
                "encode_p50": coding.get("encode_us_p50"),
                "decode_p50": coding.get("decode_us_p50"),
                "how": (
                    "the same calls timed once each where the gateway runs them, under this load (the "
                    "median of the service's last 10 000, since the cluster started): single calls "
                    "among the event loop's other work, so mostly with cold caches"
                ),
            }
            policies[policy]["coding"] = _counts_since(before, coding)
    out["policies"] = policies
    out["targets"] = _targets_met({"policies": policies})
    load.append(round(os.getloadavg()[0], 2))
    out["machine_load_1min"] = {"start": load[0], "end": load[1], "cpus": os.cpu_count()}
    return out


def _counts_since(before: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """The service's coding counts over one level (the index counts since the cluster started)."""
    return {
        key: value - before.get(key, 0) if key in _COUNTS and isinstance(value, int) else value
        for key, value in now.items()
    }


_COUNTS = (
    "requests",
    "coded_groups",
    "uncoded_groups",
    "reconstructed",
    "reconstructed_during_failover",
    "served_by_another_member",
)


def _level_line(level: dict[str, Any]) -> str:
    """One level as a line: each policy's p50/p99/p99.9 and ParM's p99.9 over Equal-Resources'."""
    parts = [f"rate {level['rate_rps']:g} rps, slow {level['slow_ms']:g} ms:"]
    for policy, summary in level["policies"].items():
        lat = summary["latency_ms"]
        parts.append(f"{policy} p50/p99/p99.9 {lat['p50']}/{lat['p99']}/{lat['p999']} ms;")
    ratio = level["targets"].get("parm_over_er_p999")
    if ratio is not None:
        parts.append(f"parm/equal-resources p99.9 {ratio}")
    return " ".join(parts)


# the cluster ---------------------------------------------------------------------------------------
def _bench_config(path: Path, settings: CodingBenchSettings) -> tuple[dict[str, Any], _Plan]:
    data = read_bench_config(path, settings.root)
    coded = [s for s in data.get("services") or [] if s.get("mode") == "coded"]
    if len(coded) != 1:
        raise ConfigError(f"{str(path)!r}: bench coding needs exactly one coded service; found {len(coded)}")
    (service,) = coded
    params = service.get("params") or {}
    if settings.fill_timeout_ms is not None:
        params = service["params"] = {**params, "fill_timeout_ms": settings.fill_timeout_ms}
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
    gateway: Target,
    targets: Sequence[str],
    settings: CodingBenchSettings,
    plan: _Plan,
    stragglers: bool,
    until: asyncio.Event | None = None,
) -> list[Shot]:
    """Open-loop Poisson load on ``targets`` (the one with fewest in flight) until the duration ends
    or ``until`` is set; with ``stragglers``, the shuffled slowdowns run meanwhile."""
    inputs, labels = _queries(plan)
    rng = np.random.default_rng(settings.seed)
    client = gateway.async_client(settings.timeout_s, max_connections=settings.max_in_flight)
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
    """Slow ``stragglers`` random servers at a time (seeded), for ``shuffle_s``; restored at the end."""
    servers = sorted(set(plan.servers))
    draw = random.Random(settings.seed)
    current: set[str] = set()
    try:
        while not stop.is_set():
            n = min(settings.stragglers, len(servers))
            chosen = {draw.choice(servers)} if n == 1 else set(draw.sample(servers, n))
            for server in sorted(current - chosen):
                await client.admin("slow", server=server, ms=0)
            for server in sorted(chosen - current):
                await client.admin("slow", server=server, ms=settings.slow_ms)
            current = chosen
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.shuffle_s)
    finally:
        for server in servers:
            await client.admin("slow", server=server, ms=0)


# the failover --------------------------------------------------------------------------------------
async def _failover(
    gateway: Target, client: Any, plan: _Plan, settings: CodingBenchSettings
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
    shots = await _drive(gateway, (plan.service,), settings, plan, stragglers=False, until=stop)
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


def policy_timing(repeats: int = 20_000, cold_repeats: int = 300) -> dict[str, Any]:
    """ParM's encode and decode at k = 2, r = 1, as the gateway times them (microseconds, median).

    ``encode_us``: :meth:`Encoder.encode` of two queries into the parity query. ``decode_us``: the
    report of the k-th answer to the group's :class:`AnswerTracker` (the parity answer after one
    data answer), which checks the answer, decodes the straggler's output and names the member to
    cancel: exactly the call the gateway's dispatcher times as its decode. Each call is timed alone
    with ``time.perf_counter`` (as the gateway does), ``repeats`` times (a fresh tracker each), and
    the median taken, warm; ``decoder_us`` is the decoder's checked :meth:`Decoder.decode` alone.
    ``digits``: one 64-value digit per query and 10-class outputs (what ``bench coding`` serves);
    ``paper_size``: 3x224x224 images and 1000-class outputs (ParM 6.2.5: 93 us and 8 us at k = 2).
    ``cold_us``: the digits calls again, with the caches evicted before each (``cold_repeats``
    calls): what the gateway's own timings under load approach, since its event loop runs much
    other work between two decodes.
    """
    from failsoft.policies.coding.groups import AnswerTracker
    from failsoft.policies.registry import get_decoder, get_encoder

    rng = np.random.default_rng(0)
    decoder = get_decoder(2, 1)

    sweep = np.ones(COLD_BYTES // 8)  # read between calls to evict the caches
    objects = [{"n": i} for i in range(COLD_BYTES // 400)]

    def median_us(setup: Callable[[], Callable[[], object]], n: int, cold: bool = False) -> float:
        times = []
        for _ in range(n):
            call = setup()
            if cold:  # as in a server, other work ran since the last call: its data and code evicted
                sweep.sum()
                sum(len(o) for o in objects)
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
        return round(float(np.median(times)) * 1e6, 2)

    def sizes(shape: tuple[int, ...], classes: int, n: int, cold: int = 0) -> dict[str, float]:
        queries = [rng.random((1, *shape), dtype=np.float32) for _ in range(2)]
        data, parity = (rng.random((1, classes), dtype=np.float32) for _ in range(2))
        encoder = get_encoder("add", 2, 1, shape)

        def report() -> Callable[[], object]:
            tracker = AnswerTracker(decoder)
            tracker.answered(0, data)
            return lambda: tracker.answered(2, parity)

        out = {
            "encode_us": median_us(lambda: lambda: encoder.encode(queries), n),
            "decode_us": median_us(report, n),
            "decoder_us": median_us(lambda: lambda: decoder.decode({0: data, 2: parity}), n),
        }
        if cold:
            out["cold_encode_us"] = median_us(lambda: lambda: encoder.encode(queries), cold, True)
            out["cold_decode_us"] = median_us(report, cold, True)
        return out

    digits = sizes(DIGITS_SHAPE, 10, repeats, cold_repeats)
    paper = sizes((3, 224, 224), 1000, max(repeats // 10, 1))
    return {
        "encode_us": {"p50": digits["encode_us"]},
        "decode_us": {"p50": digits["decode_us"]},
        "decoder_us": {"p50": digits["decoder_us"]},
        "cold_us": {"encode_p50": digits.get("cold_encode_us"), "decode_p50": digits.get("cold_decode_us")},
        "paper_size": paper,
        "how": (
            f"k=2, r=1, in the bench's process, warm: each call timed alone with perf_counter as the "
            f"gateway times it, median of {repeats} calls ((1, 64) queries, (1, 10) outputs; paper_size: "
            f"(1, 3, 224, 224) and (1, 1000), {max(repeats // 10, 1)} calls); decode_us is the tracker's "
            "report of the k-th answer (checks, decode, stragglers), decoder_us the checked decoder alone; "
            f"cold_us: the same calls ({cold_repeats} each) with {COLD_BYTES >> 20} MiB of other data and "
            "objects read before each, as the gateway's event loop runs them between other work"
        ),
    }


def _targets_met(result: dict[str, Any]) -> dict[str, Any]:
    policies = result.get("policies", {})
    out: dict[str, Any] = {}
    parm, er = policies.get("parm"), policies.get("equal-resources")
    if parm and er:
        cut = 1 - parm["latency_ms"]["p999"] / er["latency_ms"]["p999"]
        median = parm["latency_ms"]["p50"] / er["latency_ms"]["p50"] - 1
        out["parm_over_er_p999"] = round(parm["latency_ms"]["p999"] / er["latency_ms"]["p999"], 3)
        out["parm_over_er_p50"] = round(parm["latency_ms"]["p50"] / er["latency_ms"]["p50"], 3)
        out["p999_below_er_pct"] = round(100 * cut, 1)
        out["p999_at_least_35pct_below_er"] = bool(cut >= 0.35)
        out["median_vs_er_pct"] = round(100 * median, 1)
        out["median_within_10pct_of_er"] = bool(abs(median) <= 0.10)
    if parm:
        enc, dec = parm["encode_us"]["p50"], parm["decode_us"]["p50"]
        out["encode_le_50us"] = enc is not None and enc <= 50
        out["decode_le_10us"] = dec is not None and dec <= 10
    failover = result.get("failover")
    if failover:
        p50 = failover["outage_ms"]["p50"]
        out["failover_outage_p50_le_20ms"] = p50 is not None and p50 <= 20
        out["failover_zero_failed"] = failover["failed_requests"] == 0
    return out


def _round(value: Any) -> float:
    return round(float(value), 2)
