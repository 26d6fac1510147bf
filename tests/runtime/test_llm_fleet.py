"""The controller's LlmFleet as the core's executor, with fake workers on a manual clock (no Ray:
fakes stand in for the worker actors, whose death is what cannot be produced here cheaply).

The real orchestration core decides (placement, failure, where a restart goes, draft first); the
fleet carries its commands out and reports back, wired as the controller wires them: the table,
the events, a standby adopting a dead worker's name, a probe finding a dead actor."""

from __future__ import annotations

import asyncio
import functools
import itertools
from pathlib import Path
from typing import Any

from failsoft.clock import ManualClock
from failsoft.domain import PolicyParams, Scenario, Server
from failsoft.errors import ServerUnavailableError
from failsoft.orchestration import ClusterState, Emit, OrchestrationSettings, Orchestrator
from failsoft.orchestration.llm_state import LlmGroup
from failsoft.runtime.llm_config import LlmServiceModel, llm_serving
from failsoft.runtime.llm_fleet import LlmFleet

PIDS = itertools.count(100)


class FakeWorker:
    """A worker actor's async API; ``dead`` makes every call fail as a dead actor's does, and
    ``refuse`` adoptions (of any worker) fail as one whose process died while adopting."""

    refuse = 0

    def __init__(self, name: str, server: str, spec: Any) -> None:
        self.name, self.server, self.spec = name, server, spec
        self.pid = next(PIDS)
        self.dead = False
        self.killed = False
        self.adopted: tuple[str, str | None] | None = None
        self.preloaded: str | None = None
        self.target = asyncio.Event()

    def _alive(self) -> None:
        if self.dead or self.killed:
            raise ServerUnavailableError(f"worker {self.name}: unavailable")

    async def info(self, timeout_s: float = 10.0) -> dict[str, Any]:
        self._alive()
        return {"pid": self.pid, "model": "m", "context": 128, "kv_mb_per_token": 0.01, "fingerprint": "f"}

    async def preload_draft(self, spec: Any, draft: str, timeout_s: float = 600.0) -> dict[str, Any]:
        self._alive()
        self.preloaded = draft
        return {"pid": self.pid, "draft": draft, "preload_ms": 12.5}

    async def adopt(
        self, spec: Any, draft: str | None, delay: float, timeout_s: float = 600.0
    ) -> dict[str, Any]:
        self._alive()
        if FakeWorker.refuse:
            FakeWorker.refuse -= 1
            raise ServerUnavailableError(f"worker {self.name}: died while adopting")
        self.adopted = (spec.name, draft)
        if draft is None:
            self.target.set()
        return {"acceptance": 0.7}

    async def wait_target(self, timeout_s: float = 600.0) -> dict[str, Any]:
        await self.target.wait()
        self._alive()
        return {}

    def kill(self) -> None:
        self.killed = True


class Wired:
    """The core, the fleet and the controller's wiring between them (``_LlmReports``, ``_feed``)."""

    def __init__(self, tmp_path: Path, draft: bool) -> None:
        model: dict[str, Any] = {"root": str(tmp_path)}
        if draft:  # a Hugging Face model with a draft: lumen restarts draft first
            (tmp_path / "config.json").write_text("{}")
            model = {"path": str(tmp_path), "draft": str(tmp_path)}
        spec = LlmServiceModel(name="bytes", mode="llm", workers=3, spares=1, policy="lumen", model=model)
        self.serving = llm_serving(spec, "test", ("s1", "s2", "s3"), tmp_path)
        servers = tuple(Server(s, "a", 1000, 10) for s in ("s1", "s2", "s3"))
        self.state = ClusterState.deployed(Scenario(servers, (), (), PolicyParams(), ()))
        self.clock = ManualClock()
        self.core = Orchestrator(self.state, OrchestrationSettings(replan_warm=False, gc_s=None), 0.0)
        self.core.assume_deployed(0.0)
        self.spawned: list[FakeWorker] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.fleet = LlmFleet(
            self.serving,
            self.clock,
            self,
            functools.partial(self.state.llm.of, "bytes"),
            spawn=self.spawn,
            build=False,
        )
        s = self.serving
        group = LlmGroup("bytes", s.service.members, s.servers, s.spare_servers, 100.0, draft_first=draft)
        self.feed(self.core.place_llm(group, self.clock.now()))

    def spawn(self, name: str, server: str, spec: Any) -> FakeWorker:
        self.spawned.append(FakeWorker(name, server, spec))
        return self.spawned[-1]

    def worker(self, name: str) -> FakeWorker:
        """The actor first started for ``name``."""
        return next(x for x in self.spawned if x.spec is not None and x.spec.name == name)

    def standbys(self) -> list[FakeWorker]:
        """The standby actors started, in order (the first with the service)."""
        return [x for x in self.spawned if x.spec is None]

    def feed(self, commands: list[Any]) -> None:
        for c in commands:
            if isinstance(c, Emit):
                self.events.append((c.type, c.fields))
            elif hasattr(c, "service"):
                self.fleet.execute(c)

    # the reports (the controller's _LlmReports)
    def started(self, service: str, worker: str, incarnation: int, phase: str, info: dict[str, Any]) -> None:
        self.feed(self.core.llm_started(service, worker, incarnation, phase, self.clock.now(), info))

    def start_failed(self, service: str, worker: str, incarnation: int, error: str) -> None:
        self.feed(self.core.llm_start_failed(service, worker, incarnation, error, self.clock.now()))

    def died(self, service: str, worker: str, incarnation: int, reason: str) -> bool:
        began, commands = self.core.llm_died(service, worker, incarnation, reason, self.clock.now())
        self.feed(commands)
        return began

    def standby_lost(self, service: str, server: str, reason: str) -> None:
        self.feed(self.core.llm_standby_lost(service, server, reason, self.clock.now()))


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


