"""The model repository on disk: where agents find cold replicas and planners find profiles.

FailLite's agents keep every variant an app may need in a local model repository and ask Triton to
load or unload them (section 4); a *cold* backup is a variant that is only on disk. failsoft's
:class:`ModelRepository` is that repository: ``<root>/<family>/<variant>/`` holding safetensors
weights, ``config.json`` and ``profile.json`` (see :mod:`failsoft.zoo.layout`).

Guarantees:

* a family or variant name that would resolve outside the root (``../x``, an absolute path, a
  symlink pointing out) is refused with :class:`~failsoft.errors.ModelNotFoundError`;
* weights are read with safetensors only, never pickle;
* anything missing is :class:`~failsoft.errors.ModelNotFoundError`, anything unreadable is
  :class:`~failsoft.errors.CorruptModelError`, each naming the file; nothing else escapes.

Reading the repository (``families()``, ``profile()``) needs no torch; ``load()`` imports it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from failsoft.bounds import describe_validation_error
from failsoft.domain import Family, Variant
from failsoft.errors import ConfigError, CorruptModelError, ModelNotFoundError
from failsoft.versions import split_version, versioned
from failsoft.zoo.formats.loader import load_handler_model
from failsoft.zoo.layout import (
    CONFIG_FILE,
    NAME_PATTERN,
    PROFILE_FILE,
    VariantConfig,
    check_name,
    read_config,
    read_json,
)
from failsoft.zoo.loaded import LoadedModel

if TYPE_CHECKING:
    from failsoft.zoo.network import Skeleton


def default_zoo_path() -> Path:
    """``$FAILSOFT_ZOO``, else ``$XDG_CACHE_HOME/failsoft/zoo``, else ``~/.cache/failsoft/zoo``."""
    if env := os.environ.get("FAILSOFT_ZOO"):
        return Path(env).expanduser()
    if cache := os.environ.get("XDG_CACHE_HOME"):
        return Path(cache).expanduser() / "failsoft" / "zoo"
    return Path.home() / ".cache" / "failsoft" / "zoo"


def resolve_repository(given: str | Path | None = None) -> Path:
    """The model repository a command works on: the one it was given, else :func:`default_zoo_path`.

    ``given`` is what the user named for this command (a config's ``repository``, a ``--root`` or
    ``--out`` option), already resolved against the config's directory where relative. Every
    command resolves its repository here and nowhere else, so that ``failsoft zoo build`` builds
    where ``failsoft serve``, ``scenario``, ``parity`` and every benchmark look.
    """
    if given is not None and str(given):
        return Path(given).expanduser()
    return default_zoo_path()


class _ProfileSummary(BaseModel):
    """The fields of ``profile.json`` the domain model needs; the rest is detail for humans."""

    model_config = ConfigDict(extra="allow", frozen=True)
    memory_mb: float = Field(gt=0)
    load_ms: float = Field(ge=0)
    latency_ms: float = Field(gt=0)
    accuracy: float = Field(ge=0, le=1)
    accuracy_source: str = Field(pattern="^(measured|declared)$")
    load_cpu_ms: float | None = Field(default=None, ge=0)  # profiles before 0.x lack the split
    warm_load_ms: float | None = Field(default=None, ge=0)


class ModelRepository:
    """A Triton-like repository rooted at ``root`` (which need not exist yet)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()

    def __repr__(self) -> str:
        return f"ModelRepository({str(self.root)!r})"

    # names ---------------------------------------------------------------------------------
    def family_names(self) -> list[str]:
        """Families with at least one built variant, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if self._inside(p) and self.variant_names(p.name))

    def variant_names(self, family: str) -> list[str]:
        """Built variants of a family (those with a ``config.json``), sorted by name; a variant's
        numbered versions after the first are listed as ``<variant>@<version>`` (:func:`versioned`)."""
        fam_dir = self.safe_path(check_name("family", family))
        if not fam_dir.is_dir():
            return []
        names = []
        for p in fam_dir.iterdir():
            if self._inside(p):
                names += [versioned(p.name, v) for v in _versions(p)]
        return sorted(names)

    def versions(self, family: str, variant: str) -> list[int]:
        """The versions of a variant in the repository, ascending (``[1]`` for one without any)."""
        base, _ = split_version(variant)
        path = self.safe_path(check_name("family", family), check_name("variant", base))
        return _versions(path) if path.is_dir() else []

    def _inside(self, path: Path) -> bool:
        """A listable child: a safe name, a directory, and (symlinks resolved) inside the root."""
        if not path.is_dir() or path.name.startswith(".") or not NAME_PATTERN.match(path.name):
            return False
        return path.resolve().is_relative_to(self.root.resolve())

    def variant_dir(self, family: str, variant: str) -> Path:
        """The directory of an existing variant (of one of its versions: ``<variant>@<version>``);
        unknown or escaping names are ModelNotFoundError."""
        check_name("family", family)
        base, version = split_version(variant)
        check_name("variant", base)
        path = self.safe_path(family, base)
        only_numbered = (path / "1" / CONFIG_FILE).is_file() and not (path / CONFIG_FILE).is_file()
        if (version or 1) > 1 or only_numbered:
            path = path / str(version or 1)  # a numbered version directory (Triton's layout)
        if not path.is_dir() or (version is not None and not (path / CONFIG_FILE).is_file()):
            known = ", ".join(self.family_names()) or "none"
            raise ModelNotFoundError(
                f"no variant {family}/{variant} in repository {str(self.root)!r} (families: {known})"
            )
        return path

    def safe_path(self, *parts: str) -> Path:
        """``root/parts...`` resolved (symlinks followed); ModelNotFoundError if it leaves the root."""
        root = self.root.resolve()
        path = root.joinpath(*parts).resolve()
        if not path.is_relative_to(root) or path == root:
            raise ModelNotFoundError(f"{'/'.join(parts)!r} resolves outside repository {str(root)!r}")
        return path

    # metadata ------------------------------------------------------------------------------
    def config(self, family: str, variant: str) -> VariantConfig:
        return read_config(self.variant_dir(family, variant))

    def profile(self, family: str, variant: str) -> dict[str, Any]:
        """The ``profile.json`` content; ModelNotFoundError when the variant was never profiled."""
        return read_json(self.variant_dir(family, variant) / PROFILE_FILE)

    def is_profiled(self, family: str, variant: str) -> bool:
        return (self.variant_dir(family, variant) / PROFILE_FILE).is_file()

    def variant(self, family: str, variant: str) -> Variant:
        """The domain :class:`Variant` from a profile: measured memory, load time, latency, accuracy."""
        path = self.variant_dir(family, variant) / PROFILE_FILE
        data = read_json(path)
        try:
            p = _ProfileSummary.model_validate(data)
        except ValidationError as exc:
            raise CorruptModelError(f"{str(path)!r}: {describe_validation_error(exc, data)}") from exc
        return Variant(
            variant, p.memory_mb, p.accuracy, p.load_ms, p.latency_ms, p.accuracy_source,
            _batch_profile(data.get("latency")), p.load_cpu_ms, p.warm_load_ms,
        )  # fmt: skip

    def families(self, names: list[str] | None = None) -> tuple[Family, ...]:
        """Domain families from the profiles; variants not profiled yet are left out."""
        out = []
        for fam in names if names is not None else self.family_names():
            variants = [self.variant(fam, v) for v in self.variant_names(fam) if self.is_profiled(fam, v)]
            if variants:
                out.append(Family(fam, tuple(variants)))
            elif names is not None:
                raise ModelNotFoundError(f"family {fam!r} has no profiled variant in {str(self.root)!r}")
        return tuple(out)

    # loading -------------------------------------------------------------------------------
    def load(
        self, family: str, variant: str, device: str | None = None, skeleton: Skeleton | None = None
    ) -> LoadedModel:
        """Load a variant from disk onto ``device`` (CUDA when available by default).

        A stateful variant (``config.json`` says ``stateful``) loads as a
        :class:`~failsoft.zoo.stateful.StatefulModel`, in its initial state; a user's model (any
        ``model_format`` but ``builtin``) through its format's handler (:mod:`failsoft.zoo.formats`).
        ``skeleton``, one prepared ahead for this variant (:mod:`failsoft.zoo.skeletons`), is used
        (and consumed) rather than one built here."""
        from failsoft.zoo.network import load_network

        path = self.variant_dir(family, variant)
        config = read_config(path)
        dev = _pick_device(device)
        if config.model_format != "builtin":
            return load_handler_model(path, config, dev)
        module, forward = load_network(path, config, dev, skeleton)
        if config.stateful:  # compute/state/apply_state (failsoft.zoo.stateful)
            from failsoft.zoo.stateful import load_stateful

            return load_stateful(config, dev, module)
        return LoadedModel(family, variant, dev, config.input_shape, config.num_classes, module, forward)


def _versions(path: Path) -> list[int]:
    """A variant directory's versions: 1 for its own ``config.json``, and each numbered
    subdirectory with one (Triton's layout)."""
    found = {1} if (path / CONFIG_FILE).is_file() else set()
    for child in path.iterdir() if path.is_dir() else ():
        if child.name.isascii() and child.name.isdigit() and (child / CONFIG_FILE).is_file():
            found.add(int(child.name))
    return sorted(v for v in found if v >= 1)


def _batch_profile(latency: Any) -> tuple[tuple[int, float], ...]:
    """(batch size, p50 ms of the whole batch) from a profile's ``latency`` table, by growing size.

    A larger batch never takes less time than a smaller one: at sub-millisecond latencies timer noise
    can say otherwise, so the profile is made monotone (running maximum), which schedulers rely on.
    """
    if not isinstance(latency, dict):
        return ()
    points = []
    for size, row in latency.items():
        try:
            points.append((int(size), float(row["p50_ms"])))
        except (KeyError, TypeError, ValueError):
            return ()
    out, worst = [], 0.0
    for size, ms in sorted(points):
        worst = max(worst, ms)
        out.append((size, worst))
    return tuple(out)


def _pick_device(device: str | None) -> str:
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"invalid device {device!r}") from exc
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but CUDA is not available here")
    return str(parsed)
