"""``failsoft status`` and ``failsoft chaos`` as a person reads them, from status and admin answers."""

from __future__ import annotations

import time
from datetime import datetime

from rich.console import Console

from failsoft.cli.chaos import describe
from failsoft.cli.status import _contract, app_table, llm_table, llm_workers, local_time, server_table

NOW = time.time()


def _body(with_history: bool) -> dict:
    server = {"name": "a1", "site": "edge-a", "state": "up", "memory_mb": 40, "used_mb": 19.8, "models": 2}
    app = {
        "name": "cam-1",
        "family": "digits_cnn",
        "critical": True,
        "primary": {"server": "a1", "variant": "cnn_l"},
        "route": {"server": "c2", "variant": "cnn_m"},
        "variant": "cnn_m",
        "kind": "warm",
        "degraded": True,
        "warm_backups": [],
    }
    if with_history:
        server |= {"restarts": 2, "last_failure": NOW - 5}
        app["last_failover"] = {"at": NOW - 4.9, "kind": "warm", "server": "c2", "variant": "cnn_m"}
    return {"cluster": "edge", "policy": "faillite", "version": 7, "servers": [server], "apps": [app]}


def _text(table) -> str:
    console = Console(record=True, width=250)
    console.print(table)
    return console.export_text()


def _row(text: str, first: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"│ {first}"))
    return [cell.strip() for cell in line.strip("│").split("│")]


def test_status_shows_restarts_last_failure_and_last_failover():
    body = _body(with_history=True)
    servers = _text(server_table(body))
    assert "restarts" in servers and "last failure" in servers
    assert _row(servers, "a1")[-2:] == ["2", local_time(NOW - 5)]
    apps = _text(app_table(body))
    assert _row(apps, "cam-1")[-1] == f"{local_time(NOW - 4.9)} warm -> c2/cnn_m"


def test_status_renders_a_dash_where_the_gateway_says_nothing():
    body = _body(with_history=False)
    assert _row(_text(server_table(body)), "a1")[-2:] == ["-", "-"]
    assert _row(_text(app_table(body)), "cam-1")[-1] == "-"
    body["servers"][0] |= {"restarts": 0, "last_failure": None}
    body["apps"][0]["last_failover"] = None
    assert _row(_text(server_table(body)), "a1")[-2:] == ["0", "-"]


def test_status_json_carries_the_history_fields():
    doc = _contract(_body(with_history=True))
    assert doc["servers"][0]["restarts"] == 2 and doc["servers"][0]["last_failure"] == NOW - 5
    assert doc["apps"][0]["last_failover"]["server"] == "c2"
    bare = _contract(_body(with_history=False))
    assert bare["servers"][0]["restarts"] is None and bare["apps"][0]["last_failover"] is None


def test_status_lists_llm_workers_as_the_core_places_them():
    body = _body(with_history=False) | {
        "llm_workers": [
            {"service": "bytes", "worker": "w0", "server": "a1", "phase": "serving",
             "incarnation": 0, "memory_mb": 12.5, "restarts": 0},
            {"service": "bytes", "worker": "w1", "server": "c2", "phase": "draft",
             "incarnation": 2, "memory_mb": 12.5, "restarts": 1},
        ]
    }  # fmt: skip
    assert _row(_text(llm_table(body)), "bytes")[:4] == ["bytes", "w0", "a1", "serving"]
    assert _contract(body)["llm_workers"][1]["state"] == "draft"
    assert _contract(_body(with_history=False))["llm_workers"] is None


def _llm_entry() -> dict:
    """An ``llm`` service's entry of the repository index (``LlmDispatcher.describe``): w1 died
    and its standby drafts while the target reloads; requests in flight per worker."""
    return {
        "name": "coder",
        "mode": "llm",
        "state": "READY",
        "workers": {
            "w0": {"server": "s1", "phase": "serving"},
            "w1": {"server": "s3", "phase": "draft"},
        },
        "dead": ["w1"],
        "model": "target",
        "policy": "lumen",
        "in_flight": {"w0": 5, "w1": 0},
    }


