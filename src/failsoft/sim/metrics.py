"""FailLite's metrics, exactly as its section 5.1 defines them, plus detection and outage times.

For one failure event, an app is **affected** when its primary is on a failed server. Then:

* **recovery rate**: recovered affected apps / affected apps. An app is recovered when its client
  can use a new location before the simulation ends (a warm switch, or a first or cold variant
  loaded and the client notified);
* **MTTR** (ms): from the controller's *detection* of the failure of the app's server to the client
  being able to use the new location: planning (when charged), unloading released warm backups,
  loading the (first) variant, and the client notification. Recovered apps only: an unrecovered app
  has an infinite MTTR and is left out of the mean;
* **accuracy reduction** (percentage points): the family-normalised accuracy (FailLite 3.2:
  ``a / max a`` within the family) of the primary minus that of the variant serving the app at the
  end (the final variant once upgraded). Recovered apps only: an unrecovered app would count as
  zero accuracy, and 5.1 leaves it out;
* **detection latency** (ms): failure injection to the controller declaring the server failed;
* **outage** (ms): failure injection to the client being able to use the new location (detection
  plus MTTR): what a client sees, and what FailLite's measured MTTRs appear to include.

Several events are pooled: the rates are over all affected apps of all events, the means over all
recovered apps.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from failsoft.domain import ActionKind, FailoverAction, FailoverPlan, Scenario
from failsoft.sim.requests import Request, RequestStats
from failsoft.sim.trace import Entry

NAN = float("nan")


@dataclass(slots=True)
class AppRecord:
    """What happened to one affected app in one failure event (a crash of its server, or its model
    lost on a live one: :func:`~failsoft.sim.simulate_model_loss`)."""

    app: str
    critical: bool
    failed_server: str
    detected_at: float
    primary_accuracy: float  # family-normalised
    kind: ActionKind | None = None
    server: str | None = None
    serving_at: float | None = None  # the client can use the new location
    final_at: float | None = None  # the final variant serves
    accuracy: float | None = None  # family-normalised accuracy of the variant serving now
    variant: str | None = None
    answered_at: float | None = None  # its first answer on the new route (SimConfig.first_answer)
    recovery: str | None = None  # the core's failover kind: warm, promoted, progressive, cold, reload

    @property
    def recovered(self) -> bool:
        return self.serving_at is not None

    @property
    def mttr_ms(self) -> float:
        return (self.serving_at - self.detected_at) * 1000.0 if self.serving_at is not None else math.inf

    @property
    def first_answer_ms(self) -> float:
        return (self.answered_at - self.detected_at) * 1000.0 if self.answered_at is not None else math.inf

    @property
    def accuracy_reduction_pct(self) -> float:
        if self.accuracy is None:
            return NAN
        return (self.primary_accuracy - self.accuracy) * 100.0


@dataclass
class EventResult:
    """The outcome of one simulated failure event."""

    policy: str
    failed: tuple[str, ...]
    injected_at: float
    detected_at: dict[str, float]
    apps: dict[str, AppRecord]
    plan_ms: list[float] = field(default_factory=list)
    oom_loads: int = 0
    released_warm: int = 0
    warm_backups: int = 0
    requests: RequestStats | None = None
    end_s: float = 0.0
    log: list[Entry] = field(default_factory=list)
    request_log: list[Request] = field(default_factory=list)  # every request, when tracing

    def outage_ms(self, record: AppRecord) -> float:
        return (record.serving_at - self.injected_at) * 1000.0 if record.serving_at is not None else math.inf


class Recorder:
    """Collects an event's :class:`AppRecord` as the controller detects, plans and recovers."""

    def __init__(self, scenario: Scenario, policy: str, failed: Sequence[str], injected_at: float) -> None:
        self.scenario = scenario
        self.result = EventResult(policy, tuple(failed), injected_at, {}, {})
        self.result.warm_backups = len(scenario.warm or ())

    def _normalized(self, app_name: str, variant: str) -> float:
        app = self.scenario.app(app_name)
        family = self.scenario.family(app.family)
        return family.normalized_accuracy(family.variant(variant))

    def detected(self, server: str, at: float) -> None:
        self.result.detected_at.setdefault(server, at)

    def affected(self, app_name: str, server: str, at: float) -> None:
        if app_name in self.result.apps:
            return
        app = self.scenario.app(app_name)
        assert app.primary is not None
        primary = self._normalized(app_name, app.primary.variant)
        self.result.apps[app_name] = AppRecord(app_name, app.critical, server, at, primary)

    def planned(self, plan: FailoverPlan, applied: Sequence[FailoverAction] | None = None) -> None:
        """A plan was made; ``applied`` are the actions carried out (all of them when None)."""
        self.result.plan_ms.append(plan.plan_ms)
        self.result.released_warm += len(plan.released)
        for action in plan.actions if applied is None else applied:
            record = self.result.apps[action.app]
            record.kind, record.server = action.kind, action.server

    def failover(self, app: str, kind: ActionKind, server: str) -> None:
        """How the app was recovered (warm switches happen before any plan, at the failure)."""
        record = self.result.apps[app]
        record.kind, record.server = kind, server

    def recovered_by(self, app: str, kind: str) -> None:
        """The core's ``failover`` event for the app: how it was served again (its first one)."""
        record = self.result.apps[app]
        if record.recovery is None:
            record.recovery = kind

    def serving(self, app: str, variant: str, at: float, final: bool) -> None:
        record = self.result.apps[app]
        record.variant, record.accuracy = variant, self._normalized(app, variant)
        if final:
            record.final_at = at

    def answered(self, app: str, at: float) -> None:
        record = self.result.apps[app]
        if record.answered_at is None:
            record.answered_at = at

    def notified(self, app: str, at: float) -> None:
        record = self.result.apps[app]
        if record.serving_at is None:
            record.serving_at = at


