"""The serve process's side of ``failsoft deploy``: a new config checked, resolved, handed to the
controller; the gateway then serves its services.

``POST /admin/deploy`` (:mod:`failsoft.runtime.gateway.admin`) brings a parsed config here. Every
check that can refuse it runs before anything changes, and a refusal is one line (ConfigError,
HTTP 400, exit status 2 in the CLI):

1. the config validates as ``failsoft serve`` validates one
   (:func:`~failsoft.runtime.config.config_from_dict`);
2. what a deploy cannot change is as it runs: the cluster's name, servers and model repository
   (the other runtime sections, such as the gateway's port or the agents' settings, are those of the
   running processes: a difference is reported as a note, not applied);
3. it resolves against the repository (unknown family or variant, a primary that does not fit),
   apps whose config leaves the server open keeping the home they run on
   (:func:`~failsoft.runtime.deployment.resolve`'s ``keep``), and its services are servable;
4. the controller plans it against what runs (:func:`~failsoft.orchestration.deploy.plan_deploy`:
   modes, memory during the deploy) and, unless it is a dry run, starts carrying the plan out.

Only then does the gateway change: it starts serving new and changed services and stops taking
requests for removed ones (their requests on the way are answered; the core unloads them after its
``retire_s``). Deploys are taken one at a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from failsoft.domain import App, Family, Placement
from failsoft.errors import ConfigError, UnknownNameError
from failsoft.orchestration.deploy import Desired, MemoryRefused
from failsoft.runtime.config import RuntimeConfig, config_from_dict
from failsoft.runtime.deployment import resolve
from failsoft.versions import split_version, versioned

if TYPE_CHECKING:
    from failsoft.domain import Scenario
    from failsoft.runtime.cluster import ControllerRef
    from failsoft.runtime.gateway.app import Gateway
    from failsoft.runtime.gateway.protocol import ModelMeta

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resolved:
    """A new config made ready for the controller: what it wants and what the gateway will serve."""

    desired: Desired
    models: dict[str, ModelMeta]
    variants: dict[str, list[str]]
    digest: str
    notes: tuple[str, ...]


def config_digest(data: Any) -> str:
    """Identifies a config's content (shown by ``failsoft status`` beside its version)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


def fixed_settings(running: RuntimeConfig, new: RuntimeConfig) -> tuple[str, ...]:
    """Refuse what a deploy cannot change; notes for the runtime settings it does not apply."""
    for what, a, b in (
        ("name", running.name, new.name),
        ("model repository", str(running.repository), str(new.repository)),
    ):
        if a != b:
            raise ConfigError(
                f"{new.source}: the {what} differs from the running cluster's ({b!r}, running {a!r}): "
                "it changes only with a restart of 'failsoft serve'"
            )
    return tuple(
        f"{what} differs from the running cluster's: not applied (it changes with a restart)"
        for what in ("heartbeat", "agents", "placements")
        if getattr(running, what) != getattr(new, what)
    )


def resolve_config(
    running: RuntimeConfig, data: Any, source: str, base_dir: Path | None, current: dict[str, Any]
) -> Resolved:
    """Checks 1-3 of the module docstring; ``current`` is ``Controller.deployment()``'s answer."""
    from failsoft.runtime.metadata import checked_models
    from failsoft.zoo import ModelRepository

    new = config_from_dict(data, source=source, base_dir=base_dir)
    notes = fixed_settings(running, new)
    repo = ModelRepository(running.repository)
    deployed: Scenario = current["deployment"]
    keep = {a.name: a for a in deployed.apps}
    where = f"model repository {str(running.repository)!r}"
    scenario = resolve(new, repo.families(), repository=where, keep=keep)
    models, variants = checked_models(repo, scenario)
    desired = Desired(scenario, new.policy, new.replan_delay_s)
    return Resolved(desired, models, variants, config_digest(data), notes)


