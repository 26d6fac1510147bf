"""How the orchestration core behaves: one frozen dataclass, validated once.

The runtime builds it from its config (``failsoft.runtime.controller.orchestration_settings``), the
simulator from its ``SimConfig``; the core and its collaborators only read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OrchestrationSettings:
    """How the core behaves; the runtime takes these from its config, the simulator from SimConfig."""

    heartbeat_interval_s: float = 0.020  # FailLite 4: a heartbeat every 20 ms
    missed_to_fail: int = 2  # ... two missed make a failure
    pause_grace: bool = False  # after a late check of its own, verdicts wait one interval
    global_grace: float | None = None  # every live server silent at once: hold verdicts this many thresholds
    load_slots: int = 2  # loads running at once per server
    heavy_load_slots: int | None = None  # ... of which heavy ones (orchestration.loads); None: all
    heavy_loads_per_host: bool = False  # the heavy slots are the host's, all servers together
    drain_s: float = 0.2  # a replaced model is unloaded this long after traffic left it
    retire_s: float = 2.0  # an app a deploy removes keeps its route this long (requests on their way)
    replan_warm: bool = True  # re-plan warm backups once recoveries settle
    replan_delay_s: float = 3.0  # ... and no route changed for this long
    reconcile_s: float | None = 0.25  # full reconciliation sweep period (None: on changes only)
    gc_s: float | None = 2.0  # compare servers' holdings with the state this often (None: never)
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    deploy_wait_s: float = 180.0  # how long a deployment waits for every server's first heartbeat
    quarantine_s: float = 30.0  # a server failed for not serving ignores its heartbeats this long
    link_grace_s: float = 0.0  # a silent server whose connection is up is failed this much later

    def __post_init__(self) -> None:
        if self.heartbeat_interval_s <= 0 or self.missed_to_fail < 1 or self.load_slots < 1:
            raise ValueError(f"invalid orchestration settings: {self}")
        if self.heavy_load_slots is not None and self.heavy_load_slots < 1:
            raise ValueError(f"invalid orchestration settings: {self}")
        if min(self.drain_s, self.retire_s, self.replan_delay_s, self.backoff_base_s) < 0:
            raise ValueError(f"orchestration delays must not be negative: {self}")
