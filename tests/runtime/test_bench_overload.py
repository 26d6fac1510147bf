"""``failsoft bench overload`` on a real one-server cluster, short and small: the digits MLP made
slow (every batch waits ``SLOW_MS``, ``chaos slow``) so that 16 clients overload it where 4 do not.

The invariants the benchmark checks are the issue's: under overload the server is never reported
unhealthy or failed over, and every request is answered or refused at once with 503 and
``Retry-After``; the JSON carries every figure the docs quote.
"""

from __future__ import annotations

import json

import pytest
import yaml

from failsoft.bench.overload import OverloadSettings, run

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
SLOW_MS = 400.0  # per batch of at most 2 rows: about 5 answers/s, whatever the machine's load
DEADLINE_S = 2.0  # about 4 batches, 8 requests fit: 4 clients always do, 16 clients never all do


@pytest.mark.timeout(600)  # a cluster and three client processes on a busy 2-core machine: ~2 min
def test_an_overloaded_server_sheds_at_once_keeps_its_goodput_and_is_never_failed_over(tiny_zoo, tmp_path):
    config = tmp_path / "one.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "bench-overload-test",
                "repository": str(tiny_zoo.root),
                "servers": [{"name": "s1", "site": "a", "memory_mb": 100, "compute": 4.0}],
                "apps": [
                    {"name": "ocr", "family": "digits_mlp", "primary": {"server": "s1", "variant": "mlp_s"}}
                ],
                "agents": {"queue": {"discipline": "fifo", "max_batch": 2}},
            }
        )
    )
    settings = OverloadSettings(
        base_clients=4,
        clients=16,
        base_s=4.0,
        duration_s=6.0,
        warmup_s=1.0,
        deadline_s=DEADLINE_S,
        slow_ms=SLOW_MS,
        window_s=2.0,
        refusal_limit_s=DEADLINE_S / 2,  # the machine may be busy: well before the deadline is enough
    )
    out = run(config, settings, progress=lambda _: None)
    json.dumps(out)  # what the command prints
    seen = json.dumps({k: out[k] for k in ("phases", "checks", "goodput_ratio")}, indent=1)
    assert out["model"] == "digits_mlp/mlp_s" and out["server"] == "s1"
    assert set(out["phases"]) == {"base", "overload", "base_after"}
    over = out["phases"]["overload"]
    assert over["codes"].get("503", 0) > 0 and over["queue"]["refused"] > 0, seen  # it was overloaded
    assert over["queue"]["mean_batch_rows"] > 1.5, seen  # and ran full batches
    assert len(over["rps_by_window"]) == 3 and min(over["rps_by_window"]) > 0, seen
    # The invariants: nothing reported or failed over, every request answered or refused at once.
    assert out["failure_events"] == {"unhealthy": 0, "failure": 0, "failover": 0}, seen
    assert out["route_after"]["server"] == "s1" and out["servers_after"] == {"s1": "up"}
    assert out["checks"]["no_failure_events"], seen
    for phase in out["phases"].values():
        assert set(phase["codes"]) <= {"200", "503"}, seen
        refused = phase["by_status"].get("503")
        if refused:
            assert refused["retry_after"] == refused["count"], seen
            assert refused["max_ms"] < DEADLINE_S * 1000 / 2, seen  # at once, not at the deadline
    assert out["checks"]["answered_or_refused"] and out["deadline_exceeded"] == 0, seen
    # Shedding costs the server little: the batches' wait is not CPU, so the overload answers about
    # as many requests per second as the base (a broken admission would time out, or run late work).
    assert out["goodput_ratio"] >= 0.8, seen
