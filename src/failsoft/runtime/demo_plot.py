"""The demo's latency plot: the whole run, and a zoom on the failover.

At the scale of the whole run (tens of seconds) a 1 ms route switch and a ~100 ms client outage are
invisible, so the figure has two panels:

* **the whole run**: every answer's latency at the time it was sent, with the kill, the detection,
  the ``server_up`` event (the restarted agent heard again, not the restart request) and the first
  restore marked;
* **the failover**, a few hundred milliseconds around the kill, in milliseconds since the kill: the
  detection and each app's failover (and upgrade) as they happened, from the controller's events.

Answers by a smaller variant than the app's primary (``degraded``: FailLite's accuracy-for-
availability trade) are drawn apart from the others, so the time a warm backup or a progressive
stand-in served is visible; failed requests are crosses. :func:`layout` decides what goes where
(pure, tested on synthetic samples); :func:`draw` only draws it.

The shaded span from the restart request to ``server_up`` is the killed server's new agent process
starting: Ray starts a worker, which imports Python, Ray and torch and loads nothing yet (3-4 s at
most of a core on the 2-core development machine), and Ray's actor creation runs in the demo's own
process, beside the gateway's thread. Every app's latency rises while it lasts, most at its start;
that is the machine being shared, not the failover (measured with a per-process CPU sampler: the
worker at 60-80 % of a core through the span, the demo process at 80 % for ~100 ms at its start).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from failsoft.runtime.loadgen import Sample

ZOOM_BEFORE_S = 0.1  # the zoom starts this long before the kill
ZOOM_AFTER_S = 0.15  # ... and ends this long after the last answer or event of the failover
ZOOM_MIN_S, ZOOM_MAX_S = 0.3, 2.0  # its length after the kill stays within these


@dataclass(frozen=True)
class Line:
    """A vertical line at a moment (wall time) with its legend label."""

    at: float
    label: str
    colour: str
    style: str = "--"


@dataclass(frozen=True)
class Points:
    """One kind of answer: ``(sent wall time, latency ms)`` pairs with how to draw them."""

    label: str
    colour: str
    marker: str
    size: float
    xy: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Layout:
    """What the figure shows: the points, the lines of each panel, and the zoom's window."""

    start: float  # wall time of the whole run's origin
    kill: float
    killed: str
    points: tuple[Points, ...]
    lines: tuple[Line, ...]  # whole-run panel
    zoom_lines: tuple[Line, ...]
    zoom: tuple[float, float]  # wall times
    restarting: tuple[float, float] | None = None  # restart request to server_up: a new agent starts
    notes: tuple[str, ...] = field(default=())  # per affected app: its first answer after the kill


def layout(
    samples: Sequence[Sample],
    events: Sequence[dict[str, Any]],
    marks: dict[str, float],
    killed: str,
    affected: Iterable[str],
) -> Layout:
    """Place the answers and the events: which panel shows what, and the zoom window."""
    kill = marks["kill"]
    mine = [e for e in events if e["timestamp"] >= kill - 0.5]
    detected = _first(
        e.get("detected_at") for e in mine if e["type"] == "failure" and e.get("server") == killed
    )
    up = _first(e["timestamp"] for e in mine if e["type"] == "server_up" and e.get("server") == killed)
    restore = _first(e["timestamp"] for e in mine if e["type"] == "restore")
    moves = [e for e in mine if e["type"] in ("failover", "upgrade") and (up is None or e["timestamp"] < up)]

    whole = [Line(kill, f"{killed} killed", "#d1495b")]
    if detected is not None:
        whole.append(Line(detected, "failure detected", "#ef8a17", ":"))
    if up is not None:
        whole.append(Line(up, f"{killed} up again (server_up)", "#2e8540"))
    if restore is not None:
        whole.append(Line(restore, "apps restored to their primaries", "#3066be", ":"))
    zoom_lines = [Line(kill, f"{killed} killed", "#d1495b")]
    if detected is not None:
        zoom_lines.append(Line(detected, f"detected (+{(detected - kill) * 1000:.0f} ms)", "#ef8a17", ":"))
    for e in moves:
        zoom_lines.append(
            Line(e["timestamp"], f"{e['type']} {e['app']} -> {e['server']}/{e['variant']}", *_style(e))
        )
    firsts = _first_answers(samples, affected, kill, killed)
    return Layout(
        start=marks["start"],
        kill=kill,
        killed=killed,
        points=_groups(samples, set(affected)),
        lines=tuple(whole),
        zoom_lines=tuple(zoom_lines),
        zoom=_window(kill, [*firsts.values(), *(e["timestamp"] for e in moves)]),
        restarting=(marks["revive"], up) if "revive" in marks and up is not None else None,
        notes=tuple(
            f"{app}: answered again {(at - kill) * 1000:.0f} ms after the kill" for app, at in firsts.items()
        ),
    )


