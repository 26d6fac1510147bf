"""Coding groups: which queries are coded together, and when a group's answers are complete.

**Forming groups** (ParM section 4.1). Queries join coding groups in arrival order, whoever sent
them; a group is complete at k queries. As in the paper, a data query is never delayed by coding:
the caller dispatches it to its data instance as soon as it joins (its :class:`Slot` says which
group and member index it has), and only the parity queries wait for the group to fill. The public
code (Clipper's ``ModelQueue``) waits for the k-th query without bound; failsoft closes a group that
has waited its fill timeout since its first query: with the ``rate`` policy (the default of a coded
service, :mod:`failsoft.policies.coding.fill`) the time in which k - 1 more queries arrive with
probability 0.99 at the current arrival rate, at most ``fill_timeout_ms`` (``CodedParams``); with
``fixed``, ``fill_timeout_ms`` itself. The timeout is set when the group opens. **A partial group is
released uncoded**: its queries were dispatched already and are answered by their data instances
alone; no parity query is made (the parity models are trained on k-query parities only, so a
zero-padded parity would be out of their training distribution) and no reconstruction is possible
for them. So no query is ever held, and a trickle of requests costs no accuracy, only protection.

:class:`GroupFormer` keeps one open group per *shape* (queries of different shapes, e.g. batches of
different sizes, cannot be encoded together). Time is passed in (``now_s``); the driver calls
:meth:`GroupFormer.poll` at :meth:`GroupFormer.next_timeout_s` (a timer in the gateway, a SimPy
timeout in the simulator) and :meth:`GroupFormer.join` on each arrival.

**Tracking answers** (section 4.1, "first k of k+r"). :class:`AnswerTracker` follows one complete
group: each member's answer (or loss) is reported as it comes; as soon as any k of the k+r are
present it decodes every missing data output, and it says which members' work is no longer needed:
the stragglers to cancel (the still-running data members once decoded, or every parity member once
all k data answers are in). A driver may create a group's tracker when the group opens (its first
:class:`Slot` has index 0) and report data answers that come back while the group is still filling:
nothing decodes before a parity answer, which only exists once the group is complete. The tracker
of a group released uncoded is simply dropped.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failsoft.errors import ConfigError
from failsoft.policies.coding.fill import FillTimeout
from failsoft.policies.coding.interface import Decoder, check_code, check_member


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a query sits: coding group ``group``, data member ``index`` (0..k-1)."""

    group: int
    index: int


@dataclass(frozen=True, slots=True)
class Group:
    """A closed coding group. ``complete``: k queries, to be encoded; else released uncoded."""

    id: int
    keys: tuple[Any, ...]
    shape: Hashable
    opened_s: float
    closed_s: float
    complete: bool


@dataclass(slots=True)
class _Open:
    id: int
    shape: Hashable
    opened_s: float
    due_s: float
    keys: list[Any] = field(default_factory=list)


class GroupFormer:
    """Queries in arrival order into groups of k, a partial group released at its fill timeout.

    ``fill``: ``"fixed"`` (every group waits ``fill_timeout_ms``) or ``"rate"`` (at most that long,
    less at higher arrival rates: :class:`~failsoft.policies.coding.fill.FillTimeout`).
    """

    def __init__(self, k: int, fill_timeout_ms: float, fill: str = "fixed") -> None:
        self.k, _ = check_code(k, 1)
        if not (isinstance(fill_timeout_ms, (int, float)) and 0 < fill_timeout_ms <= 10_000):
            raise ConfigError(f"fill_timeout_ms must be in (0, 10000]; got {fill_timeout_ms!r}")
        self.fill_timeout_s = float(fill_timeout_ms) / 1000.0  # the longest any group waits
        self.fill = FillTimeout(self.k, fill_timeout_ms, fill)
        self._open: dict[Hashable, _Open] = {}
        self._next_id = 0

    def join(self, key: Any, now_s: float, shape: Hashable = None) -> tuple[Slot, tuple[Group, ...]]:
        """Place query ``key``; returns its slot and the groups this closes (timed-out ones first)."""
        closed = list(self.poll(now_s))
        self.fill.arrived(now_s)
        group = self._open.get(shape)
        if group is None:
            group = self._open[shape] = _Open(self._next_id, shape, now_s, now_s + self.fill.timeout_s())
            self._next_id += 1
        group.keys.append(key)
        slot = Slot(group.id, len(group.keys) - 1)
        if len(group.keys) == self.k:
            closed.append(self._close(group, now_s, complete=True))
        return slot, tuple(closed)

    def poll(self, now_s: float) -> tuple[Group, ...]:
        """The open groups whose fill timeout has passed by ``now_s``, released uncoded."""
        due = [g for g in self._open.values() if now_s >= g.due_s]
        return tuple(self._close(g, now_s, complete=False) for g in sorted(due, key=lambda g: g.id))

    def flush(self, now_s: float) -> tuple[Group, ...]:
        """Release every open group uncoded (shutting down, or the service is being changed)."""
        return tuple(
            self._close(g, now_s, complete=False) for g in sorted(self._open.values(), key=lambda g: g.id)
        )

    def next_timeout_s(self) -> float | None:
        """When the oldest open group times out; ``None`` when no group is open."""
        if not self._open:
            return None
        return min(g.due_s for g in self._open.values())

    @property
    def waiting(self) -> int:
        """Queries in open groups."""
        return sum(len(g.keys) for g in self._open.values())

    def _close(self, group: _Open, now_s: float, complete: bool) -> Group:
        del self._open[group.shape]
        return Group(group.id, tuple(group.keys), group.shape, group.opened_s, now_s, complete)


