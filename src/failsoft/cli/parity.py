"""``failsoft parity``: train ParM parity models into the model repository.

``failsoft parity train FAMILY/VARIANT --k 2 [--r 1] [--encoder add|concat] [--root DIR]`` trains
the r parity models of a deployed digits variant (one per parity index, see
:mod:`failsoft.zoo.parity`), measures each one's degraded-mode accuracy on the held-out split,
stores it as ``<family>_parity/<variant>_<encoder>_k<k>_r<r>_p<index>`` and profiles it, then prints
one JSON object: ``{"parity_models": [...]}`` with, per model, ``degraded_accuracy``,
``deployed_accuracy``, ``default_accuracy`` (the random-prediction lower bound) and
``reconstruction``; with r > 1 also ``joint``: the degraded accuracy when ``min(r, k)`` data members
of a group are unavailable at once, decoded from all r parity models (section 7).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from failsoft.errors import ConfigError

app = typer.Typer(help="Train ParM parity models (stored in the model repository).", no_args_is_help=True)


@app.command("train")
def train(
    target: Annotated[str, typer.Argument(help="The deployed variant, FAMILY/VARIANT", show_default=False)],
    k: Annotated[int, typer.Option("--k", help="Queries per coding group (add: 2..4, concat: 2 or 4)")] = 2,
    r: Annotated[int, typer.Option("--r", help="Parity models per group (1..4)")] = 1,
    encoder: Annotated[str, typer.Option("--encoder", help="add or concat")] = "add",
    root: Annotated[
        Path | None,
        typer.Option("--root", help="Repository root (default: $FAILSOFT_ZOO or ~/.cache/failsoft/zoo)"),
    ] = None,
    epochs: Annotated[
        int | None, typer.Option(min=1, help="Training epochs (default: 300 for MLPs, 100 for CNNs)")
    ] = None,
    lr: Annotated[float, typer.Option(help="Adam learning rate (the config's)")] = 1e-3,
    seed: Annotated[int, typer.Option(min=0, help="Training seed (parity index p trains with seed + p)")] = 0,
    profile: Annotated[bool, typer.Option(help="Profile each parity model after training it")] = True,
    quick: Annotated[bool, typer.Option(help="Quick profile: fewer loads and batch sizes")] = False,
    device: Annotated[
        str | None, typer.Option(help="Device to profile on (default: cuda if available)")
    ] = None,
    random_weights: Annotated[
        bool,
        typer.Option(
            "--random-weights",
            help="Store untrained parity models (random weights, any architecture) for latency work",
        ),
    ] = False,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data", help="A user's model: its training inputs, .npz with x (and y, labels, if any)"
        ),
    ] = None,
    parity_format: Annotated[
        str, typer.Option("--format", help="With --data: export the parity models as onnx or pt2")
    ] = "onnx",
) -> None:
    """Train, measure (degraded-mode accuracy) and store the r parity models of FAMILY/VARIANT."""
    from failsoft.policies.registry import get_encoder
    from failsoft.zoo import ModelRepository, resolve_repository
    from failsoft.zoo.parity import ParityCode, ParityTraining, measure_joint, train_parity
    from failsoft.zoo.profiler import QUICK, ProfileSettings

    family, _, variant = target.partition("/")
    if not family or not variant:
        raise ConfigError(f"expected FAMILY/VARIANT, e.g. digits_mlp/mlp_m; got {target!r}")
    get_encoder(encoder, k, r)  # unknown encoder, k or r out of range: refused before any work
    repo = ModelRepository(resolve_repository(root))
    repo.config(family, variant)  # the deployed variant must exist
    training = ParityTraining(epochs=epochs, lr=lr, seed=seed)
    settings = QUICK if quick else ProfileSettings()
    if random_weights:
        from failsoft.zoo.parity import random_parity

        codes = [ParityCode(family, variant, k, r, encoder, p) for p in range(r)]
        models = [random_parity(repo, code, seed, profile, settings, device) for code in codes]
        typer.echo(json.dumps({"root": str(repo.root), "parity_models": models}, indent=2))
        return
    results = []
    for index in range(r):
        code = ParityCode(family, variant, k, r, encoder, index)
        if data is not None:
            from failsoft.zoo.user_parity import train_user_parity

            result = train_user_parity(repo, code, data, training, parity_format, profile, settings, device)
        else:
            result = train_parity(repo, code, training, profile, settings, device)
        results.append(result.to_dict())
    out: dict[str, object] = {"root": str(repo.root), "parity_models": results}
    if r > 1 and data is None:  # joint decoding is measured on the digits' held-out split
        joint = measure_joint(repo, family, variant, k, r, encoder)
        out["joint"] = {
            "missing": min(r, k),
            "degraded_accuracy": round(joint.degraded, 4),
            "deployed_accuracy": round(joint.deployed, 4),
            "reconstruction": round(joint.reconstruction, 4),
            "decoded": joint.decoded,
        }
    typer.echo(json.dumps(out, indent=2))
