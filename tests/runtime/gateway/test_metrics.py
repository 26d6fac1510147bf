"""The gateway's metrics: one definition per name, each failure and recovery counted once, and
nothing that grows with uptime."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from failsoft.runtime.gateway.dispatch import Answer
from failsoft.runtime.gateway.metrics import RECOVERY_LOG_SIZE, GatewayMetrics, first_recoveries


def answer(detected_at: float | None = None, route_at: float | None = None, attempts: int = 1) -> Answer:
    return Answer(
        None, "s2", "small", True, 0.8, "warm", attempts, detected_at=detected_at, route_at=route_at
    )


def samples(metrics: GatewayMetrics) -> dict[tuple[str, tuple], float]:
    text = metrics.render(7, True, None).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_mttr_is_detection_to_the_new_route_and_first_answer_has_its_own_metric():
    metrics = GatewayMetrics()
    metrics.on_event({"type": "failover", "app": "cam", "kind": "warm", "route_ms": 1.5})
    metrics.observe("cam", 200, 0.01, answer(detected_at=1.0, route_at=1.0015))
    got = samples(metrics)
    assert got[("failsoft_mttr_seconds_sum", (("kind", "warm"),))] == 0.0015
    assert got[("failsoft_first_answer_seconds_count", (("kind", "warm"),))] == 1
    help_texts = {
        f.name: f.documentation
        for f in text_string_to_metric_families(metrics.render(0, True, None).decode())
    }
    assert "new route published" in help_texts["failsoft_mttr_seconds"]
    assert "first answer" in help_texts["failsoft_first_answer_seconds"]
    (entry,) = metrics.recovery_log
    assert entry["mttr_ms"] == pytest.approx(1.5)
    assert entry["first_answer_ms"] >= entry["mttr_ms"]


def test_a_recovery_is_counted_once_per_failure_and_replays_are_ignored():
    metrics = GatewayMetrics()
    for _ in range(3):  # many answers on one failover route
        metrics.observe("cam", 200, 0.01, answer(detected_at=10.0))
    metrics.observe("cam", 200, 0.01, answer(detected_at=20.0))  # the next failure
    metrics.observe("cam", 200, 0.01, answer(detected_at=10.0))  # an old route seen late
    assert samples(metrics)[("failsoft_recoveries_total", (("app", "cam"),))] == 2
    for event in [{"type": "failure", "server": "s1", "app": a, "detected_at": 10.0} for a in "abc"] * 2:
        metrics.on_event(event)
    assert samples(metrics)[("failsoft_server_failures_total", (("server", "s1"),))] == 1


def test_what_the_metrics_remember_is_bounded():
    metrics = GatewayMetrics()
    for n in range(RECOVERY_LOG_SIZE + 500):
        metrics.observe(f"app-{n % 7}", 200, 0.01, answer(detected_at=float(n)))
        metrics.on_event({"type": "failure", "server": f"s{n % 5}", "detected_at": float(n)})
    assert len(metrics.recovery_log) == RECOVERY_LOG_SIZE
    assert metrics.recovery_log[-1]["detected_at"] == RECOVERY_LOG_SIZE + 499
    assert len(metrics._recovered) == 7 and len(metrics._failed) == 5


def test_every_status_code_is_counted_as_itself():
    metrics = GatewayMetrics()
    for code in (200, 400, 404, 413, 499, 500, 503, 504):
        metrics.observe("cam" if code != 404 else "-", code, 0.01, answer() if code == 200 else None)
    got = samples(metrics)
    codes = {dict(k[1])["code"] for k in got if k[0] == "failsoft_requests_total"}
    assert codes == {"200", "400", "404", "413", "499", "500", "503", "504"}
    assert got[("failsoft_controller_connected", ())] == 1


def test_reports_take_each_apps_first_recovery_after_the_kill():
    metrics = GatewayMetrics()
    metrics.observe("ocr", 200, 0.01, answer(detected_at=5.0))  # an earlier failure
    metrics.observe("ocr", 200, 0.01, answer(detected_at=10.0))  # the stand-in's first answer
    metrics.observe("ocr", 200, 0.01, answer(detected_at=12.0))  # its stand-in failed too
    metrics.observe("cam", 200, 0.01, answer(detected_at=10.0))
    first = first_recoveries(list(metrics.recovery_log), since=9.5)
    assert {app: r["detected_at"] for app, r in first.items()} == {"ocr": 10.0, "cam": 10.0}
