"""Chaos never signals a process that is not the server's agent any more.

A hung agent cannot say its PID, so chaos keeps the last one it said; the kernel hands a PID out
again once its process is gone. These tests use real processes; the agent's Ray handle is a fake
that does not answer (a hung agent, which needs no cluster to stand for).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import psutil
import pytest

from failsoft.domain import Server
from failsoft.errors import ConfigError, ServingError, UnknownNameError
from failsoft.runtime.chaos import AgentProcess, Chaos

# waits for a line on stdin, then becomes another program under the same PID (execv)
STAND_IN = "import os, sys; sys.stdin.readline(); os.execv('/bin/sleep', ['sleep', '60'])"


class SilentAgent:
    """Fake AgentRef of a hung agent: it never answers ``info``."""

    async def info(self, timeout_s: float) -> dict:
        raise ServingError("server 's1' did not answer within 1 s")


@pytest.fixture
def stand_in():
    proc = subprocess.Popen([sys.executable, "-c", STAND_IN], stdin=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def chaos_for(proc: subprocess.Popen) -> Chaos:
    chaos = Chaos([Server("s1", "a", 100.0)], {"s1": SilentAgent()})
    chaos.remember("s1", {"pid": proc.pid, "hostname": socket.gethostname()})
    return chaos


def test_a_kept_pid_that_is_still_the_agent_is_killed(stand_in):
    result = asyncio.run(chaos_for(stand_in).kill("s1"))
    assert result["killed"][0]["pid"] == stand_in.pid
    assert stand_in.wait(timeout=5) == -9


def test_a_kept_pid_now_running_another_program_is_refused(stand_in):
    chaos = chaos_for(stand_in)
    python = psutil.Process(stand_in.pid).exe()
    stand_in.stdin.write("exec\n")  # the PID now runs /bin/sleep: not the agent any more
    stand_in.stdin.flush()
    deadline = time.monotonic() + 5
    while psutil.Process(stand_in.pid).exe() == python and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(ServingError, match=rf"pid {stand_in.pid} is no longer its agent .*sleep.*refusing"):
        asyncio.run(chaos.kill("s1"))
    with pytest.raises(ServingError, match="no longer its agent"):
        asyncio.run(chaos.resume("s1"))
    assert stand_in.poll() is None  # nothing was sent to it


def test_a_pid_reused_by_a_process_started_later_is_refused(stand_in):
    kept = AgentProcess.of({"pid": stand_in.pid, "hostname": socket.gethostname()})
    assert kept.impostor() is None
    earlier = AgentProcess(kept.pid, kept.host, kept.started - 5.0, kept.exe)  # as before a PID reuse
    assert "started at" in earlier.impostor()


def test_killing_an_agent_that_is_already_gone_is_no_error(stand_in):
    chaos = chaos_for(stand_in)
    stand_in.kill()
    stand_in.wait()
    assert asyncio.run(chaos.kill("s1"))["killed"][0]["server"] == "s1"


def test_servers_of_two_sites_are_killed_at_one_instant_and_a_bad_list_kills_none():
    procs = [
        subprocess.Popen([sys.executable, "-c", STAND_IN], stdin=subprocess.PIPE, text=True) for _ in range(3)
    ]
    try:
        servers = [Server("s1", "a", 100.0), Server("s2", "b", 100.0), Server("s3", "b", 100.0)]
        chaos = Chaos(servers, {s.name: SilentAgent() for s in servers})
        for server, proc in zip(servers, procs, strict=True):
            chaos.remember(server.name, {"pid": proc.pid, "hostname": socket.gethostname()})
        for bad, error in ((["s1", "s9"], UnknownNameError), (["s1", "s1"], ConfigError)):
            with pytest.raises(error, match="s9" if error is UnknownNameError else "twice: s1"):
                asyncio.run(chaos.kill(servers=bad))
        assert all(p.poll() is None for p in procs)  # refused as a whole: nothing was signalled
        killed = asyncio.run(chaos.kill(servers=["s3", "s1"]))["killed"]
        assert [k["server"] for k in killed] == ["s3", "s1"]
        assert procs[2].wait(timeout=5) == -9 and procs[0].wait(timeout=5) == -9
        assert 0 <= killed[1]["at"] - killed[0]["at"] < 0.05  # back to back (a descheduled thread aside)
        assert procs[1].poll() is None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


class HoldingAgent:
    """Fake AgentRef that holds ``app``'s model in one variant until evicted."""

    def __init__(self) -> None:
        self.held = {"p": ["gru_16"]}

    async def evict(self, app: str) -> list[str]:
        return self.held.pop(app, [])


def test_evict_says_what_the_server_lost_and_refuses_an_app_it_does_not_hold():
    from failsoft.errors import UnknownNameError

    chaos = Chaos([Server("s1", "a", 100.0)], {"s1": HoldingAgent()})
    answer = asyncio.run(chaos.evict("s1", "p"))
    assert {k: answer[k] for k in ("action", "server", "app", "variants")} == {
        "action": "evict", "server": "s1", "app": "p", "variants": ["gru_16"],
    }  # fmt: skip
    with pytest.raises(UnknownNameError, match="holds no model of app 'p'"):
        asyncio.run(chaos.evict("s1", "p"))  # gone already
    with pytest.raises(UnknownNameError, match="unknown server 's9'"):
        asyncio.run(chaos.evict("s9", "p"))
