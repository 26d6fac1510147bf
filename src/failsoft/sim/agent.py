"""The SimPy twin of the runtime's agent: one per server (FailLite 3.4 and 4).

In the runtime an agent is a Ray actor on its server: it loads and unloads models through the
serving engine and pushes a heartbeat to the controller every ``interval``. Here it is a plain
object driven by SimPy processes, doing the same things with durations from the profiles:

* **memory**: what the loaded models take; a load that would overflow the server's memory fails
  (an out-of-memory load, counted; a correct plan never causes one);
* **loads** take the variant's profiled ``load_ms`` (``warm_load_ms`` with ``SimConfig.page_cache``
  warm, where it was measured), plus, with ``SimConfig.warm_up``, the profiled cost of the runtime's
  warm-up inferences beyond the first answer: in a background load (warm backups, upgrades) before
  it is ready; after a recovery load, as the runtime does, as background work on the host's cores
  that the app's route does not wait for; which ones run at once and in which order is the
  orchestration core's per-server load queue (the runtime's), not the agent's. A load waits for the
  unloads issued to this server before it (``SimConfig.unload_ms``): the memory it needs may be
  theirs. On a shared host (``SimConfig.host_cores``) a load is CPU work on
  :class:`~failsoft.sim.cpu.SharedCPU` at the runtime's load priority (background loads lower), so
  it takes longer while others run; of a cold load only the profiled ``load_cpu_ms`` is work, the
  rest waits for the disk and takes no core; and every load holds its slot ``SimConfig.control_ms``
  longer (the controller's call to the agent and back, the route's publication: a wait, measured by
  ``bench fidelity``'s control probe), or first does ``SimConfig.control_work_ms`` of work at nice 0
  (the same path as threads that wait for a core: it takes longer while more runs beside it; with
  ``SimConfig.control_ahead`` it runs ahead of the loads, as a short job that woke, and waits only
  for other control work);
* **heartbeats**: at ``phase + k * interval`` until the agent crashes or the controller no longer
  listens; :class:`~failsoft.sim.heartbeats.HeartbeatFeed` works them out for the detector.

A crash is abrupt: the agent stops heartbeating, its models are gone, and a load in progress on it
fails.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator
from typing import Any

import simpy

from failsoft.domain import Server, Variant
from failsoft.errors import ConfigError
from failsoft.orchestration.loads import load_nice
from failsoft.policies.queueing import warmup_ms
from failsoft.sim.config import PageCache, SimConfig
from failsoft.sim.cpu import SharedCPU
from failsoft.sim.trace import EventLog

_EPS = 1e-6
CONTROL_NICE = 0  # the controller's, Ray's and the agent's call threads run at the default priority


class SimAgent:
    """Models, memory, load path and heartbeats of one simulated server."""

    def __init__(
        self,
        env: simpy.Environment,
        server: Server,
        config: SimConfig,
        log: EventLog,
        cpu: SharedCPU | None = None,
    ) -> None:
        self.env, self.server, self.config, self.log, self.cpu = env, server, config, log, cpu
        self.alive = True
        self.models: Counter[tuple[str, str]] = Counter()  # (app, variant) -> copies loaded or loading
        self.used_mb = 0.0
        self.oom_loads = 0
        self.unloaded_at = 0.0  # when the last unload issued here frees its memory

    @property
    def name(self) -> str:
        return self.server.name

    @property
    def free_mb(self) -> float:
        return self.server.memory_mb - self.used_mb

    def preload(self, app: str, variant: Variant) -> None:
        """A model already loaded when the simulation starts (steady state before the failure)."""
        if not self._reserve(app, variant):
            raise ConfigError(
                f"server {self.name!r} cannot hold {variant.name} for {app!r} at start "
                f"({self.free_mb:.1f} MB free of {self.server.memory_mb:.1f})"
            )

    def load(self, app: str, variant: Variant, background: bool = False) -> Generator[simpy.Event, Any, bool]:
        """Process: load ``variant`` for ``app``; its value is True once the model is ready."""
        if self.unloaded_at > self.env.now:
            yield self.env.timeout(self.unloaded_at - self.env.now)
        if not self.alive:
            return False
        if not self._reserve(app, variant):
            self.oom_loads += 1
            self.log.add(self.env.now, "oom", app, self.name, variant.name)
            return False
        self.log.add(self.env.now, "load-start", app, self.name, variant.name)
        work_ms, wait_ms = self.load_parts_ms(variant, background)
        wait_ms += self.config.control_ms  # the control path's round trip: no core taken
        if wait_ms > 0:
            yield self.env.timeout(wait_ms / 1000.0)
        control = self.config.control_work_ms / 1000.0
        if self.alive and control > 0:  # ... or taken, at the control path's priority (or ahead)
            yield from self.work(control, CONTROL_NICE, self.config.control_ahead)
        if not self.alive:
            return False
        yield from self.work(work_ms / 1000.0, load_nice(variant, background))
        if not self.alive:
            return False
        self.log.add(self.env.now, "loaded", app, self.name, variant.name)
        later = self._warmup_ms(variant) if not background else 0.0
        if later > 0 and self.cpu is not None:  # the runtime's deferred warm-up: takes a core, no wait
            self.env.process(self.work(later / 1000.0, load_nice(variant, background=True)))
        return True

    def load_ms(self, variant: Variant, background: bool = False) -> float:
        """How long loading ``variant`` takes alone: its profile, and the warm-up when modelled."""
        return sum(self.load_parts_ms(variant, background))

    def load_parts_ms(self, variant: Variant, background: bool = False) -> tuple[float, float]:
        """A load alone as (work, wait): CPU work (a core's milliseconds, a background load's warm-up
        included when modelled: a recovery load leaves it for after) and the disk wait beside it,
        which only a cold load with a measured CPU time has (without one, the whole profiled load is
        taken as work: the conservative reading)."""
        warmup = self._warmup_ms(variant) if background else 0.0
        if self.config.page_cache is PageCache.WARM and variant.warm_load_ms is not None:
            return variant.warm_load_ms + warmup, 0.0
        work = variant.load_work_ms
        return work + warmup, variant.load_ms - work

    def _warmup_ms(self, variant: Variant) -> float:
        return warmup_ms(variant, self.config.max_batch) if self.config.warm_up else 0.0

    def work(self, seconds: float, nice: int, ahead: bool = False) -> Generator[simpy.Event, Any, bool]:
        """Process: ``seconds`` of one core's work, on the shared host when there is one (``ahead``:
        before the other jobs there, as a short job that woke)."""
        if self.cpu is None:
            yield self.env.timeout(seconds)
            return True
        return (yield from self.cpu.run(seconds, nice, owner=self.name, ahead=ahead))

    def unload(self, app: str, variant: Variant) -> None:
        """Free a model's memory; loads issued after this wait ``SimConfig.unload_ms`` for it."""
        key = (app, variant.name)
        if not self.alive or self.models[key] == 0:
            return
        self.unloaded_at = max(self.unloaded_at, self.env.now + self.config.unload_ms / 1000.0)
        self.models[key] -= 1
        self.used_mb -= variant.memory_mb
        self.log.add(self.env.now, "unloaded", app, self.name, variant.name)

    def crash(self) -> None:
        self.alive = False
        if self.cpu is not None:
            self.cpu.cancel(self.name)
        self.models.clear()
        self.used_mb = 0.0
        self.log.add(self.env.now, "crash", "", self.name, "")

    def _reserve(self, app: str, variant: Variant) -> bool:
        if variant.memory_mb > self.free_mb + _EPS:
            return False
        self.models[(app, variant.name)] += 1
        self.used_mb += variant.memory_mb
        return True
