"""The serving benchmark's anchors as processes: started, checked, measured by the caller, stopped.

An anchor is a server a user would pick instead of failsoft, over the same model file at the same
torch threads: the plain FastAPI app (:mod:`failsoft.bench.serving_anchor`) or Ray Serve, one
replica, without and with ``@serve.batch`` (:mod:`failsoft.bench.serving_anchor_rayserve`, which
runs a Ray instance of its own, apart from the one failsoft serves on). :func:`served_anchor` starts
one in a process of its own on a free port of 127.0.0.1, waits until it answers a real request,
checks its answers (JSON and binary) against the logits the model gives in the benchmark's process,
yields where it listens and which processes are its (for their CPU), and stops it: SIGTERM (the Ray
Serve anchor then runs ``serve.shutdown()`` and ``ray.shutdown()``), then SIGKILL for whatever of its
processes (by pid, as recorded while it ran: raylet, GCS, workers) is still alive.
"""

from __future__ import annotations

import contextlib
import importlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from failsoft.bench.serving_load import Body
from failsoft.errors import FailsoftError

Progress = Callable[[str], None]

# Ray Serve's batching as the anchor runs it: at most the benchmark's default top level of clients in
# one batch, and a wait of about two inferences of a small model for a batch to fill (Ray Serve's own
# defaults are 10 and 10 ms; 10 ms would dwarf the digits MLP's 1 ms at one client)
RAY_SERVE_MAX_BATCH_SIZE = 32
RAY_SERVE_BATCH_WAIT_TIMEOUT_S = 0.002
# requests a replica takes at once (Ray Serve's default is 5): at least the clients and the batch,
# so that requests wait in the replica, not in the proxy's retries
RAY_SERVE_MAX_ONGOING_REQUESTS = 64


@dataclass(frozen=True)
class AnchorSpec:
    """How to run one anchor: its module, its extra arguments, what it reports of its settings,
    and how long it may take to answer its first request."""

    module: str
    args: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    ready_s: float = 120.0
    needs: str | None = None  # a module that must import, else the anchor is skipped


_RAY_SERVE = {"num_replicas": 1, "max_ongoing_requests": RAY_SERVE_MAX_ONGOING_REQUESTS}
_RAY_SERVE_ARGS = ("--max-ongoing-requests", str(RAY_SERVE_MAX_ONGOING_REQUESTS))
_BATCH = {"max_batch_size": RAY_SERVE_MAX_BATCH_SIZE, "batch_wait_timeout_s": RAY_SERVE_BATCH_WAIT_TIMEOUT_S}
ANCHORS: dict[str, AnchorSpec] = {
    "fastapi": AnchorSpec("failsoft.bench.serving_anchor", settings={"server": "uvicorn"}),
    "ray-serve": AnchorSpec(
        "failsoft.bench.serving_anchor_rayserve",
        _RAY_SERVE_ARGS,
        _RAY_SERVE | {"batching": None},
        ready_s=240.0,
        needs="ray.serve",
    ),
    "ray-serve-batch": AnchorSpec(
        "failsoft.bench.serving_anchor_rayserve",
        (
            *_RAY_SERVE_ARGS,
            "--max-batch-size",
            str(RAY_SERVE_MAX_BATCH_SIZE),
            "--batch-wait-timeout-s",
            str(RAY_SERVE_BATCH_WAIT_TIMEOUT_S),
        ),
        _RAY_SERVE | {"batching": _BATCH},
        ready_s=240.0,
        needs="ray.serve",
    ),
}


def missing(spec: AnchorSpec) -> str | None:
    """Why an anchor cannot run here (its optional dependency does not import), or None."""
    needs = spec.needs
    if needs is None:
        return None
    try:
        importlib.import_module(needs)
    except Exception as exc:
        return (
            f"skipped: {needs} is not importable ({type(exc).__name__}: {exc}); it is optional: "
            "pip install 'failsoft[anchors]'"
        )
    return None


@dataclass(frozen=True)
class Anchor:
    """A running anchor: its port on 127.0.0.1, its processes (for their CPU), what it reports."""

    port: int
    pids: Callable[[], list[int]]
    facts: dict[str, Any]


