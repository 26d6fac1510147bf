"""The gateway's HTTP surface in-process: errors mapped by class, Triton's classification extension,
the admin API's limits and log, the events endpoint's cap.

The controller and agents are fakes (:mod:`tests.runtime.gateway.fakes`): an overloaded queue or a
hung server are produced by scripting them. The live gateway on a real cluster is tested in
``test_live_gateway.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from collections.abc import Iterator, Mapping
from typing import ClassVar

import numpy as np
import pytest
from fastapi import APIRouter
from starlette.testclient import TestClient, WebSocketDenialResponse

from failsoft.clock import MonotonicClock
from failsoft.domain import App, Server
from failsoft.errors import DeadlineExceededError, OverloadedError, UnknownNameError
from failsoft.runtime.chaos import Chaos
from failsoft.runtime.config import GatewaySettings
from failsoft.runtime.gateway import Gateway, ModelMeta
from failsoft.runtime.gateway.dispatch import DISPATCHERS, Dispatcher, SingleDispatcher
from failsoft.services import ServiceMode
from tests.runtime.gateway.fakes import CLASSES, FakeAgent, FakeController, route_entry

TOKEN = "a-test-token-of-some-length"
ROW = [0.5] * 4


def gateway_of(agents: dict[str, FakeAgent]) -> Gateway:
    """A gateway serving ``cam`` (on s1) and ``ocr`` (on s2), singles, over a fake controller."""
    controller = FakeController(agents["s1"].clock, {"cam": route_entry("s1"), "ocr": route_entry("s2")})  # type: ignore[arg-type]
    servers = [Server("s1", "a", 100.0), Server("s2", "b", 100.0)]
    return Gateway(
        GatewaySettings(max_batch=8),
        controller,  # type: ignore[arg-type]
        agents,  # type: ignore[arg-type]
        Chaos(servers, agents),  # type: ignore[arg-type]
        {"cam": App("cam", "fam", slo_ms=100.0), "ocr": App("ocr", "fam")},
        {"fam": ModelMeta((4,), CLASSES)},
        {"fam": ["small", "big"]},
        TOKEN,
    )


@pytest.fixture
def rig() -> Iterator[tuple[Gateway, TestClient, dict[str, FakeAgent]]]:
    clock = MonotonicClock()
    agents = {s: FakeAgent(s, clock, latency_s=0.0) for s in ("s1", "s2")}  # type: ignore[arg-type]
    gateway = gateway_of(agents)
    with TestClient(gateway.app, client=("10.1.2.3", 4567)) as client:
        client.get("/v2/health/ready")
        yield gateway, client, agents


def infer(client: TestClient, name: str = "cam", **extra) -> object:
    body = {"inputs": [{"name": "input", "shape": [2, 4], "datatype": "FP32", "data": ROW * 2}], **extra}
    return client.post(f"/v2/models/{name}/infer", json=body)


def codes(gateway: Gateway) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in gateway.metrics.requests.collect():
        for s in metric.samples:
            if s.name.endswith("_total"):
                out[s.labels["code"]] = out.get(s.labels["code"], 0) + s.value
    return out


def test_a_name_resolves_to_its_service_and_the_answer_says_how_it_was_served(rig):
    gateway, client, _ = rig
    response = infer(client)
    assert response.status_code == 200, response.text
    params = response.json()["parameters"]
    assert params == {
        "variant": "big",
        "server": "s1",
        "degraded": False,
        "reconstructed": False,
        "dropped": False,
        "accuracy": 0.9,
        "kind": "primary",
        "attempts": 1,
    }
    assert response.json()["outputs"][0]["name"] == "output"
    assert [e["mode"] for e in client.post("/v2/repository/index").json()] == ["single", "single"]
    assert client.get("/v2/models/ocr").json()["outputs"][0]["shape"] == [-1, CLASSES]
    missing = infer(client, "nope")
    assert missing.status_code == 404 and "unknown app 'nope'" in missing.json()["error"]
    assert codes(gateway) == {"200": 1, "404": 1}


def test_an_overloaded_queue_is_a_503_with_its_retry_after(rig, caplog):
    gateway, client, agents = rig
    caplog.set_level(logging.DEBUG, logger="failsoft.runtime.gateway.app")
    agents["s1"].error = OverloadedError("server 's1': queue of big is full", retry_after_s=2.2)
    response = infer(client)
    assert response.status_code == 503 and response.headers["retry-after"] == "3"
    assert "queue of big is full" in response.json()["error"]
    agents["s1"].error = DeadlineExceededError("no answer within 100 ms")
    assert infer(client).status_code == 504
    assert codes(gateway) == {"503": 1, "504": 1}
    # shedding is counted, not shouted: a refusal at DEBUG, a failure at WARNING
    ours = [r for r in caplog.records if r.name.endswith("gateway.app")]
    logged = {(r.levelno, r.getMessage().split(":")[0]) for r in ours}
    assert logged == {(logging.DEBUG, "request refused"), (logging.WARNING, "request failed")}


@pytest.mark.parametrize("value", ["²".encode("latin-1"), b"-5", b"1e3", b"12 ", b"0x10", "١".encode()])
def test_a_header_length_that_is_not_ascii_digits_is_a_400_and_counted_as_one(rig, value):
    gateway, client, _ = rig
    response = client.post(
        "/v2/models/cam/infer", content=b"{}", headers={"Inference-Header-Content-Length": value}
    )
    assert response.status_code == 400, response.text
    assert "Inference-Header-Content-Length must be a number of bytes" in response.json()["error"]
    assert codes(gateway) == {"400": 1}


def test_classification_answers_the_top_k_classes_as_triton_does(rig):
    _, client, _ = rig
    response = infer(client, outputs=[{"name": "output", "parameters": {"classification": 3}}])
    assert response.status_code == 200, response.text
    (out,) = response.json()["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("output", "BYTES", [2, 3])
    assert out["data"][:3] == ["1.000000:3", "0.000000:0", "0.000000:1"]  # best first, ties by index
    for bad, says in [
        (0, "classification must be an integer in 1..10"),
        (11, "has 10 classes"),
        (True, "got True"),
        ("3", "got '3'"),
    ]:
        refused = infer(client, outputs=[{"name": "output", "parameters": {"classification": bad}}])
        assert refused.status_code == 400 and says in refused.json()["error"]
    wrong = infer(client, outputs=[{"name": "probabilities", "parameters": {"classification": 2}}])
    assert "its output: 'output'" in wrong.json()["error"]


def _binary_answer(response) -> tuple[dict, bytes]:
    """A binary-extension answer split as tritonclient splits it: the JSON header, then the data."""
    assert response.status_code == 200, response.text
    length = int(response.headers["inference-header-content-length"])
    return json.loads(response.content[:length]), response.content[length:]


def test_binary_data_outputs_are_answered_in_binary_as_tritonclient_reads_them(rig):
    _, client, _ = rig
    as_json = infer(client).json()["outputs"][0]
    header, data = _binary_answer(
        infer(client, outputs=[{"name": "output", "parameters": {"binary_data": True}}])
    )
    (out,) = header["outputs"]
    assert "data" not in out and out["parameters"] == {"binary_data_size": len(data)}
    assert (out["datatype"], out["shape"]) == ("FP32", as_json["shape"])
    assert np.frombuffer(data, dtype="<f4").tolist() == as_json["data"]  # the same values, no JSON
    assert header["parameters"]["server"] == "s1"
    asked = infer(client, parameters={"binary_data_output": True}, outputs=[{"name": "output"}])
    assert np.frombuffer(_binary_answer(asked)[1], dtype="<f4").tolist() == as_json["data"]
    top = infer(
        client, outputs=[{"name": "output", "parameters": {"classification": 2, "binary_data": True}}]
    )
    header, data = _binary_answer(top)
    elements, at = [], 0
    while at < len(data):  # each BYTES element led by its 4-byte little-endian length
        (n,) = struct.unpack_from("<I", data, at)
        elements.append(data[at + 4 : at + 4 + n].decode())
        at += 4 + n
    assert header["outputs"][0]["shape"] == [2, 2] and elements[:2] == ["1.000000:3", "0.000000:0"]
    plain = infer(client, outputs=[{"name": "output", "parameters": {"binary_data": False}}])
    assert "inference-header-content-length" not in plain.headers and plain.json()["outputs"][0]["data"]


@pytest.fixture
def admin(rig) -> Iterator[TestClient]:
    """The admin plane of the rig's gateway (its own app: the session serves it on its own port)."""
    gateway, _, _ = rig
    with TestClient(gateway.admin_app, client=("10.1.2.3", 4567)) as client:
        yield client


