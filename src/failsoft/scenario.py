"""The scenario JSON (docs/scenario.md): validated once at the edge, then turned into the domain model.

A scenario describes a cluster for the planners (``failsoft plan``) and the simulator::

    {"servers":  [{"name": "s1", "site": "edge-a", "memory_mb": 16384, "compute": 1.0}],
     "families": {"convnext": [{"variant": "convnext_tiny", "memory_mb": 330, "accuracy": 0.821,
                                "load_ms": 441, "latency_ms": 4.2}, ...]},
     "apps": [{"name": "cam-1", "family": "convnext",
               "primary": {"server": "s1", "variant": "convnext_large"},
               "critical": true, "rate_rps": 10, "slo_ms": 100}],
     "policy": {"alpha": 0.1, "site_independent": true, "warm_replicas": 1},
     "warm": [{"app": "cam-1", "variant": "convnext_tiny", "server": "s2"}]}   # optional

Anything wrong (a missing field, a negative capacity, an unknown family or server, a duplicate name)
is refused with one :class:`~failsoft.errors.ConfigError` whose message names the offending entry and
the bad value. Nothing here raises anything else.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from failsoft.bounds import describe_validation_error
from failsoft.domain import App, Family, Placement, PolicyParams, Scenario, Server, Variant, WarmBackup
from failsoft.errors import ConfigError
from failsoft.services import PARAMS_OF_MODE, Service, ServiceMode, check_services


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_Model = TypeVar("_Model", bound=BaseModel)


class ServerSpec(_Strict):
    name: str = Field(min_length=1)
    site: str = Field(min_length=1)
    memory_mb: float = Field(ge=0)
    compute: float = Field(default=1.0, ge=0)


class VariantSpec(_Strict):
    variant: str = Field(min_length=1)
    memory_mb: float = Field(gt=0)
    accuracy: float = Field(ge=0, le=1)
    load_ms: float = Field(ge=0)
    latency_ms: float = Field(gt=0)
    accuracy_source: str = Field(default="declared", pattern="^(measured|declared)$")
    # measured latency of a whole batch by batch size, e.g. {"1": 0.4, "4": 0.9, "16": 2.8}
    batch_latency_ms: dict[int, float] | None = None
    # the CPU time of a cold load (the rest of load_ms waited for the disk), and a load from the
    # page cache; both optional (the simulator's shared host and warm page cache use them)
    load_cpu_ms: float | None = Field(default=None, ge=0)
    warm_load_ms: float | None = Field(default=None, ge=0)

    def batch_profile(self) -> tuple[tuple[int, float], ...]:
        points = sorted((self.batch_latency_ms or {}).items())
        for size, ms in points:
            if size < 1 or not ms > 0:
                raise ConfigError(
                    f"variant {self.variant!r}: batch_latency_ms needs batch sizes >= 1 and positive "
                    f"latencies; got {size}: {ms}"
                )
        return tuple((int(b), float(ms)) for b, ms in points)


class PlacementSpec(_Strict):
    server: str = Field(min_length=1)
    variant: str = Field(min_length=1)


class AppSpec(_Strict):
    name: str = Field(min_length=1)
    family: str = Field(min_length=1)
    primary: PlacementSpec | None = None
    critical: bool = False
    rate_rps: float = Field(default=1.0, ge=0)
    slo_ms: float | None = Field(default=None, gt=0)


class WarmSpec(_Strict):
    app: str = Field(min_length=1)
    variant: str = Field(min_length=1)
    server: str = Field(min_length=1)
    pinned: bool = False


class ServiceSpec(_Strict):
    """A service of member apps; ``params`` are validated by the mode's parameter class."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    mode: ServiceMode
    members: list[str] = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)


class ScenarioSpec(_Strict):
    servers: list[ServerSpec] = Field(min_length=1)
    families: dict[str, list[VariantSpec]] = Field(min_length=1)
    apps: list[AppSpec]
    policy: PolicyParams = Field(default_factory=PolicyParams)
    warm: list[WarmSpec] | None = None
    services: list[ServiceSpec] = Field(default_factory=list)


# ----------------------------------------------------------------------------------------------


def read_document(path: Path, what: str) -> str:
    """The text of a scenario or config file; an unreadable one is one ConfigError naming it."""
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from exc


