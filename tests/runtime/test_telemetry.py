"""Telemetry settings: the config section and the environment, each bad value one clear error."""

from __future__ import annotations

import pytest

from failsoft.errors import ConfigError
from failsoft.runtime import logs, telemetry
from failsoft.runtime.config import config_from_dict

BASE = {
    "servers": [{"name": "s1", "site": "a", "memory_mb": 100}],
    "apps": [{"name": "cam", "family": "digits_mlp"}],
}


def test_the_config_section_defaults_to_everything_off_but_the_access_log():
    settings = config_from_dict(BASE).telemetry
    assert settings == telemetry.TelemetrySettings("none", "text", True)
    on = config_from_dict({**BASE, "telemetry": {"traces": "otlp", "log_format": "json"}}).telemetry
    assert (on.traces, on.log_format) == ("otlp", "json")


@pytest.mark.parametrize(
    ("section", "says"), [({"traces": "jaeger"}, "jaeger"), ({"log_format": "xml"}, "xml")]
)
def test_a_bad_telemetry_value_is_refused_naming_it(section, says):
    with pytest.raises(ConfigError, match=says):
        config_from_dict({**BASE, "telemetry": section})


def test_the_environment_wins_and_a_bad_value_there_is_refused_naming_the_variable(monkeypatch):
    assert telemetry.traces_from_env("none", {"FAILSOFT_TRACES": "Console"}) == "console"
    assert telemetry.traces_from_env("otlp", {}) == "otlp"
    with pytest.raises(ConfigError, match=r"FAILSOFT_TRACES.*'zipkin'"):
        telemetry.traces_from_env("none", {"FAILSOFT_TRACES": "zipkin"})
    monkeypatch.setenv("FAILSOFT_LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match="FAILSOFT_LOG_FORMAT"):
        logs.log_format("text")


def test_configure_with_none_makes_no_tracer_and_the_agents_get_the_exporters_variables(monkeypatch):
    monkeypatch.delenv("FAILSOFT_TRACES", raising=False)
    assert telemetry.configure(telemetry.TelemetrySettings(), "failsoft-test") is False
    assert (
        not telemetry.enabled()
        and telemetry.extract({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) is None
    )
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "FAILSOFT_TRACES": "otlp", "HOME": "/root"}
    assert telemetry.forwarded_env(env) == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "FAILSOFT_TRACES": "otlp",
    }
