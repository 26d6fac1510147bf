"""``failsoft demo``: serve a 6-server edge cluster, kill a server, watch FailLite recover it, live."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer


class LiveView:
    """Terminal view of the demo (rich): a live table of apps and the events as they come."""

    def __init__(self, killed: str | None = None) -> None:
        from rich.console import Console

        self.killed = killed  # the server the demo kills: its failure is the expected one
        self.console = Console() if sys.stdout.isatty() else Console(width=140)
        self.seen = 0

    def say(self, message: str) -> None:
        self.console.print(f"[bold]failsoft demo[/] {message}")

    def watch(
        self,
        client: Any,
        load: Any,
        marks: dict[str, float],
        seconds: float,
        phase: str,
        until: Callable[[], bool] | None = None,
    ) -> None:
        """Show events and (on a terminal) a live table for ``seconds``, or until ``until()`` then
        ``seconds`` more (at most a minute in all)."""
        from rich.live import Live

        started = time.monotonic()
        deadline = started + (seconds if until is None else 60.0)
        live = Live(self._render(client, load, phase), console=self.console, refresh_per_second=4)
        with live if self.console.is_terminal else contextlib.nullcontext():
            while time.monotonic() < deadline:
                time.sleep(0.25)
                self._print_events(client, marks, live.console if self.console.is_terminal else None)
                if self.console.is_terminal:
                    live.update(self._render(client, load, phase))
                if until is not None and until():
                    deadline, until = min(deadline, time.monotonic() + seconds), None

    def _print_events(self, client: Any, marks: dict[str, float], console: Any = None) -> None:
        events = client.recoveries()["events"]
        for e in events[self.seen :]:
            line = describe_event(e, marks, self.killed)
            if line:
                (console or self.console).print(line)
        self.seen = len(events)

    def _render(self, client: Any, load: Any, phase: str) -> Any:
        from rich.table import Table

        status = client.status()
        recent: dict[str, list[Any]] = {}
        for s in load.samples[-400:]:
            recent.setdefault(s.app, []).append(s)
        table = Table(title=f"failsoft demo: {phase}", caption="requests in the last few seconds")
        for col in ("app", "critical", "primary", "served by", "kind", "ok", "failed", "latency ms"):
            table.add_column(col)
        for a in status["apps"]:
            mine = recent.get(a["name"], [])
            ok = [s for s in mine if s.ok]
            route = a["route"]
            served = "[red]nobody[/]" if route is None else f"{route['server']}/{route['variant']}"
            if a["degraded"]:
                served = f"[yellow]{served}[/]"
            latency = f"{sorted(s.latency_ms for s in ok)[len(ok) // 2]:.1f}" if ok else "-"
            failed = len(mine) - len(ok)
            table.add_row(
                a["name"],
                "yes" if a["critical"] else "",
                f"{a['primary']['server']}/{a['primary']['variant']}",
                served,
                a["kind"] or "-",
                str(len(ok)),
                f"[red]{failed}[/]" if failed else "0",
                latency,
            )
        return table


def describe_event(e: dict[str, Any], marks: dict[str, float], killed: str | None = None) -> str | None:
    """One line per event, with times relative to the kill when there was one. A failure nobody
    caused (before the kill, or of another server) says so, never "after the kill"."""
    t = e["timestamp"] - marks.get("kill", marks["start"])
    stamp = f"[dim]{t * 1000:+8.0f} ms[/]"
    kind, app, where = e["type"], e.get("app"), f"{e.get('server')}/{e.get('variant')}"
    if kind == "failure" and app:
        if not caused(e, marks, killed):
            return f"{stamp} [red]failure[/]  {app}: {e['server']} is down [red](nobody killed it)[/]"
        after = (e["detected_at"] - marks["kill"]) * 1000
        how = ", its connection ended" if e.get("cause") == "connection" else ""
        down = f"{e['server']} is down (detected {after:.0f} ms after the kill{how})"
        return f"{stamp} [red]failure[/]  {app}: {down}"
    if kind == "failover":
        acc = e.get("accuracy") or 0.0
        return (
            f"{stamp} [green]failover[/] {app} -> {where} ({e.get('kind')}, accuracy {acc:.3f}), "
            f"served again {e.get('route_ms', 0):.0f} ms after detection"
        )
    if kind == "upgrade":
        return f"{stamp} [cyan]upgrade[/]  {app} -> {where} (accuracy {(e.get('accuracy') or 0):.3f})"
    if kind == "restore":
        return f"{stamp} [blue]restore[/]  {app} back on its primary {where}"
    if kind == "unrecovered":
        return f"{stamp} [red]unrecovered[/] {app}: no capacity left for it"
    if kind == "server_up":
        return f"{stamp} [blue]server[/]   {e['server']} is up again"
    return None


def caused(e: dict[str, Any], marks: dict[str, float], killed: str | None) -> bool:
    """Whether a failure event is the demo's kill: the killed server, detected after the kill."""
    return "kill" in marks and e.get("server") == killed and e["detected_at"] >= marks["kill"]


def print_summary(view: LiveView, summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"recovery of the apps on {summary['killed']}")
    for col in (
        "app",
        "recovered as",
        "on",
        "upgraded to",
        "MTTR ms",
        "first answer ms",
        "client outage ms",
        "failed req",
    ):
        table.add_column(col)
    for row in summary["apps"]:
        table.add_row(
            row["app"],
            row["kind"] or "[red]not recovered[/]",
            row["moved_to"] or "-",
            row["upgraded_to"] or "-",
            _ms(row["mttr_ms"]),
            _ms(row["first_answer_ms"]),
            _ms(row["client_outage_ms"]),
            str(row["failed_requests"]),
        )
    view.console.print(table)
    acc = summary["accuracy_of_answers"]
    view.console.print(
        f"failure detected {_ms(summary['detection_ms'])} ms after the kill; "
        f"{summary['requests']} requests, {summary['failed']} failed, "
        f"{summary['degraded_answers']} answered by a smaller variant; "
        f"answers correct: {'-' if acc is None else f'{acc:.1%}'} (held-out digits)"
    )
    for false in summary.get("unexpected_failures", []):
        view.console.print(
            f"[red]unexpected failure[/]: {false['server']} was declared down "
            f"{false['detected_after_start_s']:.1f} s after the start, and nobody killed it"
        )
    view.console.print(f"client latency plot: {summary['plot']} (data: {summary['data']})")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def demo(
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for the latency plot (failsoft-demo.png) and its data "
            "(default: demo/ in the state directory, ~/.local/state/failsoft/demo)"
        ),
    ] = None,
    kill: Annotated[str, typer.Option(help="The server to kill")] = "a1",
    down_s: Annotated[float, typer.Option(min=1, max=120, help="Seconds the server stays down")] = 8.0,
    repository: Annotated[Path | None, typer.Option(help="Model repository (default: the zoo path)")] = None,
) -> None:
    """Serve 6 servers in 3 sites with 12 apps, kill a server, and show FailLite recover it live."""
    from failsoft.runtime.demo import DemoSettings, default_out_dir, run_demo

    view = LiveView(killed=kill)
    settings = DemoSettings(out_dir=out or default_out_dir(), kill=kill, down_s=down_s, repository=repository)
    summary = run_demo(settings, view)
    print_summary(view, summary)
