"""Failure injection: crash, hang, resume or slow down servers (``failsoft chaos``, ``/admin/chaos``).

FailLite injects a server failure by stopping its Triton container (5.1). Here a server *is* its
agent's process, so:

* **kill** sends SIGKILL to it (a crash: power loss, OOM kill). With ``agents.restart`` (the default)
  Ray starts the agent again, empty, like a rebooted server: the controller then restores it;
* **kill a site** kills every server of the site at the same instant (FailLite 5.6);
* **hang** sends SIGSTOP: the process is alive but silent, and is detected like a crash, by its
  missing heartbeats; **resume** (SIGCONT) brings it back with its models still loaded;
* **slow** adds latency to every inference of a server, and optionally to every model load (a slow
  disk or a remote model repository).

Signals are sent from this process when the agent runs on this host (embedded mode); otherwise the
agent is asked to kill itself. Every injection returns the wall time it happened at, so benchmarks
can measure detection from the true failure instant.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Sequence
from typing import Any

from failsoft.domain import Server
from failsoft.errors import ConfigError, ServingError
from failsoft.runtime.cluster import AgentRef


class Chaos:
    def __init__(self, servers: Sequence[Server], agents: dict[str, AgentRef]) -> None:
        self.servers = {s.name: s for s in servers}
        self.agents = agents
        self._pids: dict[str, int] = {}
        self._hosts: dict[str, str] = {}

    def servers_of(self, server: str | None = None, site: str | None = None) -> list[str]:
        if site is not None:
            names = [s.name for s in self.servers.values() if s.site == site]
            if not names:
                sites = sorted({s.site for s in self.servers.values()})
                raise ConfigError(f"unknown site {site!r} (sites: {', '.join(sites)})")
            return names
        if server is None or server not in self.servers:
            raise ConfigError(f"unknown server {server!r} (servers: {', '.join(self.servers)})")
        return [server]

    def remember(self, server: str, info: dict[str, Any]) -> None:
        """Note an agent's PID and host (from its ``info()``): a hung agent cannot tell us later."""
        self._pids[server], self._hosts[server] = int(info["pid"]), str(info["hostname"])

    def forget(self, server: str) -> None:
        """The server's agent was replaced: its old PID means nothing now."""
        self._pids.pop(server, None)
        self._hosts.pop(server, None)

    async def refresh(self, server: str) -> None:
        self.remember(server, await self.agents[server].info(timeout_s=1.0))

    async def _pid(self, server: str) -> int:
        try:
            await self.refresh(server)
        except ServingError:
            if server not in self._pids:
                raise
        return self._pids[server]

    async def kill(self, server: str | None = None, site: str | None = None) -> dict[str, Any]:
        names = self.servers_of(server, site)
        pids = await asyncio.gather(*(self._pid(n) for n in names))
        killed = []
        for name, pid in zip(names, pids, strict=True):
            at = time.time()
            self._signal(name, pid, signal.SIGKILL)
            killed.append({"server": name, "pid": pid, "at": at})
        return {"action": "kill", "killed": killed}

    async def hang(self, server: str) -> dict[str, Any]:
        (name,) = self.servers_of(server)
        pid = await self._pid(name)
        at = time.time()
        self._signal(name, pid, signal.SIGSTOP)
        return {"action": "hang", "server": name, "pid": pid, "at": at}

    async def resume(self, server: str) -> dict[str, Any]:
        (name,) = self.servers_of(server)
        if name not in self._pids:
            raise ServingError(f"server {name!r} was not hung by this gateway")
        at = time.time()
        self._signal(name, self._pids[name], signal.SIGCONT)
        return {"action": "resume", "server": name, "pid": self._pids[name], "at": at}

    async def slow(self, server: str, ms: float, load_ms: float | None = None) -> dict[str, Any]:
        (name,) = self.servers_of(server)
        for value in (ms, load_ms or 0.0):
            if not 0 <= value <= 600_000:
                raise ConfigError(f"slowdown must be within 0..600000 ms, got {value}")
        await self.agents[name].set_slow(ms, load_ms)
        return {"action": "slow", "server": name, "ms": ms, "load_ms": load_ms, "at": time.time()}

    def _signal(self, server: str, pid: int, sig: signal.Signals) -> None:
        if self._hosts.get(server) not in (None, socket.gethostname()):
            if sig is not signal.SIGKILL:
                raise ServingError(f"server {server!r} runs on another host: only 'kill' reaches it")
            self.agents[server].crash_nowait()
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass  # already dead: the injection has happened
        except PermissionError as exc:
            raise ServingError(f"cannot signal server {server!r} (pid {pid}): {exc}") from exc
