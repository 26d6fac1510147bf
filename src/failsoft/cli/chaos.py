"""``failsoft chaos``: inject failures through the gateway's token-protected admin API.

Each verb prints one line per server it touched, with the local time it happened (``--json``: the
gateway's JSON answer, Unix times). After a kill, ``failsoft status`` shows the failover, and the
agent's restart once Ray has started it again.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from failsoft.cli.status import AdminUrlOpt, ConfigOpt, StateOpt, TokenOpt, local_time
from failsoft.errors import ConfigError

app = typer.Typer(
    help="Failure injection: kill, hang, resume, slow down or break servers, or evict a model.",
    no_args_is_help=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the gateway's JSON answer")]


def _admin(
    action: str,
    admin_url: str | None,
    token: str | None,
    config: Any,
    state_dir: Any,
    as_json: bool,
    **body: Any,
) -> None:
    from failsoft.runtime.discovery import find_admin

    with find_admin(admin_url, token, config, state_dir).client(timeout=10.0) as client:
        answer = client.admin(action, **body)
    typer.echo(json.dumps(answer, indent=2) if as_json else "\n".join(describe(answer)))


def describe(answer: dict[str, Any]) -> list[str]:
    """What an injection did, one line per server, at local time."""
    action = answer.get("action")
    if action == "kill":
        return [
            f"killed {k['server']} (SIGKILL to pid {k['pid']}) at {local_time(k['at'], zone=True)}"
            for k in answer["killed"]
        ]
    at = local_time(answer.get("at"), zone=True)
    if action == "hang":
        return [f"hung {answer['server']} (SIGSTOP to pid {answer['pid']}) at {at}"]
    if action == "resume":
        return [f"resumed {answer['server']} (SIGCONT to pid {answer['pid']}) at {at}"]
    if action == "slow":
        load = answer.get("load_ms")
        more = f" and {load:g} ms per model load" if load else ""
        return [f"slowed {answer['server']} by {answer['ms']:g} ms per inference{more} from {at}"]
    if action == "break":
        if answer.get("broken"):
            return [f"broke {answer['server']}: every inference fails, heartbeats go on, from {at}"]
        return [f"mended {answer['server']}: inferences work again from {at}"]
    if action == "evict":
        variants = ", ".join(answer["variants"])
        return [f"evicted {answer['app']} ({variants}) from {answer['server']} at {at}; the server lives on"]
    return [json.dumps(answer)]


@app.command("kill")
def kill(
    servers: Annotated[
        list[str] | None,
        typer.Argument(
            help="Server(s) to crash (SIGKILL); several are killed at one instant", show_default=False
        ),
    ] = None,
    site: Annotated[str | None, typer.Option(help="Crash every server of this site at once")] = None,
    admin_url: AdminUrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Crash a server, several at one instant, or a whole site: their agent processes are killed."""
    if (not servers) == (site is None):
        raise ConfigError("name a SERVER (or several) or a --site SITE (not both)")
    names = servers or []
    body: dict[str, Any] = (
        {"site": site} if site else {"server": names[0]} if len(names) == 1 else {"servers": names}
    )
    _admin("kill", admin_url, token, config, state_dir, as_json, **body)


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
    admin_url: AdminUrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add latency to every inference of a server (and, with --load-ms, to its model loads)."""
    body: dict[str, Any] = {"server": server, "ms": ms}
    if load_ms is not None:
        body["load_ms"] = load_ms
    _admin("slow", admin_url, token, config, state_dir, as_json, **body)


@app.command("hang")
def hang(
    server: Annotated[str, typer.Argument(help="Server to freeze (SIGSTOP)", show_default=False)],
    admin_url: AdminUrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Freeze a server: alive but silent, detected by its missing heartbeats."""
    _admin("hang", admin_url, token, config, state_dir, as_json, server=server)


@app.command("resume")
def resume(
    server: Annotated[str, typer.Argument(help="Server to unfreeze (SIGCONT)", show_default=False)],
    admin_url: AdminUrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Unfreeze a hung server; the controller restores it."""
    _admin("resume", admin_url, token, config, state_dir, as_json, server=server)


@app.command("break")
def break_(
    server: Annotated[str, typer.Argument(help="Server whose inferences fail", show_default=False)],
    mend: Annotated[bool, typer.Option("--mend", help="Undo: inferences work again")] = False,
    admin_url: AdminUrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make every inference of a server fail while it keeps heartbeating (app-level health sees it)."""
    _admin("break", admin_url, token, config, state_dir, as_json, server=server, broken=not mend)


@app.command("evict")
def evict(
    server: Annotated[
        str, typer.Argument(metavar="SERVER", help="Server that loses the model", show_default=False)
    ],
    app_name: Annotated[
        str, typer.Argument(metavar="APP", help="App whose model it loses", show_default=False)
    ],
    admin_url: AdminUrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make a server lose one app's model while it lives on (a crashed model runtime, an eviction)."""
    _admin("evict", admin_url, token, config, state_dir, as_json, server=server, app=app_name)
