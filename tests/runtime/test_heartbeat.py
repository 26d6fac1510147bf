"""Heartbeats end to end without Ray: a real agent stand-in process, its sidecar, the receiver socket."""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from failsoft.policies.detection import HeartbeatDetector
from failsoft.runtime.heartbeat import HeartbeatEndpoint, HeartbeatReceiver, HeartbeatReceiverError
from failsoft.runtime.pulse import datagram, process_state

pytestmark = pytest.mark.slow  # real sidecar processes, timed on the wall clock

AGENT = """
import sys, time
from failsoft.runtime.pulse import Pulse
host, port, key, incarnation = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3]), sys.argv[4]
pulse = Pulse(host, port, key, "s1", incarnation, 0.02, 0.5).start()
print(pulse.sidecar.pid, flush=True)
time.sleep(120)
"""


def start_agent(host: str, port: int, key: bytes, incarnation: str = "inc-1") -> tuple[subprocess.Popen, int]:
    """A stand-in agent process and its real sidecar, beating to ``host:port``; (process, sidecar pid)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT, host, str(port), key.hex(), incarnation],
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, int(proc.stdout.readline())


def stop_agent(proc: subprocess.Popen, sidecar: int) -> None:
    """SIGKILL the agent (a crash) and wait until its sidecar has noticed and exited."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait()
    deadline = time.monotonic() + 2.0
    while process_state(sidecar) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.02)


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
    proc, sidecar = start_agent(endpoint.host, endpoint.port, endpoint.key)
    try:
        yield proc, sidecar, receiver, endpoint
    finally:
        stop_agent(proc, sidecar)
        receiver.close()


def test_the_sidecar_beats_while_the_agent_runs_and_stops_when_it_stops_or_dies(agent):
    proc, sidecar, receiver, _ = agent
    collect(receiver, 0.5)  # startup
    running = collect(receiver, 0.4)
    assert len(running) >= 8 and {(b.server, b.incarnation) for b in running} == {("s1", "inc-1")}
    assert max(receiver.max_gap_s.values()) < 0.5

    skipped = receiver.skipped.get("s1", 0)
    os.kill(proc.pid, signal.SIGSTOP)  # a hung server: alive, silent
    collect(receiver, 0.1)
    assert collect(receiver, 0.3) == []
    os.kill(proc.pid, signal.SIGCONT)
    assert collect(receiver, 0.3), "heartbeats resume when the process does"
    assert receiver.skipped["s1"] - skipped >= 10  # the silence shows as ticks not sent, not lateness

    proc.kill()  # a crash: the sidecar notices and exits, leaving nothing behind
    proc.wait()
    deadline = time.monotonic() + 2.0
    while process_state(sidecar) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process_state(sidecar) in (None, "Z")
    notice = collect(receiver, 0.1)  # its last word: the agent died (proof, where silence is not)
    assert [(b.server, b.incarnation, b.dead) for b in notice][-1:] == [("s1", "inc-1", True)]
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


