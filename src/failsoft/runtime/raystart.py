"""Starting an embedded Ray instance on a busy host: retry when Ray's own start times out.

Ray 2.60's ``ray.init`` that starts a local instance waits a fixed 30 s for its raylet to register
with the GCS (a local literal in ``ray/_private/node.py``; no setting lengthens it) and then raises
a plain ``Exception("The current node timed out during startup. ...")``. Before that it waits for
the GCS to write its port (``RAY_gcs_server_port_wait_time_s``, 30 s by default), and raises
``RuntimeError("Timed out waiting for file .../gcs_server_port_...")``. On a 2-core host beside CPU
hogs the first happened once in 30 runs of the graph failover test: the raylet was starved, not
broken. Lengthening the GCS wait through its variable would not help the raylet's, so both are
handled the same way here: kill what the failed start left and start again.

When ``Node()`` raises inside ``ray.init``, ``ray.init`` has not recorded the node, so
``ray.shutdown()`` knows none of the processes it already started (GCS, raylet, monitor, dashboard,
log monitor, and the raylet's agents and workers): they stay, children of this process, holding
ports, memory and CPU on a host that was already too busy. :func:`start_embedded` kills them by
pid (the children of this process that appeared during the failed call and run Ray's own programs,
and their descendants), waits for them, and tries again, at most ``attempts`` times in all. Only
these two timeouts are retried: a bad argument or any other error fails at once, as before, but
without leaving processes behind (Ray checks some arguments, such as a negative ``num_cpus``, only
once its GCS is up). The
failed start's session directory (``/tmp/ray/session_*``) is kept: its logs say why the raylet
was late, and the next start makes a directory of its own.
"""

from __future__ import annotations

import logging
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass

import psutil

log = logging.getLogger(__name__)

START_ATTEMPTS = 2  # one retry: a host too busy to start Ray twice in a row is not one to serve on
RAYLET_TIMEOUT = "The current node timed out during startup"  # node.py, a plain Exception
GCS_PORT_TIMEOUT = "Timed out waiting for file"  # _raylet.wait_for_persisted_port, a RuntimeError
_SESSION = re.compile(r"(/\S*?/session_[^/\s]+)")


def is_start_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is Ray's own start timing out (retried), not a bad argument (never retried).

    Ray raises the raylet's timeout as a bare ``Exception``, so the type alone says nothing: the
    message is matched too, and a subclass (``ValueError``, ``TypeError``...) is never a timeout.
    """
    text = str(exc)
    if type(exc) is Exception:
        return text.startswith(RAYLET_TIMEOUT)
    if type(exc) is RuntimeError:
        return text.startswith(GCS_PORT_TIMEOUT) and "gcs_server_port" in text
    return False


@dataclass(frozen=True)
class Leftovers:
    """What a failed start left and what became of it."""

    pids: tuple[int, ...]  # killed (and reaped where they were our children)
    session_dir: str | None  # the failed start's session directory, kept for its logs


def _children() -> set[tuple[int, float]]:
    """This process's children as (pid, start time): a pid alone may be reused."""
    found = set()
    for child in psutil.Process().children(recursive=False):
        try:
            found.add((child.pid, child.create_time()))
        except psutil.NoSuchProcess:
            continue
    return found


def _ray_programs(before: set[tuple[int, float]], ray_home: str) -> list[psutil.Process]:
    """Ray's processes started since ``before``: new children of ours that run a program from Ray's
    package directory ``ray_home`` (so nothing another thread of this process started), with all
    their descendants."""
    found: dict[int, psutil.Process] = {}
    for child in psutil.Process().children(recursive=False):
        try:
            if (child.pid, child.create_time()) in before:
                continue
            if not any(ray_home in arg for arg in child.cmdline()):
                continue
            found[child.pid] = child
            for below in child.children(recursive=True):
                found[below.pid] = below
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def _session_dir(procs: list[psutil.Process]) -> str | None:
    for proc in procs:
        try:
            for arg in proc.cmdline():
                if match := _SESSION.search(arg):
                    return match.group(1)
        except psutil.NoSuchProcess:
            continue
    return None


def kill_leftovers(before: set[tuple[int, float]], ray_home: str) -> Leftovers:
    """Kill (SIGKILL, by pid) the Ray processes started since ``before`` and wait for them."""
    procs = _ray_programs(before, ray_home)
    session = _session_dir(procs)
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)  # also ends a stopped (SIGSTOP) process
        except psutil.NoSuchProcess:
            continue
    # reaps our own children; the raylet's (now orphans) are reaped by whoever adopts them
    _, alive = psutil.wait_procs(procs, timeout=10.0)
    if alive:
        log.warning("Ray processes %s outlived SIGKILL by 10 s", sorted(p.pid for p in alive))
    return Leftovers(tuple(sorted(p.pid for p in procs)), session)


def start_embedded(init: Callable[[], object], ray_home: str, attempts: int = START_ATTEMPTS) -> None:
    """Run ``init`` (an embedded ``ray.init``); when it fails, kill the processes it left, and when
    the failure was Ray's own start timing out, run it again, ``attempts`` times in all. The last
    timeout, or any other error, is raised. ``ray_home`` is Ray's package directory, from which
    every program Ray starts is run (given by the caller: only the cluster wrapper imports Ray)."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        before = _children()
        try:
            init()
            return
        except Exception as exc:
            # whatever failed, Ray's half-started processes go (a negative num_cpus fails after
            # the GCS is up); only a timeout is worth another try
            left = kill_leftovers(before, ray_home)
            if attempt == attempts or not is_start_timeout(exc):
                raise
            log.warning(
                "embedded Ray did not start (%s); killed the %d processes it left (pids %s; "
                "its logs stay in %s); starting again (attempt %d of %d)",
                exc,
                len(left.pids),
                ", ".join(map(str, left.pids)) or "none",
                left.session_dir or "no session directory",
                attempt + 1,
                attempts,
            )
