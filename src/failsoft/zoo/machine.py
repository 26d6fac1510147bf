"""The machine a profile was measured on: numbers mean little without it.

FailLite profiles its variants on the serving hardware (section 5.1, Triton Model Analyzer on an A2);
failsoft's profiler records where its own numbers come from: CPU model, cores, memory, torch version,
threads and, when used, the CUDA device.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Mapping
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

    def elapsed(self) -> float:
        """Seconds since the meter was made."""
        return time.monotonic() - self._at

    def read(self) -> float:
        """Busy cores on average since the meter was made (0 to the usable cores)."""
        elapsed = self.elapsed()
        if elapsed <= 0:
            return 0.0
        busy = (self._busy() - self._start) / elapsed
        return max(0.0, min(busy, float(usable_cores())))


AUTOGROUP_SWITCH = Path("/proc/sys/kernel/sched_autogroup_enabled")
UNATTRIBUTED = "(exited processes)"


def _sched_group(pid: int, autogroups: bool) -> str:
    """The scheduling group the kernel shares CPU between first: the process's autogroup (one per
    session, ``setsid``) where autogroup scheduling is on, else one group for the whole host."""
    if not autogroups:
        return "host"
    try:
        # "/autogroup-12 nice 0": the group's name and its weight
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except (OSError, IndexError):
        return "kernel"  # kernel threads, or a process gone since it was listed


def autogroups_enabled() -> bool:
    try:
        return AUTOGROUP_SWITCH.read_text().strip() == "1"
    except OSError:
        return False


class HostCpu:
    """The host's busy cores since the meter was made (:class:`BusyCores`), split by scheduling
    group: this process's own group and each other one.

    Linux with autogroup scheduling (on by default on desktop kernels, and on this project's
    machines) shares CPU between *sessions* first and by ``nice`` only inside one, so a tenant in
    another session takes a session's share whatever its threads' priorities. A twin of the host
    must know which busy cores are whose: per-process CPU times from ``/proc`` (psutil), grouped by
    ``/proc/PID/autogroup``. CPU of processes that exited in between cannot be attributed; it is
    reported as one more group (:data:`UNATTRIBUTED`)."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._autogroups = autogroups_enabled()
        self._own = _sched_group(os.getpid(), self._autogroups)
        self._busy = BusyCores()
        self._start = self._per_process()

    def _per_process(self) -> dict[tuple[int, float], tuple[float, str]]:
        seen: dict[tuple[int, float], tuple[float, str]] = {}
        for proc in self._psutil.process_iter(["create_time", "cpu_times"]):
            times, created = proc.info["cpu_times"], proc.info["create_time"]
            if times is None or created is None:
                continue
            seen[(proc.pid, created)] = (times.user + times.system, _sched_group(proc.pid, self._autogroups))
        return seen

    def read(self, processes: Mapping[str, int] | None = None) -> dict[str, Any]:
        """``{"seconds", "busy_cores", "own_cores", "other_groups": {GROUP: cores}, "autogroups"}``:
        busy cores on average over the ``seconds`` since the meter was made; ``own_cores`` is this
        process's group (itself, its children, anything else of its session), ``other_groups``
        every other group with more than 0.01 of a core. With ``processes`` (a name per pid), also
        ``"processes": {NAME: cores}``: what each of them took (0 for one not seen at both ends)."""
        elapsed = self._busy.elapsed()
        busy = self._busy.read()
        groups: dict[str, float] = {}
        named = dict.fromkeys(processes or {}, 0.0)
        by_pid = {pid: name for name, pid in (processes or {}).items()}
        for key, (cpu, group) in self._per_process().items():
            seen = key in self._start  # else started since: all its CPU is the window's
            cores = max(cpu - (self._start[key][0] if seen else 0.0), 0.0) / max(elapsed, 1e-9)
            groups[group] = groups.get(group, 0.0) + cores
            if seen and key[0] in by_pid:
                named[by_pid[key[0]]] = round(cores, 3)
        own = min(groups.pop(self._own, 0.0), busy)
        others = {g: c for g, c in groups.items() if c > 0.01}
        attributed = own + sum(others.values())
        if busy - attributed > 0.01:
            if self._autogroups:
                others[UNATTRIBUTED] = busy - attributed
            else:  # one group for the whole host: whatever ran, ran in it
                own = busy - sum(others.values())
        elif attributed > busy and others:  # counters read a moment apart: scale others to fit
            scale = max(busy - own, 0.0) / sum(others.values())
            others = {g: c * scale for g, c in others.items()}
        return {
            "seconds": round(elapsed, 3),
            "busy_cores": round(busy, 3),
            "own_cores": round(own, 3),
            "other_groups": {g: round(c, 3) for g, c in sorted(others.items())},
            "autogroups": self._autogroups,
        } | ({"processes": named} if processes is not None else {})


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
