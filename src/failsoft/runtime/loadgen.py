"""Bounded client load for the demo, the failover benchmark and the tests (127.0.0.1 only).

Each app gets one request every ``period_s`` (open loop, FailLite 5.2's clients issue requests at a
steady rate), with at most ``max_in_flight`` outstanding per app, each with a deadline of
``timeout_s`` (``parameters.timeout``). The load stops at ``duration_s``, at ``max_requests``, or when
:meth:`LoadThread.stop` is called, whichever comes first: it is always bounded.

Two more shapes of load, for measuring:

* ``sequential=N``: instead of the open loop, each app in turn is asked ``N`` times, one request at a
  time over all apps: its latency alone (the benchmark's "usual latency" of an app);
* ``gated``: the client (a :class:`LoadProcess`) gets everything ready (inputs, HTTP client, its
  imports) and then waits for :meth:`LoadProcess.go`, so that its first requests leave within a
  millisecond of a chosen moment (the benchmark's requests at the instant of a crash). ``go`` may
  bring request parameters made meanwhile (an slo service's client, registered only once the load is
  ready: the service forgets a client silent for 10 s, and a child process can take that long to
  start on a busy host).

``stagger`` starts each app at a random offset within its period (seeded), so that apps with long
periods do not all ask at once.

Inputs are real: the held-out digits images for digits apps (so answers can be scored), and a fixed
random image for ImageNet-style apps. Every request becomes a :class:`Sample` with wall-clock send
and completion times and how it was served, from which the demo plots latency and the benchmark
measures what a client sees of a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from failsoft.errors import ConfigError, FailsoftError


@dataclass(frozen=True, slots=True)
class LoadSpec:
    url: str
    inputs: Mapping[str, tuple[int, ...]]  # app -> input shape (without the batch dimension)
    period_s: float = 0.1
    timeout_s: float = 5.0
    duration_s: float = 60.0
    max_requests: int = 100_000
    max_in_flight: int = 4
    seed: int = 0
    periods: Mapping[str, float] = field(default_factory=dict)  # per-app overrides of period_s
    stagger: bool = False  # first request of each app at a random offset within its period
    sequential: int = 0  # > 0: ask each app this many times, one request at a time over all apps
    gated: bool = False  # LoadProcess only: get ready, then wait for go()
    # per-app further request parameters (an slo service's registered ``client``)
    parameters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def period_of(self, app: str) -> float:
        return self.periods.get(app, self.period_s)

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://127.0.0.1", "http://localhost")):
            raise ConfigError(f"the load generator only targets this machine (127.0.0.1), not {self.url!r}")
        if self.period_s <= 0 or self.duration_s <= 0 or self.max_requests < 1:
            raise ConfigError("load period, duration and request count must be positive")
        if any(p <= 0 for p in self.periods.values()) or self.sequential < 0:
            raise ConfigError("per-app periods must be positive, sequential rounds not negative")


@dataclass(frozen=True, slots=True)
class Sample:
    app: str
    sent: float
    done: float
    ok: bool
    server: str | None = None
    variant: str | None = None
    degraded: bool = False
    attempts: int = 0
    correct: bool | None = None
    error: str | None = None
    reconstructed: bool = False  # decoded by a coded service (ParM), not computed by the model asked
    dropped: bool = False  # shed by an slo service to keep its other frames in their SLO: not answered

    @property
    def latency_ms(self) -> float:
        return (self.done - self.sent) * 1000.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Inputs:
    """Request payloads per app: held-out digits (with labels) or one fixed random image."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.shapes = dict(shapes)
        self._digits: tuple[np.ndarray, np.ndarray] | None = None
        self._images: dict[tuple[int, ...], np.ndarray] = {}

    def next(self, app: str) -> tuple[np.ndarray, int | None]:
        shape = self.shapes[app]
        if shape == (64,):
            x, y = self._digit_split()
            i = int(self.rng.integers(len(y)))
            return x[i : i + 1], int(y[i])
        if shape not in self._images:
            self._images[shape] = self.rng.random((1, *shape), dtype=np.float32)
        return self._images[shape], None

    def _digit_split(self) -> tuple[np.ndarray, np.ndarray]:
        if self._digits is None:
            from failsoft.zoo.digits import load_digits_split

            split = load_digits_split()
            self._digits = (split.x_test, split.y_test)
        return self._digits


