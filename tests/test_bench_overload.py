"""The overload benchmark's verdict, from phases as the client reports them (no cluster)."""

from __future__ import annotations

import copy

import pytest

from failsoft.bench.overload import OverloadSettings, verdict
from failsoft.errors import ConfigError

SETTINGS = OverloadSettings(deadline_s=2.0)


def phase(rps: float, by_status: dict | None = None, events: dict | None = None) -> dict:
    by_status = by_status or {}
    codes = {"200": 100} | {k: v["count"] for k, v in by_status.items()}
    return {"goodput_rps": rps, "codes": codes, "by_status": by_status, "events": events or {}}


def refusals(count: int, with_header: int | None = None, max_ms: float = 20.0) -> dict:
    header = count if with_header is None else with_header
    return {"count": count, "retry_after": header, "p50_ms": 5.0, "p99_ms": max_ms, "max_ms": max_ms}


def result(**phases: dict) -> dict:
    out = {
        "server": "s1",
        "route_after": {"server": "s1", "variant": "v"},
        "servers_after": {"s1": "up"},
        "phases": {
            "base": phase(10.0),
            "overload": phase(9.5, {"503": refusals(50)}),
            "base_after": phase(10.0),
        },
    }
    out["phases"] |= phases
    return out


def test_an_overload_that_keeps_goodput_and_refuses_at_once_with_retry_after_passes():
    v = verdict(result(), SETTINGS)
    assert v["goodput_ratio"] == 0.95 and v["base_rps"] == 10.0
    assert v["ok"] and all(v["checks"].values()) and v["deadline_exceeded"] == 0


def test_the_ratio_is_against_the_mean_of_the_base_before_and_after():
    v = verdict(result(base=phase(12.0), base_after=phase(8.0)), SETTINGS)
    assert v["base_rps"] == 10.0 and v["goodput_ratio"] == 0.95
    low = verdict(result(overload=phase(8.9, {"503": refusals(5)})), SETTINGS)
    assert low["goodput_ratio"] == 0.89 and not low["checks"]["goodput"] and not low["ok"]


@pytest.mark.parametrize(
    "by_status",
    [
        {"504": refusals(3, with_header=0)},  # deadline exceeded: admitted, then late
        {"503": refusals(50, with_header=49)},  # a refusal without Retry-After
        {"503": refusals(50, max_ms=600.0)},  # a refusal after a quarter of the deadline: not at once
        {"500": refusals(1)},  # an error is not a refusal, Retry-After or not
    ],
)
def test_any_answer_but_a_200_or_a_fast_refusal_with_retry_after_fails(by_status):
    v = verdict(result(overload=phase(9.5, by_status)), SETTINGS)
    assert not v["checks"]["answered_or_refused"] and not v["ok"]
    assert set(v["not_refused_at_once"]["overload"]) == set(by_status)


@pytest.mark.parametrize("kind", ["unhealthy", "failure", "failover"])
def test_a_failure_event_in_any_phase_fails(kind):
    v = verdict(result(base_after=phase(10.0, events={kind: 1})), SETTINGS)
    assert v["failure_events"][kind] == 1 and not v["checks"]["no_failure_events"]


def test_an_app_moved_off_its_server_fails_even_without_events():
    out = result()
    moved = copy.deepcopy(out) | {"route_after": {"server": "s2", "variant": "v"}}
    assert not verdict(moved, SETTINGS)["checks"]["no_failure_events"]


def test_bad_settings_are_refused_naming_the_value():
    with pytest.raises(ConfigError, match="below clients"):
        OverloadSettings(base_clients=32, clients=8)
    with pytest.raises(ConfigError, match="encoding"):
        OverloadSettings(encoding="msgpack")