def test_the_inference_app_has_no_admin_api_and_the_admin_app_no_inference(rig, admin):
    _, client, _ = rig
    auth = {"Authorization": f"Bearer {TOKEN}"}
    paths = [("GET", "/admin/status"), ("GET", "/admin/recoveries"), ("POST", "/admin/chaos/kill")]
    for method, path in paths:
        assert client.request(method, path, headers=auth, json={"server": "s1"}).status_code == 404
    assert admin.get("/admin/status").status_code == 401
    assert admin.get("/admin/status", headers={"Authorization": f"Bearer {TOKEN[:-1]}"}).status_code == 401
    assert admin.get("/admin/status", headers=auth).status_code == 200
    assert admin.post("/v2/models/cam/infer", json={}).status_code == 404
    assert admin.get("/metrics").status_code == 404 and admin.get("/openapi.json").status_code == 404


def test_the_token_is_never_logged(rig, admin, caplog):
    caplog.set_level(logging.DEBUG)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    admin.get("/admin/status", headers=auth)
    admin.post("/admin/chaos/slow", json={"server": "s9", "ms": 1}, headers=auth)  # logged, refused
    admin.post("/admin/chaos/slow", json={"server": "s9", "ms": 1}, headers={"Authorization": "Bearer nope"})
    admin.post("/admin/chaos/slow", json={"server": "s9", "ms": -1}, headers=auth)
    assert caplog.records and all(TOKEN not in r.getMessage() for r in caplog.records)