async def drive(
    spec: LoadSpec,
    stop: threading.Event | None = None,
    samples: list[Sample] | None = None,
    go: threading.Event | None = None,
    ready: Any = None,
    parameters: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Sample]:
    """Run the load until its bounds (or ``stop``); every request's outcome, in completion order.

    ``samples`` (appended to as requests complete) lets another thread watch the load live. With
    ``go``, everything is made ready first (``ready()`` is then called), and the load starts when
    ``go`` is set (or never, if ``stop`` comes first). ``parameters``, when not empty as the load
    starts, replaces ``spec.parameters``: a gated load's, given with ``go``.
    """
    from failsoft.client import AsyncClient

    inputs = _Inputs(spec.inputs, spec.seed)
    for app in spec.inputs:  # read the inputs now (digits: a scikit-learn import), not mid-measurement
        inputs.next(app)
    samples = [] if samples is None else samples
    budget = [spec.max_requests]
    async with AsyncClient(
        spec.url, timeout=spec.timeout_s, max_connections=4 * len(spec.inputs) + 4
    ) as client:
        if go is not None and not await _wait_go(client, go, stop, ready):
            return samples
        if parameters:
            spec = dataclasses.replace(spec, parameters=dict(parameters))
        deadline = time.monotonic() + spec.duration_s  # from when the client is ready
        if spec.sequential:
            await _sequential(client, inputs, spec, samples, stop)
            return samples
        offsets = np.random.default_rng(spec.seed + 1).random(len(spec.inputs)) if spec.stagger else None
        await asyncio.gather(
            *(
                _app_loop(
                    client, app, inputs, spec, samples, budget, deadline, stop,
                    0.0 if offsets is None else float(offsets[i]) * spec.period_of(app),
                )
                for i, app in enumerate(spec.inputs)
            )
        )  # fmt: skip
    return samples


async def _wait_go(client: Any, go: threading.Event, stop: threading.Event | None, ready: Any) -> bool:
    """Open a connection (one health request), say ready, wait for ``go``; False on ``stop``."""
    with contextlib.suppress(FailsoftError):
        await client.live()
    if ready is not None:
        ready()
    while not go.is_set():
        if stop is not None and stop.is_set():
            return False
        await asyncio.sleep(0.0005)  # a poll, not a thread handoff: the first request leaves at once
    return True


async def _sequential(
    client: Any, inputs: _Inputs, spec: LoadSpec, samples: list[Sample], stop: threading.Event | None
) -> None:
    """Each app in turn, ``spec.sequential`` requests, one at a time: each app's latency alone."""
    for app in spec.inputs:
        for _ in range(spec.sequential):
            if stop is not None and stop.is_set():
                return
            x, label = inputs.next(app)
            await _one(client, app, x, label, spec, samples)


async def _app_loop(
    client: Any,
    app: str,
    inputs: _Inputs,
    spec: LoadSpec,
    samples: list[Sample],
    budget: list[int],
    deadline: float,
    stop: threading.Event | None,
    offset_s: float = 0.0,
) -> None:
    in_flight: set[asyncio.Task[None]] = set()
    if offset_s > 0:
        await asyncio.sleep(offset_s)
    next_at = time.monotonic()
    first = True  # every app gets at least one request, however short the load
    while (first or time.monotonic() < deadline) and budget[0] > 0 and not (stop and stop.is_set()):
        first = False
        if len(in_flight) < spec.max_in_flight:
            budget[0] -= 1
            x, label = inputs.next(app)
            task = asyncio.create_task(_one(client, app, x, label, spec, samples))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        next_at += spec.period_of(app)
        await asyncio.sleep(max(min(next_at, deadline) - time.monotonic(), 0.0))
    if in_flight:
        await asyncio.wait(in_flight, timeout=spec.timeout_s + 1.0)


async def _one(
    client: Any, app: str, x: np.ndarray, label: int | None, spec: LoadSpec, out: list[Sample]
) -> None:
    sent = time.time()
    try:
        r = await client.infer(app, x, timeout=spec.timeout_s, parameters=dict(spec.parameters.get(app, {})))
    except FailsoftError as exc:
        out.append(Sample(app, sent, time.time(), False, error=f"{type(exc).__name__}: {exc}"))
        return
    if r.dropped:  # not ok (no answer), not failed: the service shed it on purpose
        reason = f"dropped: {r.raw['parameters'].get('drop_reason')}"
        out.append(Sample(app, sent, time.time(), False, r.server, r.variant, dropped=True, error=reason))
        return
    correct = None if label is None else bool(int(r.predictions[0]) == label)
    out.append(
        Sample(
            app,
            sent,
            time.time(),
            True,
            r.server,
            r.variant,
            r.degraded,
            r.attempts,
            correct,
            reconstructed=r.reconstructed,
        )
    )


