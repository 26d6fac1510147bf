"""The serving benchmark's client: closed- and open-loop HTTP load, in a process of its own.

One client drives every system of ``failsoft bench serving`` the same way, so that their figures
compare: pre-encoded request bytes (the body is built once), HTTP/1.1 keep-alive connections on
asyncio streams (no HTTP library: a client that costs less per request than the servers it
measures), the status line and ``Content-Length`` read back, nothing parsed beyond that.

* **closed loop**: ``concurrency`` connections, each sending its next request when the last one is
  answered (throughput at that many clients);
* **open loop**: requests leave at ``rate_rps`` (evenly spaced) whatever the answers do, on a pool
  of connections; a request's latency counts from when it was due, so a server that falls behind
  is charged for the wait (no coordinated omission).

Every answer that is not a 200 is kept apart by status: how many, how many carried ``Retry-After``,
and how fast they came (p50, p99, max), so that ``failsoft bench overload`` can tell a refusal at
once from one after the deadline. With ``backoff`` a closed-loop client waits out a refusal's
``Retry-After`` before its next request, as a well-behaved client does; without it, it asks again at
once (the harder case for the server). With ``window_s``, answers per second are also counted per
window of that length, to show whether goodput holds over a long run.

Run as ``python -m failsoft.bench.serving_load`` with one JSON line on stdin (:class:`LoadPlan`'s
fields) followed by the request body's bytes; prints one JSON line: requests, errors by status,
requests/s, p50/p99 in milliseconds, and the figures per status.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

BROKEN = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)


@dataclass(frozen=True)
class LoadPlan:
    host: str
    port: int
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    concurrency: int = 1  # closed loop: clients; open loop: connections in the pool
    rate_rps: float | None = None  # set: open loop at this rate
    duration_s: float = 5.0
    warmup_s: float = 1.0  # requests sent before this are not counted
    backoff: bool = False  # closed loop: wait out a refusal's Retry-After before the next request
    window_s: float | None = None  # also count answers per second per window of this length


@dataclass(frozen=True)
class Body:
    """A request body, and the length of its JSON header when the tensor follows it as raw bytes."""

    data: bytes
    header_length: int | None = None

    def headers(self) -> dict[str, str]:
        """The request's content headers: JSON, or the binary tensor extension's."""
        if self.header_length is None:
            return {"Content-Type": "application/json"}
        return {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(self.header_length),
        }


def request_input(shape: tuple[int, ...]) -> np.ndarray:
    """The benchmark's one query: a fixed random input of batch 1 (what every system is asked)."""
    return np.random.default_rng(0).random((1, *shape), dtype=np.float32)


def request_body(encoding: str, shape: tuple[int, ...], timeout_s: float | None = None) -> Body:
    """The request for :func:`request_input`, as KServe v2 JSON or binary; ``timeout_s``: its
    deadline (``parameters.timeout``; None: the gateway's default)."""
    return encode_request(request_input(shape), encoding, timeout_s)


def encode_request(x: np.ndarray, encoding: str, timeout_s: float | None = None) -> Body:
    """An infer request for the float32 batch ``x``, as KServe v2 JSON or binary."""
    tensor: dict[str, Any] = {"name": "input", "shape": list(x.shape), "datatype": "FP32"}
    request: dict[str, Any] = {"inputs": [tensor]}
    if timeout_s is not None:
        request["parameters"] = {"timeout": timeout_s}
    if encoding == "json":
        tensor["data"] = x.ravel().tolist()
        return Body(json.dumps(request).encode())
    raw = np.ascontiguousarray(x, dtype="<f4").tobytes()
    tensor["parameters"] = {"binary_data_size": len(raw)}
    head = json.dumps(request).encode()
    return Body(head + raw, len(head))


