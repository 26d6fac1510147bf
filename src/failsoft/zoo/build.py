"""Building the zoo: train or initialise each selected variant, store it, profile it.

``build_zoo`` is idempotent and resumes: a variant whose weights match the hash in its
``config.json`` is not rebuilt, and one whose ``profile.json`` was measured on those weights is not
profiled again. A variant is written into a hidden scratch directory and renamed into place only
when complete, so an interrupted build leaves nothing half-written that a later run would trust.

Trained (digits) variants get accuracy measured on the held-out split; ImageNet variants are
randomly initialised from a fixed seed and declare their published accuracy (see
:mod:`failsoft.zoo.catalog`).
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from failsoft.errors import RepositoryError
from failsoft.zoo.catalog import FamilySpec, VariantSpec, declared_accuracy, select
from failsoft.zoo.layout import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    Accuracy,
    VariantConfig,
    check_name,
    read_config,
    write_json,
)
from failsoft.zoo.profiler import ProfileSettings, is_current, profile_variant
from failsoft.zoo.repository import ModelRepository
from failsoft.zoo.stateful import is_stateful_arch, stateful_io, train_stateful

if TYPE_CHECKING:
    import torch

INIT_SEED = 0


@dataclass(frozen=True)
class BuildEvent:
    """One step of a build, for progress displays: ``index`` of ``total`` variants (1-based)."""

    stage: Literal["build", "profile"]
    state: Literal["start", "done", "skipped"]
    family: str
    variant: str
    index: int
    total: int
    seconds: float = 0.0


Progress = Callable[[BuildEvent], None]


def build_zoo(
    out: str | Path,
    families: Sequence[str] | None = None,
    progress: Progress | None = None,
    profile: bool = True,
    settings: ProfileSettings | None = None,
    device: str | None = None,
) -> ModelRepository:
    """Build (and profile) the selected variants into ``out``; ``families=None`` is the default zoo.

    ``families`` holds selectors: a family name (all its variants) or ``family/variant``.
    """
    repo = ModelRepository(out)
    repo.root.mkdir(parents=True, exist_ok=True)
    chosen = select(families)
    emit = progress or (lambda event: None)
    for i, (fam, var) in enumerate(chosen, start=1):
        where = (fam.name, var.name, i, len(chosen))
        _step(emit, "build", *where, functools.partial(_ensure_built, repo, fam, var))
        if profile:
            _step(
                emit,
                "profile",
                *where,
                functools.partial(_ensure_profiled, repo, fam.name, var.name, settings, device),
            )
    return repo


def _step(
    emit: Progress,
    stage: Literal["build", "profile"],
    family: str,
    variant: str,
    i: int,
    n: int,
    work: Callable[[], bool],
) -> None:
    emit(BuildEvent(stage, "start", family, variant, i, n))
    began = time.perf_counter()
    did = work()
    state: Literal["done", "skipped"] = "done" if did else "skipped"
    emit(BuildEvent(stage, state, family, variant, i, n, time.perf_counter() - began))


def _ensure_profiled(
    repo: ModelRepository, family: str, variant: str, settings: ProfileSettings | None, device: str | None
) -> bool:
    if is_current(repo, family, variant):
        return False
    profile_variant(repo, family, variant, settings, device)
    return True


def is_built(variant_dir: Path) -> bool:
    """True when the config reads back and the weight file has the recorded size and hash."""
    from failsoft.zoo.network import file_sha256

    weights = variant_dir / WEIGHTS_FILE
    try:
        config = read_config(variant_dir)
        if not weights.is_file() or weights.stat().st_size != config.weights_bytes:
            return False
        return file_sha256(weights) == config.weights_sha256
    except (RepositoryError, OSError):
        return False


def _ensure_built(repo: ModelRepository, fam: FamilySpec, var: VariantSpec) -> bool:
    final = repo.safe_path(check_name("family", fam.name)) / check_name("variant", var.name)
    if not final.is_symlink() and is_built(final):
        return False
    install_variant(repo, fam.name, var.name, lambda scratch: write_variant(scratch, fam, var))
    return True


def install_variant(repo: ModelRepository, family: str, variant: str, write: Callable[[Path], Any]) -> None:
    """Run ``write`` into a hidden scratch directory, then rename it into ``<root>/family/variant``."""
    fam_dir = repo.safe_path(check_name("family", family))
    final = fam_dir / check_name("variant", variant)
    fam_dir.mkdir(parents=True, exist_ok=True)
    repo.safe_path(family)  # the family directory must not be a link out of the repository
    scratch = fam_dir / f".build-{variant}-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        write(scratch)
        if final.is_symlink() or final.is_file():
            final.unlink()
        elif final.exists():
            shutil.rmtree(final)
        try:
            scratch.rename(final)
        except OSError:
            if not is_built(final):  # another build renamed its copy in first: keep that one
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def write_variant(target: Path, fam: FamilySpec, var: VariantSpec) -> VariantConfig:
    """Train or initialise one variant and write its weights and ``config.json`` into ``target``."""
    module, architecture, accuracy = make_variant(fam, var)
    return store_variant(target, fam, var, module, architecture, accuracy)


def make_variant(fam: FamilySpec, var: VariantSpec) -> tuple[torch.nn.Module, dict[str, Any], Accuracy]:
    """The variant's network, trained (digits, accuracy measured) or initialised (accuracy declared)."""
    from failsoft.zoo.network import build_network
    from failsoft.zoo.train import deterministic, measure_accuracy, train_digits

    architecture = var.architecture()
    draft = VariantConfig(
        fam.name, var.name, var.arch, architecture, (), 1, 0, 0, "0" * 64, Accuracy(0.0, "declared")
    )
    with deterministic(var.training.seed if var.training else INIT_SEED):
        module, _ = build_network(draft)
        if var.training is not None and is_stateful_arch(var.arch):
            value, detail = train_stateful(var.arch, module, architecture, var.training)
            accuracy = Accuracy(value, "measured", detail | {"training": vars(var.training)})
        elif var.training is not None:
            train_digits(module, var.training)
            value, detail = measure_accuracy(module)
            accuracy = Accuracy(value, "measured", detail | {"training": vars(var.training)})
        else:
            value, detail = declared_accuracy(var)
            accuracy = Accuracy(value, "declared", detail)
    return module.eval(), architecture, accuracy


