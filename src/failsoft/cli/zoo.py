"""``failsoft zoo``: build, profile, list the model repository, and turn it into scenario families.

``build`` is idempotent and resumes (see :mod:`failsoft.zoo.build`); it shows a progress bar on a
terminal and one plain line per step otherwise. ``list`` prints the repository as a table (or JSON),
``scenario`` prints the ``families`` section of a scenario JSON from a repository or a profile CSV,
``add`` puts a user's model (``hf``, ``onnx``, ``pt2``, ``python``) into the repository, checked and
profiled (see :mod:`failsoft.zoo.add`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from failsoft.errors import ConfigError, RepositoryError

app = typer.Typer(help="Build, profile and list the model repository.", no_args_is_help=True)

DirArg = Annotated[
    Path | None, typer.Argument(help="Repository root (default: $FAILSOFT_ZOO or ~/.cache/failsoft/zoo)")
]
FamiliesOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--families",
        "-f",
        help="A family (all its variants) or family/variant; repeatable or comma-separated",
    ),
]
DeviceOpt = Annotated[str | None, typer.Option(help="cpu, cuda, cuda:1 ... (default: cuda if available)")]
ThreadsOpt = Annotated[int, typer.Option(min=0, help="torch threads while profiling on CPU (0: all cores)")]


def _root(path: Path | None) -> Path:
    from failsoft.zoo import resolve_repository

    return resolve_repository(path)


def _selectors(families: list[str] | None) -> list[str] | None:
    if not families:
        return None
    return [s.strip() for item in families for s in item.split(",") if s.strip()]


def _settings(quick: bool, threads: int) -> Any:
    from dataclasses import replace

    from failsoft.zoo.profiler import QUICK, ProfileSettings

    return replace(QUICK if quick else ProfileSettings(), threads=threads)


@app.command("build")
def build(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Repository root")] = None,
    families: FamiliesOpt = None,
    profile: Annotated[bool, typer.Option(help="Profile each variant after building it")] = True,
    quick: Annotated[bool, typer.Option(help="Quick profile: fewer loads and batch sizes")] = False,
    threads: ThreadsOpt = 1,
    device: DeviceOpt = None,
) -> None:
    """Train, initialise and profile the zoo (default: the demo zoo); skips what is already there."""
    from failsoft.zoo.build import build_zoo
    from failsoft.zoo.catalog import select

    root = _root(out)
    chosen = select(_selectors(families))
    steps = len(chosen) * (2 if profile else 1)
    counts = {"done": 0, "skipped": 0}
    with _progress(steps) as report:

        def on_event(event: Any) -> None:
            if event.state != "start":
                counts[event.state] += 1
            report(event)

        build_zoo(root, _selectors(families), on_event, profile, _settings(quick, threads), device)
    typer.echo(
        f"zoo at {root}: {len(chosen)} variants; {counts['done']} steps done, "
        f"{counts['skipped']} already up to date"
    )


@contextmanager
def _progress(total: int) -> Iterator[Callable[[Any], None]]:
    """A rich progress bar on a terminal; plain lines (one per finished step) otherwise."""
    if not sys.stdout.isatty():

        def plain(event: Any) -> None:
            if event.state != "start":
                typer.echo(
                    f"[{event.index}/{event.total}] {event.stage} {event.family}/{event.variant}: "
                    f"{event.state} ({event.seconds:.1f} s)"
                )

        yield plain
        return
    from failsoft.cli.progress import progress_bar

    with progress_bar() as bar:
        task = bar.add_task("zoo", total=total)

        def rich(event: Any) -> None:
            if event.state == "start":
                bar.update(task, description=f"{event.stage} {event.family}/{event.variant}")
            else:
                bar.advance(task)

        yield rich


@app.command("profile")
def profile(
    root: DirArg = None,
    families: FamiliesOpt = None,
    quick: Annotated[bool, typer.Option(help="Quick profile: fewer loads and batch sizes")] = False,
    threads: ThreadsOpt = 1,
    device: DeviceOpt = None,
) -> None:
    """Measure again every built variant (or the selected ones) and rewrite their profile.json."""
    from failsoft.zoo import ModelRepository
    from failsoft.zoo.profiler import profile_variant

    repo = ModelRepository(_root(root))
    targets = _built_targets(repo, _selectors(families))
    settings = _settings(quick, threads)
    from failsoft.zoo.build import BuildEvent

    with _progress(len(targets)) as report:
        for i, (fam, var) in enumerate(targets, start=1):
            report(BuildEvent("profile", "start", fam, var, i, len(targets)))
            began = time.perf_counter()
            profile_variant(repo, fam, var, settings, device)
            report(BuildEvent("profile", "done", fam, var, i, len(targets), time.perf_counter() - began))
    typer.echo(f"profiled {len(targets)} variants in {repo.root}")


def _built_targets(repo: Any, selectors: list[str] | None) -> list[tuple[str, str]]:
    built = [(f, v) for f in repo.family_names() for v in repo.variant_names(f)]
    if selectors is None:
        if not built:
            raise RepositoryError(f"no built variant in {str(repo.root)!r}: run `failsoft zoo build` first")
        return built
    wanted = []
    for sel in selectors:
        fam, _, var = sel.partition("/")
        hits = [(f, v) for f, v in built if f == fam and (not var or v == var)]
        if not hits:
            raise ConfigError(f"{sel!r} is not built in {str(repo.root)!r}")
        wanted += [h for h in hits if h not in wanted]
    return wanted


@app.command("list")
def list_(
    root: DirArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")] = False,
) -> None:
    """The repository as a table: size, memory, load time, latency, accuracy (measured/declared)."""
    from failsoft.zoo import ModelRepository
    from failsoft.zoo.listing import render_table, rows

    repo = ModelRepository(_root(root))
    table = rows(repo)
    if as_json:
        typer.echo(json.dumps({"root": str(repo.root), "variants": table}, indent=2))
        return
    if not table:
        raise RepositoryError(f"no built variant in {str(repo.root)!r}: run `failsoft zoo build` first")
    render_table(table, f"failsoft zoo: {repo.root}")


@app.command("scenario")
def scenario(
    root: DirArg = None,
    profile_csv: Annotated[
        Path | None, typer.Option("--profile-csv", help="Read a profile CSV instead of a repository")
    ] = None,
    families: FamiliesOpt = None,
) -> None:
    """Print the 'families' section of a scenario JSON, from a repository or a profile CSV."""
    from failsoft.zoo import ModelRepository, families_from_csv, families_section

    names = _selectors(families)
    if profile_csv is not None:
        if root is not None:
            raise ConfigError("give a repository directory or --profile-csv, not both")
        fams = families_from_csv(profile_csv, names)
    else:
        repo = ModelRepository(_root(root))
        fams = repo.families(names)
        if not fams:
            raise RepositoryError(f"no profiled variant in {str(repo.root)!r}: run `failsoft zoo build`")
    typer.echo(json.dumps({"families": families_section(fams)}, indent=2))


@app.command("add")
def add(
    target: Annotated[str, typer.Argument(metavar="FAMILY/VARIANT", help="Where the model goes")],
    path: Annotated[Path, typer.Argument(help="A transformers dir, a .onnx, a .pt2, or a .safetensors")],
    model_format: Annotated[
        str | None, typer.Option("--format", help="hf, onnx, pt2 or python (default: from the path)")
    ] = None,
    accuracy: Annotated[float | None, typer.Option(help="Declared top-1 accuracy in [0, 1]")] = None,
    eval_file: Annotated[
        Path | None, typer.Option("--eval", help="Labelled data to measure accuracy on (.npz, .jsonl)")
    ] = None,
    sample: Annotated[
        Path | None, typer.Option(help="Inputs to check and profile on (.npy, .npz, .jsonl, .txt)")
    ] = None,
    handler: Annotated[str | None, typer.Option(help="python format: package.module:Class")] = None,
    task: Annotated[
        str | None,
        typer.Option(help="hf format: image-classification, text-classification or text-generation"),
    ] = None,
    labels: Annotated[
        Path | None, typer.Option(help="Class names, one per line (default: the model's own, if any)")
    ] = None,
    image_processor: Annotated[
        Path | None,
        typer.Option(help="An image processor's preprocessor_config.json (or its dir): take PNG/JPEG"),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Repository root")] = None,
    quick: Annotated[bool, typer.Option(help="Quick profile: fewer loads and batch sizes")] = False,
    threads: ThreadsOpt = 1,
    device: DeviceOpt = None,
) -> None:
    """Add a user's model to the repository: check it answers, record its accuracy, profile it."""
    from failsoft.zoo import ModelRepository
    from failsoft.zoo.add import AddRequest, add_variant

    family, sep, variant = target.partition("/")
    if not sep:
        raise ConfigError(f"give the target as FAMILY/VARIANT, got {target!r}")
    from failsoft.zoo.llm_add import add_llm, is_causal_lm, summary

    if model_format in (None, "hf") and is_causal_lm(path, task):  # an LLM: recorded, not profiled
        typer.echo(summary(add_llm(_root(out), family, variant, path, device)))
        return
    request = AddRequest(
        family, variant, path, model_format, accuracy, eval_file, sample, handler, task, labels,
        image_processor,
    )  # fmt: skip
    repo = ModelRepository(_root(out))
    began = time.perf_counter()
    config = add_variant(repo, request, _settings(quick, threads), device)
    profile = repo.profile(family, variant)
    typer.echo(
        f"added {family}/{variant} ({config.model_format}{', stateful' if config.stateful else ''}, "
        f"{config.parameters} parameters, accuracy "
        f"{config.accuracy.value:.3f} {config.accuracy.source}) to {repo.root}: latency p50 "
        f"{profile['latency_ms']:.3f} ms, load {profile['load_ms']:.1f} ms, "
        f"memory {profile['memory_mb']:.1f} MB ({time.perf_counter() - began:.1f} s)"
    )
