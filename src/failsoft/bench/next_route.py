"""``bench failover``'s in-flight column: how long a request that met a killed server took to be on
its next route, per request, from the gateway's own record of each move (``/admin/recoveries``,
``moves``: :class:`~failsoft.runtime.gateway.dispatch.Move`).

A request *meets* a killed server when its call there failed (it was in flight at the kill, or
sent there before the gateway saw the connection end) or when the gateway did not send it there
because the connection had ended already. For each, measured from the kill, or from the request's
arrival at the gateway when it came later (it cannot be sent before it came):

* ``next_route_ms``: until its call on the next route was sent (the issue's target: 10 ms);
* ``answer_ms``: until that call's answer (adds the answering server's queue and inference);

and its timeline from the kill (``timeline_ms``: ``arrived`` at the gateway, negative when in
flight at the kill; ``connection_end`` seen by the gateway; ``call_failed`` on the dead server;
``route_published`` by the controller and ``route_seen`` by the gateway's mirror, when the next
route was the controller's; ``sent``; ``answered``), which shows where the time goes. ``via`` says
how the next route was found: ``backup`` (a warm backup the gateway chose from its mirror, before
the controller's route), ``replica``, or ``route`` (the controller's new route).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

WHAT = (
    "requests that met a killed server (in flight on it, or sent while their route still named "
    "it): from the kill, or their arrival if later, to their call on the next route (next_route_ms) "
    "and to its answer (answer_ms); timeline_ms: p50 of each step from the kill"
)
STEPS = (
    ("arrived", "started_at"),
    ("connection_end", "lost_at"),
    ("call_failed", "failed_at"),
    ("route_published", "route_at"),
    ("route_seen", "route_seen_at"),
    ("sent", "sent_at"),
    ("answered", "answered_at"),
)


def moved_requests(
    moves: Sequence[Mapping[str, Any]], kill_at: Mapping[str, float], affected: Collection[str]
) -> list[dict[str, Any]]:
    """One row per move of an affected app off a killed server after its kill (wall-clock times)."""
    rows = []
    for move in moves:
        kill = kill_at.get(move["left"])
        if kill is None or move["app"] not in affected or move["sent_at"] < kill:
            continue
        since = max(kill, move["started_at"])
        timeline = {step: _ms(move.get(key), kill) for step, key in STEPS}
        rows.append(
            {
                "app": move["app"],
                "via": move["via"],
                "in_flight_at_kill": move["started_at"] <= kill,
                "next_route_ms": round((move["sent_at"] - since) * 1000.0, 2),
                "answer_ms": round((move["answered_at"] - since) * 1000.0, 2),
                "timeline_ms": {k: v for k, v in timeline.items() if v is not None},
            }
        )
    return rows


def summarize_moves(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """p50 and max of ``next_route_ms`` and ``answer_ms`` over the rows (every run's), the p50 of
    each timeline step, and how the next routes were found."""
    steps = {
        step: _p50([r["timeline_ms"][step] for r in rows if step in r["timeline_ms"]]) for step, _ in STEPS
    }
    return {
        "measures": WHAT,
        "requests": len(rows),
        "in_flight_at_kill": sum(1 for r in rows if r["in_flight_at_kill"]),
        "via": dict(sorted(Counter(r["via"] for r in rows).items())),
        "next_route_ms": _stats([r["next_route_ms"] for r in rows]),
        "answer_ms": _stats([r["answer_ms"] for r in rows]),
        "timeline_ms": {k: v for k, v in steps.items() if v is not None},
        # an app with a loaded copy elsewhere can move at the connection's end; one recovered by a
        # load has no next route until its load ends (its recovery, not the signal's trip): apart
        "next_route_ms_by_app": _grouped(rows, "app"),
        "next_route_ms_by_via": _grouped(rows, "via"),
    }


def _grouped(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(str(r[key]), []).append(r["next_route_ms"])
    return {name: {"requests": len(v), **_stats(v)} for name, v in sorted(groups.items())}


def _ms(t: float | None, since: float) -> float | None:
    return None if t is None else round((t - since) * 1000.0, 2)


def _p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def _stats(values: list[float]) -> dict[str, float | None]:
    return {"p50": _p50(values), "max": round(max(values), 1) if values else None}
