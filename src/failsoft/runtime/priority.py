"""CPU priority for the latency-critical parts of a cluster that shares its host with model work.

The controller and the gateway are light but on the path of every recovery: a failure the gateway
hears 20 ms late, or a route the controller publishes late, is outage. On a machine shared with
the agents' inference and recovery loads (an embedded cluster, an edge box) the scheduler would
otherwise make them wait whole ticks behind model work. Raising a priority needs the privilege
(root, CAP_SYS_NICE); without it nothing changes and serving goes on as before.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

CONTROLLER_NICE = -5  # the controller's process: verdicts and routes
GATEWAY_NICE = -5  # the gateway's event-loop thread: requests, connection ends, route changes
MAX_NICE = 19  # the lowest priority there is


def set_niceness(nice: int, whole_process: bool = False) -> bool:
    """Set this thread's niceness (every thread of the process with ``whole_process``) to ``nice``:
    raised for the latency-critical parts, lowered for background work. Threads started afterwards
    from it inherit it. Returns whether it took effect (not without the privilege to raise, nor off
    Linux, where niceness is not per thread)."""
    if whole_process:
        tasks = Path("/proc/self/task")
        tids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    else:
        tids = [threading.get_native_id()]
    done = False
    for tid in tids:
        with contextlib.suppress(OSError, AttributeError):  # no privilege, the thread ended, not Linux
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            done = True
    return done


def lower_niceness(steps: int) -> bool:
    """Lower this thread's priority ``steps`` below what it has now (inherited from the thread that
    started it), at most to :data:`MAX_NICE`. Needs no privilege; raising it back would, so
    background work runs in a thread of its own. Returns whether it took effect."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux
        base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return set_niceness(min(base + steps, MAX_NICE))
    return False