def test_status_lists_llm_workers_with_server_state_model_and_active_requests():
    body = _body(with_history=True) | {"llm": [_llm_entry()]}
    text = _text(llm_table(body))
    assert _row(text, "coder")[:2] == ["coder", "w0"]
    rows = [_row_cells(line) for line in text.splitlines() if line.startswith("│ coder")]
    assert rows == [
        ["coder", "w0", "s1", "serving", "target", "lumen", "-", "-", "-", "5"],
        ["coder", "w1", "s3", "draft", "target", "lumen", "-", "-", "-", "0"],
    ]
    doc = _contract(body)
    assert doc["llm_workers"][1] == {
        "service": "coder",
        "worker": "w1",
        "server": "s3",
        "state": "draft",
        "model": "target",
        "policy": "lumen",
        "incarnation": None,
        "memory_mb": None,
        "restarts": None,
        "active_requests": 0,
    }


def test_status_joins_the_cores_records_with_the_gateways_view_of_each_worker():
    placed = [
        {"service": "coder", "worker": "w0", "server": "s1", "phase": "serving",
         "incarnation": 0, "memory_mb": 40.0, "restarts": 0},
        {"service": "coder", "worker": "w1", "server": "s3", "phase": "draft",
         "incarnation": 1, "memory_mb": 40.0, "restarts": 1},
    ]  # fmt: skip
    rows = llm_workers(_body(with_history=True) | {"llm_workers": placed, "llm": [_llm_entry()]})
    assert rows is not None
    assert [(r["worker"], r["state"], r["restarts"], r["model"], r["active_requests"]) for r in rows] == [
        ("w0", "serving", 0, "target", 5),
        ("w1", "draft", 1, "target", 0),
    ]


def test_status_without_the_gateways_index_has_no_llm_rows():
    assert _contract(_body(with_history=False))["llm_workers"] is None
    assert llm_workers({"llm": []}) == []


def _row_cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip("│").split("│")]


def test_local_time_is_dated_unless_today():
    assert local_time(None) == "-"
    today = datetime.now().astimezone().replace(hour=9, minute=8, second=7, microsecond=654_321)
    assert local_time(today.timestamp()) == "09:08:07.654"
    assert local_time(today.timestamp(), zone=True) == f"09:08:07.654 {today.tzname()}"
    assert local_time(datetime(2020, 2, 3, 4, 5, 6).timestamp()) == "2020-02-03 04:05:06.000"


def test_chaos_prints_what_it_did_and_when_in_local_time():
    at = NOW - 1
    kill = {
        "action": "kill",
        "killed": [{"server": "a1", "pid": 4242, "at": at}, {"server": "a2", "pid": 7, "at": at}],
    }
    assert describe(kill) == [
        f"killed a1 (SIGKILL to pid 4242) at {local_time(at, zone=True)}",
        f"killed a2 (SIGKILL to pid 7) at {local_time(at, zone=True)}",
    ]
    assert describe({"action": "hang", "server": "b1", "pid": 9, "at": at}) == [
        f"hung b1 (SIGSTOP to pid 9) at {local_time(at, zone=True)}"
    ]
    slow = describe({"action": "slow", "server": "b1", "ms": 5.0, "load_ms": 200.0, "at": at})
    assert slow == [
        f"slowed b1 by 5 ms per inference and 200 ms per model load from {local_time(at, zone=True)}"
    ]
    broke = describe({"action": "break", "server": "b1", "broken": True, "at": at})
    assert broke == [f"broke b1: every inference fails, heartbeats go on, from {local_time(at, zone=True)}"]
    mended = describe({"action": "break", "server": "b1", "broken": False, "at": at})
    assert mended == [f"mended b1: inferences work again from {local_time(at, zone=True)}"]
    evicted = describe({"action": "evict", "server": "s1", "app": "p", "variants": ["gru_16"], "at": at})
    assert evicted == [f"evicted p (gru_16) from s1 at {local_time(at, zone=True)}; the server lives on"]
    assert str(int(at)) not in "".join(describe(kill))  # no Unix time in the human line
