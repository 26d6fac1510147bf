"""``failsoft scenario CONFIG.yaml``: the scenario JSON of a serving config, for ``failsoft plan``.

The config's servers, apps and services, every app placed as ``failsoft serve`` would place it
(:func:`failsoft.runtime.deployment.resolve`), and the families it uses with the model repository's
measured profiles (memory, load time, latency per batch size, accuracy). The schema is in
``docs/scenario.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from failsoft.errors import ConfigError


def scenario(
    config: Annotated[
        Path, typer.Argument(help="Serving config (YAML), e.g. examples/edge.yaml", show_default=False)
    ],
    repository: Annotated[
        Path | None,
        typer.Option(help="Model repository with measured profiles (default: the config's, else the zoo's)"),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write the JSON here instead of stdout")] = None,
) -> None:
    """Write the scenario JSON of a serving config, with the zoo's measured profiles."""
    text = json.dumps(config_scenario(config, repository), indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.write_text(text)
    except OSError as exc:
        raise ConfigError(f"cannot write {str(out)!r}: {exc.strerror or exc}") from exc
    typer.echo(f"scenario of {config} written to {out}", err=True)


def config_scenario(config: Path, repository: Path | None = None) -> dict[str, Any]:
    """The scenario dict of the config at ``config``, profiles from ``repository`` (or its own)."""
    from failsoft.runtime.config import load_config
    from failsoft.runtime.deployment import resolve
    from failsoft.scenario import scenario_to_dict
    from failsoft.zoo import ModelRepository

    cfg = load_config(config)
    root = repository or cfg.repository  # --repository, else the config's (resolve_repository)
    repo = ModelRepository(root)
    if not repo.root.is_dir():
        raise ConfigError(
            f"model repository {str(root)!r} does not exist: build it with 'failsoft zoo build --out {root}'"
        )
    return scenario_to_dict(resolve(cfg, repo.families(), repository=f"model repository {str(root)!r}"))
