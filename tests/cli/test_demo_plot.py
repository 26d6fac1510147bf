"""The demo's plot, from synthetic samples and events (no cluster): what is drawn where."""

from __future__ import annotations

import json

import pytest

from failsoft.runtime.demo import DemoRun, default_out_dir, write_outputs
from failsoft.runtime.demo_plot import ZOOM_MAX_S, draw, layout
from failsoft.runtime.loadgen import Sample

START, KILL, REVIVE, UP = 1000.0, 1010.0, 1020.0, 1025.0


def _samples() -> list[Sample]:
    out = []
    for i in range(600):  # every 50 ms for 30 s: cam-2 on b1 throughout
        t = START + i * 0.05
        out.append(Sample("cam-2", t, t + 0.004, True, "b1", "cnn_l", attempts=1))
        if t < KILL - 0.01 or t > UP + 0.5:
            out.append(Sample("cam-1", t, t + 0.003, True, "a1", "cnn_l", attempts=1))
    # in flight at the kill, answered by the warm backup after the failover; one request lost
    out.append(Sample("cam-1", KILL - 0.005, KILL + 0.09, True, "c2", "cnn_m", degraded=True, attempts=2))
    out.append(Sample("cam-1", KILL + 0.2, KILL + 0.203, True, "c2", "cnn_m", degraded=True, attempts=1))
    out.append(Sample("cam-1", KILL + 0.3, KILL + 5.3, False, error="deadline"))
    return out


def _events() -> list[dict]:
    def event(type_: str, at: float, **more: object) -> dict:
        return {"type": type_, "timestamp": at, **more}

    return [
        event("failure", KILL - 30, app="cam-1", server="a1", detected_at=KILL - 30),  # an older failure
        event("failure", KILL + 0.031, app="cam-1", server="a1", variant="cnn_l", detected_at=KILL + 0.03),
        event("failover", KILL + 0.032, app="cam-1", server="c2", variant="cnn_m", kind="warm"),
        event("upgrade", KILL + 0.15, app="cam-1", server="c2", variant="cnn_l"),
        event("server_up", UP, app=None, server="a1"),
        event("restore", UP + 0.2, app="cam-1", server="a1", variant="cnn_l"),
    ]


def _plan():
    marks = {"start": START, "kill": KILL, "revive": REVIVE}
    return layout(_samples(), _events(), marks, "a1", ["cam-1"])


def test_lines_mark_the_events_not_the_restart_request():
    plan = _plan()
    whole = {line.at: line.label for line in plan.lines}
    assert set(whole) == {KILL, KILL + 0.03, UP, UP + 0.2}
    assert "server_up" in whole[UP] and "detected" in whole[KILL + 0.03]
    assert REVIVE not in whole
    assert plan.restarting == (REVIVE, UP)
    zoom = {line.at: line.label for line in plan.zoom_lines}
    assert zoom[KILL + 0.032] == "failover cam-1 -> c2/cnn_m"
    assert zoom[KILL + 0.15] == "upgrade cam-1 -> c2/cnn_l"
    assert UP not in zoom


def test_the_zoom_holds_the_outage_and_the_switch():
    lo, hi = _plan().zoom
    assert lo < KILL < KILL + 0.15 < KILL + 0.09 + 0.1 < hi <= KILL + ZOOM_MAX_S
    assert hi - lo < 1.0  # hundreds of milliseconds, not the whole run


def test_answers_by_a_smaller_variant_and_failures_are_drawn_apart():
    groups = {g.label: g.xy for g in _plan().points}
    smaller = groups["answered by a smaller variant"]
    assert sorted(t for t, _ in smaller) == [KILL - 0.005, KILL + 0.2]
    assert smaller[0][1] == pytest.approx(95.0)
    assert groups["failed requests"] == ((KILL + 0.3, pytest.approx(5000.0)),)
    on_killed = groups["apps on the killed server"]
    assert all(t < KILL or t > UP for t, _ in on_killed)
    assert len(groups["other apps"]) == 600


def test_notes_say_when_each_app_answered_again():
    assert _plan().notes == ("cam-1: answered again 90 ms after the kill",)


def test_draw_writes_a_png_into_a_new_folder(tmp_path):
    path = draw(_plan(), tmp_path / "out" / "failsoft-demo.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_demo_writes_into_the_state_dir_by_default(monkeypatch, tmp_path):
    monkeypatch.setenv("FAILSOFT_STATE", str(tmp_path / "state"))
    assert default_out_dir() == tmp_path / "state" / "demo"


def test_the_demo_writes_its_plot_and_data_into_the_folder_it_is_given(tmp_path):
    summary = {"killed": "a1", "apps": [{"app": "cam-1"}]}
    run = DemoRun(_samples(), _events(), {"start": START, "kill": KILL, "revive": REVIVE}, summary)
    paths = write_outputs(run, tmp_path / "demo-out")
    assert paths == {
        "plot": str(tmp_path / "demo-out" / "failsoft-demo.png"),
        "data": str(tmp_path / "demo-out" / "failsoft-demo.json"),
    }
    data = json.loads((tmp_path / "demo-out" / "failsoft-demo.json").read_text())
    assert len(data["samples"]) == len(run.samples) and data["marks"]["kill"] == KILL
    assert data["events"] == run.events and data["summary"] == summary