def validate_document(model: type[_Model], data: Any, source: str, top: str) -> _Model:
    """``data`` as ``model``; anything wrong is one ConfigError naming the offending entry.

    ``top`` names what the document must be at its top level ("a mapping", "a JSON object").
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected {top} at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_validation_error(exc, data)}") from exc


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    path = Path(path)
    text = read_document(path, "scenario")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"scenario {str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    return scenario_from_dict(data, source=str(path))


def scenario_from_dict(data: Any, source: str = "scenario") -> Scenario:
    """Validate a parsed scenario and build the domain model."""
    return _build(validate_document(ScenarioSpec, data, source, "a JSON object"), source)


def _build(spec: ScenarioSpec, source: str) -> Scenario:
    _refuse_duplicates(source, "server", [s.name for s in spec.servers])
    _refuse_duplicates(source, "app", [a.name for a in spec.apps])
    families = []
    for fam_name, variants in spec.families.items():
        if not variants:
            raise ConfigError(f"{source}: family {fam_name!r} has no variants")
        _refuse_duplicates(source, f"variant of family {fam_name!r}", [v.variant for v in variants])
        families.append(
            Family(
                fam_name,
                tuple(
                    Variant(
                        v.variant,
                        v.memory_mb,
                        v.accuracy,
                        v.load_ms,
                        v.latency_ms,
                        v.accuracy_source,
                        v.batch_profile(),
                        v.load_cpu_ms,
                        v.warm_load_ms,
                    )
                    for v in variants
                ),
            )
        )
    servers = tuple(Server(s.name, s.site, s.memory_mb, s.compute) for s in spec.servers)
    server_names = {s.name for s in servers}
    family_index = {f.name: f for f in families}
    apps = []
    for i, a in enumerate(spec.apps):
        where = f"apps[{i}] {a.name!r}"
        family = family_index.get(a.family)
        if family is None:
            raise ConfigError(
                f"{source}: {where}: unknown family {a.family!r} (known: {_names(family_index)})"
            )
        primary = None
        if a.primary is not None:
            if a.primary.server not in server_names:
                raise ConfigError(f"{source}: {where}: primary server {a.primary.server!r} does not exist")
            if not family.has_variant(a.primary.variant):
                raise ConfigError(
                    f"{source}: {where}: family {a.family!r} has no variant {a.primary.variant!r} "
                    f"(known: {', '.join(v.name for v in family.variants)})"
                )
            primary = Placement(a.primary.server, a.primary.variant)
        apps.append(App(a.name, a.family, primary, a.critical, a.rate_rps, a.slo_ms))
    app_index = {a.name: a for a in apps}
    warm = None
    if spec.warm is not None:
        warm = tuple(
            _warm_backup(source, i, w, app_index, family_index, server_names) for i, w in enumerate(spec.warm)
        )
    services = build_services(spec.services, app_index, source)
    return Scenario(servers, tuple(families), tuple(apps), spec.policy, warm, services)


def build_services(specs: list[ServiceSpec], apps: dict[str, Any], source: str) -> tuple[Service, ...]:
    """The services of a scenario or config, each mode's ``params`` validated by its class."""
    services = []
    for i, spec in enumerate(specs):
        where = f"services[{i}] ({spec.name!r})"
        cls = PARAMS_OF_MODE[spec.mode]
        try:
            params: Any = TypeAdapter(cls).validate_python(spec.params)
        except ValidationError as exc:
            raise ConfigError(f"{source}: {where}.params: {describe_validation_error(exc, None)}") from exc
        try:
            services.append(Service(spec.name, spec.mode, tuple(spec.members), params))
        except ValueError as exc:  # ConfigError included: member counts, graph shape
            raise ConfigError(f"{source}: {where}: {exc}") from exc
    check_services(services, apps, source)
    return tuple(services)


def _warm_backup(
    source: str, i: int, w: WarmSpec, apps: dict[str, App], families: dict[str, Family], servers: set[str]
) -> WarmBackup:
    where = f"warm[{i}]"
    app = apps.get(w.app)
    if app is None:
        raise ConfigError(f"{source}: {where}: unknown app {w.app!r}")
    if w.server not in servers:
        raise ConfigError(f"{source}: {where}: server {w.server!r} does not exist")
    if not families[app.family].has_variant(w.variant):
        raise ConfigError(f"{source}: {where}: family {app.family!r} has no variant {w.variant!r}")
    return WarmBackup(w.app, w.variant, w.server, w.pinned)


def _refuse_duplicates(source: str, what: str, names: list[str]) -> None:
    dupes = [name for name, count in Counter(names).items() if count > 1]
    if dupes:
        raise ConfigError(f"{source}: duplicate {what} name {dupes[0]!r}")


def _names(index: dict[str, Any]) -> str:
    return ", ".join(sorted(index)) or "none"


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """The inverse of :func:`scenario_from_dict`, for writing generated scenarios."""
    out: dict[str, Any] = {
        "servers": [
            {"name": s.name, "site": s.site, "memory_mb": s.memory_mb, "compute": s.compute}
            for s in scenario.servers
        ],
        "families": {
            f.name: [
                {
                    "variant": v.name,
                    "memory_mb": v.memory_mb,
                    "accuracy": v.accuracy,
                    "load_ms": v.load_ms,
                    "latency_ms": v.latency_ms,
                    "accuracy_source": v.accuracy_source,
                }
                | ({"batch_latency_ms": dict(v.batch_latency_ms)} if v.batch_latency_ms else {})
                | ({"load_cpu_ms": v.load_cpu_ms} if v.load_cpu_ms is not None else {})
                | ({"warm_load_ms": v.warm_load_ms} if v.warm_load_ms is not None else {})
                for v in f.variants
            ]
            for f in scenario.families
        },
        "apps": [],
        "policy": dataclasses.asdict(scenario.policy),
    }
    for a in scenario.apps:
        app: dict[str, Any] = {"name": a.name, "family": a.family}
        if a.primary is not None:
            app["primary"] = {"server": a.primary.server, "variant": a.primary.variant}
        app.update({"critical": a.critical, "rate_rps": a.rate_rps})
        if a.slo_ms is not None:
            app["slo_ms"] = a.slo_ms
        out["apps"].append(app)
    if scenario.warm is not None:
        out["warm"] = [
            {"app": w.app, "variant": w.variant, "server": w.server} | ({"pinned": True} if w.pinned else {})
            for w in scenario.warm
        ]
    if scenario.services:
        out["services"] = [service_to_dict(s) for s in scenario.services]
    return out


def service_to_dict(service: Service) -> dict[str, Any]:
    params = TypeAdapter(type(service.params)).dump_python(service.params, mode="json")
    return {
        "name": service.name,
        "mode": service.mode.value,
        "members": list(service.members),
        "params": params,
    }
