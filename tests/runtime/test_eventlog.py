"""A run's failure record (``$FAILSOFT_EVENTS_LOG``) and what ``tools/soak.py`` counts from it:
every server failure caused by a fault the run injected, or spurious. Pure classification on
hand-written records, the record in real files, and the soak tool run as a user runs it (a real
subprocess per run, its JSON read back). The live wiring (the controller's events and the chaos
module's kill in the record) is checked by ``dataplane/test_crash_signal.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from failsoft.runtime import eventlog

REPO = Path(__file__).resolve().parents[2]
T0 = 1_000.0


def kill(server: str, at: float, action: str = "kill") -> dict:
    return {"type": "chaos", "action": action, "servers": [server], "at": T0 + at}


def failure(server: str, at: float, app: str | None = "app", cause: str | None = None) -> dict:
    event = {"type": "failure", "server": server, "app": app, "timestamp": T0 + at, "detected_at": T0 + at}
    event["last_heartbeat_at"] = T0 + at - 0.04
    return event | ({"cause": cause} if cause else {})


def up(server: str, at: float) -> dict:
    return {"type": "server_up", "server": server, "app": None, "timestamp": T0 + at}


def test_the_killed_server_s_failure_is_caused_and_one_per_detection_whatever_its_apps():
    records = [
        kill("s1", 5.0),
        failure("s1", 5.012, "cam", "process"),
        failure("s1", 5.012, "ocr", "process"),
    ]
    verdict = eventlog.classify(records)
    assert verdict.spurious == [] and verdict.unanswered == []
    (caused,) = verdict.caused
    assert (caused.server, caused.apps, caused.cause) == ("s1", ["cam", "ocr"], "process")
    assert caused.to_dict(T0) == {
        "server": "s1",
        "detected_s": 5.012,
        "cause": "process",
        "silent_ms": 40.0,
        "apps": ["cam", "ocr"],
        "fault": "kill",
        "after_fault_ms": 12.0,
    }


def test_failures_nobody_caused_are_spurious_another_server_before_the_kill_and_after_a_comeback():
    records = [
        failure("c1", 3.4),  # the demo's report: c1 down 3.4 s after the start, nobody touched it
        kill("a1", 5.0),
        failure("a1", 5.03),
        failure("b2", 5.03),  # at the same moment as the kill's, but another server
        up("a1", 9.0),
        failure("a1", 12.0),  # back up, then down again with no new kill
        failure("s9", 14.0, app=None),  # a server without apps still counts
    ]
    verdict = eventlog.classify(records)
    assert [(f.server, round(f.detected_at - T0, 3)) for f in verdict.caused] == [("a1", 5.03)]
    assert [f.server for f in verdict.spurious] == ["c1", "b2", "a1", "s9"]
    assert verdict.spurious[0].cause == "heartbeats" and verdict.spurious[0].fault is None


def test_hang_and_break_cause_failures_mend_does_not_kill_unanswered_late_start_apart():
    mend = {"type": "chaos", "action": "break", "servers": ["s4"], "at": T0 + 8.0, "broken": False}
    records = [
        kill("s2", 1.0, "hang"),
        failure("s2", 1.3),
        kill("s4", 2.0, "break"),
        failure("s4", 2.5),
        mend,
        kill("s3", 4.0),
        {"type": "chaos", "action": "slow", "servers": ["s1"], "at": T0 + 6.0},
        failure("s1", 6.5),
    ]
    verdict = eventlog.classify(records)
    assert [(f.server, f.fault.action) for f in verdict.caused if f.fault] == [
        ("s2", "hang"),
        ("s4", "break"),
    ]
    assert [f.server for f in verdict.spurious] == ["s1"]  # a slowdown is not a fault
    assert [(f.server, f.action) for f in verdict.unanswered] == [("s3", "kill")]


def test_the_record_appends_one_line_per_entry_only_when_asked_and_reads_past_a_cut_line(
    tmp_path, monkeypatch
):
    path = tmp_path / "events.jsonl"
    monkeypatch.delenv(eventlog.EVENTS_LOG_ENV, raising=False)
    eventlog.record({"type": "failure"})
    assert not path.exists()
    monkeypatch.setenv(eventlog.EVENTS_LOG_ENV, str(path))
    eventlog.record(kill("s1", 1.0))
    eventlog.record(failure("s1", 1.01))
    with path.open("a") as f:
        f.write('{"type": "fail')  # a writer killed mid-line
    assert [r["type"] for r in eventlog.read(path)] == ["chaos", "failure"]
    assert eventlog.read(tmp_path / "none.jsonl") == []


def test_a_record_that_cannot_be_written_is_reported_and_ignored(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(eventlog.EVENTS_LOG_ENV, str(tmp_path / "no" / "such" / "dir.jsonl"))
    eventlog.record({"type": "failure"})
    assert "cannot append to the events log" in caplog.text


# a run as the soak starts it: it writes the record the controller and chaos would, a spurious
# failure in run 2 (its number comes in as an argument, from the soak's {run})
RUN = """
import sys, time
from failsoft.runtime import eventlog
now = time.time()
eventlog.record({"type": "chaos", "action": "kill", "servers": ["a1"], "at": now})
eventlog.record({"type": "failure", "server": "a1", "app": "cam-1", "detected_at": now + 0.03,
                 "last_heartbeat_at": now - 0.01, "cause": "process", "timestamp": now + 0.03})
if sys.argv[1] == "2":
    eventlog.record({"type": "failure", "server": "c1", "app": "cam-5", "detected_at": now + 1.0,
                     "last_heartbeat_at": now + 0.9, "timestamp": now + 1.0})
"""


def test_the_soak_counts_spurious_failures_from_each_run_s_record_not_from_its_exit_status(tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(REPO / "tools" / "soak.py"), "--runs", "2", "--hogs", "0", "--exec"]
    cmd += ["--out", str(out), "--log-dir", str(tmp_path / "logs"), "--", sys.executable, "-c", RUN, "{run}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr  # every run exited 0, yet one declared c1 down
    result = json.loads(out.read_text())
    assert (result["runs"], result["passes"], result["failures"]) == (2, 2, 0)
    assert (result["faults"], result["caused_failures"], result["spurious_failures"]) == (2, 2, 1)
    assert result["runs_with_spurious"] == [2]
    first, second = result["per_run"]
    assert first["spurious_failures"] == [] and first["caused"][0]["fault"] == "kill"
    (false,) = second["spurious_failures"]
    assert (false["server"], false["apps"], false["cause"], false["silent_ms"]) == (
        "c1",
        ["cam-5"],
        "heartbeats",
        100.0,
    )
    assert [e["type"] for e in second["events"]] == ["chaos", "failure", "failure"]
    assert (tmp_path / "logs" / "run-002.events.jsonl").exists()