def _first_answers(
    samples: Sequence[Sample], affected: Iterable[str], kill: float, killed: str
) -> dict[str, float]:
    """Each affected app's first answer from another server after the kill (wall time)."""
    out = {}
    for app in affected:
        done = [s.done for s in samples if s.app == app and s.ok and s.server != killed and s.done > kill]
        if done:
            out[app] = min(done)
    return out


def _first(values: Iterable[float | None]) -> float | None:
    return min((v for v in values if v is not None), default=None)


def _style(event: dict[str, Any]) -> tuple[str, str]:
    return ("#2e8540", "-.") if event["type"] == "failover" else ("#17a2b8", ":")


def _groups(samples: Sequence[Sample], affected: set[str]) -> tuple[Points, ...]:
    def xy(keep: Any) -> tuple[tuple[float, float], ...]:
        return tuple((s.sent, s.latency_ms) for s in samples if keep(s))

    return (
        Points(
            "other apps", "#9aa5b1", "o", 6, xy(lambda s: s.ok and not s.degraded and s.app not in affected)
        ),
        Points(
            "apps on the killed server",
            "#d1495b",
            "o",
            8,
            xy(lambda s: s.ok and not s.degraded and s.app in affected),
        ),
        Points("answered by a smaller variant", "#ef8a17", "^", 14, xy(lambda s: s.ok and s.degraded)),
        Points("failed requests", "black", "x", 18, xy(lambda s: not s.ok)),
    )


def _window(kill: float, moments: Iterable[float]) -> tuple[float, float]:
    """From just before the kill to just after the failover's answers and events (within bounds):
    where the switch and the outage are visible."""
    last = max([kill, *(t for t in moments if t < kill + ZOOM_MAX_S)])
    length = min(max(last - kill + ZOOM_AFTER_S, ZOOM_MIN_S), ZOOM_MAX_S)
    return kill - ZOOM_BEFORE_S, kill + length


def draw(plan: Layout, path: Path, title: str) -> Path:
    """Draw a :class:`Layout` into a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (whole, zoom) = plt.subplots(2, 1, figsize=(11, 8.5), gridspec_kw={"height_ratios": [1, 1.1]})
    _panel(whole, plan, plan.lines, plan.start, 1.0, None)
    whole.set_xlabel("time since start (s)")
    whole.set_title(title)
    lo, hi = plan.zoom
    _panel(zoom, plan, plan.zoom_lines, plan.kill, 1000.0, (lo, hi))
    zoom.set_xlabel("time since the kill (ms); requests plotted when sent")
    zoom.set_title("the failover, zoomed" + "".join(f"\n{note}" for note in plan.notes), fontsize=10)
    whole.axvspan(lo - plan.start, hi - plan.start, color="#f2e6a7", alpha=0.6, lw=0, label="zoomed below")
    if plan.restarting is not None:
        began, up = (t - plan.start for t in plan.restarting)
        label = f"{plan.killed} restarting: its new agent process starts beside the others"
        whole.axvspan(began, up, color="#cfe8d5", alpha=0.5, lw=0, label=label)
    whole.legend(loc="upper right", fontsize=7, ncol=2)

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _panel(ax: Any, plan: Layout, lines: tuple[Line, ...], origin: float, scale: float, window: Any) -> None:
    inside = (lambda t: window[0] <= t <= window[1]) if window else (lambda t: True)
    for group in plan.points:
        pts = [((t - origin) * scale, ms) for t, ms in group.xy if inside(t)]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.scatter(
                xs, ys, s=group.size, c=group.colour, marker=group.marker, label=group.label, alpha=0.75
            )
    for line in lines:
        ax.axvline(
            (line.at - origin) * scale, color=line.colour, linestyle=line.style, lw=1.2, label=line.label
        )
    if window:
        ax.set_xlim((window[0] - origin) * scale, (window[1] - origin) * scale)
    ax.set_yscale("log")
    ax.set_ylabel("client latency (ms, log)")
    ax.legend(loc="upper right", fontsize=7, ncol=2)
