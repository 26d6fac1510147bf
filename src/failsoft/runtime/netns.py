"""Machines on one host: Linux network namespaces joined by a private bridge, and the faults of a
real network (a node's processes killed, its link down, its heartbeats cut, its link slowed).

Each *node* is a network namespace with its own address on a private /24 (``10.77.0.0/24`` by
default) and one veth pair whose other end is on a bridge in the host's namespace, which has the
address ``.254`` there (the operator's and the clients' machine). The host does not forward
between the bridge and anything else, so the nodes reach each other and the host, and nothing
beyond. Processes started with :meth:`Lab.spawn` run inside a node (``ip netns exec``); everything
that was started there is found again by namespace (``ip netns pids``), so :meth:`Lab.close`
kills every process of every node by PID, then removes the namespaces, the veths and the bridge,
whatever state a test or a benchmark left them in.

Faults, each the network's, not failsoft's:

* :meth:`Lab.kill` -- SIGKILL every process of a node (the machine loses power);
* :meth:`Lab.partition` / :meth:`Lab.heal` -- the node's link down / up (a site loses its uplink:
  its processes keep running and can reach nobody, nobody can reach them);
* :meth:`Lab.cut` / :meth:`Lab.uncut` -- drop what the node sends over UDP (or to one port; a
  policy routing rule to a discarding device), e.g. only its heartbeats, while the rest of its
  traffic (Ray's, all TCP) flows (a partial partition: the controller thinks it failed, clients
  still reach it);
* :meth:`Lab.impair` -- delay and drop on the node's link (``tc qdisc ... netem``), where the kernel
  has netem (:class:`Unsupported` with the kernel's own message where it does not).

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and the ``ip`` and ``tc`` commands;
:func:`unsupported_reason` says why not, for a test to skip with.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from failsoft.errors import FailsoftError

log = logging.getLogger(__name__)
DEFAULT_SUBNET = "10.77.0"  # a /24 of the private 10.0.0.0/8, for nodes .1 to .253 and the host .254
HOST_OCTET = 254
DISCARD_DEVICE = "discard0"  # a device inside a node that drops what is routed to it
DISCARD_TABLE = "77"


class Unsupported(FailsoftError):
    """This machine cannot do it (no root, no namespaces, no netem): the kernel's or the tool's word."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise Unsupported(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def _selector(proto: str, port: int | None) -> list[str]:
    return ["ipproto", proto, *(["dport", str(port)] if port is not None else [])]


def unsupported_reason() -> str | None:
    """Why this machine cannot make network namespaces (None: it can), from the kernel's answer."""
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    probe = f"fsprobe{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
        _ip("link", "add", f"{probe}a", "type", "veth", "peer", "name", f"{probe}b")
        _ip("link", "add", f"{probe}c", "type", "bridge")
    except Unsupported as exc:
        return f"the kernel refused: {exc}"
    finally:
        for link in (f"{probe}a", f"{probe}c"):
            _ip("link", "del", link, check=False)
        _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Node:
    """One machine: a namespace ``ns``, its address, and the host end of its link (``veth``)."""

    name: str
    ns: str
    address: str
    veth: str
    inner: str  # its end of the link, inside the namespace
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    cuts: list[tuple[str, int | None]] = field(default_factory=list)


