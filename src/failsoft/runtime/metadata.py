"""The gateway's metadata of a deployment's families, read from the model repository.

``failsoft serve`` (:func:`failsoft.runtime.session.prepare`) and ``failsoft deploy``
(:mod:`failsoft.runtime.redeploy`) both check a deployment here before anything runs: each of its
services can be served, a coded service's parity models fit its data models, and every variant of a
family takes the same input (a failover must not change what a request has to look like).
"""

from __future__ import annotations

from typing import Any

from failsoft.domain import Scenario
from failsoft.errors import ConfigError
from failsoft.runtime.gateway.dispatch import check_dispatchable
from failsoft.runtime.gateway.protocol import ModelMeta
from failsoft.services import ServiceMode


def checked_models(repo: Any, deployment: Scenario) -> tuple[dict[str, ModelMeta], dict[str, list[str]]]:
    """The gateway's metadata of each family a deployment serves, once its services are checked
    (a mode the gateway cannot serve, a coded service's parity models); ConfigError otherwise.
    ``failsoft serve`` and ``failsoft deploy`` both check a deployment here."""
    from failsoft.zoo.formats.model import family_image_input, image_input_of

    check_dispatchable(deployment.all_services())  # a mode the gateway cannot serve yet: refused now
    _check_coded(repo, deployment)
    models, variants = {}, {}
    for family in deployment.families:
        shapes, labels, images = {}, {}, {}
        for v in family.variants:
            cfg = repo.config(family.name, v.name)
            datatype = cfg.inputs[0].datatype if cfg.inputs else "FP32"
            shapes[v.name] = (tuple(cfg.input_shape), int(cfg.num_classes), datatype)
            labels[v.name] = cfg.labels
            images[v.name] = image_input_of(repo.variant_dir(family.name, v.name), cfg)
        if len(set(shapes.values())) > 1:
            raise ConfigError(
                f"family {family.name!r} mixes input shapes across variants ({shapes}); "
                "an app's variants must take the same input"
            )
        shape, classes, datatype = next(iter(shapes.values()))
        first = repo.config(family.name, family.variants[0].name)  # its tensors' names are the app's
        models[family.name] = ModelMeta(
            shape, classes, _family_labels(family.name, labels), datatype,
            family_image_input(family.name, images), first.inputs, first.outputs,
        )  # fmt: skip
        variants[family.name] = [v.name for v in family.variants]
    return models, variants


def _family_labels(family: str, labels: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The class names an app answers with: those of the family's variants that name their classes,
    which must agree (a failover must not rename a class); () when none does."""
    named = {v: names for v, names in labels.items() if names}
    if len(set(named.values())) > 1:
        raise ConfigError(f"family {family!r}: its variants name their classes differently ({named})")
    return next(iter(named.values()), ())


def _check_coded(repo: Any, deployment: Any) -> None:
    """Each coded service's parity members hold parity models trained for its data variant (ParM)."""
    coded = [s for s in deployment.all_services() if s.mode is ServiceMode.CODED]
    if coded:
        from failsoft.zoo.parity import check_coded_service

        apps = {a.name: a for a in deployment.apps}
        for service in coded:
            check_coded_service(repo, service, apps)
