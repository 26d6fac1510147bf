"""The machine a profile was measured on: numbers mean little without it.

FailLite profiles its variants on the serving hardware (section 5.1, Triton Model Analyzer on an A2);
failsoft's profiler records where its own numbers come from: CPU model, cores, memory, torch version,
threads and, when used, the CUDA device.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; every core where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class BusyCores:
    """How many of this process's usable cores were busy (any process, any user) since it was made.

    Read from the kernel's per-CPU time counters (``psutil.cpu_times``), so it counts everything the
    host runs, other tenants included: the simulator's twin of a runtime run needs the host's real
    load, not this process's."""

    def __init__(self) -> None:
        import psutil

        self._cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        self._psutil = psutil
        self._start, self._at = self._busy(), time.monotonic()

    def _busy(self) -> float:
        per_cpu = self._psutil.cpu_times(percpu=True)
        chosen = per_cpu if self._cpus is None else [per_cpu[i] for i in self._cpus if i < len(per_cpu)]
        # guest time is already counted in user time; steal is time the hypervisor gave elsewhere
        free = ("idle", "iowait", "guest", "guest_nice")
        return sum(sum(t) - sum(getattr(t, f, 0.0) for f in free) for t in chosen)

    def read(self) -> float:
        """Busy cores on average since the meter was made (0 to the usable cores)."""
        elapsed = time.monotonic() - self._at
        if elapsed <= 0:
            return 0.0
        busy = (self._busy() - self._start) / elapsed
        return max(0.0, min(busy, float(usable_cores())))


def machine_info(device: str) -> dict[str, Any]:
    """A JSON-able description of this machine and of the torch build that ran the profile."""
    import psutil
    import torch

    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count_logical": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "cpu_affinity": usable_cores(),
        "memory_total_mb": round(psutil.virtual_memory().total / 2**20),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": device,
    }
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        info |= {
            "cuda_device": props.name,
            "cuda_memory_mb": round(props.total_memory / 2**20),
            "cuda_version": torch.version.cuda,
        }
    return info
