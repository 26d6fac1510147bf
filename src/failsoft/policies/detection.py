"""Failure detection from pushed heartbeats: a small, pure state machine (FailLite 4).

Each server's agent pushes a heartbeat every ``interval_s``; the controller declares the server
failed when ``missed_to_fail`` consecutive heartbeats are missing (FailLite: 20 ms, two missed).
A server is ``suspect`` after one missed heartbeat, ``failed`` after ``missed_to_fail``, and
``recovering`` when heartbeats come back from a failed server, until the runtime calls
:meth:`HeartbeatDetector.mark_up` once its models are reloaded. A hung agent (alive but silent)
looks exactly like a crashed one: it stops heartbeating.

The detector keeps no clock: every call takes ``now`` (seconds) from the caller's
:class:`~failsoft.clock.Clock`, so the runtime and the simulator run the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

from failsoft.domain import ServerState


@dataclass(frozen=True, slots=True)
class HealthChange:
    """A server's state changed; ``at`` is when the change is deemed to have happened."""

    server: str
    old: ServerState
    new: ServerState
    at: float
    last_heartbeat: float


class HeartbeatDetector:
    """Health of every registered server, from heartbeats and periodic checks."""

    def __init__(self, interval_s: float = 0.020, missed_to_fail: int = 2, pause_grace: bool = False) -> None:
        """``pause_grace``: after a check that came later than the failure threshold (the observer
        itself was paused), verdicts wait one more interval.

        A pause of the whole machine (a stalled VM, a stopped container) also stops the senders; on
        resume the observer may read one sender's fresh heartbeat before the others have run, and
        would then call all the others failed. One interval is enough for every sender to speak;
        a real failure is then detected that much later, and only after such a pause. Checkers that
        check sparsely on purpose (event-driven simulators) leave it off.
        """
        if interval_s <= 0:
            raise ValueError(f"heartbeat interval must be positive, got {interval_s}")
        if missed_to_fail < 1:
            raise ValueError(f"missed_to_fail must be at least 1, got {missed_to_fail}")
        self.interval_s = interval_s
        self.missed_to_fail = missed_to_fail
        self.pause_grace = pause_grace
        self._last: dict[str, float] = {}
        self._state: dict[str, ServerState] = {}
        self._last_check: float | None = None
        self._hold_until = float("-inf")

    def register(self, server: str, now: float) -> None:
        """Start watching ``server`` as up, as if it had just sent a heartbeat."""
        self._last[server] = now
        self._state[server] = ServerState.UP

    def forget(self, server: str) -> None:
        self._last.pop(server, None)
        self._state.pop(server, None)

    def state(self, server: str) -> ServerState:
        return self._state[server]

    def states(self) -> dict[str, ServerState]:
        return dict(self._state)

    def last_heartbeat(self, server: str) -> float:
        return self._last[server]

    def heartbeat(self, server: str, now: float) -> HealthChange | None:
        """Record a heartbeat. A failed server that speaks again becomes ``recovering``."""
        if server not in self._state:
            raise KeyError(f"heartbeat from unregistered server {server!r}")
        self._last[server] = max(self._last[server], now)
        old = self._state[server]
        if old is ServerState.SUSPECT:
            return self._set(server, ServerState.UP, now)
        if old is ServerState.FAILED:
            return self._set(server, ServerState.RECOVERING, now)
        return None

    def check(self, now: float) -> list[HealthChange]:
        """Advance every server's state to ``now``; returns the changes, failures first."""
        threshold = self.missed_to_fail * self.interval_s
        if self.pause_grace and self._last_check is not None and now - self._last_check > threshold:
            self._hold_until = now + self.interval_s
        self._last_check = now if self._last_check is None else max(self._last_check, now)
        if now < self._hold_until:
            return []
        changes = []
        for server, last in self._last.items():
            state = self._state[server]
            if state in (ServerState.FAILED, ServerState.RECOVERING):
                if state is ServerState.RECOVERING and now - last > self.missed_to_fail * self.interval_s:
                    changes.append(self._set(server, ServerState.FAILED, now))
                continue
            silent = now - last
            if silent > self.missed_to_fail * self.interval_s:
                changes.append(self._set(server, ServerState.FAILED, now))
            elif silent > self.interval_s and state is ServerState.UP:
                changes.append(self._set(server, ServerState.SUSPECT, now))
        changes.sort(key=lambda c: c.new is not ServerState.FAILED)
        return changes

    def next_deadline(self, now: float) -> float:
        """The earliest time a check could change a state (for event-driven checkers)."""
        deadlines = [
            last
            + (self.interval_s if self._state[s] is ServerState.UP else self.missed_to_fail * self.interval_s)
            for s, last in self._last.items()
            if self._state[s] is not ServerState.FAILED
        ]
        return min(deadlines, default=now + self.interval_s)

    def mark_up(self, server: str, now: float) -> HealthChange | None:
        """A recovering server is serving again."""
        if self._state[server] is ServerState.RECOVERING:
            return self._set(server, ServerState.UP, now)
        return None

    def _set(self, server: str, new: ServerState, now: float) -> HealthChange:
        old = self._state[server]
        self._state[server] = new
        return HealthChange(server, old, new, now, self._last[server])