# ----------------------------------------------------------------------------------------------
# Aggregation over events.
# ----------------------------------------------------------------------------------------------


def summarize(events: Sequence[EventResult]) -> dict[str, float]:
    """FailLite 5.1's metrics and the simulator's extras, pooled over ``events``."""
    records = [(e, r) for e in events for r in e.apps.values()]
    recovered = [(e, r) for e, r in records if r.recovered]
    detection = [(t - e.injected_at) * 1000.0 for e in events for t in e.detected_at.values()]
    plan_ms = [p for e in events for p in e.plan_ms]
    out = {
        "recovery_rate": len(recovered) / len(records) if records else NAN,
        "mttr_ms": _mean(r.mttr_ms for _, r in recovered),
        "accuracy_reduction_pct": _mean(r.accuracy_reduction_pct for _, r in recovered),
        "detection_ms": _mean(detection),
        "outage_ms": _mean(e.outage_ms(r) for e, r in recovered),
        "mttr_p50_ms": _median(r.mttr_ms for _, r in recovered),
        "mttr_max_ms": max((r.mttr_ms for _, r in recovered), default=NAN),
        "time_to_final_ms": _mean(
            (r.final_at - r.detected_at) * 1000.0 for _, r in recovered if r.final_at is not None
        ),
        "critical_recovery_rate": _share([r.recovered for _, r in records if r.critical]),
        "warm_switch_share": _share([r.kind is ActionKind.WARM for _, r in recovered]),
        "affected": float(len(records)),
        "recovered": float(len(recovered)),
        "events": float(len(events)),
        "warm_backups": _mean(e.warm_backups for e in events),
        "released_warm": float(sum(e.released_warm for e in events)),
        "oom_loads": float(sum(e.oom_loads for e in events)),
        "plan_ms": _mean(plan_ms),
        "plan_max_ms": max(plan_ms, default=NAN),
    }
    out.update(RequestStats.pooled([e.requests for e in events if e.requests is not None]))
    return out


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.fmean(values) if values else NAN


def _median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else NAN


def _share(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else NAN
