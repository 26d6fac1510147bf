"""The agent's end of the data plane: a ZeroMQ ROUTER socket served by one thread.

The thread reads requests off the socket and hands each one to the model's serving queue
(:meth:`Handler.submit_infer`), which admits or refuses it at once; nothing waits for the answer.
Once it has read what arrived, it asks the handler to run what it queued (``run_queued``, when the
handler has it: the agent): a quick model whose worker is idle answers in this thread, and the
reply leaves at once; that is a lone request's path, with no hand-off between threads. Otherwise
the queue's worker thread completes the request, encodes the reply itself and passes it to this
thread over an in-process socket (ZeroMQ sockets belong to one thread), which sends it. No pool
either way: the Ray path parked one of Ray's threads on every request waiting in a queue.

A withdrawal (``cancel``) takes the request out of its queue if it is still there; the gateway
sends one when it gives up on a call (its deadline, a route that moved, a client that left). A
deadline needs nothing more here: the caller's time left becomes a deadline in the queue, which
drops what it cannot answer in time, and the gateway's own timer ends the call.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from typing import Any, Protocol

import numpy as np
import zmq

from failsoft.runtime.dataplane import frames

log = logging.getLogger(__name__)
_ids = itertools.count()
BATCH_READS = 64  # requests read per wake-up before the replies get their turn


class Handler(Protocol):
    """What the server serves (the agent)."""

    def submit_infer(
        self,
        app: str,
        variant: str,
        batch: np.ndarray,
        timeout_s: float | None,
        request_id: str | None,
        sent_at: float | None,
        meta: dict[str, str] | None = None,
    ) -> concurrent.futures.Future[np.ndarray]: ...

    def cancel(self, request_id: str) -> bool: ...


class Runner(Protocol):
    """A handler that runs what it queued when told (the agent): its ``submit_infer`` takes
    ``wake=False``, and ``run_queued`` follows each read of the socket."""

    def run_queued(self) -> None: ...


class DataPlaneServer:
    """Serves ``handler`` on ``tcp://host:<a free port>`` (:attr:`endpoint` once started)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1") -> None:
        self.handler = handler
        self.host = host
        self.endpoint: str | None = None
        self._context: zmq.Context[Any] = zmq.Context.instance()
        self._inproc = f"inproc://failsoft-dataplane-{next(_ids)}"
        self._local = threading.local()  # each replying thread's own PUSH socket
        self._closed = False
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="dataplane", daemon=True)
        self._router: zmq.Socket[Any] | None = None  # its own thread replies on it directly
        runner = getattr(handler, "run_queued", None)
        self._run_queued: Runner | None = handler if callable(runner) else None  # type: ignore[assignment]
        self._submit_kw: dict[str, Any] = {} if self._run_queued is None else {"wake": False}

    def start(self, timeout_s: float = 10.0) -> str:
        """Bind and start serving; the endpoint gateways connect to."""
        self._thread.start()
        if not self._ready.wait(timeout_s) or self.endpoint is None:
            raise RuntimeError(f"data plane did not start on {self.host}: {self._error}")
        return self.endpoint

    def close(self) -> None:
        """Stop serving (an agent living in a test's process); requests in queues are not answered."""
        self._closed = True
        self._reply([b"", b""])  # wakes the thread up
        self._thread.join(5.0)

    # the socket's thread ------------------------------------------------------------------------
    def _serve(self) -> None:
        router = self._context.socket(zmq.ROUTER)
        replies = self._context.socket(zmq.PULL)
        try:
            router.setsockopt(zmq.LINGER, 0)
            router.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a reply to a gone gateway is dropped
            port = router.bind_to_random_port(f"tcp://{self.host}")
            replies.bind(self._inproc)
            self.endpoint = f"tcp://{self.host}:{port}"
        except BaseException as exc:
            self._error = exc
            router.close(0)
            replies.close(0)
            self._ready.set()
            return
        self._router = router
        self._ready.set()
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(replies, zmq.POLLIN)
        try:
            while not self._closed:
                ready = dict(poller.poll())
                if router in ready:
                    self._read(router)
                if replies in ready:
                    self._forward(replies, router)
        finally:
            router.close(0)
            replies.close(0)

    def _read(self, router: zmq.Socket[Any]) -> None:
        for _ in range(BATCH_READS):
            try:
                message = router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                self._handle(message)
            except Exception as exc:  # a malformed message: never stop serving for it
                log.warning("data plane: dropped a message: %s", exc)
        if self._run_queued is not None:
            try:
                self._run_queued.run_queued()
            except Exception:  # a queue's fault is its requests' (answered by it), never the socket's
                log.exception("data plane: running the queued requests failed")

    def _forward(self, replies: zmq.Socket[Any], router: zmq.Socket[Any]) -> None:
        while True:
            try:
                message = replies.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(message[0].bytes) > 0:  # an empty identity is close()'s wake-up
                router.send_multipart(message, copy=False)

    def _handle(self, message: list[zmq.Frame]) -> None:
        if len(message) < 2:
            raise frames.FrameError(f"a message of {len(message)} frames")
        identity, head = message[0], frames.header(message[1])
        op, rid = head.get("op"), head.get("id")
        if op == "cancel":
            self.handler.cancel(str(rid))
            return
        seq = head.get("seq")
        if op == "ping":
            self._reply([identity, frames.dump({"seq": seq, "ok": True})])
            return
        if op != "infer" or len(message) < 3:
            raise frames.FrameError(f"unknown operation {op!r} with {len(message)} frames")
        try:
            batch = frames.tensor(head, message[2])
            future = self.handler.submit_infer(
                str(head["app"]),
                str(head["variant"]),
                batch,
                head.get("timeout_s"),
                None if rid is None else str(rid),
                head.get("sent_at"),
                head.get("meta"),
                **self._submit_kw,
            )
        except Exception as exc:  # refused at once: admission, no such model, bad input
            self._reply([identity, frames.dump({"seq": seq, "ok": False, **frames.error_fields(exc)})])
            return
        future.add_done_callback(lambda done: self._answer(identity, seq, done))

    def _answer(self, identity: zmq.Frame, seq: Any, done: concurrent.futures.Future[np.ndarray]) -> None:
        """In the thread that completed the request (the queue's worker): encode, pass on."""
        try:
            out = done.result()
            fields, data = frames.tensor_frames(out)
            reply = [identity, frames.dump({"seq": seq, "ok": True, **fields}), data]
        except BaseException as exc:
            reply = [identity, frames.dump({"seq": seq, "ok": False, **frames.error_fields(exc)})]
        self._reply(reply)

    def _reply(self, message: list[Any]) -> None:
        if self._router is not None and threading.current_thread() is self._thread:
            self._router.send_multipart(message, copy=False)  # answered in this thread: no hand-off
            return
        push = getattr(self._local, "push", None)
        if push is None:
            push = self._local.push = self._context.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(self._inproc)
        push.send_multipart(message, copy=False)
