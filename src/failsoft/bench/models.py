"""What a benchmark's config needs in the model repository, built on first use.

A benchmark is run by someone who has just read its command: ``failsoft bench coding
examples/coded.yaml`` on a fresh machine must not end with "no variant ... in repository". Before
any cluster starts, :func:`ensure_models` builds into the config's repository (see
:func:`failsoft.zoo.resolve_repository`) what it lacks:

* every variant of each zoo family the config's apps use (failover may pick any variant of a
  family, so the whole family; quick profiles);
* each coded service's parity models (ParM): trained on the digits for a digits variant
  (:func:`~failsoft.zoo.parity.train_parity`, about a minute per model on one core), or with random
  weights for any other architecture, as ``failsoft parity train --random-weights`` does.

Building is idempotent and resumes; a parity model already there is kept as it is (the session's
own check then refuses one trained for another variant, k, r or encoder, naming it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from failsoft.errors import ConfigError, ModelNotFoundError
from failsoft.runtime.config import RuntimeConfig, config_from_dict
from failsoft.services import CodedParams

if TYPE_CHECKING:
    from failsoft.zoo.parity import ParityTraining

Progress = Callable[[str], None]


def ensure_config_models(path: Path, data: dict[str, Any], say: Progress) -> None:
    """:func:`ensure_models` for a benchmark's config dict (as read from ``path``)."""
    ensure_models(config_from_dict(data, source=str(path), base_dir=path.parent), say)


def ensure_models(config: RuntimeConfig, say: Progress, training: ParityTraining | None = None) -> None:
    """Build the config's zoo families, then its coded services' parity models (trained with
    ``training``, the paper's configuration by default), where missing."""
    ensure_families(config, say)
    ensure_parity(config, say, training)


def ensure_families(config: RuntimeConfig, say: Progress) -> None:
    """Build (quick profiles) every variant of the config's zoo families that the repository lacks.

    The zoo's default build has ResNet-18/34/50 only; failover may use any variant of a family, so
    the whole family must be there. Families the zoo's catalog does not know (parity models, a
    user's own) are left to :func:`ensure_parity` and to the session's check.
    """
    from failsoft.zoo import ModelRepository, build_zoo
    from failsoft.zoo.catalog import FAMILIES, family_spec
    from failsoft.zoo.profiler import QUICK

    root = config.repository
    repo = ModelRepository(root)
    known = {f.name for f in FAMILIES}
    missing = []
    for family in sorted({a.family for a in config.apps} & known):
        built = set(repo.variant_names(family)) if repo.root.is_dir() else set()
        if {v.name for v in family_spec(family).variants} - built:
            missing.append(family)
    for family in missing:  # before minutes of building: a family whose inputs differ cannot fail over
        sizes = {v.name: v.architecture().get("image_size") for v in family_spec(family).variants}
        if len({size for size in sizes.values() if size is not None}) > 1:
            raise ConfigError(
                f"family {family!r} cannot serve an app: its variants take different input sizes "
                f"({', '.join(f'{n}: {s}' for n, s in sizes.items())}); nothing was built"
            )
    if missing:
        say(f"building {', '.join(missing)} into {root} (once; minutes for ImageNet families) ...")
        build_zoo(root, families=missing, settings=QUICK)


def ensure_parity(config: RuntimeConfig, say: Progress, training: ParityTraining | None = None) -> None:
    """Store each coded service's missing parity models, under the names its parity members serve.

    A parity member that names another family or variant than the code's own is left alone: the
    session refuses it with the name it should have.
    """
    from failsoft.zoo import ModelRepository
    from failsoft.zoo.parity import ParityCode, random_parity, train_parity
    from failsoft.zoo.profiler import QUICK

    repo = ModelRepository(config.repository)
    apps = {a.name: a for a in config.apps}
    for service in config.services:
        params = service.params
        if not isinstance(params, CodedParams):
            continue
        lead = apps.get(service.members[0])
        if lead is None or lead.variant is None:
            continue  # the session names what is wrong
        for index, member in enumerate(service.members[params.k :]):
            code = ParityCode(lead.family, lead.variant, params.k, params.r, params.encoder, index)
            app = apps.get(member)
            if app is None or (app.family, app.variant) != (code.parity_family, code.parity_variant):
                continue
            try:
                repo.config(code.parity_family, code.parity_variant)
                continue  # there already
            except ModelNotFoundError:
                pass
            deployed = repo.config(code.family, code.variant).arch
            if deployed in ("digits_mlp", "digits_cnn"):
                name = f"{code.parity_family}/{code.parity_variant}"
                say(f"training the parity model {name} (once, about a minute) ...")
                train_parity(repo, code, training, settings=QUICK)
            else:
                say(f"storing a random-weight parity model {code.parity_family}/{code.parity_variant} ...")
                random_parity(repo, code, settings=QUICK)
