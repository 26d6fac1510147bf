"""``failsoft bench``: benchmarks that print JSON."""

from __future__ import annotations

import json
from typing import Annotated

import typer

app = typer.Typer(help="Benchmarks; each prints one JSON object.", no_args_is_help=True)


@app.command("plan")
def plan(
    repeats: Annotated[int, typer.Option(min=1, help="Timed repetitions of the heuristic")] = 5,
    seeds: Annotated[int, typer.Option(min=1, help="Random clusters for the ILP")] = 3,
) -> None:
    """Progressive heuristic at 1000 servers x 3000 apps x 4 variants; ILP gap at 100 x 640."""
    from failsoft.bench.plan import run

    typer.echo(json.dumps(run(repeats=repeats, seeds=seeds), indent=2))
