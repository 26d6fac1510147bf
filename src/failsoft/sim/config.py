"""What the simulator assumes about time: one frozen config, validated once.

Every duration the simulator uses comes from one of three places:

* **measured profiles**: a variant's ``load_ms`` (disk to accelerator, ready to serve) and
  ``latency_ms`` (one batch-1 inference), from the bundled A2 CSV or the zoo's profiler;
* **FailLite's configuration and measurements** (sections 4, 5.1 and 5.8): agents push a heartbeat
  every 20 ms and a server is failed after two missed ones; telling a client the new location of
  its app takes about 10 ms; the controller checks health every 5 ms, as failsoft's runtime
  controller does (FailLite's checked every 100 ms; ``check_interval_s`` models either);
* **modelling choices**, named here with their defaults and documented in ``docs/simulator.md``:
  how many model loads one server runs at once (``load_slots``), how long an unload takes, whether
  the planner's wall time is charged to simulated time, and how requests are simulated: the serving
  queue's discipline and batch bound (the runtime's disciplines, by name), and how long a client
  waits before it gives up (``request_timeout_ms``: a request's deadline; none by default, as
  FailLite's clients wait through an outage).

Load-path contention. Loads on one server share its disk, PCIe link and the CPU that builds the
inference session, and the profiled ``load_ms`` was measured with nothing else loading. The
simulator models the load path as a SimPy ``PriorityResource`` with ``load_slots`` slots: a load
holds a slot for its whole profiled duration, recovery loads (first or cold variants) queue ahead of
background upgrades. One slot (the default) means concurrent loads on a server take turns, which
finishes the batch no later than sharing the bandwidth would; ``load_slots=10`` mirrors the 10
loader threads of FailLite's Triton with no interference between them (an optimistic bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from failsoft.errors import ConfigError
from failsoft.policies.queueing import MAX_BATCH
from failsoft.policies.registry import names as registered


class PageCache(StrEnum):
    """Where a load reads the weights from: the disk (``cold``, the profiled ``load_ms``) or memory
    (``warm``: the host read them before, the profiled ``warm_load_ms``)."""

    COLD = "cold"
    WARM = "warm"


class RequestMode(StrEnum):
    """Which apps get a per-request simulation (arrivals, queueing, batching, service)."""

    OFF = "off"  # failure and recovery path only (large sweeps)
    AFFECTED = "affected"  # the apps whose primary is on a failed server
    ALL = "all"  # every app (small clusters)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Timing and modelling parameters of one simulated failure event. Seconds unless named ``_ms``."""

    heartbeat_interval_s: float = 0.020  # FailLite 4: agents push a heartbeat every 20 ms
    missed_to_fail: int = 2  # FailLite 4: failed after two missed heartbeats
    # failsoft's controller checks health every 5 ms (runtime/controller.py); FailLite's every 100 ms (5.1)
    check_interval_s: float = 0.005
    notify_ms: float = 10.0  # FailLite 5.8: informing the client of the new location took ~10 ms
    unload_ms: float = 0.0  # not measured; Triton's unload frees memory at once
    drain_ms: float = 200.0  # a replaced model is unloaded this long after traffic left it (runtime's)
    horizon_s: float = 60.0  # the controller acts at most this long after the last injected failure
    load_slots: int = 1  # concurrent model loads per server (load-path contention)
    heavy_load_slots: int | None = None  # ... of which heavy ones (orchestration.loads); None: all
    heavy_loads_per_host: bool = False  # ... counted over all servers together (one shared host)
    failure_at_s: float = 0.3  # failures are injected here, after a warm-up in steady state
    random_phases: bool = True  # heartbeat and health-check phases drawn per event (else 0)
    heartbeats_after_detection: bool = False  # keep heartbeats running once failures are detected
    charge_plan_time: bool = False  # add the planner's measured wall time to simulated time
    requests: RequestMode = RequestMode.AFFECTED
    request_warmup_s: float = 0.3  # arrivals start this long before the failure
    request_window_s: float = 10.0  # ... and stop this long after it
    max_batch: int = 1  # rows per batch; FailLite profiled batch size 1
    batch_cost: float = (
        1.0  # without a batch profile, a batch of b takes latency_ms * (1 + batch_cost * (b - 1))
    )
    discipline: str = "fifo"  # the serving queues' discipline (policies.registry, seam "queueing")
    max_queue: int | None = None  # requests a queue holds before it refuses more; None: unbounded
    request_timeout_ms: float | None = None  # a client gives up after this (a deadline); None: never
    # An embedded cluster: every server shares one host of this many cores (sim/cpu.py); None: each
    # server has its own, and a load or an inference takes its profiled time.
    host_cores: float | None = None
    # ... of which this many are busy with everything the simulation does not model (measured on the
    # real host: the gateway, the controller, clients, steady traffic); see sim/cpu.py
    host_busy_cores: float = 0.0
    # ... and each other scheduling group's busy cores (other sessions, where the kernel shares CPU
    # between sessions first: autogroup); host_busy_cores is then the cluster's own group's
    host_other_groups: tuple[float, ...] = ()
    # ... or, measured instead, the share of a core one thread at the loads' priority got on the
    # host: the background is then the competitors that leave it that (sim/cpu.py); None: not measured
    host_load_share: float | None = None
    warm_up: bool = False  # loads end with the runtime's warm-up inferences (their profiled cost)
    # every load holds its slot this much longer, as a wait that takes no core: the controller's call
    # to the agent and back, the agent's pick-up, the route's publication (measured: bench fidelity's
    # control probe); 0: not modelled
    control_ms: float = 0.0
    # ... or as CPU work instead (a core's milliseconds at nice 0 on the shared host, before the
    # load's own): the controller's, Ray's and the agent's threads on the path wait for a core like
    # any other, so the cost grows with what runs beside it (measured: the control probe's pins,
    # fitted with it; see bench fidelity --control); 0: not modelled
    control_work_ms: float = 0.0
    # ... run ahead of the loads and the background (a short job that woke preempts long-running
    # ones: sim/cpu.py), not at its share beside them (see bench fidelity --control ahead)
    control_ahead: bool = False
    # the controller's reaction: a failure detected, its plan is asked for this much later (the
    # controller's loop waking on a busy host; measured: bench fidelity's control probe); 0: at once
    plan_wait_ms: float = 0.0
    # cold: loads read the weights from disk (FailLite's cold loads); warm: from the page cache,
    # where a profile measured it (warm_load_ms), as on a host that read the files before
    page_cache: PageCache = PageCache.COLD
    first_answer: bool = False  # each recovered app answers one request on its new route (its first)
    trace: bool = False  # keep an event log (for tests and debugging)

    def __post_init__(self) -> None:
        positive = ("heartbeat_interval_s", "check_interval_s", "failure_at_s", "request_window_s")
        positive += ("horizon_s",)
        for name in positive:
            _require(name, getattr(self, name), lambda v: v > 0, "must be positive")
        nonnegative = ("notify_ms", "unload_ms", "drain_ms", "request_warmup_s", "control_ms")
        for name in (*nonnegative, "control_work_ms", "plan_wait_ms"):
            _require(name, getattr(self, name), lambda v: v >= 0, "must be zero or positive")
        _require("missed_to_fail", self.missed_to_fail, lambda v: v >= 1, "must be at least 1")
        _require("load_slots", self.load_slots, lambda v: v >= 1, "must be at least 1")
        _require("max_batch", self.max_batch, lambda v: 1 <= v <= MAX_BATCH, f"must be in 1..{MAX_BATCH}")
        _require("batch_cost", self.batch_cost, lambda v: 0 < v <= 1, "must be in (0, 1]")
        if self.max_queue is not None:
            _require("max_queue", self.max_queue, lambda v: v >= 1, "must be at least 1 (or None)")
        if self.host_cores is not None:
            _require("host_cores", self.host_cores, lambda v: v > 0, "must be positive (or None)")
        cores = self.host_cores
        _require(
            "host_busy_cores",
            self.host_busy_cores,
            lambda v: v == 0 or (cores is not None and 0 <= v <= cores),
            "must be in [0, host_cores] (and 0 without host_cores)",
        )
        if self.host_other_groups:
            object.__setattr__(self, "host_other_groups", tuple(float(g) for g in self.host_other_groups))
            _require(
                "host_other_groups",
                sum(self.host_other_groups) + self.host_busy_cores,
                lambda v: cores is not None and v <= cores + 1e-6 and min(self.host_other_groups) >= 0,
                "must be non-negative busy cores that, with host_busy_cores, fit in host_cores",
            )
        if self.host_load_share is not None:
            _require(
                "host_load_share",
                self.host_load_share,
                lambda v: (
                    cores is not None
                    and 0 < v <= 1
                    and not self.host_busy_cores
                    and not self.host_other_groups
                ),
                "must be in (0, 1], with host_cores and without host_busy_cores or host_other_groups",
            )
        if self.request_timeout_ms is not None:
            _require(
                "request_timeout_ms", self.request_timeout_ms, lambda v: v > 0, "must be positive (or None)"
            )
        if self.discipline not in registered("queueing"):
            known = ", ".join(registered("queueing"))
            raise ConfigError(f"simulator setting discipline must be one of {known}; got {self.discipline!r}")
        if self.request_warmup_s > self.failure_at_s:
            raise ConfigError(
                f"request_warmup_s ({self.request_warmup_s}) cannot exceed failure_at_s ({self.failure_at_s})"
            )
        try:
            object.__setattr__(self, "page_cache", PageCache(self.page_cache))
        except ValueError:
            known = ", ".join(m.value for m in PageCache)
            raise ConfigError(f"page_cache must be one of {known}; got {self.page_cache!r}") from None
        try:
            object.__setattr__(self, "requests", RequestMode(self.requests))
        except ValueError:
            known = ", ".join(m.value for m in RequestMode)
            raise ConfigError(f"requests must be one of {known}; got {self.requests!r}") from None


def _require(name: str, value: float, ok, what: str) -> None:
    if (isinstance(value, float) and math.isnan(value)) or not ok(value):
        raise ConfigError(f"simulator setting {name} {what}; got {value!r}")
