"""``failsoft bench serving CONFIG``: steady-state serving, failsoft beside what a user would compare.

One app of the config (its primary variant), measured in one run, one system at a time, by one
client (:mod:`failsoft.bench.serving_load`, a process of its own) for every system:

* ``inprocess``: the model's ``predict`` called in a loop in this process at the agents' torch
  threads, batch 1: the limit no server can pass; ``cold_p50_ms`` is the same call after the
  caches were swept (``SWEEP_BYTES`` written between calls), which is what a server's request pays
  when other work ran since the last one and the weights are larger than a core's cache;
* ``failsoft``: a cluster served from the config, through its gateway, as KServe v2 JSON and as the
  binary tensor extension, the gateway calling its agent over the data plane
  (:mod:`failsoft.runtime.dataplane`);
* ``failsoft-ray``: the same, every inference call a Ray actor call (``$FAILSOFT_DATA_PLANE=ray``),
  which is what the data plane replaced;
* ``fastapi``: a plain FastAPI app over the same model (:mod:`failsoft.bench.serving_anchor`,
  uvicorn in a subprocess), both encodings;
* ``ray-serve`` and ``ray-serve-batch``: Ray Serve, one replica, without and with ``@serve.batch``
  (:mod:`failsoft.bench.serving_anchor_rayserve`: a process with a Ray instance of its own, apart
  from failsoft's), both encodings; skipped, with the reason in the JSON, when ``ray.serve`` does not
  import (the optional extra ``failsoft[anchors]``).

Every anchor (:mod:`failsoft.bench.serving_anchor_process`) is started on a free port of 127.0.0.1,
must answer both encodings with the logits the model gives in this process before it is measured,
and is stopped (with every process it started) before the next system runs.

Each HTTP system is measured closed-loop at every ``concurrency`` (1, 8, 32 clients by default) and
open-loop at ``rate_rps`` (default: half of failsoft's best closed-loop JSON throughput, so that the
open-loop latency is the one a moderately loaded server gives). Per level: requests, errors (by
status), requests/s, p50 and p99 latency, and the server's CPU per request (``psutil``: the server's
processes' user+system time over the level, divided by its answers; the client's own CPU is not
counted). Ratios: failsoft's requests/s to each anchor's (FastAPI, Ray Serve without and with
batching), to the in-process limit and to its own Ray-call path, per level.

``phases`` breaks failsoft's request path down at one client (JSON), per request, in milliseconds:
the client's whole latency; ``http`` (uvicorn and the client: the latency outside the gateway's
handler); ``parse`` and ``response`` (the gateway's own decoding and encoding, timed on the same
request in this process); ``dispatch`` (the handler's time less parse, response and the agent:
routing, the transport both ways, the event loop hand-offs); the agent's ``agent_call`` (entry
to return, admission included) split by its serving queue into ``queue_wait``, ``batch`` (assembly),
``inference`` (``predict``) and ``answer`` (splitting outputs, waking the caller). The figures come
from counters the gateway (``failsoft_request_latency_seconds``) and the agents (``info()``) keep
anyway: a few additions per request.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from failsoft.bench.serving_anchor_process import process_tree
from failsoft.bench.serving_load import Body, request_body, request_input
from failsoft.errors import ConfigError, FailsoftError
from failsoft.runtime.config import RuntimeConfig, load_config

ANCHOR_SYSTEMS = ("fastapi", "ray-serve", "ray-serve-batch")  # failsoft.bench.serving_anchor_process
SYSTEMS = ("inprocess", "failsoft", "failsoft-ray", *ANCHOR_SYSTEMS)
TRANSPORTS = {"failsoft": "zmq", "failsoft-ray": "ray"}  # $FAILSOFT_DATA_PLANE of each failsoft system
ENCODINGS = ("json", "binary")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ServingSettings:
    app: str | None = None  # the config's app to serve (default: the first)
    concurrency: tuple[int, ...] = (1, 8, 32)
    duration_s: float = 10.0  # per level, after its warm-up
    warmup_s: float = 2.0
    rate_rps: float | None = None  # open loop; None: half failsoft's best closed-loop JSON rps
    systems: tuple[str, ...] = SYSTEMS
    encodings: tuple[str, ...] = ENCODINGS

    def __post_init__(self) -> None:
        unknown = [s for s in self.systems if s not in SYSTEMS] + [
            e for e in self.encodings if e not in ENCODINGS
        ]
        if unknown:
            raise ConfigError(
                f"unknown system or encoding {unknown} (systems: {SYSTEMS}; encodings: {ENCODINGS})"
            )
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"concurrency levels must be whole numbers >= 1, got {self.concurrency}")


def run(
    config_path: str | Path, settings: ServingSettings, progress: Progress | None = None
) -> dict[str, Any]:
    from failsoft.runtime.session import prepare

    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    with one_app_served(config_path, settings.app, "failsoft-bench-serving-state-", say) as (cfg, app):
        primary = next(a.primary for a in prepare(cfg).deployment.apps if a.name == app.name)
        assert primary is not None
        return _run(cfg, app.name, app.family, primary.variant, settings, say)


def _run(
    cfg: RuntimeConfig,
    app: str,
    family: str,
    variant: str,
    settings: ServingSettings,
    say: Progress,
) -> dict[str, Any]:
    threads = _torch_threads(cfg)
    out: dict[str, Any] = {"app": app, "model": f"{family}/{variant}", "torch_threads": threads}
    out |= {"settings": asdict(settings), "systems": {}}
    model = _load(cfg, family, variant, threads)
    bodies = {e: request_body(e, tuple(model.input_shape)) for e in settings.encodings}
    expected = model.predict(request_input(tuple(model.input_shape)))  # every anchor must answer it
    systems = out["systems"]
    if "inprocess" in settings.systems:
        say("[inprocess] the model called in this process, batch 1")
        systems["inprocess"] = inprocess(model, settings.duration_s)
    del model
    rate = None
    for name, transport in TRANSPORTS.items():
        if name in settings.systems:
            systems[name] = _failsoft(cfg, app, bodies, settings, say, transport, name, rate)
            rate = rate or systems[name][settings.encodings[0]]["open"]["rate_rps"]  # every open loop's
    for name in ANCHOR_SYSTEMS:
        if name in settings.systems:
            model_ref = (family, variant, threads, expected)
            systems[name] = _anchor(name, cfg, model_ref, bodies, settings, say, rate)
    out["ratios"] = ratios(systems)
    return out


# ----------------------------------------------------------------------------------------------
# the systems
# ----------------------------------------------------------------------------------------------


def inprocess(model: Any, duration_s: float) -> dict[str, Any]:
    """``predict`` at batch 1 in a loop: answers per second, latency, CPU per answer."""
    batch = np.random.default_rng(0).random((1, *model.input_shape), dtype=np.float32)
    for _ in range(5):
        model.predict(batch)
    times, cpu0, stop = [], time.process_time(), time.perf_counter() + duration_s
    while (t := time.perf_counter()) < stop:
        model.predict(batch)
        times.append(time.perf_counter() - t)
    cpu = time.process_time() - cpu0
    ms = np.asarray(times) * 1000.0
    return {
        "rps": round(len(ms) / max(sum(times), 1e-9), 2),
        "p50_ms": round(float(np.percentile(ms, 50)), 4),
        "p99_ms": round(float(np.percentile(ms, 99)), 4),
        "cpu_ms_per_request": round(cpu * 1000.0 / max(len(ms), 1), 4),
        "requests": len(ms),
        "cold_p50_ms": round(_cold_p50_ms(model, batch), 4),
    }


SWEEP_BYTES = 64 << 20  # larger than this machine's caches (a core's L2, the shared L3)
COLD_CALLS = 60


def _cold_p50_ms(model: Any, batch: np.ndarray) -> float:
    """``predict``'s median time when the caches hold none of the model: a buffer larger than
    them written before each call (not timed). A model whose weights outgrow a core's cache reads
    them from memory then: for the digits MLP ``mlp_l`` (8.7 MB) that is most of a request's
    inference, in any server, unless nothing else ran since its previous request."""
    sweep = np.zeros(SWEEP_BYTES, dtype=np.uint8)
    times = []
    for _ in range(COLD_CALLS):
        sweep += 1
        t = time.perf_counter()
        model.predict(batch)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1000.0


def _failsoft(
    cfg: RuntimeConfig,
    app: str,
    bodies: dict[str, Body],
    settings: ServingSettings,
    say: Progress,
    transport: str = "zmq",
    name: str = "failsoft",
    rate: float | None = None,
) -> dict[str, Any]:
    from failsoft.bench.cluster import wait_home
    from failsoft.runtime.dataplane import ENV
    from failsoft.runtime.session import Session

    say(f"[{name}] deploying ...")
    with _environ(ENV, transport), Session(cfg) as session:
        client = session.client(timeout=30.0)  # both planes: wait_home reads the admin status
        wait_home(client, 300.0)
        host, port = host_port(session.url)
        result: dict[str, Any] = {"transport": transport}
        for encoding, body in bodies.items():
            say(f"[{name}] {encoding}")
            result[encoding] = levels(Target(host, port, app, body, settings, own_processes), rate)
            rate = rate or result[encoding]["open"]["rate_rps"]  # every system's open loop at one rate
            if encoding == "json":
                result["phases"] = phases(session, host, port, app, body, settings)
        if name == "failsoft":  # the gateway -> agent hop alone, over both transports
            result["transport_rtt"] = transport_rtt(session, app, settings)
        client.close()
        return result


def _anchor(
    name: str,
    base: RuntimeConfig,
    model: tuple[str, str, int, np.ndarray],
    bodies: dict[str, Body],
    settings: ServingSettings,
    say: Progress,
    rate: float | None,
) -> dict[str, Any]:
    """Anchor ``name`` (``model``: family, variant, torch threads, the logits it must answer) at
    every level and encoding; a row with only ``status`` when its optional dependency is missing."""
    from failsoft.bench.serving_anchor_process import ANCHORS, missing, served_anchor
    from failsoft.zoo import resolve_repository

    reason = missing(ANCHORS[name])
    if reason is not None:
        say(f"[{name}] {reason}")
        return {"status": reason}
    family, variant, threads, expected = model
    repo = str(resolve_repository(base.repository))
    with served_anchor(name, repo, family, variant, threads, bodies, expected, say) as anchor:
        result: dict[str, Any] = {"status": "measured", **anchor.facts}
        for encoding, body in bodies.items():
            say(f"[{name}] {encoding}")
            target = Target("127.0.0.1", anchor.port, "app", body, settings, anchor.pids)
            result[encoding] = levels(target, rate)
        return result


# ----------------------------------------------------------------------------------------------
# levels of load, and the server's CPU over each
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A system under load: where it listens, what it is asked, and which processes are its own."""

    host: str
    port: int
    app: str
    body: Body
    settings: ServingSettings
    pids: Callable[[], list[int]]