@contextlib.contextmanager
def served_anchor(
    name: str,
    repository: str,
    family: str,
    variant: str,
    threads: int,
    bodies: dict[str, Body],
    expected: np.ndarray,
    say: Progress,
) -> Iterator[Anchor]:
    """Anchor ``name`` serving ``family/variant`` from ``repository``, answering ``bodies`` with
    ``expected`` (the in-process logits of the bodies' input), until the block ends."""
    spec = ANCHORS[name]
    port = free_port()
    cmd = [sys.executable, "-m", spec.module, repository, family, variant, str(port), str(threads)]
    say(f"[{name}] starting ...")
    with tempfile.TemporaryDirectory(prefix="failsoft-anchor-") as tmp, open(Path(tmp) / "log", "ab") as out:
        log = Path(tmp) / "log"
        server = subprocess.Popen([*cmd, *spec.args], stdout=out, stderr=subprocess.STDOUT)
        seen: dict[int, Any] = {}
        pids = process_tree(server.pid, seen)
        try:
            answers = {e: wait_answer(name, port, b, server, log, spec.ready_s) for e, b in bodies.items()}
            pids()
            facts = {"settings": spec.settings, "answer_check": check_answers(name, answers, expected)}
            say(f"[{name}] answering on 127.0.0.1:{port} with the model's logits")
            yield Anchor(port, pids, facts)
        finally:
            pids()
            stop(server, seen)


def process_tree(root: int, seen: dict[int, Any] | None = None) -> Callable[[], list[int]]:
    """A function giving the pids of ``root`` and its descendants at each call (none once ``root``
    is gone); every process seen is also kept in ``seen`` (pid -> psutil process), so that
    :func:`stop` can kill those its root left behind."""
    import psutil

    def pids() -> list[int]:
        try:
            proc = psutil.Process(root)
            found = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            return []
        if seen is not None:
            for p in found:
                seen.setdefault(p.pid, p)
        return [p.pid for p in found]

    return pids


def stop(server: subprocess.Popen[bytes], seen: dict[int, Any], grace_s: float = 60.0) -> None:
    """SIGTERM to the anchor (it shuts down what it started), then SIGKILL to it and to every
    process of it still alive (by pid; psutil refuses a pid reused since)."""
    import psutil

    server.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(grace_s)
    if server.poll() is None:
        server.kill()
        server.wait()
    for proc in seen.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs([p for p in seen.values() if p.pid != server.pid], timeout=10.0)


def wait_answer(
    name: str, port: int, body: Body, server: subprocess.Popen[bytes], log: Path, timeout_s: float
) -> dict[str, Any]:
    """The anchor's first 200 answer to ``body`` (JSON), asked until it comes or ``timeout_s`` pass;
    an anchor that exits or never answers is a :class:`FailsoftError` quoting the end of its log."""
    import httpx

    url = f"http://127.0.0.1:{port}/v2/models/app/infer"
    deadline, last = time.monotonic() + timeout_s, "no answer"
    while time.monotonic() < deadline:
        if server.poll() is not None:
            exit_code = server.returncode
            raise FailsoftError(f"the {name} anchor exited with {exit_code} before serving{_tail(log)}")
        try:
            answer = httpx.post(url, content=body.data, headers=body.headers(), timeout=10.0)
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if answer.status_code == 200:
                result: dict[str, Any] = answer.json()
                return result
            last = f"HTTP {answer.status_code}: {answer.text[:200]}"
        time.sleep(0.25)
    raise FailsoftError(
        f"the {name} anchor did not answer on 127.0.0.1:{port} within {timeout_s:.0f} s ({last}){_tail(log)}"
    )


def check_answers(name: str, answers: dict[str, dict[str, Any]], expected: np.ndarray) -> dict[str, Any]:
    """The largest difference between each encoding's answer and the in-process logits; an anchor
    that answers other numbers is not measured (its speed would mean nothing)."""
    out: dict[str, Any] = {}
    for encoding, answer in answers.items():
        tensor = answer["outputs"][0]
        got = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-4, atol=1e-5):
            raise FailsoftError(
                f"the {name} anchor answered {encoding} with logits of shape {got.shape} that differ "
                f"from the model's in-process logits of shape {expected.shape}"
            )
        out[encoding] = {"max_abs_diff": float(np.max(np.abs(got - expected)))}
    return out


def _tail(log: Path, lines: int = 20) -> str:
    text = log.read_bytes().decode(errors="replace").strip().splitlines()[-lines:]
    return (":\n" + "\n".join(text)) if text else ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