class Relay:
    """A UDP hop between the sidecar and the receiver that records every datagram it forwards:
    what someone on the network path could capture and send again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.recorded: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(512)
            except TimeoutError:
                continue
            self.recorded.append(data)
            self.sock.sendto(data, self.target)

    def replay(self, datagrams: list[bytes]) -> None:
        for data in datagrams:
            self.sock.sendto(data, self.target)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def relayed():
    endpoint = HeartbeatEndpoint.make("127.0.0.1")
    receiver = HeartbeatReceiver(endpoint, {"s1"})
    relay = Relay((endpoint.host, endpoint.port))
    try:
        yield receiver, relay, endpoint
    finally:
        relay.close()
        receiver.close()


def test_a_replayed_heartbeat_cannot_keep_a_dead_server_alive(relayed):
    receiver, relay, endpoint = relayed
    proc, sidecar = start_agent("127.0.0.1", relay.port, endpoint.key)
    detector = HeartbeatDetector(0.02, 2)
    detector.register("s1", time.monotonic())
    try:
        for beat in collect(receiver, 0.5):
            detector.heartbeat(beat.server, beat.arrived)
        captured = list(relay.recorded)
        assert len(captured) >= 10 and receiver.replayed == 0
        relay.replay(captured[-5:])  # replayed while the server lives: refused, the live beats go on
        time.sleep(0.05)
        assert collect(receiver, 0.1) and receiver.replayed == 5
    finally:
        stop_agent(proc, sidecar)
    collect(receiver, 0.1)  # the last genuine beats

    before = receiver.replayed
    for _ in range(10):  # the server is dead; someone keeps sending its recorded heartbeats
        relay.replay(captured)
        for beat in receiver.drain():
            detector.heartbeat(beat.server, beat.arrived)
        time.sleep(0.02)
    assert receiver.replayed - before == 10 * len(captured)  # every one refused and counted
    assert [c.new.value for c in detector.check(time.monotonic())] == ["failed"]


def test_a_previous_incarnations_heartbeats_are_refused_after_a_restart(relayed):
    receiver, relay, endpoint = relayed
    first = start_agent("127.0.0.1", relay.port, endpoint.key, "inc-1")
    try:
        assert {b.incarnation for b in collect(receiver, 0.4)} == {"inc-1"}
    finally:
        stop_agent(*first)
    collect(receiver, 0.1)  # its last genuine beats
    old = list(relay.recorded)
    second = start_agent("127.0.0.1", relay.port, endpoint.key, "inc-2")  # the server restarted
    try:
        assert {b.incarnation for b in collect(receiver, 0.4)} == {"inc-2"}
        relay.replay(old)
        time.sleep(0.05)
        assert {b.incarnation for b in collect(receiver, 0.1)} == {"inc-2"}
        assert receiver.replayed == len(old)
    finally:
        stop_agent(*second)


class FlakySocket:
    """A fake for what cannot be provoked on a receiving UDP socket at will: ``recvmsg`` fails
    with ``errors`` transient OSErrors (as ENOBUFS or a pending ICMP error would), then the real
    socket answers."""

    def __init__(self, real: socket.socket, errors: int) -> None:
        self.real, self.left = real, errors

    def recvmsg(self, *args: int):
        if self.left:
            self.left -= 1
            raise OSError(errno.ENOBUFS, os.strerror(errno.ENOBUFS))
        return self.real.recvmsg(*args)

    def fileno(self) -> int:
        return self.real.fileno()

    def close(self) -> None:
        self.real.close()


def test_the_receiver_survives_transient_socket_errors(agent, caplog):
    _, _, receiver, _ = agent
    assert collect(receiver, 0.3)
    receiver._sock = FlakySocket(receiver._sock, errors=3)
    with caplog.at_level(logging.WARNING, logger="failsoft.runtime.heartbeat"):
        beats = collect(receiver, 0.3)
    assert beats and beats[-1].arrived > time.monotonic() - 0.1  # still receiving, fresh beats
    assert receiver.errors == 3
    assert "No buffer space available" in caplog.text and "receiving on" in caplog.text


def test_a_receiver_whose_socket_is_gone_fails_loudly():
    endpoint = HeartbeatEndpoint.make("127.0.0.1")
    receiver = HeartbeatReceiver(endpoint, {"s1"})
    receiver.close()  # as if its descriptor had been closed under it
    with pytest.raises(HeartbeatReceiverError, match=f"heartbeat socket 127.0.0.1:{endpoint.port} is gone"):
        receiver.drain()
    with pytest.raises(HeartbeatReceiverError):  # every time, not once
        receiver.drain()


def _realtime_permitted() -> bool:
    probe = "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def test_the_sidecar_runs_real_time_where_the_os_permits(agent):
    _, sidecar, receiver, _ = agent
    assert collect(receiver, 0.3)  # it has started and set itself up
    policy = os.sched_getscheduler(sidecar) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)
    if _realtime_permitted():  # root or an RLIMIT_RTPRIO: woken ahead of every normal task
        assert policy == os.SCHED_FIFO
    else:
        assert policy == os.SCHED_OTHER
