"""Heartbeats end to end without Ray: a real agent stand-in process, its sidecar, the receiver socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from failsoft.runtime.heartbeat import HeartbeatEndpoint, HeartbeatReceiver
from failsoft.runtime.pulse import datagram, process_state

AGENT = """
import sys, time
from failsoft.runtime.pulse import Pulse
host, port, key = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
pulse = Pulse(host, port, key, "s1", "inc-1", 0.02, 0.5).start()
print(pulse.sidecar.pid, flush=True)
time.sleep(120)
"""


def collect(receiver: HeartbeatReceiver, seconds: float) -> list:
    beats, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        beats.extend(receiver.drain())
        time.sleep(0.01)
    return beats


@pytest.fixture
def agent():
    endpoint = HeartbeatEndpoint.make("127.0.0.1")
    receiver = HeartbeatReceiver(endpoint, {"s1"})
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT, endpoint.host, str(endpoint.port), endpoint.key.hex()],
        stdout=subprocess.PIPE,
        text=True,
    )
    sidecar = int(proc.stdout.readline())
    try:
        yield proc, sidecar, receiver, endpoint
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()
        receiver.close()


def test_the_sidecar_beats_while_the_agent_runs_and_stops_when_it_stops_or_dies(agent):
    proc, sidecar, receiver, _ = agent
    collect(receiver, 0.5)  # startup
    running = collect(receiver, 0.4)
    assert len(running) >= 8 and {(b.server, b.incarnation) for b in running} == {("s1", "inc-1")}
    assert max(receiver.max_gap_s.values()) < 0.5

    os.kill(proc.pid, signal.SIGSTOP)  # a hung server: alive, silent
    collect(receiver, 0.1)
    assert collect(receiver, 0.3) == []
    os.kill(proc.pid, signal.SIGCONT)
    assert collect(receiver, 0.3), "heartbeats resume when the process does"

    proc.kill()  # a crash: the sidecar notices and exits, leaving nothing behind
    proc.wait()
    deadline = time.monotonic() + 2.0
    while process_state(sidecar) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process_state(sidecar) in (None, "Z")
    collect(receiver, 0.1)
    assert collect(receiver, 0.2) == []


def test_forged_heartbeats_are_rejected(agent):
    _, _, receiver, endpoint = agent
    collect(receiver, 0.2)
    before = receiver.rejected
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(datagram(b"wrong key", "s1", "x", 1), (endpoint.host, endpoint.port))
        sock.sendto(b"garbage", (endpoint.host, endpoint.port))
    time.sleep(0.05)
    assert all(b.incarnation == "inc-1" for b in receiver.drain())
    assert receiver.rejected == before + 2


def test_arrival_times_are_the_kernels_not_the_readers():
    endpoint = HeartbeatEndpoint.make("127.0.0.1")
    receiver = HeartbeatReceiver(endpoint, {"s1"})
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sent = time.monotonic()
            sock.sendto(datagram(endpoint.key, "s1", "i", 0), (endpoint.host, endpoint.port))
        time.sleep(0.2)  # the controller is "stalled": it reads late
        (beat,) = receiver.drain()
        assert abs(beat.arrived - sent) < 0.05  # stamped on arrival, not when read 200 ms later
    finally:
        receiver.close()
