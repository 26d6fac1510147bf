"""``failsoft chaos``: inject failures through the gateway's token-protected admin API."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from failsoft.cli.status import ConfigOpt, StateOpt, TokenOpt, UrlOpt
from failsoft.errors import ConfigError

app = typer.Typer(help="Failure injection: kill, hang, resume or slow down servers.", no_args_is_help=True)


def _admin(action: str, url: str | None, token: str | None, config: Any, state_dir: Any, **body: Any) -> None:
    from failsoft.client import Client
    from failsoft.runtime.discovery import find_gateway

    target = find_gateway(url, token, config, state_dir)
    if not target.token:
        raise ConfigError("no admin token: pass --token, set $FAILSOFT_ADMIN_TOKEN or use --state-dir")
    with Client(target.url, token=target.token, timeout=10.0) as client:
        typer.echo(json.dumps(client.admin(action, **body), indent=2))


@app.command("kill")
def kill(
    server: Annotated[
        str | None, typer.Argument(help="Server to crash (SIGKILL)", show_default=False)
    ] = None,
    site: Annotated[str | None, typer.Option(help="Crash every server of this site at once")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
) -> None:
    """Crash a server (or a whole site): its agent process is killed."""
    if (server is None) == (site is None):
        raise ConfigError("name a SERVER or a --site SITE (not both)")
    body = {"server": server} if server else {"site": site}
    _admin("kill", url, token, config, state_dir, **body)


@app.command("slow")
def slow(
    server: Annotated[str, typer.Argument(help="Server to slow down", show_default=False)],
    ms: Annotated[
        float, typer.Option("--ms", min=0, max=600_000, help="Added latency per inference (0 undoes)")
    ],
    load_ms: Annotated[
        float | None,
        typer.Option("--load-ms", min=0, max=600_000, help="Added time per model load (slow disk)"),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
) -> None:
    """Add latency to every inference of a server (and, with --load-ms, to its model loads)."""
    body: dict[str, Any] = {"server": server, "ms": ms}
    if load_ms is not None:
        body["load_ms"] = load_ms
    _admin("slow", url, token, config, state_dir, **body)


@app.command("hang")
def hang(
    server: Annotated[str, typer.Argument(help="Server to freeze (SIGSTOP)", show_default=False)],
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
) -> None:
    """Freeze a server: alive but silent, detected by its missing heartbeats."""
    _admin("hang", url, token, config, state_dir, server=server)


@app.command("resume")
def resume(
    server: Annotated[str, typer.Argument(help="Server to unfreeze (SIGCONT)", show_default=False)],
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
) -> None:
    """Unfreeze a hung server; the controller restores it."""
    _admin("resume", url, token, config, state_dir, server=server)
