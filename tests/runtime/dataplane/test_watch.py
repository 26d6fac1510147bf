"""The gateway's watch of an agent through its heartbeat sidecar: a killed agent's death reaches
the data-plane client from the sidecar, whatever the dying process's teardown takes.

A killed process's sockets close only at the end of its teardown (after its address space is
released: for a real agent, 80 ms to seconds on a busy host). Here the teardown is made endless
on purpose: the stand-in agent forks a child that keeps every socket of the agent open and sleeps,
so the agent's own data-plane connection never ends by the kernel's close (only by ZeroMQ's
heartbeat timeout, 2 s later). Real processes throughout: the stand-in agent (a ZeroMQ ROUTER
socket, as the data plane serves, and the real :class:`~failsoft.runtime.pulse.Pulse` with its
sidecar), the real :class:`~failsoft.runtime.dataplane.DataPlaneClient`; killed by pid.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from failsoft.runtime.dataplane import DataPlaneClient
from failsoft.runtime.dataplane.client import HEARTBEAT_TIMEOUT_MS
from failsoft.runtime.heartbeat import HeartbeatEndpoint
from failsoft.runtime.pulse import DEAD, Watchers, process_state

pytestmark = pytest.mark.slow  # real processes, timed on the wall clock

AGENT = """
import json, os, sys, time, zmq
from failsoft.runtime.pulse import Pulse
host, port, key = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
router = zmq.Context.instance().socket(zmq.ROUTER)
endpoint = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
pulse = Pulse(host, port, key, "s1", "inc-1", 0.02, 0.5, watch_host="127.0.0.1").start()
print(json.dumps({"endpoint": endpoint, "watch": pulse.watch, "sidecar": pulse.sidecar.pid}), flush=True)
sys.stdin.readline()  # the gateway's connection is accepted: fork a holder of its socket
holder = os.fork()
if holder == 0:  # keeps the agent's sockets open after it dies: a teardown that never ends
    time.sleep(60)
    os._exit(0)
print(holder, flush=True)
time.sleep(60)
"""
# the sidecar looks every 5 ms; far below the 2 s after which the connection would end anyway
SEEN_WITHIN_S = 1.0


@pytest.fixture
def agent() -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    endpoint = HeartbeatEndpoint.make("127.0.0.1")  # where the sidecar beats; nobody reads here
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT, endpoint.host, str(endpoint.port), endpoint.key.hex()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    info = json.loads(proc.stdout.readline())
    try:
        yield proc, info
    finally:
        for pid in (proc.pid, info.get("holder"), info["sidecar"]):
            if pid is None:
                continue
            if process_state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


async def connected(
    proc: subprocess.Popen[str], info: dict[str, Any], changes: list[tuple[bool, str]]
) -> DataPlaneClient:
    """The client, connected to the agent and watching it; the agent's holder forked since."""
    client = DataPlaneClient(info["endpoint"], "s1", lambda up, why: changes.append((up, why)), info["watch"])
    deadline = time.monotonic() + 10.0
    while not changes:
        assert time.monotonic() < deadline, "never connected"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the watch's connection accepted by the sidecar too
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("fork\n")
    proc.stdin.flush()
    info["holder"] = int(await asyncio.to_thread(proc.stdout.readline))
    return client


def test_a_killed_agent_s_connection_ends_at_its_sidecar_s_word_not_its_teardown(agent) -> None:
    proc, info = agent

    async def body() -> tuple[float, list[tuple[bool, str]], str | None]:
        changes: list[tuple[bool, str]] = []
        client = await connected(proc, info, changes)
        killed = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        while client.lost is None and time.monotonic() - killed < HEARTBEAT_TIMEOUT_MS / 1000.0 + 1.0:
            await asyncio.sleep(0.001)
        seen = (client.lost_at or time.monotonic()) - killed
        client.close()
        return seen, changes, client.lost

    seen, changes, lost = asyncio.run(body())
    assert process_state(info["holder"]) not in (None, "Z")  # the agent's sockets were open all along
    assert lost is not None and "sidecar saw it" in lost, lost
    assert changes == [(True, "connected"), (False, lost)]
    assert seen < SEEN_WITHIN_S, f"seen {seen * 1000:.0f} ms after the kill"


def test_a_watch_that_ends_without_a_death_notice_ends_nothing(agent) -> None:
    """The sidecar gone without a word (the agent stopping it) is no proof that the agent died."""
    proc, info = agent

    async def body() -> str | None:
        changes: list[tuple[bool, str]] = []
        client = await connected(proc, info, changes)
        os.kill(info["sidecar"], signal.SIGKILL)
        await asyncio.sleep(0.5)
        lost = client.lost
        client.close()
        return lost

    assert asyncio.run(body()) is None


def test_a_watcher_the_sidecar_has_not_accepted_yet_still_hears_of_the_death() -> None:
    """A gateway that connected just before the death sits in the listener's backlog until the
    sidecar's loop accepts it; the notice must reach it too, not only the accepted watchers (else it
    waits for the agent's own connection to end, the teardown the notice exists to outrun)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = socket.create_connection(listener.getsockname())
    watchers = Watchers(os.dup(listener.fileno()))
    watchers.wait(0.5)  # accepts it
    assert len(watchers.conns) == 1
    late = socket.create_connection(listener.getsockname())  # in the backlog: no wait since
    try:
        watchers.tell_dead()
        for conn in (accepted, late):
            conn.settimeout(2.0)
            assert conn.recv(64) == DEAD
        assert watchers.conns == []
    finally:
        for conn in (accepted, late):
            conn.close()
        listener.close()
        watchers.listener.close()  # type: ignore[union-attr]
