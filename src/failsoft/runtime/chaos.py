"""Failure injection: crash, hang, resume, slow down or break servers, or make one lose a model
(``failsoft chaos``, ``/admin/chaos``).

FailLite injects a server failure by stopping its Triton container (5.1). Here a server *is* its
agent's process, so:

* **kill** sends SIGKILL to it (a crash: power loss, OOM kill). With ``agents.restart`` (the default)
  Ray starts the agent again, empty, like a rebooted server: the controller then restores it;
* **kill a site** kills every server of the site at the same instant (FailLite 5.6), and **kill
  servers** every server of a list (servers of several sites failing together);
* **hang** sends SIGSTOP: the process is alive but silent, and is detected like a crash, by its
  missing heartbeats; **resume** (SIGCONT) brings it back with its models still loaded;
* **slow** adds latency to every inference of a server, and optionally to every model load (a slow
  disk or a remote model repository);
* **break** makes every inference of a server fail while its heartbeats go on (a server that is up
  but cannot serve: a corrupt model, a broken GPU): only the gateway's app-level health sees it;
  ``broken: false`` mends it.
* **evict** makes a server lose one app's model while it lives on and heartbeats (a model runtime
  that crashed, an out-of-memory eviction): the controller learns it from the gateway's next call
  for it or from its periodic inspection, and promotes the app's pinned copy (a HAMS backup) or
  reloads the model in place (``Orchestrator.model_lost``).

Signals are sent from this process when the agent runs on this host (embedded mode); otherwise the
agent is asked to kill itself. Every injection returns the wall time it happened at, so benchmarks
can measure detection from the true failure instant.

A hung agent cannot say its PID, so the last one it said is kept; but a PID is only a number the
kernel hands out again once its process is gone. Before any signal, the process behind a kept PID
must still be the agent that said it (the same start time and executable, as :mod:`psutil` reads
them); otherwise the signal is refused with an error naming what runs there now, and nothing is
sent to an innocent process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from failsoft.domain import Server
from failsoft.errors import ConfigError, ServingError, UnknownNameError
from failsoft.runtime import eventlog
from failsoft.runtime.cluster import AgentRef

START_TIME_TOLERANCE_S = 0.01


@dataclass(frozen=True, slots=True)
class AgentProcess:
    """An agent's process as it was when it last answered: enough to recognise it later."""

    pid: int
    host: str
    started: float | None  # psutil's create_time (None: not on this host, or already gone)
    exe: str | None

    @classmethod
    def of(cls, info: dict[str, Any]) -> AgentProcess:
        pid, host = int(info["pid"]), str(info["hostname"])
        if host != socket.gethostname():
            return cls(pid, host, None, None)
        try:
            proc = psutil.Process(pid)
            return cls(pid, host, proc.create_time(), proc.exe())
        except psutil.Error:
            return cls(pid, host, None, None)

    @property
    def local(self) -> bool:
        return self.host == socket.gethostname()

    def impostor(self) -> str | None:
        """What now runs under this PID if it is not this agent any more; None if it is (or is gone)."""
        try:
            proc = psutil.Process(self.pid)
            started, exe = proc.create_time(), proc.exe()
        except psutil.NoSuchProcess:
            return None  # gone: signalling it is a no-op
        except psutil.Error as exc:
            return f"a process that cannot be inspected ({exc})"
        if self.started is None or abs(started - self.started) > START_TIME_TOLERANCE_S or exe != self.exe:
            return f"{exe} started at {time.strftime('%H:%M:%S', time.localtime(started))}"
        return None


def _record(action: str, servers: list[str], at: float, **extra: Any) -> None:
    """The fault in the run's failure record, if one is kept (:mod:`failsoft.runtime.eventlog`)."""
    eventlog.record({"type": "chaos", "action": action, "servers": servers, "at": at, **extra})