@dataclass(frozen=True, slots=True)
class Progress:
    """What one report to :class:`AnswerTracker` changed.

    ``decoded``: data outputs reconstructed now (member index to output); ``cancel``: members whose
    answers are no longer needed (cancel their queued or running work); ``done``: every data output
    is now known, or can never be (``unrecoverable`` names the data members lost for good).
    """

    decoded: dict[int, np.ndarray] = field(default_factory=dict)
    cancel: tuple[int, ...] = ()
    done: bool = False
    unrecoverable: tuple[int, ...] = ()


_NOTHING = Progress()  # a report that changed nothing (shared; never written to)
_DONE = Progress(done=True)  # a report to a finished group (shared; never written to)


class AnswerTracker:
    """The answers of one complete coding group: decode from the first k of k+r, cancel the rest.

    Lean per answer (it runs on the gateway's event loop for every answer, and the decoding one is
    timed as the service's decode): each answer's member index and shape are checked as it comes,
    so once k answers are present the decoder's unchecked :meth:`Decoder.solve` is called directly,
    once; a report that changes nothing returns a shared empty :class:`Progress`.
    """

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self.k, self.r = decoder.k, decoder.r
        self._members = self.k + self.r
        self.outputs: dict[int, np.ndarray] = {}
        self.lost: set[int] = set()
        self.reconstructed: dict[int, np.ndarray] = {}
        self.done = False
        self._data = 0  # data answers present
        self._shape: tuple[int, ...] | None = None  # every answer's shape: the first one's

    @property
    def pending(self) -> tuple[int, ...]:
        """Members neither answered nor lost."""
        return tuple(i for i in range(self.k + self.r) if i not in self.outputs and i not in self.lost)

    def answered(self, index: int, output: np.ndarray) -> Progress:
        """Member ``index`` answered. A data answer goes to its client at once (not through here)."""
        if not (type(index) is int and 0 <= index < self._members):
            index = self._check(index)
        outputs = self.outputs
        if self.done or index in outputs or index in self.lost:
            return _DONE if self.done else _NOTHING
        if type(output) is not np.ndarray:
            output = np.asarray(output)
        if self._shape is None:
            self._shape = output.shape
        elif output.shape != self._shape:
            raise ConfigError(f"output of member {index} has shape {output.shape}; others have {self._shape}")
        outputs[index] = output
        if index < self.k:
            self._data += 1
            if self._data == self.k:  # nothing to decode: the parity calls are stragglers
                self.done = True
                return Progress(cancel=self.pending, done=True)
        if len(outputs) < self.k:  # an answer never makes k answers impossible: no loss check
            return _NOTHING
        return self._decode()

    def failed(self, index: int) -> Progress:
        """Member ``index`` will never answer (its server failed, its call errored)."""
        index = self._check(index)
        if self.done or index in self.outputs:
            return _DONE if self.done else _NOTHING
        self.lost.add(index)
        if len(self.outputs) >= self.k:
            return self._decode()
        if len(self.outputs) + len(self.pending) < self.k:  # k answers will never be present
            self.done = True
            gone = tuple(i for i in range(self.k) if i not in self.outputs and i in self.lost)
            return Progress(
                cancel=tuple(i for i in self.pending if i >= self.k), done=True, unrecoverable=gone
            )
        return _NOTHING

    def _decode(self) -> Progress:
        """At least k answers, not all k data ones: the missing data outputs, the rest cancelled."""
        outputs = self.outputs
        missing = [i for i in range(self.k) if i not in outputs]
        self.reconstructed = decoded = self.decoder.solve(outputs, missing)
        self.done = True
        return Progress(decoded=decoded, cancel=self.pending, done=True)

    def _check(self, index: object) -> int:
        return check_member(index, self.k, self.r)
