"""``failsoft deploy CONFIG``: change a running cluster to a new config, in place.

The config goes to the gateway's admin API; the running cluster plans the difference (apps added,
removed, moved to another server or variant; services; the failover policy's settings) and carries
it out while it serves (docs/operations.md, "Deploying a changed config"). A config that cannot be
applied is refused whole with one line (exit status 2) and nothing changes; the same config twice
changes nothing the second time. The command waits until the deploy is done and prints what it did
(``--no-wait``: as soon as it is accepted); exit status 1 when an app was rolled back or could not
be served.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from failsoft.cli.status import AdminUrlOpt, StateOpt, TokenOpt
from failsoft.errors import ConfigError, ServingError

POLL_S = 0.2


def deploy(
    config: Annotated[Path, typer.Argument(help="The new serving config (YAML)", show_default=False)],
    admin_url: AdminUrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing")] = False,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until the deploy is done")] = True,
    timeout_s: Annotated[float, typer.Option(min=1, help="How long to wait for it")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Apply a changed config to the running cluster (apps, services, variants, placements, policy)."""
    from failsoft.runtime.config import config_from_dict
    from failsoft.runtime.discovery import find_admin
    from failsoft.scenario import read_document

    data = _read_yaml(config, read_document(config, "config"))
    base_dir = config.resolve().parent
    found = config_from_dict(data, source=str(config), base_dir=base_dir)  # refused here, before sending
    state = state_dir or (None if admin_url else found.state_dir)
    with find_admin(admin_url, token, None, state).client(timeout=30.0) as client:
        answer = client.deploy(data, str(config), str(base_dir), dry_run)
        done = answer
        if wait and answer.get("changed"):
            done = _wait(client, int(answer["version"]), timeout_s)
    if as_json:
        typer.echo(json.dumps({"accepted": answer, "deploy": done if done is not answer else None}, indent=2))
    else:
        for line in describe(answer, done if done is not answer else None):
            typer.echo(line)
    last = done.get("last") if done is not answer else None
    if last and (last.get("rolled_back") or last.get("unserved")):
        raise typer.Exit(1)


def _read_yaml(path: Path, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"config {str(path)!r} is not valid YAML: {getattr(exc, 'problem', exc)}{where}"
        ) from exc


def _wait(client: Any, version: int, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.deploy_status()
        last = status.get("last") or {}
        if status.get("version") != version or last.get("state") == "done":
            return dict(status)
        if time.monotonic() > deadline:
            raise ServingError(f"deploy of config version {version} not done after {timeout_s:g} s: {last}")
        time.sleep(POLL_S)


def describe(answer: dict[str, Any], done: dict[str, Any] | None) -> list[str]:
    """What a deploy planned and did, one line per change."""
    plan = answer.get("plan", {})
    if plan.get("empty"):
        return [f"nothing to change: config version {answer.get('version')} already serves it"]
    head = "would change" if answer.get("dry_run") else f"config version {answer.get('version')}:"
    lines = [head]
    for step in plan.get("steps", []):
        old = ", ".join(f"{p['server']}/{p['variant']}" for p in step["old"]) or "-"
        new = "-" if step["new"] is None else f"{step['new']['server']}/{step['new']['variant']}"
        lines.append(f"  {step['kind']:<6} {step['app']}: {old} -> {new}")
    for name in plan.get("changed", []):
        lines.append(f"  change {name}: settings")
    for key in ("services_added", "services_removed"):
        if plan.get(key):
            lines.append(f"  {key.replace('_', ' ')}: {', '.join(plan[key])}")
    if plan.get("policy_changed"):
        lines.append("  failover policy settings changed")
    lines += [f"  note: {n}" for n in answer.get("notes", [])]
    last = (done or {}).get("last")
    if last:
        took = (last["finished_at"] or 0) - last["started_at"]
        lines.append(f"done in {took:.2f} s")
        lines += [f"  rolled back {a}: {why}" for a, why in last.get("rolled_back", {}).items()]
        lines += [f"  not served yet (retried) {a}" for a in last.get("unserved", [])]
    return lines