class LoadThread:
    """:func:`drive` in a background thread with its own event loop."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self._stop = threading.Event()
        self.samples: list[Sample] = []  # grows as requests complete (read it live)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="failsoft-load", daemon=True)

    def start(self) -> LoadThread:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            asyncio.run(drive(self.spec, self._stop, self.samples))
        except BaseException as exc:  # reported by stop()
            self._error = exc

    def stop(self, timeout_s: float | None = None) -> list[Sample]:
        """Stop sending, wait for outstanding requests, and return every sample."""
        self._stop.set()
        self._thread.join(timeout_s if timeout_s is not None else self.spec.timeout_s + 10.0)
        if self._error is not None:
            raise self._error
        return list(self.samples)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


class LoadProcess:
    """:func:`drive` in a child process (``python -m failsoft.runtime.loadgen``), same interface.

    Client work (encoding, decoding, HTTP) then does not compete for the interpreter with a gateway
    running in this process, so the latencies measured are the system's, not the load generator's.
    Samples stream back as JSON lines and are readable live from :attr:`samples`.
    """

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.samples: list[Sample] = []
        self._child: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self) -> LoadProcess:
        self._child = subprocess.Popen(
            [sys.executable, "-m", "failsoft.runtime.loadgen"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self._child.stdin is not None
        spec = asdict(self.spec) | {
            "inputs": {k: list(v) for k, v in self.spec.inputs.items()},
            "periods": dict(self.spec.periods),
            "parameters": {k: dict(v) for k, v in self.spec.parameters.items()},
        }
        self._child.stdin.write(json.dumps(spec).encode() + b"\n")
        self._child.stdin.flush()
        self._reader = threading.Thread(target=self._read, name="failsoft-load-reader", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._child is not None and self._child.stdout is not None
        for line in self._child.stdout:
            record = json.loads(line)
            if record == _READY:
                self._ready.set()
            else:
                self.samples.append(Sample(**record))

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """A gated load: True once the child is ready to send (False after ``timeout_s``)."""
        return self._ready.wait(timeout_s)

    def go(self, parameters: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """A gated load: start sending now, with ``parameters`` instead of its spec's if given."""
        given = {} if parameters is None else {k: dict(v) for k, v in parameters.items()}
        self._command(b"go " + json.dumps(given).encode() + b"\n" if given else b"go\n")

    def join(self, timeout_s: float | None = None) -> list[Sample]:
        """Wait for the load to end by itself (its bounds, or a sequential run done), then stop it."""
        if self._child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._child.wait(timeout_s)
        return self.stop()

    def _command(self, line: bytes) -> None:
        assert self._child is not None and self._child.stdin is not None
        with contextlib.suppress(OSError):
            self._child.stdin.write(line)
            self._child.stdin.flush()

    def stop(self, timeout_s: float | None = None) -> list[Sample]:
        if self._child is None:
            return []
        assert self._child.stdin is not None
        with contextlib.suppress(OSError):
            self._child.stdin.write(b"stop\n")
            self._child.stdin.close()
        try:
            self._child.wait(timeout_s if timeout_s is not None else self.spec.timeout_s + 10.0)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
        if self._reader is not None:
            self._reader.join(5.0)
        return list(self.samples)

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.poll() is None


_READY = {"ready": True}


def _child_main() -> int:
    """The child of :class:`LoadProcess`: spec on stdin's first line, then ``go`` / ``stop`` lines."""
    raw = json.loads(sys.stdin.readline())
    spec = LoadSpec(**(raw | {"inputs": {k: tuple(v) for k, v in raw["inputs"].items()}}))
    stop, go = threading.Event(), threading.Event()
    given: dict[str, dict[str, Any]] = {}  # the parameters that came with go, if any

    def commands() -> None:
        for line in sys.stdin:
            word, _, rest = line.strip().partition(" ")
            if word == "go":
                given.update(json.loads(rest) if rest else {})
                go.set()
            else:
                stop.set()
        stop.set()  # the parent closed the pipe

    threading.Thread(target=commands, daemon=True).start()
    out = _LineSink()
    ready = (lambda: out.write_line(_READY)) if spec.gated else None
    asyncio.run(drive(spec, stop, out, go if spec.gated else None, ready, given if spec.gated else None))
    return 0


class _LineSink(list):
    """A list whose appends are also written to stdout as JSON lines (the parent reads them)."""

    def append(self, sample: Sample) -> None:
        self.write_line(sample.to_dict())

    @staticmethod
    def write_line(record: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(_child_main())
