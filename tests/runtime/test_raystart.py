"""The embedded Ray start, retried when Ray's own start times out (:mod:`failsoft.runtime.raystart`).

The timeout is produced for real: a watcher thread stops (SIGSTOP) the first raylet this process
starts, as a host too busy to run it would, so Ray's 30 s wait for the raylet to register runs out
and ``ray.init`` raises its own exception. No fake stands in for Ray. The wait is two nested ones,
both 30 s: each ``get_node`` call waits for the node in Ray's C++ (its ``raylet_start_wait_time_s``
setting, set to 3 s here in the environment and through ``ray._raylet.Config``), and
``node.py`` calls it again until 30 s have passed on its clock, a constant with no setting. So that
clock alone (``node.py``'s view of ``time.monotonic``) runs ``SPEEDUP`` times faster while the
raylet is stopped: the first start times out after one 3 s call, and the retried start runs at
real speed, with Ray's whole 30 s to register its raylet.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
import ray
import ray._private.node as ray_node

from failsoft.domain import Server
from failsoft.errors import ServingError
from failsoft.runtime import raystart
from failsoft.runtime.cluster import RayCluster, keep_embedded
from tests.conftest import RUNNER_ENV

SERVERS = [Server("s1", "a", 100.0)]
SPEEDUP = 15.0  # how much faster node.py's clock runs while the raylet is stopped
GET_NODE_WAIT_S = 3  # each get_node call's wait for the node (Ray's default: 30)
GET_NODE_WAIT_ENV = "RAY_raylet_start_wait_time_s"


def _ray_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()]


def _mentions(proc: psutil.Process, text: str) -> bool:
    try:
        return any(text in arg for arg in proc.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


class RayletStopper(threading.Thread):
    """Stops (SIGSTOP) the first raylet this process starts, before it registers with the GCS."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.done = threading.Event()
        self.stopped: psutil.Process | None = None
        self.stopped_at: float | None = None  # time.monotonic() at the SIGSTOP
        self.session_dir: str | None = None

    def run(self) -> None:
        me = psutil.Process()
        while not self.done.is_set():
            for child in me.children(recursive=False):
                try:
                    if child.name() != "raylet":
                        continue
                    child.send_signal(signal.SIGSTOP)
                    self.stopped_at = time.monotonic()
                    self.stopped = child
                    self.session_dir = self._session_dir(child)
                except psutil.NoSuchProcess:
                    continue
                return
            time.sleep(0.001)

    @staticmethod
    def _session_dir(raylet: psutil.Process) -> str | None:
        # caught in execve, a process already has its new name but not yet its arguments; stopped,
        # it finishes the exec before it halts
        for _ in range(5000):
            if found := raystart._session_dir([raylet]):
                return found
            time.sleep(0.001)
        return None


class RayClock:
    """The ``time`` module as Ray's ``node.py`` sees it: real, but for a monotonic clock that runs
    ``SPEEDUP`` times faster from the raylet's SIGSTOP until that raylet is gone (killed by the
    retry), and at real speed, ahead by what it gained, before and after. It never goes back."""

    def __init__(self, stopper: RayletStopper) -> None:
        self.stopper = stopper
        self.released_at: float | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    def monotonic(self) -> float:
        now = time.monotonic()
        stopped, since = self.stopper.stopped, self.stopper.stopped_at
        if stopped is None or since is None:
            return now
        if self.released_at is None and not stopped.is_running():
            self.released_at = now
        fast_until = now if self.released_at is None else self.released_at
        return now + (SPEEDUP - 1.0) * (fast_until - since)


@pytest.mark.parametrize(
    ("exc", "retried"),
    [
        (Exception("The current node timed out during startup. This could happen ..."), True),
        (RuntimeError("Timed out waiting for file /tmp/ray/session_x/gcs_server_port_ab"), True),
        (ValueError("The current node timed out during startup."), False),  # a subclass: not Ray's
        (Exception("Resource quantities must be nonnegative."), False),
        (RuntimeError("Timed out waiting for file /tmp/other"), False),
    ],
)
def test_only_rays_own_start_timeouts_are_retried(exc, retried):
    assert raystart.is_start_timeout(exc) is retried


@pytest.fixture
def own_ray() -> Iterator[None]:
    """The test watches a Ray start of its own: none kept from an earlier cluster of the worker."""
    keep_embedded(False)
    try:
        yield
    finally:
        keep_embedded(True, ignore_env=RUNNER_ENV)


@pytest.mark.runtime
@pytest.mark.slow
@pytest.mark.usefixtures("own_ray")
def test_a_start_whose_raylet_never_registers_is_retried_and_leaves_nothing_behind(caplog, monkeypatch):
    stopper = RayletStopper()
    monkeypatch.setattr(ray_node, "time", RayClock(stopper))
    # in the environment for Ray's re-reads of it, and set at once for a process that read it before
    os.environ[GET_NODE_WAIT_ENV] = str(GET_NODE_WAIT_S)
    ray._raylet.Config.initialize(json.dumps({"raylet_start_wait_time_s": GET_NODE_WAIT_S}))
    stopper.start()
    cluster = RayCluster(SERVERS, num_cpus=1)
    try:
        with caplog.at_level(logging.WARNING, logger=raystart.__name__):
            cluster.start()
        stopper.done.set()
        assert stopper.stopped is not None and stopper.session_dir is not None, "no raylet was stopped"
        retries = [r.getMessage() for r in caplog.records if "starting again" in r.getMessage()]
        assert len(retries) == 1 and raystart.RAYLET_TIMEOUT in retries[0], retries
        assert str(stopper.stopped.pid) in retries[0]
        # the second start serves ...
        assert ray.get(ray.remote(lambda: 41 + 1).options(num_cpus=0).remote(), timeout=60) == 42
        # ... and nothing of the first is left: not the stopped raylet, not its GCS or monitors
        assert not stopper.stopped.is_running()
        left = [p.pid for p in _ray_children() if _mentions(p, stopper.session_dir)]
        assert left == [], f"processes of the failed start {stopper.session_dir} still run: {left}"
    finally:
        stopper.done.set()
        cluster.shutdown()
        os.environ.pop(GET_NODE_WAIT_ENV, None)
        ray._raylet.Config.initialize("")  # Ray's settings as the environment gives them


@pytest.mark.runtime
@pytest.mark.slow
@pytest.mark.usefixtures("own_ray")
def test_a_bad_argument_fails_at_once_without_leaving_ray_processes(caplog):
    before = {p.pid for p in _ray_children()}
    cluster = RayCluster(SERVERS, num_cpus=-1)  # Ray refuses it once its GCS is already up
    with (
        caplog.at_level(logging.WARNING, logger=raystart.__name__),
        pytest.raises(ServingError, match="nonnegative"),
    ):
        cluster.start()
    assert not [r for r in caplog.records if "starting again" in r.getMessage()]
    left = [p.pid for p in _ray_children() if p.pid not in before and _mentions(p, "/ray/")]
    assert left == [], f"a failed start left Ray processes {left}"
