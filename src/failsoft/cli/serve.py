"""``failsoft serve CONFIG.yaml``: start (or join) Ray, the controller, the agents and the gateway."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer


def serve(
    config: Annotated[
        Path, typer.Argument(help="Serving config (YAML; see examples/edge.yaml)", show_default=False)
    ],
    address: Annotated[
        str | None, typer.Option(help="Join this Ray cluster (agents pinned to resource server:<name>)")
    ] = None,
    node_ip_address: Annotated[
        str | None,
        typer.Option(
            help="With --address: this machine's address in the Ray cluster, as its own "
            "'ray start --node-ip-address' gave it (default: Ray's guess, the address of the "
            "default route; a machine without one, or with several networks, must say)"
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Gateway port (0: any free port)")
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(help="Inference address (default 127.0.0.1; the admin API stays apart)"),
    ] = None,
    admin_port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Admin API port (default: gateway port + 1)")
    ] = None,
    admin_host: Annotated[
        str | None,
        typer.Option(help="Admin API address (default 127.0.0.1; others need --allow-remote-admin)"),
    ] = None,
    allow_remote_admin: Annotated[
        bool,
        typer.Option(
            "--allow-remote-admin",
            help="Let --admin-host be a non-loopback address: the token-protected admin API (which "
            "can kill servers) then answers the network; set gateway.admin_tls "
            "(config: gateway.allow_remote: true; docs/security.md)",
        ),
    ] = False,
    store: Annotated[
        str | None, typer.Option(help="State store: sqlite, sqlite:///PATH or redis://HOST:PORT/DB")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log the runtime's INFO messages")] = False,
) -> None:
    """Serve the config's apps with FailLite failover until Ctrl-C, then shut everything down."""
    from failsoft.runtime import logs
    from failsoft.runtime.config import load_config
    from failsoft.runtime.session import Session

    cfg = load_config(config)
    # every record as text or JSON lines (telemetry.log_format, FAILSOFT_LOG_FORMAT); the access log
    # (one line per HTTP request) at INFO unless telemetry.access_log is off
    logs.configure(
        cfg.telemetry.log_format, "gateway", logging.INFO if verbose else logging.WARNING, logger=""
    )
    if cfg.telemetry.access_log:
        logging.getLogger("failsoft.access").setLevel(logging.INFO)
    given = {"port": port, "host": host, "admin_port": admin_port, "admin_host": admin_host}
    if any(v is not None for v in given.values()):
        cfg = cfg.with_gateway(**{k: v for k, v in given.items() if v is not None})
    if allow_remote_admin:
        cfg = cfg.with_gateway(allow_remote=True)
    if store is not None:
        from failsoft.runtime.config import config_store_url

        cfg = cfg.replace(store_url=config_store_url(store))
    if node_ip_address is not None and address is None:
        raise typer.BadParameter("needs --address (a Ray cluster to join)", param_hint="--node-ip-address")
    session = Session(cfg, address=address, node_ip=node_ip_address)
    prepared = session.prepare()  # a bad config or repository stops here, before any process starts
    typer.echo(
        f"failsoft: starting {len(cfg.servers)} servers in {len(cfg.sites)} sites, "
        f"{len(prepared.deployment.apps)} apps, {len(cfg.llm)} llm services, policy {cfg.policy} ...",
        err=True,
    )
    session.start(background=False)
    session.serve_forever(
        on_started=lambda url: typer.echo(
            f"failsoft: serving at {url}, admin API at {session.admin_url} "
            f"(state in {cfg.state_dir}; Ctrl-C stops everything)",
            err=True,
        )
    )
    typer.echo("failsoft: stopped", err=True)
