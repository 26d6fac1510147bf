"""The profiler: what each variant costs on this machine, measured, never guessed.

FailLite's planner needs, per variant, the memory it takes when loaded, the time a cold load takes
(section 2.4, Fig. 2b: it grows with size) and its inference latency (sections 3.2-3.3); the paper gets
them from Triton's Model Analyzer (5.1). failsoft measures the same on the machine it runs on:

* **parameter bytes**: counted from the stored weights;
* **memory**: resident-set growth of a fresh process from before the load to the first answer (on
  CPU), or CUDA memory allocated (peak, first answer included) on a GPU. A loaded model cannot take
  less than its weights, so ``memory_mb`` is never below the parameter bytes (allocator reuse can
  hide small models in RSS); the raw growth is kept in ``memory.rss_growth_mb``;
* **cold load**: from reading the weight file (its page cache evicted first) to the first answer,
  warm-up included; the median of several loads (``load_ms``), and of the CPU time the loading
  thread spent in them (``load_cpu_ms``: the work; the rest waited for the disk). On a shared host
  the simulator runs the work on the host's cores and the wait beside them;
* **warm load**: the same with the weights still in the page cache (``warm_load_ms``): a model
  loaded again on a machine that read it before (a restarted agent, a failover to a variant this
  host served) pays no disk read;
* **latency** p50/p99 and throughput for batch sizes 1..16; ``latency_ms`` is p50 at batch 1;
* **the machine**: CPU model, cores, memory, torch version and threads, device;
* **the host while measuring** (``host``): its busy cores, the probe's own, and what other processes
  kept busy meanwhile. Times are wall times: measured while other work crowds the cores they come
  out inflated, and ``host.contended`` says so (``failsoft zoo list`` and ``bench fidelity`` warn;
  ``failsoft zoo profile`` measures again on a quiet machine).

CPU numbers are measured with one torch thread by default (``ProfileSettings.threads``): a serving
agent is one process among several on a machine, and one thread each is both the sane way to share
the cores and the way to get numbers that a busy machine does not scramble (two threads on two
shared cores wait on each other for whole scheduler ticks).

Each variant is measured in its own subprocess (:mod:`failsoft.zoo.probe`), so one variant's memory
never shows in another's numbers and the builder's own memory stays flat. MB is 2^20 bytes.
"""

from __future__ import annotations

import datetime as dt
import json
import resource
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

from failsoft import __version__
from failsoft.errors import CorruptModelError, ModelNotFoundError, RepositoryError
from failsoft.zoo.layout import FORMAT_VERSION, PROFILE_FILE, VariantConfig, write_json
from failsoft.zoo.machine import BusyCores, usable_cores
from failsoft.zoo.repository import ModelRepository, _pick_device

MIB = 2**20


@dataclass(frozen=True)
class ProfileSettings:
    """How hard to measure. The defaults keep the default zoo's profile to about a minute on 2 cores."""

    loads: int = 5
    warm_loads: int = 2  # loads with the weights in the page cache, after the cold ones
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    warmup_iters: int = 1
    min_iters: int = 5
    max_iters: int = 200
    budget_s: float = 0.3  # per batch size, once min_iters are done
    evict_page_cache: bool = True
    threads: int = 1  # torch intra-op threads while measuring; 0 keeps torch's default (all cores)
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.loads < 1 or self.min_iters < 1 or self.max_iters < self.min_iters:
            raise ValueError("loads and min_iters must be >= 1, and max_iters >= min_iters")
        if self.warm_loads < 0:
            raise ValueError("warm_loads must be >= 0")
        if self.threads < 0:
            raise ValueError("threads must be >= 0 (0: torch's default)")
        if 1 not in self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError("batch sizes must be positive and include 1 (latency_ms is p50 at batch 1)")


QUICK = ProfileSettings(
    loads=3, warm_loads=2, batch_sizes=(1, 4, 16), warmup_iters=1, min_iters=3, budget_s=0.05
)


