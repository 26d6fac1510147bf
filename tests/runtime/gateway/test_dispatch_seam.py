"""The dispatch seam: a dispatcher per service mode, and a mode without one refused before anything
is deployed."""

from __future__ import annotations

import time

import pytest

from failsoft.errors import ConfigError
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.gateway.dispatch import (
    DISPATCHERS,
    CodedDispatcher,
    SingleDispatcher,
    SloDispatcher,
    check_dispatchable,
    dispatcher_class,
)
from failsoft.runtime.session import Session
from failsoft.services import CodedParams, LlmParams, Service, ServiceMode, SloParams


def test_every_dispatcher_serves_the_mode_it_is_filed_under():
    assert DISPATCHERS[ServiceMode.SINGLE] is SingleDispatcher
    for mode, cls in DISPATCHERS.items():
        assert cls.mode is mode


def test_every_mode_has_a_dispatcher():
    assert set(DISPATCHERS) == set(ServiceMode)


def test_a_mode_without_a_dispatcher_is_refused_naming_the_service_and_the_mode(monkeypatch):
    # every mode has a dispatcher today: take one away to see the refusal a new mode would get
    monkeypatch.delitem(DISPATCHERS, ServiceMode.LLM)
    llm = Service("pair", ServiceMode.LLM, ("a", "b"), LlmParams())
    with pytest.raises(
        ConfigError, match=r"service 'pair': mode 'llm' cannot be served yet.*modes served: single"
    ):
        check_dispatchable([Service.single("x"), llm])
    with pytest.raises(ConfigError, match="mode 'llm'"):
        dispatcher_class(Service("fleet", ServiceMode.LLM, ("a",), LlmParams()))
    assert dispatcher_class(Service("pool", ServiceMode.SLO, ("a",), SloParams())) is SloDispatcher
    coded = Service("digits", ServiceMode.CODED, ("a", "b", "p"), CodedParams())
    assert dispatcher_class(coded) is CodedDispatcher
    check_dispatchable([Service.single("x")])  # FailLite's apps: served


def test_serve_refuses_a_config_whose_service_has_no_dispatcher_before_starting_anything(
    tiny_zoo, tmp_path, monkeypatch
):
    monkeypatch.delitem(DISPATCHERS, ServiceMode.SLO)  # as if the slo mode had no dispatcher
    config = config_from_dict(
        {
            "name": "seam",
            "repository": str(tiny_zoo.root),
            "servers": [{"name": n, "site": n, "memory_mb": 200} for n in ("s1", "s2", "s3")],
            "apps": [{"name": a, "family": "digits_mlp"} for a in ("d1", "d2", "parity")],
            "services": [{"name": "ladder", "mode": "slo", "members": ["d1", "d2"], "params": {}}],
            "state_dir": str(tmp_path / "state"),
        },
        source="test",
    )
    session = Session(config)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="service 'ladder': mode 'slo' cannot be served yet"):
        session.start()
    assert time.monotonic() - started < 5 and session.cluster is None  # no Ray, no process
