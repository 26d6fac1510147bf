"""A run's failure record: the controller's events and the faults injected, one JSON line each.

A false failure (a healthy server declared down) is what a soak beside CPU hogs looks for, and a
test's verdict is a poor witness of it: a test asserts what it was written to check, and a false
failure of a server it does not look at, or before its own kill, passes unseen. So, when
``$FAILSOFT_EVENTS_LOG`` names a file, the controller appends every event it publishes (the same
dicts ``/v2/events`` streams: ``failure``, ``failover``, ``server_up``, ...) and the chaos module
appends every fault it injects (``{"type": "chaos", "action": "kill", "servers": [...], "at": ...}``)
to it. Both write from whatever process they run in (Ray starts the controller and the gateway
with the environment of the process that started Ray, so one variable set before a run reaches
them); each record is one short line written with ``O_APPEND``, so writers never interleave.

:func:`classify` then tells every server failure in the record whether the run caused it: a
failure is *caused* when a fault of that server (a kill, a hang, a break) came before its detection
and the server has not been up again since (``server_up``); every other one is *spurious*: a
server nobody touched, one failed before any fault, or one failed again after it had come back.
A server a deploy stopped waiting for (no first heartbeat within ``deploy_wait_s``: its failure
says ``cause: not_started``) is neither: slow to start, not seen failing, it is counted apart.
``tools/soak.py`` counts them run by run. Unset, nothing is written (the default).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVENTS_LOG_ENV = "FAILSOFT_EVENTS_LOG"
FAULTS = ("kill", "hang", "break")  # chaos actions that make a server fail (resume and slow do not)
# a failure's detected_at is the controller's monotonic time made wall time: allow that much skew
CLOCK_SKEW_S = 0.05
NOT_STARTED = "not_started"  # the core's cause for a server that never spoke before the deploy went on

log = logging.getLogger(__name__)
_warned: set[str] = set()


def record(entry: Mapping[str, Any]) -> None:
    """Append ``entry`` to ``$FAILSOFT_EVENTS_LOG`` if it is set; a file that cannot be written is
    reported once and otherwise ignored (the record must never stop the controller)."""
    path = os.environ.get(EVENTS_LOG_ENV)
    if not path:
        return
    line = json.dumps(entry, default=str, separators=(",", ":")) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        if path not in _warned:
            _warned.add(path)
            log.warning("cannot append to the events log %s (%s): $%s ignored", path, exc, EVENTS_LOG_ENV)


def read(path: Path) -> list[dict[str, Any]]:
    """The records of a log (none if it does not exist); a line cut short by a killed writer is
    skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


@dataclass(frozen=True, slots=True)
class Fault:
    """One server a chaos action hit, and when (wall clock)."""

    server: str
    action: str
    at: float


@dataclass(slots=True)
class Failure:
    """One server failure (the controller emits a ``failure`` event per app the server held, with
    the same ``detected_at``); ``fault``: the injection that caused it, None for a spurious one."""

    server: str
    detected_at: float
    cause: str  # process, connection (proof of death) or heartbeats (a silence)
    silent_ms: float | None  # the last heartbeat to the detection
    apps: list[str] = field(default_factory=list)
    fault: Fault | None = None

    def to_dict(self, origin: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "server": self.server,
            "detected_s": round(self.detected_at - origin, 3),
            "cause": self.cause,
            "silent_ms": None if self.silent_ms is None else round(self.silent_ms, 1),
            "apps": self.apps,
        }
        if self.fault is not None:
            out["fault"] = self.fault.action
            out["after_fault_ms"] = round((self.detected_at - self.fault.at) * 1000.0, 1)
        return out


@dataclass(frozen=True, slots=True)
class Verdict:
    faults: list[Fault]
    caused: list[Failure]
    spurious: list[Failure]
    unanswered: list[Fault]  # kills and hangs no failure followed (a missed detection, or no record)
    not_started: list[Failure]  # servers a deploy stopped waiting for: slow to start, not seen failing


def faults_of(records: Iterable[Mapping[str, Any]]) -> list[Fault]:
    out: list[Fault] = []
    for r in records:
        if r.get("type") != "chaos" or r.get("action") not in FAULTS or r.get("broken") is False:
            continue
        out.extend(Fault(str(s), str(r["action"]), float(r["at"])) for s in r.get("servers", []))
    return sorted(out, key=lambda f: f.at)


def failures_of(records: Iterable[Mapping[str, Any]]) -> list[Failure]:
    """Server failures, one per (server, detection), in detection order."""
    seen: dict[tuple[str, float], Failure] = {}
    for r in records:
        if r.get("type") != "failure" or not r.get("server"):
            continue
        key = (str(r["server"]), float(r["detected_at"]))
        if key not in seen:
            heard = r.get("last_heartbeat_at")
            silent = None if heard is None else (key[1] - float(heard)) * 1000.0
            seen[key] = Failure(key[0], key[1], str(r.get("cause") or "heartbeats"), silent)
        if r.get("app"):
            seen[key].apps.append(str(r["app"]))
    return sorted(seen.values(), key=lambda f: f.detected_at)


def classify(records: list[dict[str, Any]], skew_s: float = CLOCK_SKEW_S) -> Verdict:
    """Each failure caused by the latest earlier fault of its server, unless the server was up
    again (a ``server_up`` event) between the fault and the failure; the rest spurious."""
    faults = faults_of(records)
    ups: dict[str, list[float]] = {}
    for r in records:
        if r.get("type") == "server_up" and r.get("server"):
            ups.setdefault(str(r["server"]), []).append(float(r["timestamp"]))
    caused: list[Failure] = []
    spurious: list[Failure] = []
    not_started: list[Failure] = []
    answered: set[Fault] = set()
    for failure in failures_of(records):
        if failure.cause == NOT_STARTED:
            not_started.append(failure)
            continue
        before = [f for f in faults if f.server == failure.server and f.at - skew_s <= failure.detected_at]
        fault = before[-1] if before else None
        if fault is not None and any(fault.at < t < failure.detected_at for t in ups.get(failure.server, [])):
            fault = None  # it came back after that fault: this is a new failure nobody caused
        failure.fault = fault
        if fault is None:
            spurious.append(failure)
        else:
            caused.append(failure)
            answered.add(fault)
    unanswered = [f for f in faults if f not in answered and f.action != "break"]
    return Verdict(faults, caused, spurious, unanswered, not_started)
