"""``failsoft status``: servers, sites, apps, routes and backups of a running failsoft."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

UrlOpt = Annotated[str | None, typer.Option(help="Gateway URL (default: found in the state directory)")]
TokenOpt = Annotated[
    str | None, typer.Option(help="Admin token (default: $FAILSOFT_ADMIN_TOKEN or the state dir)")
]
ConfigOpt = Annotated[Path | None, typer.Option(help="The config the cluster was started with")]
StateOpt = Annotated[Path | None, typer.Option(help="The cluster's state directory")]


def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
) -> None:
    """Show every server's state and every app's primary, current route, variant and warm backups."""
    from failsoft.client import Client
    from failsoft.runtime.discovery import find_gateway

    target = find_gateway(url, token, config, state_dir)
    with Client(target.url, token=target.token, timeout=10.0) as client:
        body = client.status()
    if as_json:
        typer.echo(json.dumps(_contract(body), indent=2))
        return
    _print_tables(body)


def _contract(body: dict[str, Any]) -> dict[str, Any]:
    """The status object of DESIGN.md: servers (name, site, state) and apps with routes and backups."""
    return {
        "cluster": body.get("cluster"),
        "policy": body.get("policy"),
        "ready": body.get("ready"),
        "route_version": body.get("version"),
        "servers": [
            {k: s.get(k) for k in ("name", "site", "state", "memory_mb", "used_mb", "models")}
            for s in body["servers"]
        ],
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
            }
            for a in body["apps"]
        ],
    }


def _print_tables(body: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    colour = {"up": "green", "suspect": "yellow", "failed": "red", "recovering": "cyan"}
    servers = Table(
        title=f"cluster {body.get('cluster')} (policy {body.get('policy')}, route v{body.get('version')})"
    )
    for col in ("server", "site", "state", "memory used", "models"):
        servers.add_column(col)
    for s in body["servers"]:
        state = s["state"]
        servers.add_row(
            s["name"],
            s["site"],
            f"[{colour.get(state, 'white')}]{state}[/]",
            f"{s['used_mb']:.1f} / {s['memory_mb']:.0f} MB",
            str(s["models"]),
        )
    apps = Table(title="apps")
    for col in ("app", "critical", "primary", "route", "kind", "warm backups"):
        apps.add_column(col)
    for a in body["apps"]:
        route = a["route"]
        shown = "[red]none[/]" if route is None else f"{route['server']}/{route['variant']}"
        if a["degraded"]:
            shown += " [yellow](degraded)[/]"
        warm = ", ".join(f"{w['server']}/{w['variant']} ({w['state']})" for w in a["warm_backups"]) or "-"
        primary = f"{a['primary']['server']}/{a['primary']['variant']}"
        apps.add_row(a["name"], "yes" if a["critical"] else "", primary, shown, a["kind"] or "-", warm)
    console.print(servers)
    console.print(apps)
