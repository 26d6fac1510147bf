"""The data plane with real sockets: frames, a server over real serving queues, a client on an
event loop, withdrawals, deadlines, typed errors, and a killed server process.

The server serves a :class:`Handler` made of real :class:`ServingQueue` objects over a numpy
function (a fixed linear map) whose batches can be held on a gate, so that what is queued while a
batch runs is exact; the crash test runs the server in a child process and SIGKILLs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from failsoft.domain import Variant
from failsoft.errors import (
    ConfigError,
    DeadlineExceededError,
    ModelNotLoadedError,
    OverloadedError,
    ServerUnavailableError,
    ServingError,
)
from failsoft.policies import registry
from failsoft.policies.queueing import ServiceModel
from failsoft.runtime.dataplane import DataPlaneClient, DataPlaneLink, DataPlaneServer, LinkChange, frames
from failsoft.runtime.dataplane.link import NoDataPlane
from failsoft.runtime.serving import ServingQueue

WEIGHTS = np.arange(12, dtype=np.float32).reshape(4, 3)
PROFILE = Variant("m", 1.0, 0.9, 100.0, 1.0)
WAIT_S = 10.0


class Queues:
    """The agent's side as the server sees it: one real serving queue per model, gated batches."""

    def __init__(self, max_queue: int = 64) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Semaphore(0)
        discipline = registry.make("queueing", "fifo", 8, max_queue)
        self.queue = ServingQueue("s/app/m", self._predict, (4,), discipline, ServiceModel(PROFILE)).start()
        self.cancelled: list[str] = []
        self.meta: dict[str, str] | None = None

    def _predict(self, x: np.ndarray) -> np.ndarray:
        self.entered.release()
        assert self.gate.wait(WAIT_S)
        return x @ WEIGHTS

    def submit_infer(self, app, variant, batch, timeout_s, request_id, sent_at, meta=None):  # type: ignore[no-untyped-def]
        self.meta = meta
        if (app, variant) != ("app", "m"):
            raise ModelNotLoadedError(f"does not hold {variant!r} for {app!r}")
        return self.queue.submit(batch, timeout_s, request_id).future

    def cancel(self, request_id: str) -> bool:
        self.cancelled.append(request_id)
        return self.queue.cancel(request_id)


@pytest.fixture
def served() -> Iterator[tuple[Queues, DataPlaneServer]]:
    queues = Queues()
    server = DataPlaneServer(queues)
    server.start()
    yield queues, server
    queues.gate.set()
    server.close()
    queues.queue.close(5.0)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 30.0))


# frames --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "uint8", "bool", "float16"])
def test_tensors_travel_as_raw_bytes_and_come_back_equal(dtype: str) -> None:
    x = (np.random.default_rng(0).normal(size=(3, 5)) * 10).astype(dtype)
    fields, data = frames.tensor_frames(x)
    back = frames.tensor(frames.header(frames.dump(fields)), bytes(data))
    assert back.dtype == x.dtype and back.shape == x.shape and np.array_equal(back, x)


def test_a_strided_array_and_bytes_tensors_travel_too() -> None:
    x = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    fields, data = frames.tensor_frames(x)
    assert np.array_equal(frames.tensor(fields, bytes(data)), x)
    texts = np.array(["héllo", "", "wörld"], dtype=object)
    fields, data = frames.tensor_frames(texts)
    assert list(frames.tensor(fields, data)) == ["héllo", "", "wörld"]
    raw = np.array([[b"\x00\x01", b"abc"]], dtype=object)
    fields, data = frames.tensor_frames(raw)
    back = frames.tensor(fields, data)
    assert back.shape == (1, 2) and list(back.flat) == [b"\x00\x01", b"abc"]


