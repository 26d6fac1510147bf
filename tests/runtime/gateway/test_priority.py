"""The gateway's event loop runs ahead of model work on a shared host (runtime/priority.py): with the
privilege to raise a priority, its thread is at GATEWAY_NICE; without it, serving is unchanged."""

from __future__ import annotations

import os
import threading

import pytest
import uvicorn
from starlette.applications import Starlette

from failsoft.runtime.gateway.server import GatewayServer
from failsoft.runtime.priority import GATEWAY_NICE, set_niceness

privileged = pytest.mark.skipif(os.geteuid() != 0, reason="raising a priority needs root")


def _niceness_of(thread: threading.Thread) -> int:
    assert thread.native_id is not None
    return os.getpriority(os.PRIO_PROCESS, thread.native_id)


@privileged
def test_the_gateway_s_loop_thread_runs_at_the_gateway_s_niceness_and_the_caller_s_is_untouched() -> None:
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    server = GatewayServer(uvicorn.Config(Starlette(), host="127.0.0.1", port=0, log_level="warning"))
    server.start_in_thread()
    try:
        assert server._thread is not None
        assert _niceness_of(server._thread) == GATEWAY_NICE
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    finally:
        server.stop()


@privileged
def test_only_the_calling_thread_is_raised_unless_the_whole_process_is_asked_for() -> None:
    seen: dict[str, int] = {}
    ready, done = threading.Event(), threading.Event()

    def bystander() -> None:
        ready.set()
        done.wait(5)

    def raiser() -> None:
        seen["took"] = int(set_niceness(-2))
        seen["self"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    other = threading.Thread(target=bystander)
    other.start()
    ready.wait(5)
    base = _niceness_of(other)
    worker = threading.Thread(target=raiser)
    worker.start()
    worker.join(5)
    try:
        assert seen == {"took": 1, "self": -2}
        assert _niceness_of(other) == base
    finally:
        done.set()
        other.join(5)
