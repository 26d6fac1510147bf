"""What an embedded failsoft exposes: loopback only (Ray's processes included), the admin plane
apart from inference, both over TLS when configured.

One real session (Ray embedded, the controller with its heartbeat receiver, two agents with their
heartbeat sidecars, the gateway's inference and admin servers, each with a self-signed certificate
made here by ``openssl``):

* every socket that can receive of every process it started (this process and all its
  descendants: GCS, raylet, runtime-env agent, Ray workers, sidecars) is listed from the kernel's
  tables (psutil): TCP sockets in LISTEN, UDP sockets bound to a port. Any address other than a
  loopback one fails the test, naming the process and the address; the test also checks that it
  saw failsoft's own servers and Ray's, so that an empty list cannot pass for a clean one;
* the inference port answers 404 under ``/admin``; the admin port answers with the token, 401
  without it, and serves no inference; both speak HTTPS that verifies against the certificate;
* ``failsoft status`` and ``failsoft chaos`` find the admin plane (and the certificate to trust)
  in the state directory.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from failsoft.client import _ssl
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.session import Session
from tests.runtime.conftest import wait_for

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


def self_signed(where: Path) -> dict[str, str]:
    """A certificate for 127.0.0.1 signed by its own key (EC P-256), made with the openssl CLI."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl binary to make a self-signed certificate with")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return {"certfile": str(cert), "keyfile": str(key)}


@pytest.fixture(scope="module")
def session(tiny_zoo, tmp_path_factory):
    tls = self_signed(tmp_path_factory.mktemp("tls"))
    config = config_from_dict(
        {
            "name": "exposure-test",
            "repository": str(tiny_zoo.root),
            "servers": [{"name": n, "site": "a", "memory_mb": 50, "compute": 4.0} for n in ("s1", "s2")],
            "apps": [{"name": "app-1", "family": "digits_mlp", "primary": {"server": "s1"}}],
            "gateway": {"port": 0, "tls": tls, "admin_tls": tls},
            "state_dir": str(tmp_path_factory.mktemp("state") / "exposure-test"),
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
    assert ("tcp", session.port) in ports  # the gateway's inference plane
    assert ("tcp", session.admin_port) in ports  # its admin plane
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


def test_the_admin_plane_is_apart_from_inference_and_both_speak_tls(session):
    cert = str(session.config.gateway.tls.certfile)
    token = session.prepared.admin_token
    auth = {"Authorization": f"Bearer {token}"}
    assert session.url.startswith("https://") and session.admin_url.startswith("https://")
    with httpx.Client(verify=_ssl(cert), timeout=10.0) as http:
        assert http.get(f"{session.url}/v2/health/ready").status_code == 200
        assert http.get(f"{session.url}/admin/status", headers=auth).status_code == 404  # not here
        kill = http.post(f"{session.url}/admin/chaos/kill", json={"server": "s1"}, headers=auth)
        assert kill.status_code == 404
        assert http.get(f"{session.admin_url}/admin/status").status_code == 401
        wrong = http.get(f"{session.admin_url}/admin/status", headers={"Authorization": "Bearer " + "x" * 32})
        assert wrong.status_code == 401
        status = http.get(f"{session.admin_url}/admin/status", headers=auth)
        assert status.status_code == 200 and status.json()["ready"] is True
        assert http.get(f"{session.admin_url}/v2/health/live").status_code == 404  # no inference there
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{session.url}/v2/health/live")  # the system's CAs do not know it
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{session.admin_port}/admin/status", headers=auth)  # no plaintext
    with session.client(timeout=10.0) as client:  # the SDK: inference and admin on their own URLs
        assert client.ready() and client.status()["ready"] is True


def test_status_and_chaos_find_the_admin_plane_in_the_state_directory(session):
    state = session.config.state_dir
    where = json.loads((state / "gateway.json").read_text())
    assert (where["url"], where["admin_url"]) == (session.url, session.admin_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAILSOFT_URL", "FAILSOFT_ADMIN"))}
    env["FAILSOFT_STATE"] = str(state.parent)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "failsoft", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)

    def both_up() -> subprocess.CompletedProcess[str] | None:
        # a heartbeat late on a busy host shows a server "suspect" for a moment: ask again
        shown = cli("status", "--json", "--state-dir", str(state))
        assert shown.returncode == 0, shown.stderr
        up = [s["state"] for s in json.loads(shown.stdout)["servers"]] == ["up", "up"]
        return shown if up else None

    shown = wait_for(both_up, 30.0, "status to show both servers up", 0.5)
    slowed = cli("chaos", "slow", "s2", "--ms", "0", "--json")  # found as the only running cluster
    assert slowed.returncode == 0, slowed.stderr
    assert json.loads(slowed.stdout)["server"] == "s2"
    token = session.prepared.admin_token
    assert token not in shown.stdout + shown.stderr + slowed.stdout + slowed.stderr
