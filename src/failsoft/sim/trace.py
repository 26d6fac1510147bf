"""An optional log of what happened in a simulated event, for tests that assert exact event logs.

Entries are ``(time_s, kind, app, server, variant)`` in the order SimPy ran them. Kinds: ``crash``,
``detected``, ``plan`` (variant: the policy), ``release`` (a warm backup unloaded to make room),
``load-start``, ``loaded``, ``oom``, ``serving`` (the server serves the app with that variant: a warm
switch, a first or cold variant, an upgrade), ``notified`` (the client can use the new location),
``unloaded``.
Logging is off unless ``SimConfig.trace`` is set, so large sweeps pay nothing for it.
"""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    t: float
    kind: str
    app: str
    server: str
    variant: str


class EventLog:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.entries: list[Entry] = []

    def add(self, t: float, kind: str, app: str, server: str, variant: str) -> None:
        if self.enabled:
            self.entries.append(Entry(round(t, 9), kind, app, server, variant))

    def of_kind(self, kind: str) -> list[Entry]:
        return [e for e in self.entries if e.kind == kind]
