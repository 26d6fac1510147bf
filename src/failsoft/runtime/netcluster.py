"""failsoft across machines, on one host: a Ray cluster whose nodes are network namespaces.

The layout an operator would build with real machines (docs/operations.md, "Across machines"):

* node ``head`` (``.1``): the Ray head (GCS) and ``failsoft serve --address`` (the controller, its
  heartbeat receiver and the gateway, both planes on the head's address);
* one node per server (``.2``, ``.3``, ...): ``ray start --address`` offering ``server:<name>``, kept
  running by a loop as systemd's ``Restart=always`` would (a raylet that Ray declared dead, after a
  long partition, exits when it reaches the head again and is started afresh);
* the host (``.254``): the clients, the operator's CLI, this module.

Ray's token authentication is on (``RAY_AUTH_MODE=token``, a token made here, passed to every
process in its environment: Ray 2.60's ``ray start --head`` turns it on by default and refuses
nodes without it). Each node gets its own Ray temp directory (its sockets would collide in a
shared one). :meth:`NetCluster.close` removes everything (:meth:`~failsoft.runtime.netns.Lab.close`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from failsoft.errors import ServingError
from failsoft.runtime.netns import DEFAULT_SUBNET, Lab

RAY_PORT = 6379
GATEWAY_PORT = 8000
OBJECT_STORE_BYTES = 80 * 1024 * 1024
_PROBE = """
import json, sys, time
from ray._raylet import GcsClient
want, deadline = set(sys.argv[2].split(',')), time.monotonic() + float(sys.argv[3])
while True:
    try:
        nodes = GcsClient(address=sys.argv[1]).get_all_node_info(timeout=5)
        alive = [n for n in nodes.values() if n.state == 0]
        have = {k[7:] for n in alive for k in n.resources_total if k.startswith('server:')}
        if want <= have:
            print(json.dumps(sorted(have))); break
    except Exception as exc:
        print(exc, file=sys.stderr)
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(0.5)
"""


class NetCluster:
    """A head namespace with Ray and ``failsoft serve``, one namespace per server, the host as client."""

    def __init__(
        self, config: Path, servers: Sequence[str], work: Path, subnet: str = DEFAULT_SUBNET
    ) -> None:
        self.config = config
        self.servers = tuple(servers)
        self.work = work
        self.lab = Lab(subnet, logs=work / "logs")
        self.token = work / "ray-token"
        self.serve_proc: subprocess.Popen[bytes] | None = None
        self.python = sys.executable
        self.keep_logs: Path | None = None
        # Ray's sockets live in its temp directory, and a Unix socket's path has 107 bytes at most:
        # a short one of its own, whatever ``work`` is
        self.ray_dir = Path(tempfile.gettempdir()) / f"fsnet-{self.lab.tag}"
        self.head_proc: subprocess.Popen[bytes] | None = None
        self.ray = str(Path(sys.executable).parent / "ray")

    @property
    def head(self) -> str:
        return self.lab.nodes["head"].address

    def address(self, server: str) -> str:
        return self.lab.nodes[server].address

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token),
        }

    # start --------------------------------------------------------------------------------------
    def start(self, state_dir: Path, timeout_s: float = 240.0) -> NetCluster:
        """Namespaces, the Ray head and nodes, then ``failsoft serve`` on the head; ready to serve."""
        deadline = time.monotonic() + timeout_s
        try:
            self.work.mkdir(parents=True, exist_ok=True)
            self.token.write_text(secrets.token_hex(32))
            self.token.chmod(0o600)
            for node in ("head", *self.servers):
                self.lab.add(node)
            self._ray_head()
            for server in self.servers:
                self.start_node(server)
            self.wait_nodes(self.servers, deadline - time.monotonic())
            self._serve(state_dir, deadline)
        except BaseException:
            self.close()
            raise
        return self

    def _ray_head(self) -> None:
        argv = [
            self.ray, "start", "--head", "--block", f"--node-ip-address={self.head}", f"--port={RAY_PORT}",
            "--num-cpus=1", f"--object-store-memory={OBJECT_STORE_BYTES}", "--include-dashboard=false",
            "--disable-usage-stats", f"--temp-dir={self.ray_dir / 'head'}",
        ]  # fmt: skip
        self.head_proc = self.lab.spawn("head", argv, self.env(), log_name="ray-head")

    def start_node(self, server: str) -> None:
        """Start (again, after :meth:`~failsoft.runtime.netns.Lab.kill`) ``server``'s Ray node."""
        argv = [
            self.ray, "start", "--block", f"--address={self.head}:{RAY_PORT}",
            f"--node-ip-address={self.address(server)}", "--num-cpus=1",
            f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats",
            f"--resources={json.dumps({f'server:{server}': 1})}",
            f"--temp-dir={self.ray_dir / server}",
        ]  # fmt: skip
        loop = 'while :; do "$@"; sleep 1; done'  # Restart=always
        self.lab.spawn(server, ["sh", "-c", loop, "ray-node", *argv], self.env(), log_name=f"ray-{server}")

    def wait_nodes(self, servers: Sequence[str], timeout_s: float) -> None:
        """Until Ray has a live node offering ``server:<name>`` for each of ``servers``."""
        argv = [
            self.python,
            "-c",
            _PROBE,
            f"{self.head}:{RAY_PORT}",
            ",".join(servers),
            str(max(timeout_s, 1)),
        ]
        probe = subprocess.Popen(argv, env=self.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            while probe.poll() is None:
                if self.head_proc is not None and self.head_proc.poll() is not None:
                    raise ServingError(f"the Ray head exited; see {self.work}/logs/ray-head.log")
                time.sleep(0.5)
        finally:
            if probe.poll() is None:
                probe.kill()
            _, err = probe.communicate(timeout=30)
        if probe.returncode != 0:
            raise ServingError(f"Ray nodes {list(servers)} did not join: {err.decode().strip()[-500:]}")

    def _serve(self, state_dir: Path, deadline: float) -> None:
        (state_dir / "gateway.json").unlink(missing_ok=True)
        h = self.head
        argv = [
            self.python, "-m", "failsoft", "serve", str(self.config), f"--address={h}:{RAY_PORT}",
            f"--node-ip-address={h}", f"--host={h}", f"--port={GATEWAY_PORT}", f"--admin-host={h}",
            f"--admin-port={GATEWAY_PORT + 1}", "--allow-remote-admin",
        ]  # fmt: skip
        self.serve_proc = self.lab.spawn("head", argv, self.env(), log_name="serve")
        where = state_dir / "gateway.json"
        while not where.is_file():
            if self.serve_proc.poll() is not None:
                raise ServingError(
                    f"failsoft serve exited ({self.serve_proc.returncode}); see {self.work}/logs"
                )
            if time.monotonic() > deadline:
                raise ServingError(f"failsoft serve did not start in time; see {self.work}/logs")
            time.sleep(0.5)

    def client(self, state_dir: Path, timeout: float = 10.0) -> Any:
        """A client of both planes, from the host, as the serve process wrote them down."""
        from failsoft.client import Client

        where = json.loads((state_dir / "gateway.json").read_text())
        token = (state_dir / "admin_token").read_text().strip()
        return Client(where["url"], admin_url=where["admin_url"], token=token, timeout=timeout)

    # removal ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Every process of every namespace killed, the namespaces and links removed, Ray's temp
        directories deleted (the logs kept first when :attr:`keep_logs` names a directory).
        Idempotent."""
        self.lab.close()
        if self.keep_logs is not None:
            self._copy_logs(self.keep_logs)
        shutil.rmtree(self.ray_dir, ignore_errors=True)

    def _copy_logs(self, to: Path) -> None:
        """The processes' output, and Ray's GCS and raylet logs of every node (what a partition
        did to Ray: nodes declared dead, raylets restarted)."""
        to.mkdir(parents=True, exist_ok=True)
        for log in (self.work / "logs").glob("*.log"):
            shutil.copy2(log, to / log.name)
        for node_dir in self.ray_dir.glob("*"):
            for log in node_dir.glob("session_*/logs/*"):
                if log.name.startswith(("gcs_server", "raylet")) and log.is_file():
                    shutil.copy2(log, to / f"{node_dir.name}-{log.parent.parent.name[-6:]}-{log.name}")

    def __enter__(self) -> NetCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
