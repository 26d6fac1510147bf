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
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from failsoft.errors import ConfigError
from failsoft.orchestration.deploy import Desired
from failsoft.runtime.config import RuntimeConfig, config_from_dict
from failsoft.runtime.deployment import resolve

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