class Chaos:
    def __init__(self, servers: Sequence[Server], agents: dict[str, AgentRef]) -> None:
        self.servers = {s.name: s for s in servers}
        self.agents = agents
        self._procs: dict[str, AgentProcess] = {}
        # processes on a server beside its agent (llm workers, given by the gateway): killed with it
        self.companions: Callable[[str], list[int]] = lambda server: []

    def servers_of(
        self, server: str | None = None, site: str | None = None, servers: Sequence[str] | None = None
    ) -> list[str]:
        """The servers one injection names: one ``server``, a ``site``'s, or a list of ``servers``
        (every name known, none twice: the whole list is refused for one bad name)."""
        if servers is not None:
            unknown = [n for n in servers if n not in self.servers]
            if unknown:
                known = ", ".join(self.servers)
                raise UnknownNameError(
                    f"unknown server(s) {', '.join(map(repr, unknown))} (servers: {known})"
                )
            twice = sorted(n for n, times in Counter(servers).items() if times > 1)
            if twice or not servers:
                raise ConfigError(f"name each server once, at least one (twice: {', '.join(twice) or '-'})")
            return list(servers)
        if site is not None:
            names = [s.name for s in self.servers.values() if s.site == site]
            if not names:
                sites = sorted({s.site for s in self.servers.values()})
                raise UnknownNameError(f"unknown site {site!r} (sites: {', '.join(sites)})")
            return names
        if server is None or server not in self.servers:
            raise UnknownNameError(f"unknown server {server!r} (servers: {', '.join(self.servers)})")
        return [server]

    def remember(self, server: str, info: dict[str, Any]) -> None:
        """Note an agent's process (from its ``info()``): a hung agent cannot tell us later."""
        self._procs[server] = AgentProcess.of(info)

    def forget(self, server: str) -> None:
        """The server's agent was replaced: its old PID means nothing now."""
        self._procs.pop(server, None)

    async def refresh(self, server: str) -> None:
        self.remember(server, await self.agents[server].info(timeout_s=1.0))

    async def _process(self, server: str) -> AgentProcess:
        try:
            await self.refresh(server)
        except ServingError:
            if server not in self._procs:
                raise
        return self._procs[server]

    async def kill(
        self, server: str | None = None, site: str | None = None, servers: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """SIGKILL the agents of ``server``, of a ``site`` or of ``servers``, one right after another
        with nothing between the signals (on a busy 2-core host 1-2 ms apart, up to 12 where the
        first death's reactions take the cores): correlated failures reach the controller as one
        burst."""
        names = self.servers_of(server, site, servers)
        procs = await asyncio.gather(*(self._process(n) for n in names))
        for name, proc in zip(names, procs, strict=True):
            self._check(name, proc)  # all or nothing: no site half killed for one stale PID
        ats: list[float] = []
        for name, proc in zip(names, procs, strict=True):  # checked above: nothing between the kills
            ats.append(time.time())
            self._send(name, proc, signal.SIGKILL)
        killed = [
            {"server": name, "pid": proc.pid, "at": at, "with": self._kill_companions(name)}
            for name, proc, at in zip(names, procs, ats, strict=True)
        ]
        _record("kill", names, ats[0])  # the instant the first one was killed, as returned
        return {"action": "kill", "killed": killed}

    async def hang(self, server: str) -> dict[str, Any]:
        (name,) = self.servers_of(server)
        proc = await self._process(name)
        at = time.time()
        self._signal(name, proc, signal.SIGSTOP)
        _record("hang", [name], at)
        return {"action": "hang", "server": name, "pid": proc.pid, "at": at}

    async def resume(self, server: str) -> dict[str, Any]:
        (name,) = self.servers_of(server)
        if name not in self._procs:
            raise ServingError(f"server {name!r} was not hung by this gateway")
        proc = self._procs[name]
        at = time.time()
        self._signal(name, proc, signal.SIGCONT)
        return {"action": "resume", "server": name, "pid": proc.pid, "at": at}

    async def slow(self, server: str, ms: float, load_ms: float | None = None) -> dict[str, Any]:
        (name,) = self.servers_of(server)
        for value in (ms, load_ms or 0.0):
            if not 0 <= value <= 600_000:
                raise ConfigError(f"slowdown must be within 0..600000 ms, got {value}")
        await self.agents[name].set_slow(ms, load_ms)
        return {"action": "slow", "server": name, "ms": ms, "load_ms": load_ms, "at": time.time()}

    async def break_(self, server: str, broken: bool = True) -> dict[str, Any]:
        (name,) = self.servers_of(server)
        at = time.time()
        await self.agents[name].set_broken(broken)
        _record("break", [name], at, broken=broken)
        return {"action": "break", "server": name, "broken": broken, "at": at}

    async def evict(self, server: str, app: str) -> dict[str, Any]:
        (name,) = self.servers_of(server)
        at = time.time()
        variants = await self.agents[name].evict(app)
        if not variants:
            raise UnknownNameError(f"server {name!r} holds no model of app {app!r}")
        _record("evict", [name], at, app=app, variants=variants)
        return {"action": "evict", "server": name, "app": app, "variants": variants, "at": at}

    def _kill_companions(self, server: str) -> list[int]:
        """SIGKILL the server's other processes on this host (an llm service's workers)."""
        killed = []
        for pid in self.companions(server):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass  # gone already, or not ours to signal
        return killed

    @staticmethod
    def _check(server: str, proc: AgentProcess) -> None:
        """Refuse to signal a PID that now belongs to another process than the server's agent."""
        if not proc.local:
            return
        impostor = proc.impostor()
        if impostor is not None:
            raise ServingError(
                f"server {server!r}: pid {proc.pid} is no longer its agent (it now runs {impostor}); "
                "refusing to signal it"
            )

    def _signal(self, server: str, proc: AgentProcess, sig: signal.Signals) -> None:
        self._check(server, proc)
        self._send(server, proc, sig)

    def _send(self, server: str, proc: AgentProcess, sig: signal.Signals) -> None:
        """The signal itself, to a process :meth:`_check` found to be the server's agent."""
        if not proc.local:
            if sig is not signal.SIGKILL:
                raise ServingError(f"server {server!r} runs on another host: only 'kill' reaches it")
            self.agents[server].crash_nowait()
            return
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass  # already dead: the injection has happened
        except PermissionError as exc:
            raise ServingError(f"cannot signal server {server!r} (pid {proc.pid}): {exc}") from exc