def test_admin_actions_are_logged_with_who_and_what_and_bodies_are_bounded(admin, caplog):
    caplog.set_level(logging.INFO, logger="failsoft.runtime.gateway")
    client = admin
    auth = {"Authorization": f"Bearer {TOKEN}"}
    unknown = client.post("/admin/chaos/slow", json={"server": "s9", "ms": 5}, headers=auth)
    assert unknown.status_code == 404 and "unknown server 's9'" in unknown.json()["error"]
    admin_log = [r for r in caplog.records if r.name.startswith("failsoft.runtime")]  # not the access log
    (action,) = [r for r in admin_log if r.levelno == logging.INFO and "admin" in r.getMessage()]
    assert "POST /admin/chaos/slow by 10.1.2.3:4567" in action.getMessage() and "s9" in action.getMessage()
    refused = client.post("/admin/chaos/kill", json={"server": "s1"}, headers={"Authorization": "Bearer x"})
    assert refused.status_code == 401
    assert any(r.levelno == logging.WARNING and "10.1.2.3" in r.getMessage() for r in caplog.records)
    huge = client.post("/admin/chaos/kill", content=json.dumps({"server": "s" * 20_000}), headers=auth)
    assert huge.status_code == 413 and "exceeds the limit" in huge.json()["error"]


def test_a_kill_names_one_server_a_list_or_a_site_and_a_list_with_a_stranger_is_refused(admin):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    both = admin.post("/admin/chaos/kill", json={"server": "s1", "servers": ["s2"]}, headers=auth)
    assert both.status_code == 400 and "exactly one of 'server', 'servers' or 'site'" in both.json()["error"]
    empty = admin.post("/admin/chaos/kill", json={"servers": []}, headers=auth)
    assert empty.status_code == 400 and "servers" in empty.json()["error"]
    stranger = admin.post("/admin/chaos/kill", json={"servers": ["s1", "s9"]}, headers=auth)
    assert stranger.status_code == 404 and "unknown server(s) 's9'" in stranger.json()["error"]
    # (that nothing of a refused list is killed: tests/runtime/test_chaos.py, on real processes)