def levels(target: Target, rate_rps: float | None = None) -> dict[str, Any]:
    """Closed loop at every concurrency, then the open loop at ``rate_rps`` (the settings' rate, else
    this one, else half the best closed-loop rate just measured)."""
    settings = target.settings
    out: dict[str, Any] = {f"closed_{c}": measure(target, c, None) for c in settings.concurrency}
    best = max(level["rps"] for level in out.values())
    rate = settings.rate_rps or rate_rps or max(best / 2.0, 1.0)
    out["open"] = measure(target, max(settings.concurrency), rate) | {"rate_rps": round(rate, 2)}
    return out


def measure(target: Target, clients: int, rate_rps: float | None, **options: Any) -> dict[str, Any]:
    """One level of load from a client process; the server's CPU per answer over it. ``options``:
    the client's further :class:`~failsoft.bench.serving_load.LoadPlan` fields (``backoff``,
    ``window_s``)."""
    from failsoft.bench.serving_load import LoadPlan

    body, settings = target.body, target.settings
    headers = body.headers()
    path = f"/v2/models/{target.app}/infer"
    plan = LoadPlan(
        target.host,
        target.port,
        path,
        headers,
        clients,
        rate_rps,
        settings.duration_s,
        settings.warmup_s,
        **options,
    )
    client = subprocess.Popen(
        [sys.executable, "-m", "failsoft.bench.serving_load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert client.stdin is not None and client.stdout is not None
    client.stdin.write((json.dumps(asdict(plan)) + "\n").encode() + body.data)
    client.stdin.close()
    time.sleep(settings.warmup_s)
    servers = [p for p in target.pids() if p != client.pid]
    cpu0 = _cpu_by_process(servers)
    line = client.stdout.readline()
    cpu_by = _cpu_by_process(servers)
    cpu_by = {k: v - cpu0.get(k, 0.0) for k, v in cpu_by.items()}
    cpu = sum(cpu_by.values())
    if client.wait() != 0 or not line:
        where = f"{target.host}:{target.port}"
        raise FailsoftError(f"the load client failed (exit {client.returncode}) against {where}")
    result: dict[str, Any] = json.loads(line)
    answered = max(result["requests"] - result["errors"], 1)
    result["server_cpu_ms_per_request"] = round(cpu * 1000.0 / answered, 4)
    by = sorted(cpu_by.items(), key=lambda kv: -kv[1])
    result["server_cpu_ms_by_process"] = {k: round(v * 1000.0 / answered, 4) for k, v in by if v > 0}
    return result


def _cpu_by_process(pids: list[int]) -> dict[str, float]:
    """The processes' user+system CPU seconds so far, summed by what each is: the title Ray gives a
    worker, less the method it is running (``ray::ServeReplica:APP:DEPLOYMENT``, ``ray::ProxyActor``,
    ``ray::Agent``, ``ray::IDLE``), else its name (``raylet``, ``gcs_server``,
    ``python``: a driver, failsoft's gateway or an anchor)."""
    import psutil

    out: dict[str, float] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            t = proc.cpu_times()
            title = (proc.cmdline() or [""])[0].split(" ")[0]  # ray::NAME[.METHOD now running]
            label = title.rsplit(".", 1)[0] if title.startswith("ray::") else proc.name()
            out[label] = out.get(label, 0.0) + t.user + t.system
    return out


def _no_processes() -> list[int]:
    return []


def own_processes() -> list[int]:
    """This process (the gateway runs in it) and every process it started (Ray's, the agents')."""
    return process_tree(os.getpid())()


# ----------------------------------------------------------------------------------------------
# failsoft's request path, phase by phase
# ----------------------------------------------------------------------------------------------


def phases(
    session: Any, host: str, port: int, app: str, body: Body, settings: ServingSettings
) -> dict[str, Any]:
    """Milliseconds per request along failsoft's path, at one client (JSON): see the module doc."""
    before = _path_counters(session, app)
    one = measure(Target(host, port, app, body, settings, _no_processes), 1, None)
    after = _path_counters(session, app)
    d = {k: after[k] - before[k] for k in after}
    calls = max(d["agent_calls"], 1)
    handled = max(d["handled"], 1)
    handler_ms = d["handler_s"] * 1000.0 / handled
    agent_ms = d["agent_s"] * 1000.0 / calls
    parse_ms, response_ms = _codec_ms(session, app, body)
    out = {
        "client_p50_ms": one["p50_ms"],
        "client_mean_ms": round(one["seconds"] * 1000.0 / max(one["requests"], 1), 4),
        "gateway_handler_ms": handler_ms,
        "http": one["seconds"] * 1000.0 / max(one["requests"], 1) - handler_ms,
        "parse": parse_ms,
        "dispatch": handler_ms - parse_ms - response_ms - agent_ms,
        "agent_call": agent_ms,
        "queue_wait": d["wait_s"] * 1000.0 / calls,
        "batch": d["batch_s"] * 1000.0 / calls,
        "inference": d["predict_s"] * 1000.0 / calls,
        "answer": d["answer_s"] * 1000.0 / calls,
        "response": response_ms,
        "requests": one["requests"],
    }
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def transport_rtt(session: Any, app: str, settings: ServingSettings) -> dict[str, Any]:
    """The gateway -> agent call alone, from this process (batch 1, the app's model): the data
    plane against the Ray actor call it replaced, at 1 and 8 calls in flight, for ``duration_s``
    each. Calls per second, p50 and p99 ms, and this process's CPU per call."""
    import asyncio

    with session.client(timeout=30.0) as client:
        route = next(a for a in client.status()["apps"] if a["name"] == app)["route"]
    agent = session.agents[route["server"]]
    shape = tuple(
        session.prepared.models[next(a.family for a in session.config.apps if a.name == app)].input_shape
    )
    batch = np.random.default_rng(0).random((1, *shape), dtype=np.float32)

    async def level(transport: str, in_flight: int) -> dict[str, Any]:
        times: list[float] = []
        stop = time.perf_counter() + settings.duration_s

        async def caller() -> None:
            while (t := time.perf_counter()) < stop:
                await agent.infer(app, route["variant"], batch, 10.0, None, transport=transport)
                times.append(time.perf_counter() - t)

        for _ in range(20):  # connect, warm
            await agent.infer(app, route["variant"], batch, 10.0, None, transport=transport)
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(in_flight)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        ms = np.asarray(times) * 1000.0
        return {
            "calls_per_s": round(len(ms) / wall, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 3),
            "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "caller_cpu_ms_per_call": round(cpu * 1000.0 / max(len(ms), 1), 3),
            "calls": len(ms),
        }

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for transport in ("zmq", "ray"):
            out[transport] = {f"in_flight_{n}": await level(transport, n) for n in (1, 8)}
        agent.data_plane.close()  # this loop's connection, before the loop ends
        out["zmq_to_ray_calls_per_s"] = {
            k: round(v["calls_per_s"] / max(out["ray"][k]["calls_per_s"], 1e-9), 2)
            for k, v in out["zmq"].items()
        }
        return out

    return asyncio.run(main())


def _path_counters(session: Any, app: str) -> dict[str, float]:
    """The gateway's handler time and count for ``app``, and every agent's serving counters, summed."""
    text = _get_metrics(session.url)
    handler_s = handled = 0.0
    for line in text.splitlines():
        if line.startswith("failsoft_request_latency_seconds_sum") and f'app="{app}"' in line:
            handler_s += float(line.rsplit(" ", 1)[1])
        elif line.startswith("failsoft_request_latency_seconds_count") and f'app="{app}"' in line:
            handled += float(line.rsplit(" ", 1)[1])
    out = {"handler_s": handler_s, "handled": handled, "agent_calls": 0.0, "agent_s": 0.0}
    out |= {"wait_s": 0.0, "batch_s": 0.0, "predict_s": 0.0, "answer_s": 0.0}
    for agent in session.agents.values():
        info = agent.info_sync()
        out["agent_calls"] += info.get("infer_calls", 0)
        out["agent_s"] += info.get("infer_s", 0.0)
        for queue in info["queues"].values():
            for key in ("wait_s", "batch_s", "predict_s", "answer_s"):
                out[key] += queue.get(key, 0.0)
    return out


def _get_metrics(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/metrics", timeout=10.0).text


def _codec_ms(session: Any, app: str, body: Body) -> tuple[float, float]:
    """The gateway's parse of this request and its JSON response, timed here (median of 50)."""
    from failsoft.runtime.gateway.protocol import infer_response, parse_infer_request

    family = next(a.family for a in session.config.apps if a.name == app)
    meta = session.prepared.models[family]
    parse, respond = [], []
    logits = np.zeros((1, meta.num_classes), dtype=np.float32)
    for _ in range(50):
        t0 = time.perf_counter()
        req = parse_infer_request(body.data, app, meta, 64, body.header_length)
        t1 = time.perf_counter()
        json.dumps(infer_response(app, logits, req, {}), separators=(",", ":"))
        t2 = time.perf_counter()
        parse.append(t1 - t0)
        respond.append(t2 - t1)
    return statistics.median(parse) * 1000.0, statistics.median(respond) * 1000.0


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def ratios(systems: dict[str, Any]) -> dict[str, Any]:
    """failsoft's requests/s over each anchor's (FastAPI, Ray Serve without and with batching), over
    its own Ray-call path's and over the in-process limit, per encoding and level."""
    fs, limit = systems.get("failsoft"), systems.get("inprocess")
    out: dict[str, Any] = {}
    if not fs:
        return out
    anchors = {
        "failsoft_to_fastapi": systems.get("fastapi"),
        "failsoft_to_ray_serve": systems.get("ray-serve"),
        "failsoft_to_ray_serve_batch": systems.get("ray-serve-batch"),
        "failsoft_to_failsoft_ray": systems.get("failsoft-ray"),
    }
    for encoding in ENCODINGS:
        for level, figures in (fs.get(encoding) or {}).items():
            key = f"{encoding}_{level}"
            for ratio, other in anchors.items():
                if other and encoding in other and level in other[encoding] and other[encoding][level]["rps"]:
                    out.setdefault(ratio, {})[key] = round(figures["rps"] / other[encoding][level]["rps"], 3)
            if limit and limit["rps"]:
                out.setdefault("failsoft_to_inprocess", {})[key] = round(figures["rps"] / limit["rps"], 3)
    return out


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """``$name`` set to ``value`` for the block (the driver's AgentRefs read it when made)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.contextmanager
def one_app_served(
    config_path: str | Path, app_name: str | None, state_prefix: str, say: Progress
) -> Iterator[tuple[RuntimeConfig, Any]]:
    """The config a benchmark of one app serves (its families built on first use, a throwaway
    state directory) and that app (``app_name``, or the config's first)."""
    from failsoft.bench.cluster import private_state
    from failsoft.bench.models import ensure_families

    base = load_config(config_path)
    app = _app(base, app_name)
    ensure_families(base.replace(apps=(app,)), say)
    with private_state(base, state_prefix) as cfg:
        yield cfg, app


def _app(config: RuntimeConfig, name: str | None) -> Any:
    apps = [a for a in config.apps if name is None or a.name == name]
    if not apps:
        known = ", ".join(a.name for a in config.apps)
        raise ConfigError(f"no app named {name!r} in the config (apps: {known})")
    return apps[0]


def _torch_threads(config: RuntimeConfig) -> int:
    from failsoft.runtime.agent import threads_for

    return threads_for(config.agents.torch_threads)


def _load(config: RuntimeConfig, family: str, variant: str, threads: int) -> Any:
    import torch

    from failsoft.zoo import ModelRepository, resolve_repository

    torch.set_num_threads(threads)
    return ModelRepository(resolve_repository(config.repository)).load(family, variant, "cpu")


def host_port(url: str) -> tuple[str, int]:
    """The host and port of a gateway URL (``http://HOST:PORT``)."""
    host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    return host, int(port)