def test_a_record_batch_of_several_named_inputs_keeps_its_fields() -> None:
    # a model of two inputs (and two outputs) travels as one structured array, one field per tensor
    x = np.zeros(3, dtype=[("input_ids", "<i8", (8,)), ("attention_mask", "<i8", (8,))])
    x["input_ids"][1, 2], x["attention_mask"][2] = 7, 1
    fields, data = frames.tensor_frames(x)
    back = frames.tensor(json.loads(frames.dump(fields)), data)
    assert back.dtype == x.dtype and back.dtype.names == ("input_ids", "attention_mask")
    assert np.array_equal(back["input_ids"], x["input_ids"]) and back["attention_mask"][2].sum() == 8


def test_bad_frames_are_one_clear_error() -> None:
    with pytest.raises(frames.FrameError, match="header"):
        frames.header(b"not json")
    with pytest.raises(frames.FrameError, match="12 bytes are no <f4 tensor of shape"):
        frames.tensor({"dtype": "<f4", "shape": [2, 2]}, b"x" * 12)
    with pytest.raises(frames.FrameError, match="overruns"):
        frames.tensor({"dtype": "bytes", "shape": [2]}, b"\x05\x00\x00\x00ab")


def test_errors_come_back_as_their_failsoft_class() -> None:
    back = frames.error_of(frames.error_fields(OverloadedError("full", 0.25)))
    assert type(back) is OverloadedError and back.retry_after_s == 0.25 and str(back) == "full"
    assert type(frames.error_of(frames.error_fields(ModelNotLoadedError("gone")))) is ModelNotLoadedError
    other = frames.error_of(frames.error_fields(RuntimeError("boom")))
    assert type(other) is ServingError and "RuntimeError: boom" in str(other)
    assert type(frames.error_of({"error": "SystemExit", "message": "x"})) is ServingError


# server and client ----------------------------------------------------------------------------------
def test_answers_and_typed_errors(served: tuple[Queues, DataPlaneServer]) -> None:
    queues, server = served
    assert server.endpoint is not None and server.endpoint.startswith("tcp://127.0.0.1:")

    async def main() -> None:
        client = DataPlaneClient(server.endpoint or "", "server 's'")
        x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
        outs = await asyncio.gather(*(client.infer("app", "m", x[i : i + 1], 5.0, f"r{i}") for i in range(5)))
        assert np.allclose(np.concatenate(outs), x @ WEIGHTS)
        await client.infer("app", "m", x[:1], 5.0, "t", {"traceparent": "00-abc-def-01"})
        assert queues.meta == {"traceparent": "00-abc-def-01"}  # the call's metadata reached the agent
        with pytest.raises(ModelNotLoadedError, match="does not hold 'm' for 'other'"):
            await client.infer("other", "m", x, 5.0)
        with pytest.raises(ConfigError, match="expects a batch of shape"):
            await client.infer("app", "m", np.zeros((2, 3), np.float32), 5.0)
        assert client.lost is None and client.in_flight == 0
        client.close()

    run(main())


def test_replies_arriving_while_others_are_sent_are_all_read(served: tuple[Queues, DataPlaneServer]) -> None:
    """The client reads replies off the socket's fd, which ZeroMQ signals on an edge: a send that
    takes the signal of a reply already there must not leave that reply unread (its call would
    wait until the next reply's signal, or its deadline when none comes)."""
    _, server = served

    async def main() -> None:
        client = DataPlaneClient(server.endpoint or "", "server 's'")
        x = np.random.default_rng(3).normal(size=(16, 4)).astype(np.float32)

        async def caller(i: int) -> None:
            for _ in range(60):  # each call sent as the previous one's reply is read
                out = await asyncio.wait_for(client.infer("app", "m", x[i : i + 1], 5.0), 2.0)
                assert np.allclose(out, x[i : i + 1] @ WEIGHTS, atol=1e-5), (out, x[i : i + 1] @ WEIGHTS)

        await asyncio.gather(*(caller(i) for i in range(16)))
        assert client.in_flight == 0
        client.close()

    run(main())


