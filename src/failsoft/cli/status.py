"""``failsoft status``: servers, sites, apps, routes and backups of a running failsoft, and the
workers of its ``llm`` services (server, state, model, requests in flight, as the gateway's
repository index reports them).

Agents restart by themselves after a crash, so a server that is ``up`` may have failed a minute
ago: the server table says how often each was restarted and when it last failed, the app table when
and how each app last failed over. Times are local wall-clock times.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

UrlOpt = Annotated[
    str | None, typer.Option(help="Gateway (inference) URL (default: found in the state directory)")
]
AdminUrlOpt = Annotated[
    str | None,
    typer.Option(help="Admin API URL (default: $FAILSOFT_ADMIN_URL, else found in the state directory)"),
]


def _read_token_file(path: str | None) -> str | None:
    """The token in ``--token-file`` (never a token on the command line: ``ps`` shows argv to all)."""
    from failsoft.runtime.security import read_token_file

    return None if path is None else read_token_file(path)


TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token-file",
        help="File holding the admin token (default: $FAILSOFT_ADMIN_TOKEN, else the state dir's)",
        callback=_read_token_file,
    ),
]
ConfigOpt = Annotated[Path | None, typer.Option(help="The config the cluster was started with")]
StateOpt = Annotated[Path | None, typer.Option(help="The cluster's state directory")]


def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    admin_url: AdminUrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
) -> None:
    """Show every server's state, every app's primary, current route, variant and warm backups,
    and every LLM worker's server, state, model and requests in flight."""
    from failsoft.runtime.discovery import find_admin

    with find_admin(admin_url, token, config, state_dir).client(timeout=10.0) as client:
        body = client.status()
        body["llm"] = llm_index(client)
    if as_json:
        typer.echo(json.dumps(_contract(body), indent=2))
        return
    _print_tables(body)


_SERVER_KEYS = ("name", "site", "state", "memory_mb", "used_mb", "models", "restarts", "last_failure")


def llm_index(client: Any) -> list[dict[str, Any]] | None:
    """The ``llm`` services of the gateway's repository index (None when it cannot be read: the
    servers and apps are still shown)."""
    from failsoft.errors import FailsoftError

    if not client.url:
        return None
    try:
        return [e for e in client.repository_index() if e.get("mode") == "llm"]
    except FailsoftError:
        return None


