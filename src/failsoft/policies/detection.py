"""Failure detection from pushed heartbeats: a small, pure state machine (FailLite 4).

Each server's agent pushes a heartbeat every ``interval_s``; the controller declares the server
failed when ``missed_to_fail`` consecutive heartbeats are missing (FailLite: 20 ms, two missed).
A server is ``suspect`` after one missed heartbeat, ``failed`` after ``missed_to_fail``, and
``recovering`` when heartbeats come back from a failed server, until the runtime calls
:meth:`HeartbeatDetector.mark_up` once its models are reloaded. A hung agent (alive but silent)
looks exactly like a crashed one: it stops heartbeating.

Heartbeats say a server's process lives, not that it answers. A server that heartbeats but fails
every inference (a broken device, a wedged serving engine) is caught by *app-level health*: the
gateway feeds each route's outcomes to a :class:`RouteHealth`, which gives a verdict after
``errors_to_fail`` consecutive errors on a server with no success between them (timeouts are
overload, not failure, and never count); the
controller then quarantines the server (:meth:`~HeartbeatDetector.quarantine`): failed at once (its apps fail
over as after a crash), and its heartbeats ignored for ``quarantine_s`` so that it does not come
straight back; after that, or when it restarts, it recovers as a failed server does.

**A second signal.** Where the gateway keeps a connection to a server's agent (the runtime's data
plane), the connection tells a late heartbeat from a dead process: a killed process's kernel ends
the connection at once (:meth:`HeartbeatDetector.link` with ``up=False``: failed now, without
waiting for missed heartbeats), and while the connection is known up, a heartbeat silence is held
as ``suspect`` for ``link_grace_s`` past the threshold before it counts as a failure (heartbeats
late behind a busy host come back within it; a process that is stopped or unreachable also loses
its connection, or stays silent past the grace). With no connection known, heartbeats decide alone.

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

    def __init__(
        self,
        interval_s: float = 0.020,
        missed_to_fail: int = 2,
        pause_grace: bool = False,
        link_grace_s: float = 0.0,
    ) -> None:
        """``link_grace_s``: how much longer than the threshold a server whose connection is known
        up may be silent before it is failed (see the module's "second signal").

        ``pause_grace``: after a check that came later than the failure threshold (the observer
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
        if link_grace_s < 0:
            raise ValueError(f"link_grace_s must not be negative, got {link_grace_s}")
        self.interval_s = interval_s
        self.missed_to_fail = missed_to_fail
        self.pause_grace = pause_grace
        self._last: dict[str, float] = {}
        self._state: dict[str, ServerState] = {}
        self._last_check: float | None = None
        self._hold_until = float("-inf")
        self._quarantined: dict[str, float] = {}  # server -> until when its heartbeats are ignored
        self.link_grace_s = link_grace_s
        self._linked: set[str] = set()  # servers whose connection is known up

    def register(self, server: str, now: float) -> None:
        """Start watching ``server`` as up, as if it had just sent a heartbeat."""
        self._last[server] = now
        self._state[server] = ServerState.UP

    def forget(self, server: str) -> None:
        self._linked.discard(server)
        self._last.pop(server, None)
        self._state.pop(server, None)
        self._quarantined.pop(server, None)

    def quarantine(self, server: str, now: float, until: float) -> HealthChange | None:
        """App-level verdict: ``server`` heartbeats but does not serve. Failed now (None when it
        already was), and its heartbeats do not make it recovering before ``until``."""
        if server not in self._state:
            raise KeyError(f"quarantine of unregistered server {server!r}")
        self._quarantined[server] = until
        if self._state[server] in (ServerState.FAILED, ServerState.RECOVERING):
            return (
                None
                if self._state[server] is ServerState.FAILED
                else self._set(server, ServerState.FAILED, now)
            )
        return self._set(server, ServerState.FAILED, now)

    def link(self, server: str, up: bool, now: float) -> HealthChange | None:
        """The second signal: ``server``'s connection is up, or it ended (its process is gone):
        failed now unless it already was (None then, and for ``up``)."""
        if server not in self._state:
            raise KeyError(f"link of unregistered server {server!r}")
        if up:
            self._linked.add(server)
            return None
        self._linked.discard(server)
        if self._state[server] in (ServerState.UP, ServerState.SUSPECT):
            return self._set(server, ServerState.FAILED, now)
        return None

    def linked(self, server: str) -> bool:
        return server in self._linked

    def release(self, server: str) -> None:
        """End ``server``'s quarantine (it restarted: a fresh process deserves a fresh look)."""
        self._quarantined.pop(server, None)

    def quarantined(self, server: str, now: float) -> bool:
        return self._quarantined.get(server, float("-inf")) > now

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
        if old is ServerState.FAILED and not self.quarantined(server, now):
            self._quarantined.pop(server, None)
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
        if not self._last or now - min(self._last.values()) <= self.interval_s:
            return []  # nobody silent for an interval: no state can change (the common case, cheap)
        changes = []
        for server, last in self._last.items():
            state = self._state[server]
            if state in (ServerState.FAILED, ServerState.RECOVERING):
                if state is ServerState.RECOVERING and now - last > self.missed_to_fail * self.interval_s:
                    changes.append(self._set(server, ServerState.FAILED, now))
                continue
            silent = now - last
            if silent > self._limit(server):
                changes.append(self._set(server, ServerState.FAILED, now))
            elif silent > self.interval_s and state is ServerState.UP:
                changes.append(self._set(server, ServerState.SUSPECT, now))
        changes.sort(key=lambda c: c.new is not ServerState.FAILED)
        return changes

    def _limit(self, server: str) -> float:
        """How long ``server`` may be silent before it is failed."""
        threshold = self.missed_to_fail * self.interval_s
        return threshold + self.link_grace_s if server in self._linked else threshold

    def next_deadline(self, now: float) -> float:
        """The earliest time a check could change a state (for event-driven checkers)."""
        deadlines = [
            last + (self.interval_s if self._state[s] is ServerState.UP else self._limit(s))
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


# How the dispatchers word a call that ran out of time (``DispatchContext.outcome``'s ``error``): the
# gateway's own "no answer within the deadline", or the agent's queue's DeadlineExceededError.
TIMEOUT_WORDS = ("no answer within the deadline", "DeadlineExceededError", "TimeoutError")


def is_timeout(error: str) -> bool:
    """Whether a failed call's ``error`` says it ran out of time (rather than failed)."""
    return error.startswith(TIMEOUT_WORDS)


class RouteHealth:
    """Consecutive failed inferences per server, as the gateway sees them: a verdict at a threshold.

    Only the server's own errors count (an exception it raised while serving: ``chaos break``, a
    broken device); a refusal or a drop by the server's queue (back-pressure), a client's bad input
    or a model unloaded under the request do not (the gateway's one call primitive,
    ``runtime/gateway/dispatch/calls.py``, applies this rule for every dispatcher). A success clears
    the count. The verdict is given once per run of errors; the count restarts after it.

    **Timeouts are overload, not failure.** A server whose requests miss their deadline while its
    heartbeats arrive is busy: its queue admits what it can finish and refuses the rest (503 with
    ``Retry-After``), and calls that still run out of time (a short deadline, time lost on the way
    to the agent) say the server is behind, not broken. Counting them once failed the only live
    server of an app under a burst (ResNet-18 at 32 clients: ten timeouts in a row, a failover with
    nowhere to go, 503 for every request after). So timeouts neither count towards the verdict nor
    clear it; they are counted apart (:meth:`timeouts`). A process that hangs is caught by its
    heartbeats (the agent's liveness stamp stops them); a serving engine that wedges while the
    process runs fills its queue, which then refuses at once.
    """

    def __init__(self, errors_to_fail: int = 10) -> None:
        if errors_to_fail < 1:
            raise ValueError(f"errors_to_fail must be at least 1, got {errors_to_fail}")
        self.errors_to_fail = errors_to_fail
        self._errors: dict[str, int] = {}
        self._timeouts: dict[str, int] = {}

    def record(self, server: str, ok: bool, error: str = "") -> bool:
        """One outcome on ``server`` (``error``: the dispatcher's words); True when it makes the
        server unhealthy."""
        if ok:
            self._errors.pop(server, None)
            return False
        if is_timeout(error):
            self._timeouts[server] = self._timeouts.get(server, 0) + 1
            return False
        count = self._errors.get(server, 0) + 1
        if count >= self.errors_to_fail:
            self._errors.pop(server, None)
            return True
        self._errors[server] = count
        return False

    def errors(self, server: str) -> int:
        return self._errors.get(server, 0)

    def timeouts(self, server: str) -> int:
        """Calls to ``server`` that ran out of time, ever (overload: never a verdict)."""
        return self._timeouts.get(server, 0)