class Runs(Queues):
    """The agent's side with ``run_queued``: the server queues without waking the worker, then asks
    the handler to run what it queued (a quick model, an idle worker: in the socket's thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []
        self.woken: list[bool] = []

    def _predict(self, x: np.ndarray) -> np.ndarray:
        self.threads.append(threading.current_thread().name)
        return super()._predict(x)

    def submit_infer(self, app, variant, batch, timeout_s, request_id, sent_at, meta=None, wake=True):  # type: ignore[no-untyped-def]
        self.woken.append(wake)
        return self.queue.submit(batch, timeout_s, request_id, wake=wake).future

    def run_queued(self) -> None:
        self.queue.run_here()


def test_a_lone_request_is_answered_in_the_socket_thread_when_the_handler_runs_it() -> None:
    queues = Runs()
    server = DataPlaneServer(queues)
    server.start()

    async def main() -> None:
        client = DataPlaneClient(server.endpoint or "", "server 's'")
        x = np.random.default_rng(2).normal(size=(1, 4)).astype(np.float32)
        for i in range(3):
            assert np.allclose(await client.infer("app", "m", x, 5.0, f"r{i}"), x @ WEIGHTS)
        client.close()

    try:
        run(main())
        assert queues.woken == [False] * 3  # queued without waking the worker ...
        assert queues.threads == ["dataplane"] * 3  # ... and run, and answered, by the socket's thread
    finally:
        server.close()
        queues.queue.close(5.0)


def test_a_refusal_keeps_its_retry_after() -> None:
    queues = Queues(max_queue=1)
    server = DataPlaneServer(queues)
    server.start()
    queues.gate.clear()

    async def main() -> None:
        client = DataPlaneClient(server.endpoint or "", "server 's'")
        x = np.ones((1, 4), np.float32)
        first = asyncio.ensure_future(client.infer("app", "m", x, 10.0, "a"))
        await asyncio.get_running_loop().run_in_executor(None, queues.entered.acquire)
        second = asyncio.ensure_future(client.infer("app", "m", x, 10.0, "b"))  # fills the queue
        for _ in range(500):
            if queues.queue.stats()["queued"]:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(OverloadedError) as refused:  # the queue holds max_queue requests
            await client.infer("app", "m", x, 10.0, "c")
        assert refused.value.retry_after_s > 0
        queues.gate.set()
        assert (await first).shape == (1, 3) and (await second).shape == (1, 3)
        client.close()

    try:
        run(main())
    finally:
        queues.gate.set()
        server.close()
        queues.queue.close(5.0)


def test_a_withdrawn_request_is_taken_out_of_the_queue(served: tuple[Queues, DataPlaneServer]) -> None:
    queues, server = served
    queues.gate.clear()

    async def main() -> None:
        client = DataPlaneClient(server.endpoint or "", "server 's'")
        running = asyncio.ensure_future(client.infer("app", "m", np.ones((1, 4), np.float32), 5.0, "run"))
        await asyncio.get_running_loop().run_in_executor(None, queues.entered.acquire)
        queued = asyncio.ensure_future(client.infer("app", "m", np.ones((1, 4), np.float32), 1.0, "q"))
        with pytest.raises(DeadlineExceededError, match="no answer within 1000 ms"):
            await queued
        client.cancel_nowait("q")
        for _ in range(200):
            if queues.queue.counters.cancelled:
                break
            await asyncio.sleep(0.01)
        assert queues.cancelled == ["q"] and queues.queue.counters.cancelled == 1
        queues.gate.set()
        assert (await running).shape == (1, 3)
        for _ in range(200):  # the worker counts a batch just after answering it
            if queues.queue.counters.served:
                break
            await asyncio.sleep(0.01)
        assert queues.queue.counters.served == 1  # the withdrawn request never ran
        client.close()

    run(main())


def test_no_agent_at_the_endpoint_is_unavailable_at_once() -> None:
    async def main() -> None:
        lost: list[tuple[bool, str]] = []
        client = DataPlaneClient("tcp://127.0.0.1:9", "server 's'", lambda up, why: lost.append((up, why)))
        started = time.monotonic()
        with pytest.raises(ServerUnavailableError, match="connection lost"):
            await client.infer("app", "m", np.ones((1, 4), np.float32), 5.0)
        assert time.monotonic() - started < 1.0 and [up for up, _ in lost] == [False]

    run(main())


SERVER_SCRIPT = textwrap.dedent(
    """
    import concurrent.futures, sys, time
    from failsoft.runtime.dataplane import DataPlaneServer

    class Never:  # holds every request: the kill finds them in flight
        def submit_infer(self, *args):
            return concurrent.futures.Future()
        def cancel(self, request_id):
            return False

    server = DataPlaneServer(Never())
    print(server.start(), flush=True)
    time.sleep(60)
    """
)


def test_a_killed_server_fails_calls_in_flight_at_once() -> None:
    """SIGKILL the agent's process with calls in flight: they fail ServerUnavailableError and the
    listener hears it within milliseconds of the kill, long before any deadline."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().strip()

        async def main() -> tuple[float, list[float]]:
            lost: list[float] = []

            def changed(up: bool, _: str) -> None:
                if not up:
                    lost.append(time.monotonic())

            client = DataPlaneClient(endpoint, "server 's'", changed)
            x = np.ones((1, 4), np.float32)
            calls = [asyncio.ensure_future(client.infer("app", "m", x, 20.0, f"r{i}")) for i in range(8)]
            for _ in range(500):  # connected, and the requests delivered
                if client.connected_at is not None:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            killed = time.monotonic()
            os.kill(proc.pid, signal.SIGKILL)
            results = await asyncio.gather(*calls, return_exceptions=True)
            ended = time.monotonic()
            assert all(isinstance(r, ServerUnavailableError) for r in results), results
            return ended - killed, [t - killed for t in lost]

        took, lost = run(main())
        assert took < 1.0 and len(lost) == 1 and lost[0] < 1.0, (took, lost)
    finally:
        proc.kill()
        proc.wait()


