"""GPUs as Ray places them: a server's share of a GPU, the device its agent sees, and device memory.

A server that serves on a GPU asks Ray for a share of one (``gpus``: a fraction such as 0.25, so
that four servers share a GPU, or whole GPUs), as Ray Serve replicas do with ``num_gpus``. Ray then
grants GPU ids and sets ``CUDA_VISIBLE_DEVICES`` in the actor's process to them, so inside the
actor the granted GPU is ``cuda:0`` whatever its number on the machine. Without a share, Ray
accounts nothing and, in Ray 2.60, leaves the actor every GPU of the node (it has announced that a
later release hides them instead): failsoft hides them itself, so that no share means no GPU.

``device`` (per server, or ``agents.device`` for all) says where models load:

* ``auto``: CUDA when the agent sees a GPU (it sees one only with a share), else the CPU;
* ``cpu``: the CPU, with no share (a share with ``cpu`` is refused: it would hold a GPU for nothing);
* ``cuda``: the GPU Ray granted (a share is required);
* ``cuda:N``: GPU ``N`` of the machine, as ``nvidia-smi`` numbers it. Ray cannot be asked for a
  particular GPU, so the share is still reserved from Ray's pool (the machine's total is kept) and
  the agent's process is given ``CUDA_VISIBLE_DEVICES=N`` with Ray told not to override it; inside,
  :func:`local_device` maps ``cuda:N`` to its position among the visible GPUs (``cuda:0``).

Device memory is read as the device reports it (:func:`device_memory`): free and total from
``torch.cuda.mem_get_info``, this process's use from NVML where ``pynvml`` is installed, which
includes the CUDA context (hundreds of MB per process that torch's allocator never sees).

Pure helpers (no Ray): the cluster wrapper and the agents call them.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any

from failsoft.errors import ConfigError

DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
NOSET_ENV = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"  # read by Ray in the actor's process
MAX_GPUS = 64.0
_MB = 1024.0 * 1024.0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one server's agent (or one LLM worker) runs its models, and the GPU share it asks Ray for."""

    device: str = "auto"
    gpus: float = 0.0

    @property
    def pinned_gpu(self) -> int | None:
        """``N`` of ``cuda:N`` (a GPU of the machine chosen in the config), else None."""
        match = re.fullmatch(r"cuda:(\d+)", self.device)
        return int(match.group(1)) if match else None

    def actor_env(self) -> dict[str, str]:
        """Environment for the actor's process: no share hides every GPU (Ray 2.60 would leave a
        zero-GPU actor all of them, unaccounted); a pinned GPU is made the only visible one."""
        if self.gpus == 0:
            return {VISIBLE_ENV: ""}
        pinned = self.pinned_gpu
        if pinned is None:
            return {}  # Ray sets it from its grant
        return {VISIBLE_ENV: str(pinned), NOSET_ENV: "1"}


ON_CPU = Placement()  # no GPU share: where the device is auto, the agent sees no granted GPU


def check_placement(where: str, device: str, gpus: float) -> Placement:
    """A valid placement, or one ConfigError naming ``where`` (e.g. ``servers[2] ('a1')``) and the value."""
    if re.fullmatch(DEVICE_PATTERN, device) is None:
        raise ConfigError(f"{where}: device {device!r} is not one of auto, cpu, cuda, cuda:N")
    if not 0.0 <= gpus <= MAX_GPUS or math.isnan(gpus):
        raise ConfigError(f"{where}: gpus {gpus!r} must be between 0 and {MAX_GPUS:g}")
    if gpus > 1.0 and gpus != int(gpus):
        raise ConfigError(
            f"{where}: gpus {gpus:g}: Ray grants a fraction of one GPU (at most 1) or whole GPUs (2, 3, ...)"
        )
    if device.startswith("cuda") and gpus == 0:
        raise ConfigError(
            f"{where}: device {device!r} needs a share of a GPU from Ray: set gpus (e.g. gpus: 0.25 lets "
            "four servers share one GPU; agents.gpus sets it for every server)"
        )
    if device == "cpu" and gpus > 0:
        raise ConfigError(f"{where}: gpus {gpus:g} with device 'cpu' would hold a GPU that is never used")
    if device.startswith("cuda:") and gpus > 1.0:
        raise ConfigError(f"{where}: device {device!r} pins one GPU; gpus {gpus:g} asks for several")
    return Placement(device, float(gpus))


