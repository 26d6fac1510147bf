"""``failsoft plan``: the failover policies as JSON in, JSON out.

The input is a scenario JSON (schema: ``docs/scenario.md``; ``examples/scenario.json`` is the demo's
cluster, ``failsoft scenario CONFIG.yaml`` writes one for a serving config).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from failsoft.errors import ConfigError
from failsoft.policies.registry import failover_names as policy_names
from failsoft.policies.registry import get_failover_policy
from failsoft.scenario import load_scenario

app = typer.Typer(
    help="Plan warm backups or a failover for a scenario JSON (servers, model families with their "
    "profiles, apps and primaries; see docs/scenario.md, or write one with 'failsoft scenario "
    "CONFIG.yaml'); prints JSON.",
    no_args_is_help=True,
)

ScenarioPath = Annotated[
    Path,
    typer.Argument(
        help="Scenario JSON, e.g. examples/scenario.json (schema: docs/scenario.md)", show_default=False
    ),
]
PolicyName = Annotated[str, typer.Option("--policy", "-p", help=f"One of: {', '.join(policy_names())}")]


@app.command("proactive")
def proactive(scenario: ScenarioPath, policy: PolicyName = "faillite") -> None:
    """Warm backups for the critical apps (FailLite 3.2): {"warm": [{app, variant, server}],
    "unplaced": [app], "objective", "solve_ms", ...}."""
    plan = get_failover_policy(policy).plan_proactive(load_scenario(scenario))
    typer.echo(json.dumps(plan.to_dict(), indent=2))


@app.command("failover")
def failover(
    scenario: ScenarioPath,
    failed: Annotated[
        list[str] | None, typer.Option("--failed", "-f", help="A failed server (repeatable)")
    ] = None,
    site: Annotated[list[str] | None, typer.Option("--site", help="A failed site: all its servers")] = None,
    policy: PolicyName = "faillite",
) -> None:
    """Recovery of the apps on failed servers or sites (FailLite 3.3, 3.4): {"failed", "actions":
    [{app, kind (warm, progressive or cold), server, first_variant, final_variant, first_server}],
    "unrecovered", "released_warm", "plan_ms"}.

    Uses the scenario's 'warm' backups when it lists them, else the policy's own proactive plan.
    """
    sc = load_scenario(scenario)
    servers = list(failed or [])
    for name in site or []:
        in_site = sc.servers_in_sites([name])
        if not in_site:
            raise ConfigError(
                f"failed site {name!r} is not in the scenario (sites: {', '.join(s.name for s in sc.sites)})"
            )
        servers.extend(in_site)
    if not servers:
        raise ConfigError("name at least one failed server (--failed S) or site (--site SITE)")
    plan = get_failover_policy(policy).plan_failover(sc, servers)
    typer.echo(json.dumps(plan.to_dict(), indent=2))
