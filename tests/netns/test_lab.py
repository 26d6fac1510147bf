"""The namespace lab itself, without Ray: its faults cut what they say and its removal is complete.

A UDP echo server runs inside a node (a real process in a real namespace); the host sends to the
node's private address. Link down: no echo; link up: echo again; a port cut: the node's answers to
that port are dropped, others pass. Closing the lab kills the node's processes by PID and removes
the namespaces, the veths and the bridge.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from failsoft.runtime.netns import Lab, Unsupported

ECHO = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('0.0.0.0', 7000))
while True:
    data, peer = s.recvfrom(64)
    s.sendto(data, peer)
"""
SUBNET = "10.77.9"  # apart from the benchmark's default and the cluster test's


def echo(lab: Lab, node: str, port: int = 0, timeout_s: float = 0.3, tries: int = 10) -> bool:
    """True when the node's echo server answers the host (from local ``port``) within the tries."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((lab.host, port))
        sock.settimeout(timeout_s)
        for _ in range(tries):
            sock.sendto(b"ping", (lab.nodes[node].address, 7000))
            try:
                return sock.recvfrom(64)[0] == b"ping"
            except TimeoutError:
                continue
    return False


def names(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def test_faults_cut_what_they_say_and_closing_removes_everything(netns_ok):
    lab = Lab(SUBNET)
    try:
        lab.add("n1")
        proc = lab.spawn("n1", [sys.executable, "-c", ECHO])
        deadline = time.monotonic() + 20
        while not echo(lab, "n1") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert echo(lab, "n1"), "the echo server in the namespace never answered over the bridge"
        lab.partition("n1")
        assert not echo(lab, "n1", tries=3)
        lab.heal("n1")
        assert echo(lab, "n1", tries=30)
        lab.cut("n1", 7001)  # what n1 sends to port 7001 is dropped: the answers to a sender there
        assert not echo(lab, "n1", port=7001, tries=3)
        assert echo(lab, "n1", port=7002)
        lab.uncut("n1")
        assert echo(lab, "n1", port=7001)
        pids = lab.pids("n1")
        assert proc.pid in pids or pids  # the process (ip netns exec became it) runs in n1
        ns, veth, bridge = lab.nodes["n1"].ns, lab.nodes["n1"].veth, lab.bridge
    finally:
        lab.close()
    assert proc.poll() is not None  # killed by PID
    assert ns not in names("ip", "netns", "list")
    links = names("ip", "-o", "link")
    assert veth not in links and bridge not in links


def test_netem_delays_a_link_or_says_why_not(netns_ok):
    """Delay on a node's link, where the kernel has netem; where not, the kernel's own words."""
    with Lab(SUBNET) as lab:
        lab.add("n1")
        lab.spawn("n1", [sys.executable, "-c", ECHO])
        deadline = time.monotonic() + 20
        while not echo(lab, "n1") and time.monotonic() < deadline:
            time.sleep(0.2)
        try:
            lab.impair("n1", delay_ms=100)
        except Unsupported as exc:
            pytest.skip(f"no netem on this kernel: {exc}")
        started = time.monotonic()
        assert echo(lab, "n1", timeout_s=2.0, tries=1)
        assert time.monotonic() - started >= 0.2  # 100 ms each way, on both ends of the link
        lab.unimpair("n1")
