"""The host's busy cores, read from the kernel's counters: the simulator's twin of a runtime run is
given the host's real load, everyone's."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from failsoft.zoo.machine import BusyCores, usable_cores

pytestmark = pytest.mark.slow  # each measures a second of the wall clock


def test_a_spinning_thread_shows_as_about_one_busy_core():
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    meter = BusyCores()
    worker = threading.Thread(target=spin)
    worker.start()
    try:
        time.sleep(1.0)
        busy = meter.read()
    finally:
        stop.set()
        worker.join()
    # our thread alone keeps one core busy (more if other tenants run); never past the cores we have
    assert 0.8 <= busy <= usable_cores()


SPIN = "import time\nt=time.time()\nwhile time.time()-t<5: pass"


def _spin_beside(meter_type: type, **popen: Any) -> tuple[dict[str, Any], float]:
    """A process spinning for a second beside a fresh meter: what the meter read, and the cores
    the process itself got meanwhile."""
    import subprocess
    import sys

    import psutil

    meter = meter_type()
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", SPIN], **popen)
    try:
        time.sleep(1.0)
        split = meter.read()
        times = psutil.Process(proc.pid).cpu_times()
        return split, (times.user + times.system) / (time.monotonic() - started)
    finally:
        proc.kill()
        proc.wait()


def test_a_spinning_child_counts_as_our_own_group():
    from failsoft.zoo.machine import HostCpu

    split, child_cores = _spin_beside(HostCpu)  # a child of ours, in our session: our own group
    # whatever else the host runs, the child's CPU is counted as ours (not as another group's)
    assert split["own_cores"] >= 0.9 * child_cores > 0
    assert split["own_cores"] <= split["busy_cores"] + 1e-6
    others = sum(split["other_groups"].values())
    assert split["busy_cores"] == pytest.approx(split["own_cores"] + others, abs=0.02)


def test_a_spinning_process_of_another_session_is_another_group():
    from failsoft.zoo.machine import HostCpu, autogroups_enabled

    if not autogroups_enabled():
        pytest.skip("this kernel shares CPU by nice only (no autogroup scheduling)")
    split, other_cores = _spin_beside(HostCpu, start_new_session=True)  # its own autogroup
    # its CPU shows in one other group (with whatever else that group ran, if anything), not in ours
    assert max(split["other_groups"].values(), default=0.0) >= 0.9 * other_cores > 0.05


def test_the_cores_of_named_processes_are_read_beside_the_groups():
    """``bench failover`` names the agents about to be killed: the twin leaves their CPU out."""
    import subprocess
    import sys

    from failsoft.zoo.machine import HostCpu

    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.3)  # both running before the meter starts
        meter = HostCpu()
        time.sleep(1.0)
        split = meter.read({"spinner": spinner.pid, "sleeper": sleeper.pid, "gone": 2**22 + 7})
    finally:
        for proc in (spinner, sleeper):
            proc.kill()
            proc.wait()
    named = split["processes"]
    assert named["spinner"] >= 0.5  # about a core (less on a busy host), never more than the host's
    assert named["spinner"] <= split["own_cores"] + 1e-6
    assert named["sleeper"] < 0.05 and named["gone"] == 0.0  # a pid never seen: nothing
    assert "processes" not in meter.read()  # only when asked
