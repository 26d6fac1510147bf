"""LLM workers as member apps of their ``llm`` service: what the core keeps of them.

An ``llm`` service (LUMEN) has N workers, each a process running the engine with its model's
weights and a KV cache of a fixed budget. To the orchestration core each worker is a *member app*
with one placement, like a coded service's parity instance: a server it runs on, and the memory it
takes there (weights, plus the draft's under progressive recovery, plus the KV budget), counted
against that server's capacity beside the models the agents hold. Warm *standbys* (processes
started, imports done, no target) sit on servers of their own; under progressive recovery each holds
the draft already (``standby_mb``, counted on its server like every other load), so that a
draft-first restart drafts at once.

This module is the data (no decisions): :class:`LlmGroup` (one service's shape, frozen),
:class:`LlmWorkerRecord` (one worker's placement and life cycle) and :class:`LlmRecords` (all of
them, with the capacity view, the store's documents and the status). The decisions are
:mod:`failsoft.orchestration.llm`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class LlmPhase(StrEnum):
    """A worker's life cycle: first started, serving its target, failed (a restart under way),
    drafting (restarted with only its draft loaded: LUMEN's progressive recovery)."""

    STARTING = "starting"
    SERVING = "serving"
    FAILED = "failed"
    DRAFT = "draft"


@dataclass(frozen=True, slots=True)
class LlmGroup:
    """One ``llm`` service as the core places it: its workers and their home servers (in order),
    the servers of its standbys, each worker's memory, and whether a restart loads a draft first.

    ``target_load_s`` and ``draft_load_s`` are the worker's measured profile (weights read and
    moved to the device); the simulator's twin of a restart takes them, the runtime ignores them.
    ``standby_mb``: what each standby holds (the draft's weights under ``draft_first``: a standby
    preloads it, and a restart that adopts one loads no draft)."""

    service: str
    workers: tuple[str, ...]
    homes: tuple[str, ...]
    standbys: tuple[str, ...]
    memory_mb: float
    draft_first: bool = False
    target_load_s: float = 0.0
    draft_load_s: float = 0.0
    standby_mb: float = 0.0

    def __post_init__(self) -> None:
        if len(self.workers) != len(self.homes) or not self.workers:
            raise ValueError(f"llm service {self.service!r}: one home server per worker, at least one worker")
        if self.memory_mb <= 0 or min(self.target_load_s, self.draft_load_s, self.standby_mb) < 0:
            raise ValueError(
                f"llm service {self.service!r}: memory_mb must be > 0, standby_mb and load times >= 0"
            )


@dataclass
class LlmWorkerRecord:
    """One worker: where it runs (or is being started), its phase, and the incarnation of the process
    that serves under its name (``pending``: the one being started; a report about another
    incarnation is stale)."""

    service: str
    worker: str
    server: str
    memory_mb: float
    phase: LlmPhase = LlmPhase.STARTING
    incarnation: int = 0
    pending: int | None = None
    home: str = ""  # the server the config placed it on (where a moved worker goes first)
    failed_at: float | None = None  # core time of the failure the restart under way answers
    restarts: int = 0
    issued: int = 0  # the last incarnation a start was asked for (each attempt gets a new one)

    @property
    def holds_memory(self) -> bool:
        """A failed worker whose restart has not begun holds nothing; every other is counted."""
        return self.phase is not LlmPhase.FAILED or self.pending is not None

    def to_doc(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "worker": self.worker,
            "server": self.server,
            "memory_mb": self.memory_mb,
            "phase": self.phase.value,
            "incarnation": self.incarnation,
            "restarts": self.restarts,
        }


@dataclass
class LlmRecords:
    """Every ``llm`` service's workers and standbys, keyed by ``(service, worker)``."""

    groups: dict[str, LlmGroup] = field(default_factory=dict)
    workers: dict[tuple[str, str], LlmWorkerRecord] = field(default_factory=dict)
    standbys: dict[str, list[str]] = field(default_factory=dict)  # service -> servers, one per standby

    def of(self, service: str) -> list[LlmWorkerRecord]:
        return [r for (s, _), r in self.workers.items() if s == service]

    def used_mb(self, server: str) -> float:
        """The memory ``server``'s workers (those starting there included) and standbys take."""
        return self.taken().get(server, 0.0)

    def taken(self) -> dict[str, float]:
        """Memory taken per server (workers and standbys), for the failover policies' view of
        capacity."""
        out: dict[str, float] = {}
        for r in self.workers.values():
            if r.holds_memory:
                out[r.server] = out.get(r.server, 0.0) + r.memory_mb
        for service, servers in self.standbys.items():
            each = self.groups[service].standby_mb if service in self.groups else 0.0
            for server in servers if each > 0 else ():
                out[server] = out.get(server, 0.0) + each
        return out

    def to_docs(self) -> dict[str, dict[str, Any]]:
        return {f"{s}/{w}": r.to_doc() for (s, w), r in self.workers.items()}

    def load_docs(self, docs: Mapping[str, Mapping[str, Any]], servers: set[str]) -> None:
        """What a previous controller stored: kept for status until the services are placed again
        (their processes died with that controller)."""
        for doc in docs.values():
            if doc.get("server") in servers:
                rec = LlmWorkerRecord(
                    str(doc["service"]),
                    str(doc["worker"]),
                    str(doc["server"]),
                    float(doc["memory_mb"]),
                    LlmPhase(doc.get("phase", "starting")),
                    int(doc.get("incarnation", 0)),
                    restarts=int(doc.get("restarts", 0)),
                )
                self.workers.setdefault((rec.service, rec.worker), rec)

    def status(self) -> list[dict[str, Any]]:
        """One row per worker, for ``failsoft status``."""
        return [
            {
                "service": r.service,
                "worker": r.worker,
                "server": r.server,
                "phase": r.phase.value,
                "incarnation": r.incarnation,
                "memory_mb": round(r.memory_mb, 3),
                "restarts": r.restarts,
            }
            for r in self.workers.values()
        ]


__all__ = ["LlmGroup", "LlmPhase", "LlmRecords", "LlmWorkerRecord"]
