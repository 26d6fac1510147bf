"""The controller's LlmFleet with fake workers on a manual clock (no Ray: fakes stand in for the
worker actors, whose death is what cannot be produced here cheaply): start, detection by probe,
restart from a standby (draft first under lumen), the table and the events."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from failsoft.clock import ManualClock
from failsoft.errors import ServerUnavailableError
from failsoft.runtime.llm_config import LlmServiceModel, llm_serving
from failsoft.runtime.llm_fleet import LlmFleet

PIDS = itertools.count(100)


class FakeWorker:
    """A worker actor's async API; ``dead`` makes every call fail as a dead actor's does."""

    def __init__(self, name: str, server: str, spec: Any) -> None:
        self.name, self.server, self.spec = name, server, spec
        self.pid = next(PIDS)
        self.dead = False
        self.adopted: tuple[str, str | None] | None = None
        self.target = asyncio.Event()

    def _alive(self) -> None:
        if self.dead:
            raise ServerUnavailableError(f"worker {self.name}: unavailable")

    async def info(self, timeout_s: float = 10.0) -> dict[str, Any]:
        self._alive()
        return {"pid": self.pid, "model": "m", "context": 128, "kv_mb_per_token": 0.01, "fingerprint": "f"}

    async def adopt(
        self, spec: Any, draft: str | None, delay: float, timeout_s: float = 600.0
    ) -> dict[str, Any]:
        self._alive()
        self.adopted = (spec.name, draft)
        if draft is None:
            self.target.set()
        return {"acceptance": 0.7}

    async def wait_target(self, timeout_s: float = 600.0) -> dict[str, Any]:
        await self.target.wait()
        self._alive()
        return {}


def _fleet(
    tmp_path: Path, draft: bool
) -> tuple[LlmFleet, list[FakeWorker], list[tuple[str, dict[str, Any]]]]:
    model: dict[str, Any] = {"root": str(tmp_path)}
    if draft:  # a Hugging Face model with a draft: lumen restarts draft first
        (tmp_path / "config.json").write_text("{}")
        model = {"path": str(tmp_path), "draft": str(tmp_path)}
    spec = LlmServiceModel(name="bytes", mode="llm", workers=3, spares=1, policy="lumen", model=model)
    serving = llm_serving(spec, "test", ("s1", "s2", "s3"), tmp_path)
    spawned: list[FakeWorker] = []
    events: list[tuple[str, dict[str, Any]]] = []

    def spawn(name: str, server: str, spec: Any) -> FakeWorker:
        spawned.append(FakeWorker(name, server, spec))
        return spawned[-1]

    fleet = LlmFleet(
        serving, ManualClock(), lambda kind, fields: events.append((kind, fields)), spawn=spawn, build=False
    )
    return fleet, spawned, events


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


def test_a_dead_worker_is_found_by_the_probe_and_a_standby_adopts_its_name(tmp_path: Path) -> None:
    async def main() -> None:
        fleet, spawned, events = _fleet(tmp_path, draft=False)
        run = asyncio.ensure_future(fleet.run())
        await _settle()
        assert fleet.ready.is_set()
        table = fleet.table.value
        assert {n: w["server"] for n, w in table["workers"].items()} == {"w0": "s1", "w1": "s2", "w2": "s3"}
        assert all(w["phase"] == "serving" for w in table["workers"].values())
        assert table["model"]["context"] == 128 and table["spares"][0]["pid"] is not None
        w1, standby = spawned[1], spawned[3]
        assert standby.spec is None  # a standby: no model
        version = fleet.table.version
        w1.dead = True  # its process died
        fleet.clock.advance(fleet.probe_s)  # the next probe
        await _settle()
        assert [kind for kind, _ in events] == [
            "llm-service-ready",
            "llm-worker-failed",
            "llm-worker-recovered",
        ]
        assert events[1][1]["worker"] == "w1" and events[1][1]["server"] == "s2"
        assert standby.adopted == ("w1", None)  # lumen, but no draft built: the target at once
        w = fleet.table.value["workers"]["w1"]
        assert w["ref"] is standby and w["incarnation"] == 1 and w["phase"] == "serving"
        assert w["server"] == standby.server and w["pid"] == standby.pid
        assert fleet.table.version > version
        assert len(spawned) == 5 and spawned[4].spec is None  # a new standby in its place
        # a report of the same death, or of the old incarnation, starts nothing more
        assert not fleet.report_failed("w1", 0, "again")
        run.cancel()

    asyncio.run(main())


def test_under_lumen_the_standby_drafts_first_until_its_target_serves(tmp_path: Path) -> None:
    async def main() -> None:
        fleet, spawned, events = _fleet(tmp_path, draft=True)
        run = asyncio.ensure_future(fleet.run())
        await _settle()
        standby = spawned[3]
        assert fleet.report_failed("w0", 0, "the gateway saw it die")  # reported, not probed
        await _settle()
        w = fleet.table.value["workers"]["w0"]
        assert w["phase"] == "draft" and w["ref"] is standby and w["acceptance"] == 0.7
        assert standby.adopted == ("w0", str(tmp_path))
        assert [kind for kind, _ in events][-1] == "llm-worker-draft"
        standby.target.set()  # its target is loaded
        await _settle()
        assert fleet.table.value["workers"]["w0"]["phase"] == "serving"
        assert events[-1][0] == "llm-worker-recovered" and events[-1][1]["draft_first"] is True
        run.cancel()

    asyncio.run(main())


def test_a_dead_standby_is_skipped_for_the_next_one(tmp_path: Path) -> None:
    async def main() -> None:
        fleet, spawned, _ = _fleet(tmp_path, draft=False)
        run = asyncio.ensure_future(fleet.run())
        await _settle()
        spawned[3].dead = True  # the standby died with its server
        spawned[2].dead = True
        fleet.clock.advance(fleet.probe_s)
        await _settle()
        w = fleet.table.value["workers"]["w2"]
        # the standby started in the dead one's place adopts the worker
        assert w["phase"] == "serving" and w["ref"] is spawned[4] and spawned[4].adopted == ("w2", None)
        assert len(spawned) == 6  # and another standby starts in its place
        run.cancel()

    asyncio.run(main())