def visible_gpus(env: dict[str, str] | None = None) -> list[str] | None:
    """The ids in ``CUDA_VISIBLE_DEVICES`` (None when it is unset: every GPU is visible)."""
    value = (os.environ if env is None else env).get(VISIBLE_ENV)
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def local_device(device: str, env: dict[str, str] | None = None) -> str | None:
    """The torch device for a configured one, in this process: None for ``auto`` (the repository
    picks), and ``cuda:N`` (machine numbering) mapped to its index among the visible GPUs."""
    if device == "auto":
        return None
    pinned = Placement(device).pinned_gpu
    if pinned is None:
        return device
    visible = visible_gpus(env)
    if visible is None:
        return device  # nothing hidden: machine numbering is torch's
    if str(pinned) not in visible:
        raise ConfigError(
            f"device {device!r}: GPU {pinned} is not visible to this process "
            f"({VISIBLE_ENV}={','.join(visible) or '(empty)'})"
        )
    return f"cuda:{visible.index(str(pinned))}"


def uses_cuda(device: str | None) -> bool:
    """Whether models placed on ``device`` (None: auto) go to a GPU in this process."""
    if device is not None and not device.startswith("cuda"):
        return False
    import torch

    return bool(torch.cuda.is_available())


def init_cuda(device: str | None) -> float:
    """Create this process's CUDA context on ``device`` now; its milliseconds (0 on CPU).

    A context costs hundreds of milliseconds and hundreds of MB; created before the first load, it
    is part of the process's start, not of a recovery's load.
    """
    if not uses_cuda(device):
        return 0.0
    import time

    import torch

    started = time.perf_counter()
    dev = torch.device(device or "cuda")
    torch.zeros(1, device=dev)
    torch.cuda.synchronize(dev)
    return (time.perf_counter() - started) * 1000.0


def device_memory(device: str | None) -> dict[str, Any]:
    """Device memory as the device reports it, for this process's GPU (CPU: ``{"cuda": False}``).

    ``free_mb``/``total_mb`` come from ``torch.cuda.mem_get_info`` (the whole device, every process);
    ``process_mb`` from NVML (this process's use, CUDA context included; None without ``pynvml``);
    ``context_mb`` is ``process_mb`` less what torch's allocator reserved.
    """
    if not uses_cuda(device):
        return {"cuda": False}
    import torch

    dev = torch.device(device or "cuda")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(index)
    reserved = torch.cuda.memory_reserved(index)
    props = torch.cuda.get_device_properties(index)
    out: dict[str, Any] = {
        "cuda": True,
        "device": f"cuda:{index}",
        "name": props.name,
        "visible": os.environ.get(VISIBLE_ENV),
        "total_mb": round(total / _MB, 1),
        "free_mb": round(free / _MB, 1),
        "torch_allocated_mb": round(torch.cuda.memory_allocated(index) / _MB, 1),
        "torch_reserved_mb": round(reserved / _MB, 1),
        "process_mb": None,
        "context_mb": None,
    }
    used = _nvml_process_bytes(str(getattr(props, "uuid", "")), index)
    if used is not None:
        out["process_mb"] = round(used / _MB, 1)
        out["context_mb"] = round((used - reserved) / _MB, 1)
    return out


def _nvml_process_bytes(uuid: str, index: int) -> int | None:
    """This process's device memory per NVML (its context included); None without pynvml or NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver library, or no permission: NVML is optional
        return None
    try:
        handle = _nvml_handle(pynvml, uuid, index)
        procs = list(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
        mine = [p for p in procs if p.pid == os.getpid()]
        if not mine or mine[0].usedGpuMemory is None:
            return None
        return int(mine[0].usedGpuMemory)
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def _nvml_handle(pynvml: Any, uuid: str, index: int) -> Any:
    """NVML numbers GPUs as the machine does (it ignores ``CUDA_VISIBLE_DEVICES``): by UUID, else by
    the visible id at torch's index."""
    if uuid:
        name = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(name)
        except Exception:
            pass
    visible = visible_gpus()
    machine = int(visible[index]) if visible and index < len(visible) and visible[index].isdigit() else index
    return pynvml.nvmlDeviceGetHandleByIndex(machine)
