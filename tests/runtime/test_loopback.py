"""Loopback means loopback: an embedded failsoft listens on 127.0.0.1 only, Ray's processes included.

A real session (Ray embedded, the controller with its heartbeat receiver, two agents with their
heartbeat sidecars, the gateway's inference and admin servers) is started, and every socket that
can receive of every process it started (this process and all its descendants: GCS, raylet,
runtime-env agent, Ray workers, sidecars) is listed from the kernel's tables (psutil): TCP sockets
in LISTEN, UDP sockets bound to a port. Any address other than a loopback one fails the test,
naming the process and the address. The test also checks that it saw failsoft's own servers, so that
an empty list cannot pass for a clean one.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass

import psutil
import pytest

from failsoft.runtime.config import config_from_dict
from failsoft.runtime.session import Session

pytestmark = [pytest.mark.runtime, pytest.mark.slow]


@dataclass(frozen=True)
class Listener:
    process: str
    pid: int
    proto: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.process} (pid {self.pid}) {self.proto} {self.host}:{self.port}"


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped loopback (``::ffff:127.0.0.1``, what Ray's gRPC binds)."""
    address = ipaddress.ip_address(host.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def listeners(root: int) -> list[Listener]:
    """Every socket of ``root`` and its descendants that can receive: TCP LISTEN, bound UDP."""
    procs = {p.pid: p for p in [psutil.Process(root), *psutil.Process(root).children(recursive=True)]}
    found = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.pid not in procs or not conn.laddr:
            continue
        tcp = conn.type == socket.SOCK_STREAM
        if tcp and conn.status != psutil.CONN_LISTEN:
            continue
        try:
            name = procs[conn.pid].name()
        except psutil.Error:
            name = "?"
        found.append(Listener(name, conn.pid, "tcp" if tcp else "udp", conn.laddr.ip, conn.laddr.port))
    return found


@pytest.fixture(scope="module")
def session(tiny_zoo, tmp_path_factory):
    config = config_from_dict(
        {
            "name": "loopback-test",
            "repository": str(tiny_zoo.root),
            "servers": [{"name": n, "site": "a", "memory_mb": 50, "compute": 4.0} for n in ("s1", "s2")],
            "apps": [{"name": "app-1", "family": "digits_mlp", "primary": {"server": "s1"}}],
            "gateway": {"port": 0},
            "state_dir": str(tmp_path_factory.mktemp("state")),
        },
        source="test",
    )
    with Session(config, num_cpus=2) as started:
        yield started


def test_every_socket_of_an_embedded_cluster_is_on_loopback(session):
    found = listeners(os.getpid())
    exposed = [str(x) for x in found if not is_loopback(x.host)]
    assert not exposed, "listening beyond loopback:\n" + "\n".join(exposed)
    ports = {(x.proto, x.port) for x in found}
    assert ("tcp", session.port) in ports  # the gateway
    assert ("udp", session.heartbeat.port) in ports  # the controller's heartbeat receiver
    names = {x.process for x in found}
    assert {"gcs_server", "raylet"} <= names, names  # Ray's own servers were seen and checked


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.2", False),
        ("fe80::1%eth0", False),
    ],
)
def test_the_check_tells_loopback_from_the_rest(host, loopback):
    assert is_loopback(host) is loopback
