"""A real embedded cluster under a burst it cannot answer in time: fast 503s, never a long wait.

One server serving the real digits MLP, made slow by ``chaos slow`` (every batch waits 300 ms), gets
a burst of concurrent requests with 2 s deadlines: about 6 batches of 4 fit in that time. The
agent's serving queue admits what it can finish and refuses the rest at once: the gateway answers
those 503 with ``Retry-After``, well before their deadline. Once the server is fast again, normal
requests are served as before.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

from failsoft.runtime.config import config_from_dict
from tests.runtime.conftest import serving

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
SLOW_MS = 300.0
DEADLINE_S = 2.0
BURST = 80
MAX_BATCH = 4


@pytest.fixture(scope="module")
def cluster(tiny_zoo, tmp_path_factory):
    config = config_from_dict(
        {
            "name": "overload-test",
            "repository": str(tiny_zoo.root),
            "servers": [{"name": "s1", "site": "a", "memory_mb": 100, "compute": 4.0}],
            "apps": [
                {"name": "app", "family": "digits_mlp", "primary": {"server": "s1", "variant": "mlp_s"}}
            ],
            "gateway": {"port": 0},
            "agents": {"queue": {"discipline": "fifo", "max_batch": MAX_BATCH}},
            "state_dir": str(tmp_path_factory.mktemp("state")),
        },
        source="test",
    )
    with serving(config) as running:
        yield running


def body(i: int) -> dict:
    row = (np.arange(64, dtype=np.float32) * (i % 7) / 64).tolist()
    return {
        "id": f"burst-{i}",
        "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": row}],
        "parameters": {"timeout": DEADLINE_S},
    }


async def burst(url: str) -> list[tuple[int, float, dict[str, str], dict]]:
    async def one(http: httpx.AsyncClient, i: int) -> tuple[int, float, dict[str, str], dict]:
        started = time.monotonic()
        response = await http.post(f"{url}/v2/models/app/infer", json=body(i))
        return response.status_code, time.monotonic() - started, dict(response.headers), response.json()

    limits = httpx.Limits(max_connections=BURST)
    async with httpx.AsyncClient(timeout=30.0, limits=limits) as http:
        return await asyncio.gather(*(one(http, i) for i in range(BURST)))


def test_a_burst_beyond_what_a_slow_server_can_answer_gets_fast_503s_and_the_rest_is_served(cluster):
    session, client = cluster
    assert client.infer("app", np.zeros(64, dtype=np.float32)).server == "s1"
    client.admin("slow", server="s1", ms=SLOW_MS)
    try:
        results = asyncio.run(burst(session.url))
    finally:
        client.admin("slow", server="s1", ms=0)
    codes = [code for code, *_ in results]
    refused = [(elapsed, headers, answer) for code, elapsed, headers, answer in results if code == 503]
    served = [elapsed for code, elapsed, *_ in results if code == 200]
    (queue,) = session.agents["s1"].info_sync()["queues"].values()
    seen = (sorted(codes), max(elapsed for _, elapsed, *_ in results), queue)
    # Roughly 6 batches of 4 fit in 2 s; the burst is 80: most are refused, a few dozen at most served.
    assert len(refused) >= BURST // 2 and 4 <= len(served) <= 40, seen
    for elapsed, headers, answer in refused:
        assert "overloaded" in answer["error"]
        assert int(headers["retry-after"]) >= 1  # whole seconds, rounded up from the queue's estimate
        assert elapsed < DEADLINE_S / 2  # refused at once, not after waiting out the deadline
    assert min(served) >= SLOW_MS / 1000  # the admitted ones waited for the slow batches ...
    others = [
        (code, round(elapsed, 3), answer) for code, elapsed, _, answer in results if code not in (200, 503)
    ]
    # ... and (almost) none was admitted only to time out: admission trusts a service-time estimate,
    # and on a shared machine the last batch admitted now and then runs long (CI saw one whole batch
    # of 4 answer ~5 ms late); a broken admission times out dozens.
    assert len(others) <= MAX_BATCH and all(code == 504 for code, *_ in others), (others, queue)
    assert queue["refused"] >= len(refused) and queue["batches"] < queue["served"]  # batched
    # The server is fast again: normal requests are served as before.
    for _ in range(5):
        assert client.infer("app", np.zeros(64, dtype=np.float32), timeout=DEADLINE_S).server == "s1"


async def crowd(url: str, deadlines_s: list[float], seconds: float) -> list[tuple[int, dict[str, str]]]:
    """One closed-loop client per entry of ``deadlines_s`` for ``seconds``, each of its requests with
    that deadline."""
    out: list[tuple[int, dict[str, str]]] = []
    stop = time.monotonic() + seconds

    async def client(http: httpx.AsyncClient, c: int, deadline_s: float) -> None:
        i = 0
        while time.monotonic() < stop:
            request = body(c * 10_000 + i) | {"parameters": {"timeout": deadline_s}}
            response = await http.post(f"{url}/v2/models/app/infer", json=request)
            out.append((response.status_code, dict(response.headers)))
            i += 1

    async with httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_connections=len(deadlines_s))) as http:
        await asyncio.gather(*(client(http, c, d) for c, d in enumerate(deadlines_s)))
    return out


def test_requests_that_miss_their_deadline_are_overload_not_a_failure_of_the_only_server(cluster):
    """A slow server and more clients than it can answer in time: half of them with deadlines no
    request can meet (they time out, dozens in a row with no success between them), half with
    deadlines some can (served, or refused at once with Retry-After). Its heartbeats arrive, so it is
    overloaded, not failed: no "does not serve" verdict, no failover of the app's only server, and it
    serves normally once the crowd leaves. (Before, ten timeouts in a row made the gateway report it
    unhealthy and the app was failed over with nowhere to go.)"""
    session, client = cluster
    seen = len(client.recoveries()["events"])
    client.admin("slow", server="s1", ms=60.0)  # 4 rows a batch: 16 clients at 0.1 s cannot all fit
    try:
        results = asyncio.run(crowd(session.url, [0.01] * 8 + [0.1] * 16, seconds=4.0))
    finally:
        client.admin("slow", server="s1", ms=0)
    codes = sorted(code for code, _ in results)
    counts = {code: codes.count(code) for code in set(codes)}
    assert counts.get(504, 0) >= 2 * session.config.gateway.unhealthy_after, counts  # the old trigger
    assert counts.get(503, 0) + counts.get(429, 0) > 0 and set(counts) <= {200, 429, 503, 504}, counts
    for code, headers in results:
        if code in (429, 503):
            assert int(headers["retry-after"]) >= 1
    events = client.recoveries()["events"][seen:]
    assert not [e for e in events if e["type"] in ("unhealthy", "failure", "failover")], events
    status = client.status()
    assert [s["state"] for s in status["servers"]] == ["up"]
    assert status["apps"][0]["route"]["server"] == "s1"
    for _ in range(5):
        assert client.infer("app", np.zeros(64, dtype=np.float32), timeout=DEADLINE_S).server == "s1"