def test_event_subscribers_are_capped_and_one_that_leaves_is_forgotten(rig):
    gateway, client, _ = rig
    gateway.hub.max_subscribers = 1
    with client.websocket_connect("/v2/events"):
        assert gateway.hub.subscribers == 1
        with pytest.raises(WebSocketDenialResponse) as refused, client.websocket_connect("/v2/events"):
            pass
        assert refused.value.status_code == 503
        assert "too many event subscribers" in refused.value.json()["error"]
    assert gateway.hub.subscribers == 0


def test_non_finite_model_outputs_do_not_become_a_500(rig):
    _, client, agents = rig

    async def inf_logits(app, variant, batch, timeout_s, request_id=None):
        return np.full((len(batch), CLASSES), np.inf, dtype=np.float32)

    agents["s1"].infer = inf_logits  # type: ignore[method-assign]
    response = infer(client)
    assert response.status_code == 200 and "Infinity" in response.text


def test_a_client_that_leaves_is_counted_as_499_and_its_call_is_withdrawn(rig):
    gateway, client, agents = rig
    agents["s1"].latency_s = None  # the server holds the request: the client gives up first
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": ROW}]})
    messages = iter([{"type": "http.request", "body": body.encode(), "more_body": False}])

    async def receive() -> dict:
        if (message := next(messages, None)) is not None:
            return message
        while not agents["s1"].calls:  # leave once the server has the call
            await asyncio.sleep(0.001)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        pass

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v2/models/cam/infer",
        "raw_path": b"/v2/models/cam/infer",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("10.1.2.3", 4567),
        "server": ("testserver", 80),
    }
    started = time.monotonic()
    client.portal.call(gateway.app, scope, receive, send)  # on the gateway's own event loop
    assert time.monotonic() - started < 1.0  # not held until the 2 s deadline
    (call,) = agents["s1"].calls
    assert agents["s1"].cancelled == [call["request_id"]]
    assert codes(gateway) == {"499": 1}


class HookedSingle(SingleDispatcher):
    """A single dispatcher that uses every hook of the contract, to see the gateway call them."""

    calls: ClassVar[list[str]] = []

    @classmethod
    def http_routes(cls, dispatchers: Mapping[str, Dispatcher]) -> APIRouter:
        cls.calls.append(f"routes {sorted(dispatchers)}")
        router = APIRouter()

        @router.get("/v2/hooked/{name}")
        async def hooked(name: str) -> dict[str, object]:
            if name not in dispatchers:
                raise UnknownNameError(f"no service {name!r}")
            return {"front": dispatchers[name].front_app()}

        return router

    async def start(self) -> None:
        self.calls.append(f"start {self.app}")

    async def close(self) -> None:
        self.calls.append(f"close {self.app}")


def test_the_gateway_serves_a_modes_routes_and_runs_its_background_work_through_the_contract(monkeypatch):
    HookedSingle.calls = []
    monkeypatch.setitem(DISPATCHERS, ServiceMode.SINGLE, HookedSingle)  # type: ignore[index]
    clock = MonotonicClock()
    gateway = gateway_of({s: FakeAgent(s, clock, latency_s=0.0) for s in ("s1", "s2")})  # type: ignore[arg-type]
    assert HookedSingle.calls == ["routes ['cam', 'ocr']"]  # once per mode, with all its services
    with TestClient(gateway.app) as client:
        assert sorted(HookedSingle.calls[1:]) == ["start cam", "start ocr"]  # before serving
        assert client.get("/v2/hooked/ocr").json() == {"front": "ocr"}
        missing = client.get("/v2/hooked/nope")  # the gateway's error mapping covers them
        assert missing.status_code == 404 and "no service 'nope'" in missing.json()["error"]
        assert infer(client).status_code == 200
    assert sorted(HookedSingle.calls[3:]) == ["close cam", "close ocr"]