def llm_workers(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """One row per LLM worker: service, worker, server, state (its phase: ``serving``, ``failed``,
    ``draft`` while a restarted worker has only its draft, ``starting``), incarnation, memory and
    restarts from the core's records (``llm_workers`` of the controller's status), joined with the
    gateway's index (model, policy, requests in flight); a figure neither gives is None. None when
    the body has neither (a controller and gateway that do not report LLM workers)."""
    placed = body.get("llm_workers")
    index = body.get("llm")
    if placed is None and index is None:
        return None
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in index or []:
        in_flight = entry.get("in_flight") or {}
        for name, w in (entry.get("workers") or {}).items():
            seen[(entry["name"], name)] = {
                "server": w.get("server"),
                "state": w.get("phase"),
                "model": entry.get("model"),
                "policy": entry.get("policy"),
                "active_requests": in_flight.get(name, 0),
            }
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for w in placed or []:
        key = (w["service"], w["worker"])
        gateway = seen.get(key, {})
        rows[key] = {
            "service": w["service"],
            "worker": w["worker"],
            "server": w.get("server"),
            "state": w.get("phase"),
            "model": gateway.get("model"),
            "policy": gateway.get("policy"),
            "incarnation": w.get("incarnation"),
            "memory_mb": w.get("memory_mb"),
            "restarts": w.get("restarts"),
            "active_requests": gateway.get("active_requests"),
        }
    for key, g in seen.items():
        if key not in rows:  # the gateway knows a worker the core's records do not (yet)
            rows[key] = {"service": key[0], "worker": key[1], "incarnation": None, "memory_mb": None,
                         "restarts": None} | g  # fmt: skip
    return [rows[k] for k in sorted(rows)]


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _contract(body: dict[str, Any]) -> dict[str, Any]:
    """The status object: servers (name, site, state, memory, failures), apps with their routes,
    backups and last failover, and LLM workers (``null`` where the gateway does not report them)."""
    return {
        "cluster": body.get("cluster"),
        "policy": body.get("policy"),
        "ready": body.get("ready"),
        "route_version": body.get("version"),
        "config": _config(body),
        "servers": [{k: s.get(k) for k in _SERVER_KEYS} for s in body["servers"]],
        "apps": [
            {
                "name": a["name"],
                "family": a["family"],
                "critical": a["critical"],
                "primary": a["primary"],
                "route": a["route"],
                "variant": a["variant"],
                "kind": a["kind"],
                "degraded": a["degraded"],
                "warm_backups": a["warm_backups"],
                "replicas": a.get("replicas"),
                "last_failover": a.get("last_failover"),
            }
            for a in body["apps"]
        ],
        "llm_workers": llm_workers(body),
    }


def _config(body: dict[str, Any]) -> dict[str, Any] | None:
    """The config version served (1: the one ``failsoft serve`` started with), its digest, and the
    state of the last deploy."""
    config = body.get("config")
    if config is None:
        return None
    last = config.get("last") or {}
    return {"version": config.get("version"), "digest": config.get("digest"), "deploy": last.get("state")}


def _print_tables(body: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=160)  # piped: no wrapped cells
    console.print(server_table(body))
    console.print(app_table(body))
    if llm_workers(body):
        console.print(llm_table(body))


def server_table(body: dict[str, Any]) -> Any:
    """Servers: state, memory, models, and how often and when they failed."""
    from rich.table import Table

    colour = {"up": "green", "suspect": "yellow", "failed": "red", "recovering": "cyan"}
    config = _config(body) or {}
    deploying = " deploying" if config.get("deploy") == "running" else ""
    table = Table(
        title=f"cluster {body.get('cluster')} (config v{config.get('version', 1)}{deploying}, "
        f"policy {body.get('policy')}, route v{body.get('version')})"
    )
    for col in ("server", "site", "state", "memory used", "models", "restarts", "last failure"):
        table.add_column(col)
    for s in body["servers"]:
        state = s["state"]
        restarts = s.get("restarts")
        table.add_row(
            s["name"],
            s["site"],
            f"[{colour.get(state, 'white')}]{state}[/]",
            f"{s['used_mb']:.1f} / {s['memory_mb']:.0f} MB",
            str(s["models"]),
            "-" if restarts is None else str(restarts),
            local_time(s.get("last_failure")),
        )
    return table


def app_table(body: dict[str, Any]) -> Any:
    """Apps: primary, current route, warm backups, and their last failover."""
    from rich.table import Table

    table = Table(title="apps")
    for col in ("app", "critical", "primary", "route", "kind", "warm backups", "last failover"):
        table.add_column(col)
    for a in body["apps"]:
        route = a["route"]
        shown = "[red]none[/]" if route is None else f"{route['server']}/{route['variant']}"
        if a["degraded"]:
            shown += " [yellow](degraded)[/]"
        replicas = a.get("replicas") or {}
        if replicas.get("wanted", 1) > 1 or len(replicas.get("serving", ())) > 1:  # route, then replicas
            shown += f" + {', '.join(replicas['serving'][1:]) or '-'} ({replicas['wanted']} wanted)"
        warm = ", ".join(f"{w['server']}/{w['variant']} ({w['state']})" for w in a["warm_backups"]) or "-"
        primary = f"{a['primary']['server']}/{a['primary']['variant']}"
        table.add_row(
            a["name"],
            "yes" if a["critical"] else "",
            primary,
            shown,
            a["kind"] or "-",
            warm,
            last_failover(a.get("last_failover")),
        )
    return table


def llm_table(body: dict[str, Any]) -> Any:
    """LLM workers: where the core placed them (phase, incarnation, memory, restarts) and what the
    gateway sees of them (model, policy, requests in flight), per ``llm`` service."""
    from rich.table import Table

    colour = {"serving": "green", "draft": "cyan", "failed": "red", "starting": "yellow"}
    table = Table(title="llm workers")
    columns = ("service", "worker", "server", "state", "model", "policy", "incarnation", "memory", "restarts")
    for col in (*columns, "active requests"):
        table.add_column(col)
    for r in llm_workers(body) or []:
        state = r["state"] or "-"
        table.add_row(
            r["service"],
            r["worker"],
            r["server"] or "-",
            f"[{colour.get(state, 'white')}]{state}[/]",
            r["model"] or "-",
            r["policy"] or "-",
            _or_dash(r["incarnation"]),
            "-" if r["memory_mb"] is None else f"{r['memory_mb']:.1f} MB",
            _or_dash(r["restarts"]),
            _or_dash(r["active_requests"]),
        )
    return table


def last_failover(event: dict[str, Any] | None) -> str:
    """``14:03:07.123 warm -> c2/cnn_m``, or ``-`` when the app never failed over."""
    if not event:
        return "-"
    where = f"{event.get('server')}/{event.get('variant')}"
    return f"{local_time(event.get('at'))} {event.get('kind')} -> {where}"


def local_time(at: float | None, zone: bool = False) -> str:
    """A Unix time as local wall-clock time to the millisecond, dated unless it is today (``-`` for
    none); ``zone`` adds the time zone's name."""
    if at is None:
        return "-"
    moment = datetime.fromtimestamp(at).astimezone()
    day = "" if moment.date() == datetime.now().astimezone().date() else f"{moment:%Y-%m-%d} "
    shown = f"{day}{moment:%H:%M:%S}.{moment.microsecond // 1000:03d}"
    return f"{shown} {moment.tzname()}" if zone else shown