def request_bytes(plan: LoadPlan, body: bytes) -> bytes:
    head = [f"POST {plan.path} HTTP/1.1", f"Host: {plan.host}:{plan.port}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in plan.headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Connection:
    """One keep-alive HTTP/1.1 connection; :meth:`call` sends the request and reads the answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        return cls(*await asyncio.open_connection(host, port))

    async def call(self, request: bytes) -> tuple[int, float | None]:
        """The answer's status code and its ``Retry-After`` in seconds (None: no such header); the
        body is read and dropped."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length, retry = 0, None
        for line in head.split(b"\r\n")[1:]:
            name = line[:15].lower()
            if name == b"content-length:":
                length = int(line[15:])
            elif name[:12] == b"retry-after:":
                retry = _seconds(line[12:])
        if length:
            await self.reader.readexactly(length)
        return status, retry

    def close(self) -> None:
        self.writer.close()


def _seconds(value: bytes) -> float:
    """A ``Retry-After`` in seconds; an HTTP date (which failsoft never sends) counts as 0."""
    try:
        return max(float(value), 0.0)
    except ValueError:
        return 0.0


@dataclass
class _Record:
    warm_until: float
    latencies: list[float] = field(default_factory=list)
    codes: dict[int, int] = field(default_factory=dict)
    others: dict[int, list[float]] = field(default_factory=dict)  # status -> latencies (not 200)
    retry_after: dict[int, int] = field(default_factory=dict)  # status -> answers with Retry-After
    answered_at: list[float] = field(default_factory=list)  # when each 200 came back (any sent)

    def add(self, sent: float, status: int, retry: float | None = None) -> None:
        done = time.perf_counter()
        if status == 200:
            self.answered_at.append(done)
        if sent < self.warm_until:
            return
        self.codes[status] = self.codes.get(status, 0) + 1
        if status == 200:
            self.latencies.append(done - sent)
            return
        self.others.setdefault(status, []).append(done - sent)
        if retry is not None:
            self.retry_after[status] = self.retry_after.get(status, 0) + 1

    def by_status(self) -> dict[str, dict[str, Any]]:
        """Per status other than 200: count, how many carried Retry-After, latency p50/p99/max (ms)."""
        out = {}
        for status, times in sorted(self.others.items()):
            ms = np.asarray(times) * 1000.0
            out[str(status)] = {
                "count": len(ms),
                "retry_after": self.retry_after.get(status, 0),
                "p50_ms": round(float(np.percentile(ms, 50)), 3),
                "p99_ms": round(float(np.percentile(ms, 99)), 3),
                "max_ms": round(float(ms.max()), 3),
            }
        return out

    def goodput(self, stop: float) -> float:
        """200s per second that came back between the end of the warm-up and ``stop``, whenever
        they were sent: unlike ``rps`` (the answers to the requests sent in that time), it is not
        lowered by a long latency, which would count an overloaded queue's first answers out."""
        done = sum(1 for t in self.answered_at if self.warm_until <= t < stop)
        return done / max(stop - self.warm_until, 1e-9)

    def windows(self, window_s: float, stop: float) -> list[float]:
        """200s per second in each whole window of ``window_s`` from the end of the warm-up, by
        when they came back."""
        counts = [0] * max(int((stop - self.warm_until) // window_s), 1)
        for t in self.answered_at:
            i = int((t - self.warm_until) // window_s)
            if 0 <= i < len(counts):
                counts[i] += 1
        return [round(c / window_s, 2) for c in counts]


async def _closed(plan: LoadPlan, request: bytes, rec: _Record, stop: float) -> None:
    async def client() -> None:
        conn = await Connection.open(plan.host, plan.port)
        try:
            while (sent := time.perf_counter()) < stop:
                try:
                    status, retry = await conn.call(request)
                except BROKEN:  # counted as status 0; a fresh connection for the next request
                    rec.add(sent, 0)
                    conn.close()
                    conn = await Connection.open(plan.host, plan.port)
                    continue
                rec.add(sent, status, retry)
                if plan.backoff and retry is not None and status != 200:
                    await asyncio.sleep(min(retry, max(stop - time.perf_counter(), 0.0)))
        finally:
            conn.close()

    await asyncio.gather(*(client() for _ in range(plan.concurrency)))


async def _open(plan: LoadPlan, request: bytes, rec: _Record, stop: float, rate: float) -> None:
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(plan.concurrency):
        pool.put_nowait(await Connection.open(plan.host, plan.port))

    async def one(due: float) -> None:
        conn = await pool.get()  # waiting for a free connection counts: latency is from ``due``
        try:
            rec.add(due, *await conn.call(request))
        except BROKEN:
            rec.add(due, 0)
            conn.close()
            conn = await Connection.open(plan.host, plan.port)
        finally:
            pool.put_nowait(conn)

    tasks, start, k = set(), time.perf_counter(), 0
    while (due := start + k / rate) < stop:
        await asyncio.sleep(max(due - time.perf_counter(), 0.0))
        task = asyncio.ensure_future(one(due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        k += 1
    await asyncio.gather(*tasks)
    while not pool.empty():
        pool.get_nowait().close()


async def run(plan: LoadPlan, body: bytes) -> dict[str, Any]:
    request = request_bytes(plan, body)
    started = time.perf_counter()
    rec = _Record(started + plan.warmup_s)
    stop = started + plan.warmup_s + plan.duration_s
    if plan.rate_rps is None:
        await _closed(plan, request, rec, stop)
    else:
        await _open(plan, request, rec, stop, plan.rate_rps)
    elapsed = max(time.perf_counter() - rec.warm_until, 1e-9)
    ok = np.asarray(rec.latencies) * 1000.0
    total = sum(rec.codes.values())
    out = {
        "requests": total,
        "errors": total - len(ok),
        "codes": {str(k): v for k, v in sorted(rec.codes.items())},
        "rps": round(len(ok) / elapsed, 2),
        "p50_ms": round(float(np.percentile(ok, 50)), 3) if len(ok) else None,
        "p99_ms": round(float(np.percentile(ok, 99)), 3) if len(ok) else None,
        "seconds": round(elapsed, 3),
        "goodput_rps": round(rec.goodput(stop), 2),
        "by_status": rec.by_status(),
    }
    if plan.window_s:
        out["rps_by_window"] = rec.windows(plan.window_s, stop)
    return out


def main() -> None:
    plan = LoadPlan(**json.loads(sys.stdin.buffer.readline()))
    print(json.dumps(asyncio.run(run(plan, sys.stdin.buffer.read()))), flush=True)


if __name__ == "__main__":
    main()