def test_the_link_asks_for_the_endpoint_once_and_reports_the_connection(
    served: tuple[Queues, DataPlaneServer],
) -> None:
    """The link over a real server; ``fetch`` stands in for the Ray call to ``Agent.data_plane``."""
    _, server = served
    asked: list[float] = []

    async def fetch(timeout_s: float) -> dict:
        asked.append(timeout_s)
        return {"endpoint": server.endpoint, "incarnation": "inc-1", "error": None}

    async def main() -> list[LinkChange]:
        heard: list[LinkChange] = []
        link = DataPlaneLink("s", "server 's'", fetch)
        link.listener = heard.append
        x = np.ones((1, 4), np.float32)
        for i in range(3):
            assert np.allclose(await link.infer("app", "m", x, 5.0, f"r{i}"), x @ WEIGHTS)
        assert link.cancel_nowait("r9") and not link.absent
        for _ in range(100):
            if heard:
                break
            await asyncio.sleep(0.01)
        link.close()
        assert not link.cancel_nowait("r9")  # no connection now: the caller withdraws over Ray
        return heard

    heard = run(main())
    assert asked == [2.0]  # once, bounded by ENDPOINT_TIMEOUT_S
    assert [(c.server, c.incarnation, c.up) for c in heard] == [("s", "inc-1", True)]


def test_an_agent_without_a_data_plane_is_called_over_ray_for_a_while() -> None:
    async def fetch(timeout_s: float) -> dict:
        return {"endpoint": None, "incarnation": "inc-1", "error": "OSError: no port"}

    async def main() -> None:
        link = DataPlaneLink("s", "server 's'", fetch)
        with pytest.raises(NoDataPlane, match=r"serves no data plane \(OSError: no port\)"):
            await link.infer("app", "m", np.ones((1, 4), np.float32), 5.0, None)
        assert link.absent

    run(main())
