"""Idle keep-alive connections are closed by the client side first. When a server closes an idle
connection at the instant a client sends on it, the request meets a reset, which a POST cannot
safely retry (a stateful graph's request is not idempotent): CI met it as three failed requests
right after a controller restart. The race needs the two idle limits to be equal (httpx's and
uvicorn's defaults are both 5 s), so the test holds the limits apart; it cannot be timed reliably."""

from __future__ import annotations

import httpx
import uvicorn

from failsoft.client import KEEPALIVE_EXPIRY_S, AsyncClient, Client
from failsoft.runtime.session import GATEWAY_KEEP_ALIVE_S


def _expiry(http: httpx.Client | httpx.AsyncClient) -> float:
    return http._transport._pool._keepalive_expiry  # httpcore's pool: what the client really uses


def test_failsofts_clients_give_up_idle_connections_before_any_uvicorn_server_does():
    default_server = uvicorn.Config(app=None).timeout_keep_alive
    assert KEEPALIVE_EXPIRY_S < default_server <= GATEWAY_KEEP_ALIVE_S
    with Client("http://127.0.0.1:1") as client:
        assert _expiry(client._http) == KEEPALIVE_EXPIRY_S
    assert _expiry(AsyncClient("http://127.0.0.1:1")._http) == KEEPALIVE_EXPIRY_S


def test_the_gateway_outlasts_other_clients_idle_connections():
    assert httpx.Limits().keepalive_expiry < GATEWAY_KEEP_ALIVE_S  # httpx, and the openai package on it