def store_variant(
    target: Path,
    fam: FamilySpec,
    var: VariantSpec,
    module: torch.nn.Module,
    architecture: dict[str, Any],
    accuracy: Accuracy,
) -> VariantConfig:
    """Write ``module``'s weights (safetensors) and its ``config.json`` into ``target``."""
    from failsoft.zoo.network import save_weights

    target.mkdir(parents=True, exist_ok=True)
    size, sha = save_weights(module, target / WEIGHTS_FILE)
    config = VariantConfig(
        family=fam.name,
        variant=var.name,
        arch=var.arch,
        architecture=architecture,
        input_shape=_input_shape(var.arch, architecture),
        num_classes=_num_classes(var.arch, architecture),
        parameters=sum(p.numel() for p in module.parameters()),
        weights_bytes=size,
        weights_sha256=sha,
        accuracy=accuracy,
        stateful=is_stateful_arch(var.arch),
    )
    write_json(target / CONFIG_FILE, config.to_dict())
    return config


def _input_shape(arch: str, architecture: dict) -> tuple[int, ...]:
    if is_stateful_arch(arch):
        return stateful_io(arch, architecture)[0]
    if arch == "transformers":
        from failsoft.zoo.hf import input_side

        side = input_side(architecture)
        return (int(architecture.get("num_channels", 3)), side, side)
    from failsoft.zoo.digits import DIGITS_INPUT_SHAPE

    return DIGITS_INPUT_SHAPE


def _num_classes(arch: str, architecture: dict) -> int:
    if is_stateful_arch(arch):
        return stateful_io(arch, architecture)[1]
    if arch == "transformers":
        return int(architecture["num_labels"])
    from failsoft.zoo.digits import DIGITS_CLASSES

    return DIGITS_CLASSES