def test_the_core_places_the_workers_and_a_probe_found_death_is_restarted_by_a_standby(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        w = Wired(tmp_path, draft=False)
        run = asyncio.ensure_future(w.fleet.run())
        await _settle()
        assert w.fleet.ready.is_set()
        table = w.fleet.table.value
        assert {n: x["server"] for n, x in table["workers"].items()} == {"w0": "s1", "w1": "s2", "w2": "s3"}
        assert all(x["phase"] == "serving" for x in table["workers"].values())
        assert table["model"]["context"] == 128 and table["spares"][0]["pid"] is not None
        w1, (standby,) = w.worker("w1"), w.standbys()
        assert standby.spec is None and standby.server == "s1"  # a standby: no model
        assert standby.preloaded is None  # no draft to hold
        version = w.fleet.table.version
        w1.dead = True  # its process died
        w.clock.advance(w.fleet.probe_s)  # the next probe
        await _settle()
        assert [kind for kind, _ in w.events] == [
            "llm-service-ready",
            "llm-worker-failed",
            "llm-worker-recovered",
        ]
        assert w.events[1][1]["worker"] == "w1" and w.events[1][1]["server"] == "s2"
        assert standby.adopted == ("w1", None)  # lumen, but no draft built: the target at once
        x = w.fleet.table.value["workers"]["w1"]
        assert x["ref"] is standby and x["incarnation"] == 1 and x["phase"] == "serving"
        assert x["server"] == "s1" and x["pid"] == standby.pid
        assert w.fleet.table.version > version
        assert len(w.spawned) == 5 and len(w.standbys()) == 2  # a new standby in its place
        assert w1.killed  # the core stopped the dead incarnation
        assert w.state.llm.used_mb("s1") == 200  # w0 and w1 on s1 now
        # a report of the same death, or of the old incarnation, starts nothing more
        assert not w.died("bytes", "w1", 0, "again")
        run.cancel()

    asyncio.run(main())


def test_under_lumen_the_standby_drafts_first_until_the_core_switches_it_to_its_target(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        w = Wired(tmp_path, draft=True)
        run = asyncio.ensure_future(w.fleet.run())
        await _settle()
        (standby,) = w.standbys()
        # before any failure, the standby holds the draft (a restart then loads none)
        assert standby.preloaded == str(tmp_path) and standby.adopted is None
        assert (
            w.fleet.table.value["spares"][0] | {"draft": str(tmp_path), "preload_ms": 12.5}
            == (w.fleet.table.value["spares"][0])
        )
        assert w.died("bytes", "w0", 0, "the gateway saw it die")  # reported, not probed
        await _settle()
        x = w.fleet.table.value["workers"]["w0"]
        assert x["phase"] == "draft" and x["ref"] is standby and x["acceptance"] == 0.7
        assert standby.adopted == ("w0", str(tmp_path))
        assert [kind for kind, _ in w.events][-1] == "llm-worker-draft"
        standby.target.set()  # its target is loaded
        await _settle()
        assert w.fleet.table.value["workers"]["w0"]["phase"] == "serving"
        assert w.events[-1][0] == "llm-worker-recovered" and w.events[-1][1]["draft_first"] is True
        run.cancel()

    asyncio.run(main())


def test_a_dead_standby_leaves_the_pool_and_a_failed_start_is_placed_again(tmp_path: Path) -> None:
    async def main() -> None:
        w = Wired(tmp_path, draft=False)
        run = asyncio.ensure_future(w.fleet.run())
        await _settle()
        w.standbys()[0].dead = True  # the standby died
        w.clock.advance(w.fleet.probe_s)
        await _settle()
        assert w.fleet.table.value["spares"] == []  # its probe found it dead
        assert w.state.llm.standbys["bytes"] == []  # and the core, told, no longer counts it
        w.clock.advance(1.0)  # the core replaces it a retry later, on the same server
        w.feed(w.core.advance(w.clock.now()))
        await _settle()
        assert w.state.llm.standbys["bytes"] == ["s1"] and len(w.standbys()) == 2
        assert [s["pid"] for s in w.fleet.table.value["spares"]] == [w.standbys()[1].pid]
        FakeWorker.refuse = 1  # the next adoption fails
        try:
            w.worker("w2").dead = True
            w.clock.advance(w.fleet.probe_s)
            await _settle()
            # the standby on s1 adopts it, and its adoption fails
            assert w.fleet.table.value["workers"]["w2"]["phase"] == "failed"
            w.clock.advance(1.0)  # the core's retry, as the same outage
            w.feed(w.core.advance(w.clock.now()))
            await _settle()
        finally:
            FakeWorker.refuse = 0
        x = w.fleet.table.value["workers"]["w2"]
        assert x["phase"] == "serving" and x["server"] == "s1" and x["incarnation"] == 2
        assert len([e for e, _ in w.events if e == "llm-worker-failed"]) == 1
        assert [e for e, _ in w.events][-1] == "llm-worker-recovered"
        run.cancel()

    asyncio.run(main())
