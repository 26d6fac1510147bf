"""The model zoo: model families and variants, built, trained and profiled into a repository on disk.

Every fail-soft mechanism trades accuracy for availability between variants of one model family
(FailLite section 2.4, Fig. 2). This package gives failsoft real families to serve and honest
profiles of them:

* :func:`build_zoo` trains the digits families (accuracy measured) and rebuilds published ImageNet
  architectures from ``transformers`` configs (accuracy declared), writing a Triton-like
  :class:`ModelRepository` (``<root>/<family>/<variant>/{model.safetensors, config.json,
  profile.json}``);
* the profiler measures memory, cold load time, latency and throughput on this machine;
* :meth:`ModelRepository.families` turns the profiles into domain :class:`~failsoft.domain.Family`
  objects, and :func:`families_section` into the ``families`` block of a scenario JSON;
* :meth:`ModelRepository.load` returns a :class:`LoadedModel` that answers numpy batches.

Importing this package does not import torch or transformers; building and loading do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from failsoft.zoo.loaded import LoadedModel
from failsoft.zoo.repository import ModelRepository, default_zoo_path, resolve_repository
from failsoft.zoo.scenario import families_from_csv, families_section

if TYPE_CHECKING:
    from failsoft.zoo.build import BuildEvent, build_zoo
    from failsoft.zoo.profiler import ProfileSettings, profile_variant

_LAZY = {
    "build_zoo": "failsoft.zoo.build",
    "BuildEvent": "failsoft.zoo.build",
    "ProfileSettings": "failsoft.zoo.profiler",
    "profile_variant": "failsoft.zoo.profiler",
}

__all__ = [
    "BuildEvent",
    "LoadedModel",
    "ModelRepository",
    "ProfileSettings",
    "build_zoo",
    "default_zoo_path",
    "families_from_csv",
    "families_section",
    "profile_variant",
    "resolve_repository",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'failsoft.zoo' has no attribute {name!r}")