class Redeployer:
    """``POST /admin/deploy`` and ``GET /admin/deploy`` for one gateway (one deploy at a time)."""

    def __init__(self, running: RuntimeConfig, controller: ControllerRef, gateway: Gateway) -> None:
        self.running, self.controller, self.gateway = running, controller, gateway
        self._lock = asyncio.Lock()

    async def deploy(self, data: Any, source: str, base_dir: str | None, dry_run: bool) -> dict[str, Any]:
        if self._lock.locked():
            raise ConfigError("another deploy is being checked: wait until it is answered")
        async with self._lock:
            current = await self.controller.deployment()
            base = Path(base_dir) if base_dir else None
            resolved = await asyncio.to_thread(resolve_config, self.running, data, source, base, current)
            answer = await self.controller.deploy(resolved.desired, resolved.digest, dry_run)
            if answer["changed"]:
                changes = await self.gateway.apply_deployment(
                    resolved.desired.deployment, resolved.models, resolved.variants
                )
                log.info("deploy %s: gateway services %s", answer["version"], changes)
            return {**answer, "digest": resolved.digest, "notes": list(resolved.notes)}

    async def status(self) -> dict[str, Any]:
        return await self.controller.deploy_status()

    # Triton's model control (POST /v2/repository/models/{name}/load, /unload) -------------------
    async def load_model(self, name: str, version: int | None) -> dict[str, Any]:
        """A rolling update of app ``name`` to ``version`` of its variant (the latest in the
        repository when None): beside the old one on its server, else, when memory is short there,
        on the server of one of its warm backups, else on any server with room."""
        if self._lock.locked():
            raise ConfigError("another deploy is being checked: wait until it is answered")
        async with self._lock:
            current = await self.controller.deployment()
            changes = await asyncio.to_thread(self._version_changes, current, name, version)
            last: ConfigError | None = None
            for desired, models, variants, what in changes:
                try:
                    await self.controller.deploy(desired, what, True)  # a dry run: does it fit there?
                except MemoryRefused as exc:
                    last = exc
                    continue
                return await self._carry_out(desired, models, variants, what)
            assert last is not None
            raise last

    async def unload_model(self, name: str) -> dict[str, Any]:
        """Triton's unload: the app is removed, as by a config without it (drained, then unloaded)."""
        if self._lock.locked():
            raise ConfigError("another deploy is being checked: wait until it is answered")
        async with self._lock:
            current = await self.controller.deployment()
            deployed: Scenario = current["deployment"]
            _app(deployed, name)
            for service in deployed.services:
                if name in service.members:
                    raise ConfigError(
                        f"app {name!r} is a member of service {service.name!r} ({service.mode.value}): "
                        "deploy a config without that service instead"
                    )
            apps = tuple(a for a in deployed.apps if a.name != name)
            new = deployed.replace(apps=apps, families=_used(deployed.families, apps))
            desired = Desired(new, current["policy"], current["replan_delay_s"])
            return await self._carry_out(desired, {}, {}, f"unload {name}")

    async def _carry_out(
        self, desired: Desired, models: dict[str, Any], variants: dict[str, list[str]], what: str
    ) -> dict[str, Any]:
        answer = await self.controller.deploy(desired, what, False)
        if answer["changed"]:
            await self.gateway.apply_deployment(desired.deployment, models, variants)
        return {**answer, "digest": what, "notes": []}

    def _version_changes(
        self, current: dict[str, Any], name: str, version: int | None
    ) -> list[tuple[Desired, dict[str, Any], dict[str, list[str]], str]]:
        """The deployments that put ``version`` of ``name``'s variant on each candidate server."""
        from failsoft.runtime.metadata import checked_models
        from failsoft.zoo import ModelRepository

        deployed: Scenario = current["deployment"]
        app = _app(deployed, name)
        assert app.primary is not None
        repo = ModelRepository(self.running.repository)
        base, _ = split_version(app.primary.variant)
        versions = repo.versions(app.family, base)
        version = version or max(versions, default=1)
        if version not in versions:
            raise UnknownNameError(
                f"model {name!r} has no version {version} of {app.family}/{base} in the repository "
                f"(versions: {', '.join(map(str, versions)) or 'none'})"
            )
        variant = versioned(base, version)
        families = repo.families([f.name for f in deployed.families])
        backups = [w.server for w in current.get("warm", ()) if w.app == name]
        servers = [app.primary.server, *backups, *(s.name for s in deployed.servers)]
        out = []
        for server in dict.fromkeys(servers):
            moved = dataclasses.replace(app, primary=Placement(server, variant))
            new = deployed.replace(
                families=families, apps=tuple(moved if a.name == name else a for a in deployed.apps)
            )
            models, variants = checked_models(repo, new)
            desired = Desired(new, current["policy"], current["replan_delay_s"])
            out.append((desired, models, variants, f"load {name} version {version}"))
        return out


def _app(deployment: Scenario, name: str) -> App:
    if not deployment.has_app(name):
        known = ", ".join(a.name for a in deployment.apps)
        raise UnknownNameError(f"no app {name!r} in the running deployment (apps: {known})")
    return deployment.app(name)


def _used(families: tuple[Family, ...], apps: tuple[App, ...]) -> tuple[Family, ...]:
    return tuple(f for f in families if any(a.family == f.name for a in apps))