class Lab:
    """Namespaces on a private bridge; made with :meth:`add`, all removed by :meth:`close`."""

    def __init__(
        self, subnet: str = DEFAULT_SUBNET, tag: str | None = None, logs: Path | None = None
    ) -> None:
        self.subnet = subnet
        self.tag = tag or uuid.uuid4().hex[:4]  # interface names have 15 characters at most
        self.bridge = f"fs{self.tag}br"
        self.host = f"{subnet}.{HOST_OCTET}"
        self.nodes: dict[str, Node] = {}
        self.logs = logs
        self._up = False

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _bridge(self) -> None:
        if self._up:
            return
        _ip("link", "add", self.bridge, "type", "bridge")
        self._up = True
        _ip("addr", "add", f"{self.host}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add(self, name: str) -> Node:
        """A new node ``name`` with the next address of the subnet (``.1``, ``.2``, ...)."""
        if name in self.nodes:
            raise ValueError(f"node {name!r} exists")
        self._bridge()
        index = len(self.nodes) + 1
        inner = f"fs{self.tag}n{index}"
        node = Node(name, f"fs-{self.tag}-{name}", f"{self.subnet}.{index}", f"fs{self.tag}h{index}", inner)
        self.nodes[name] = node
        _ip("netns", "add", node.ns)
        _ip("-n", node.ns, "link", "set", "lo", "up")
        _ip("link", "add", node.veth, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", node.ns)
        _ip("link", "set", node.veth, "master", self.bridge)
        _ip("link", "set", node.veth, "up")
        _ip("-n", node.ns, "addr", "add", f"{node.address}/24", "dev", inner)
        _ip("-n", node.ns, "link", "set", inner, "up")
        return node

    def spawn(
        self,
        node: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        log_name: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``node``'s namespace (its output to ``logs/<log_name>.log``)."""
        n = self.nodes[node]
        out: Any = subprocess.DEVNULL
        if self.logs is not None and log_name:
            self.logs.mkdir(parents=True, exist_ok=True)
            out = open(self.logs / f"{log_name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", n.ns, *argv],
            env=dict(env) if env is not None else None,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        if out is not subprocess.DEVNULL:
            out.close()
        n.procs.append(proc)
        return proc

    def run(
        self, node: str, argv: Sequence[str], timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``node``'s namespace to its end."""
        return subprocess.run(
            ["ip", "netns", "exec", self.nodes[node].ns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def pids(self, node: str) -> list[int]:
        """Every process in ``node``'s namespace (what was started there, and their children)."""
        done = _ip("netns", "pids", self.nodes[node].ns, check=False)
        return [int(p) for p in done.stdout.split()]

    # faults ----------------------------------------------------------------------------------------
    def kill(self, node: str) -> list[int]:
        """SIGKILL every process of ``node`` (the machine is gone); the PIDs killed."""
        pids = self.pids(node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.nodes[node].procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        return pids

    def partition(self, node: str) -> None:
        """Take ``node``'s link down: it reaches nobody, nobody reaches it; its processes run on."""
        _ip("link", "set", self.nodes[node].veth, "down")

    def heal(self, node: str) -> None:
        _ip("link", "set", self.nodes[node].veth, "up")

    def cut(self, node: str, port: int | None = None, proto: str = "udp") -> None:
        """Drop, silently, what ``node`` sends over ``proto`` (to ``port``; None: to any port).

        A policy rule sends those packets to a routing table whose only route leads to a device
        that discards what it is given (a veth whose queue is tc's ``blackhole``): the sender sees
        no error, as on a real network (a ``blackhole`` route would fail its ``send`` with EINVAL)."""
        n = self.nodes[node]
        if not n.cuts:
            self._discard_device(n)
        _ip("-n", n.ns, "rule", "add", *_selector(proto, port), "lookup", DISCARD_TABLE)
        n.cuts.append((proto, port))

    def _discard_device(self, n: Node) -> None:
        if DISCARD_DEVICE in _ip("-n", n.ns, "-o", "link").stdout:
            return
        _ip("-n", n.ns, "link", "add", DISCARD_DEVICE, "type", "veth", "peer", "name", f"{DISCARD_DEVICE}p")
        for dev in (DISCARD_DEVICE, f"{DISCARD_DEVICE}p"):
            _ip("-n", n.ns, "link", "set", dev, "up")
        done = self.run(n.name, ["tc", "qdisc", "replace", "dev", DISCARD_DEVICE, "root", "blackhole"])
        if done.returncode != 0:
            raise Unsupported(f"tc qdisc blackhole: {done.stderr.strip()}")
        _ip("-n", n.ns, "route", "replace", "default", "dev", DISCARD_DEVICE, "table", DISCARD_TABLE)

    def uncut(self, node: str) -> None:
        """Let through again everything :meth:`cut` dropped."""
        n = self.nodes[node]
        while n.cuts:
            proto, port = n.cuts.pop()
            _ip("-n", n.ns, "rule", "del", *_selector(proto, port), "lookup", DISCARD_TABLE, check=False)

    def impair(self, node: str, delay_ms: float = 0.0, loss_pct: float = 0.0) -> None:
        """Delay (and drop ``loss_pct`` of) what crosses ``node``'s link, both ways (netem on each
        end). :class:`Unsupported` with the kernel's message where netem is missing."""
        if shutil.which("tc") is None:
            raise Unsupported("no 'tc' command (iproute2)")
        n = self.nodes[node]
        spec = ["netem", "delay", f"{delay_ms:g}ms", "loss", f"{loss_pct:g}%"]
        for prefix in ([], ["ip", "netns", "exec", n.ns]):
            dev = n.inner if prefix else n.veth
            done = subprocess.run(
                [*prefix, "tc", "qdisc", "replace", "dev", dev, "root", *spec],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if done.returncode != 0:
                self.unimpair(node)
                raise Unsupported(f"tc netem on {dev}: {done.stderr.strip()}")

    def unimpair(self, node: str) -> None:
        n = self.nodes[node]
        subprocess.run(["tc", "qdisc", "del", "dev", n.veth, "root"], capture_output=True, timeout=30)
        self.run(node, ["tc", "qdisc", "del", "dev", n.inner, "root"], timeout_s=30)

    # removal ---------------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process of every node, remove the namespaces, veths and bridge. Idempotent."""
        for name in list(self.nodes):
            self.kill(name)
        deadline = time.monotonic() + 10.0
        for name in list(self.nodes):
            while self.pids(name) and time.monotonic() < deadline:  # killed, not yet reaped
                self.kill(name)
                time.sleep(0.1)
            n = self.nodes.pop(name)
            _ip("link", "del", n.veth, check=False)
            _ip("netns", "del", n.ns, check=False)
        if self._up:
            _ip("link", "del", self.bridge, check=False)
            self._up = False
