"""The runtime's driver of the orchestration core, on a manual clock with fake agents (no Ray).

The fakes stand for Ray actor calls; what they record (calls and their virtual times) is what the
driver did. The core itself is the real one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from failsoft.clock import ManualClock
from failsoft.domain import App, Family, Placement, PolicyParams, Scenario, Server, Variant, WarmBackup
from failsoft.errors import ServerUnavailableError
from failsoft.orchestration import (
    ClusterState,
    Inspect,
    InspectPurpose,
    Load,
    OrchestrationSettings,
    Orchestrator,
)
from failsoft.policies.registry import get_failover_policy
from failsoft.runtime.core_driver import CoreDriver

SMALL = Variant("small", 100, 0.70, 200, 5)
BIG = Variant("big", 300, 0.80, 1000, 10)


class FakeAgent:
    """An agent whose loads take ``load_s`` of virtual time and whose unloads take ``unload_s``."""

    def __init__(
        self, name: str, clock: ManualClock, calls: list, load_s: float = 0.2, unload_s: float = 0.0
    ):
        self.name, self.clock, self.calls = name, clock, calls
        self.load_s, self.unload_s = load_s, unload_s
        self.fail_loads = False

    async def load(self, app: str, family: str, variant: str, background: bool = False) -> dict[str, Any]:
        self.calls.append(("load-start", self.name, app, variant, self.clock.now()))
        await self.clock.sleep(self.load_s)
        if self.fail_loads:
            raise ServerUnavailableError(f"server {self.name!r}: gone")
        self.calls.append(("loaded", self.name, app, variant, self.clock.now()))
        return {"load_ms": self.load_s * 1000, "cached": False}

    async def unload(self, app: str, variant: str, timeout_s: float = 5.0) -> bool:
        self.calls.append(("unload-start", self.name, app, variant, self.clock.now()))
        await self.clock.sleep(self.unload_s)
        self.calls.append(("unloaded", self.name, app, variant, self.clock.now()))
        return True

    async def holdings(self, timeout_s: float = 5.0) -> dict[str, Any]:
        raise ServerUnavailableError(f"server {self.name!r}: unavailable")


class PolicyPlanner:
    """The failover policy run at once (what the runtime's Planner does inline for small clusters)."""

    def __init__(self) -> None:
        self.policy = get_failover_policy("faillite")

    async def failover(self, scenario: Scenario, failed: Any) -> Any:
        return self.policy.plan_failover(scenario, failed)

    async def proactive(self, scenario: Scenario) -> Any:
        return self.policy.plan_proactive(scenario)


class Rig:
    def __init__(self, scenario: Scenario, **agent_kw: Any) -> None:
        self.clock = ManualClock(100.0)
        self.calls: list[tuple] = []
        self.agents = {
            s.name: FakeAgent(s.name, self.clock, self.calls, **agent_kw) for s in scenario.servers
        }
        self.state = ClusterState.deployed(scenario)
        self.state.wall_offset = 1_000_000.0
        settings = OrchestrationSettings(replan_warm=False, reconcile_s=None, gc_s=None, load_slots=1)
        self.core = Orchestrator(self.state, settings, self.clock.now())
        self.published: list[dict[str, Any]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.forgotten: list[str] = []
        self.driver = CoreDriver(
            self.core, PolicyPlanner(), self.agents.__getitem__, self._publish,
            lambda t, f: self.events.append((t, f)), self.clock, self.forgotten.append,
        )  # fmt: skip
        self.driver.feed(self.core.assume_deployed(self.clock.now()))

    def _publish(self) -> None:
        self.published.append({n: r.route for n, r in self.state.apps.items()})

    async def kill(self, server: str) -> None:
        """Heartbeats of every server but ``server`` for 0.2 s, checked every 5 ms."""
        start = self.clock.now()
        for k in range(40):
            now = start + k * 0.005
            if k % 4 == 0:
                for name in self.state.servers:
                    if name != server:
                        self.driver.feed(self.core.heartbeat(name, now))
            self.driver.feed(self.core.check_health(now))
            await self.clock.run_for(0.005)


def scenario(released_on_s2: bool = False) -> Scenario:
    small_room = released_on_s2  # then neither s1 nor s2 has room for B without releasing a backup
    s1, s2 = (250, 350) if small_room else (400, 400)
    servers = (Server("s0", "a", 1000, 10), Server("s1", "b", s1, 10), Server("s2", "b", s2, 10))
    apps = [App(n, "fam", Placement("s0", "big"), n == "A", 1.0, 100.0) for n in "AB"]
    warm = [WarmBackup("A", "small", "s1")]
    if released_on_s2:  # a healthy app's backup fills s2: the plan must release it to place B
        apps.append(App("H", "fam", Placement("s1", "small"), False, 1.0, 100.0))
        warm.append(WarmBackup("H", "big", "s2"))
    return Scenario(servers, (Family("fam", (SMALL, BIG)),), tuple(apps), PolicyParams(), tuple(warm))


def test_a_crash_is_carried_out_routes_first_then_loads_with_wall_clock_events():
    async def main() -> None:
        rig = Rig(scenario())
        await rig.kill("s0")
        await rig.clock.run_for(3.0)
        assert rig.forgotten == ["s0"]  # the dead agent's handle is dropped at detection
        assert rig.state.apps["A"].route == Placement("s1", "small")
        assert rig.state.apps["B"].route.server == "s2"
        kinds = [e[0] for e in rig.events]
        assert kinds[:3] == ["failure", "failure", "failover"] and "detected" not in kinds
        failure = rig.events[0][1]
        assert failure["detected_at"] > 1_000_000  # wall-clock time, not the core's
        loads = [c for c in rig.calls if c[0] == "load-start"]
        assert loads[0][1:4] == ("s2", "B", "small")
        assert any(r["A"] == Placement("s1", "small") and r["B"] is None for r in rig.published)

    asyncio.run(main())


def test_a_load_waits_for_the_unloads_sent_to_its_server_before_it():
    async def main() -> None:
        rig = Rig(scenario(released_on_s2=True), unload_s=0.05)
        await rig.kill("s0")
        await rig.clock.run_for(3.0)
        order = [(c[0], c[2]) for c in rig.calls if c[1] == "s2"]
        assert ("load-start", "B") in order, rig.calls
        assert order.index(("unloaded", "H")) < order.index(("load-start", "B"))

    asyncio.run(main())


def test_a_hung_unload_holds_back_only_its_own_servers_loads_and_those_only_for_the_unload_timeout():
    from failsoft.runtime.core_driver import UNLOAD_TIMEOUT_S

    async def main() -> None:
        rig = Rig(scenario(released_on_s2=True), unload_s=3600.0)  # s2 never finishes an unload
        await rig.kill("s0")
        assert rig.state.apps["A"].route == Placement("s1", "small")  # the warm switch waits for nothing
        await rig.clock.run_for(UNLOAD_TIMEOUT_S + 1.0)
        unload_h = next(c for c in rig.calls if c[0] == "unload-start")
        load_b = next(c for c in rig.calls if c[0] == "load-start" and c[2] == "B")
        assert unload_h[1:3] == ("s2", "H") and load_b[1] == "s2"
        assert UNLOAD_TIMEOUT_S <= load_b[4] - unload_h[4] <= UNLOAD_TIMEOUT_S + 0.1
        assert rig.state.apps["B"].route is not None and rig.state.apps["B"].route.server == "s2"
        assert not any(c[0] == "unloaded" for c in rig.calls)  # it really was still hung

    asyncio.run(main())


def test_a_failed_load_comes_back_to_the_core_which_backs_off():
    async def main() -> None:
        rig = Rig(scenario())
        rig.agents["s2"].fail_loads = True
        await rig.kill("s0")
        await rig.clock.run_for(0.3)
        assert rig.state.apps["B"].route is None
        assert "B" in rig.core.operations.backoff

    asyncio.run(main())


def test_an_inspection_that_fails_is_reported_as_no_answer():
    async def main() -> None:
        rig = Rig(scenario())
        seen: list[Any] = []
        rig.core.inspected = lambda server, purpose, report, now: seen.append((server, purpose, report)) or []
        rig.driver.feed([Inspect("s1", InspectPurpose.GC)])
        await rig.clock.run_for(0.01)
        assert seen == [("s1", InspectPurpose.GC, None)]

    asyncio.run(main())


@pytest.mark.parametrize("background", [False, True])
def test_loads_carry_their_background_flag_to_the_agent(background):
    from failsoft.orchestration import Priority

    priority = Priority.UPGRADE if background else Priority.FAILOVER
    assert Load(1, "s", "a", "f", "v", priority).background is background


class PhasedAgent(FakeAgent):
    """A fake agent that reports its load's stamps as the real one does (wall clock), 50 ms after
    the call reached it and 30 ms before its reply does: the virtual Ray call's two ways."""

    async def load(self, app: str, family: str, variant: str, background: bool = False) -> dict[str, Any]:
        await self.clock.sleep(0.05)
        entered = self.clock.now() + WALL
        info = await super().load(app, family, variant, background)
        phases = {"entered_at": entered, "read": {"wall_ms": 200.0}, "left_at": self.clock.now() + WALL}
        await self.clock.sleep(0.03)
        return info | {"phases": phases}


WALL = 1_000_000.0  # Rig's wall offset


def test_a_failovers_load_carries_the_drivers_and_the_agents_stamps_which_cut_its_mttr():
    from failsoft.runtime.load_phases import timeline

    async def main() -> None:
        rig = Rig(scenario())
        for name in rig.agents:
            rig.agents[name] = PhasedAgent(name, rig.clock, rig.calls)
        await rig.kill("s0")
        await rig.clock.run_for(3.0)
        (event,) = [f for t, f in rig.events if t == "failover" and f["app"] == "B"]
        phases = event["load_phases"]
        assert {"plan_asked_at", "plan_done_at", "issued_at", "returned_at"} <= phases.keys()
        cut = timeline(phases, event["detected_at"], event["route_ms"])
        assert cut["call_ms"] == pytest.approx(50.0) and cut["reply_ms"] == pytest.approx(30.0)
        assert cut["agent_ms"] == pytest.approx(200.0) and cut["agent"] == {"read": {"wall_ms": 200.0}}
        assert cut["route_ms"] == pytest.approx(0.0, abs=1e-6)  # the route is set as the reply comes
        segments = [v for k, v in cut.items() if k.endswith("_ms")]
        assert sum(segments) == pytest.approx(event["route_ms"])

    asyncio.run(main())
