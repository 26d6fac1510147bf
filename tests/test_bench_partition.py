"""``failsoft bench partition``'s accounting, on made-up records (the benchmark itself needs root
and network namespaces: tests/netns runs the same cluster for real)."""

from __future__ import annotations

from failsoft.bench.partition import Record, _account

T = {"cut": 100.0, "failed": 100.3, "healed": 105.0, "restored": 105.2}


def account(records: list[Record]) -> dict:
    return _account(records, "a1", {"_t": dict(T)})


def test_an_answer_of_the_cut_off_server_between_its_verdict_and_its_restore_is_counted_fenced():
    records = [
        Record("cam", 99.0, 99.1, "a1"),  # before the cut: its own server
        Record("cam", 100.1, 100.29, "a1"),  # before the verdict: allowed
        Record("cam", 100.2, 100.5, "a1"),  # after the verdict: fenced
        Record("cam", 104.9, 105.1, "a1"),  # after the heal, before the restore: fenced
        Record("cam", 100.2, 100.6, "b1"),  # retried on the new route
        Record("cam", 105.3, 105.31, "a1"),  # home again
    ]
    got = account(records)
    assert got["answered_by_fenced_server"] == 2
    assert (got["requests"], got["answered"], got["failed_requests"]) == (6, 6, 0)
    assert got["requests_during_partition"] == 4  # sent from the cut to the heal


def test_every_failed_request_is_listed_with_when_and_why():
    records = [
        Record("cam", 105.2, 108.2, None, "DeadlineExceededError: server 'a1'.infer: no answer"),
        Record("ocr", 101.0, 101.5, None, "NoRouteError: no live server"),
        Record("ocr", 101.0, 101.01, "b1"),
    ]
    got = account(records)
    assert got["failed_requests"] == 2 and got["failed_during_partition"] == 1
    assert got["errors"] == {"DeadlineExceededError": 1, "NoRouteError": 1}
    first = got["failures"][0]
    assert (first["app"], first["sent_s"], first["waited_ms"]) == ("cam", 5.2, 3000.0)
    assert got["latency_ms"]["max"] == 10.0