def profile_variant(
    repo: ModelRepository,
    family: str,
    variant: str,
    settings: ProfileSettings | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Measure one variant in a fresh process, write its ``profile.json`` and return it."""
    settings = settings or ProfileSettings()
    dev = _pick_device(device)
    config = repo.config(family, variant)
    meter = HostMeter()
    raw = _run_probe(repo, family, variant, dev, settings)
    profile = _compose(config, raw, settings, dev) | {"host": meter.read(settings.threads)}
    write_json(repo.variant_dir(family, variant) / PROFILE_FILE, profile)
    return profile


def _compose(config: VariantConfig, raw: dict[str, Any], settings: ProfileSettings, device: str) -> dict:
    """The ``profile.json`` content: the domain summary first, then every measurement behind it."""
    param_mb = config.weights_bytes / MIB
    measured_mb = max(raw["memory"].get("cuda_peak_mb", raw["memory"]["rss_growth_mb"]), 0.0)
    return {
        "format": FORMAT_VERSION,
        "family": config.family,
        "variant": config.variant,
        "memory_mb": round(max(measured_mb, param_mb), 3),
        "load_ms": round(statistics.median(raw["load_samples_ms"]), 3),
        **_load_split(raw),
        "latency_ms": round(raw["latency"]["1"]["p50_ms"], 4),
        "accuracy": config.accuracy.value,
        "accuracy_source": config.accuracy.source,
        "accuracy_detail": config.accuracy.detail,
        "parameters": config.parameters,
        "parameter_bytes": config.weights_bytes,
        "weights_sha256": config.weights_sha256,
        "input_shape": list(config.input_shape),
        "num_classes": config.num_classes,
        "memory": raw["memory"] | {"parameter_mb": param_mb, "method": _memory_method(device)},
        "load": {
            "samples_ms": raw["load_samples_ms"],
            "median_ms": statistics.median(raw["load_samples_ms"]),
            "cpu_samples_ms": raw.get("load_cpu_samples_ms", []),
            "warm_samples_ms": raw.get("warm_load_samples_ms", []),
            "page_cache_evicted": raw["page_cache_evicted"],
            "method": "read safetensors to device, build on meta, assign, first answer at batch 1",
        },
        "latency": raw["latency"],
        "throughput_rps": max(v["throughput_rps"] for v in raw["latency"].values()),
        "machine": raw["machine"],
        "settings": asdict(settings),
        "profiled_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "failsoft_version": __version__,
    }


def _load_split(raw: dict[str, Any]) -> dict[str, float]:
    """``load_cpu_ms`` (never above ``load_ms``) and ``warm_load_ms``, where they were measured."""
    out = {}
    if cpu := raw.get("load_cpu_samples_ms"):
        out["load_cpu_ms"] = round(min(statistics.median(cpu), statistics.median(raw["load_samples_ms"])), 3)
    if warm := raw.get("warm_load_samples_ms"):
        out["warm_load_ms"] = round(statistics.median(warm), 3)
    return out


class HostMeter:
    """What the host ran while a probe (a child process) measured: busy cores (kernel counters) and
    the children's CPU, hence what everyone else took."""

    def __init__(self) -> None:
        self._busy = BusyCores()
        self._children = _children_cpu_s()

    def read(self, threads: int) -> dict[str, Any]:
        elapsed = max(self._busy.elapsed(), 1e-9)
        busy = self._busy.read()
        probe = (_children_cpu_s() - self._children) / elapsed
        others = max(busy - probe, 0.0)
        cores = usable_cores()
        wanted = min(threads or cores, cores)  # the cores the probe could use
        return {
            "busy_cores": round(busy, 3),
            "probe_cores": round(probe, 3),
            "others_busy_cores": round(others, 3),
            # others kept more than half of the cores the probe did not need busy: it waited for them
            "contended": others > 0.5 * max(cores - wanted, 0.5),
        }


def contended(profile: dict[str, Any]) -> bool:
    """True when a profile was measured while other work crowded the host (its times are inflated)."""
    return bool((profile.get("host") or {}).get("contended", False))


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _memory_method(device: str) -> str:
    if device.startswith("cuda"):
        return "CUDA peak allocated from before the load to the first answer, fresh process"
    return "resident set growth from before the load to the first answer, fresh process"


def _run_probe(
    repo: ModelRepository, family: str, variant: str, device: str, settings: ProfileSettings
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "failsoft.zoo.probe", str(repo.root), family, variant, device]
    cmd.append(json.dumps(asdict(settings)))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=settings.timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RepositoryError(f"profiling {family}/{variant} took over {settings.timeout_s:.0f} s") from exc
    lines = done.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        out = None
    if not isinstance(out, dict):
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RepositoryError(
            f"profiling {family}/{variant} failed (exit {done.returncode}): {' | '.join(tail)}"
        )
    if "error" in out:
        kind = {"ModelNotFoundError": ModelNotFoundError, "CorruptModelError": CorruptModelError}
        raise kind.get(out.get("type", ""), RepositoryError)(out["error"])
    return out


def is_current(repo: ModelRepository, family: str, variant: str) -> bool:
    """True when the variant has a profile of its current weights."""
    try:
        profile = repo.profile(family, variant)
        return profile.get("weights_sha256") == repo.config(family, variant).weights_sha256
    except RepositoryError:
        return False
