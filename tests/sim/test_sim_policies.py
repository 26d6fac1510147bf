"""The simulator runs the runtime's own policy objects and detector, and nothing heavier."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import failsoft.sim
from failsoft.clock import Clock
from failsoft.domain import ActionKind
from failsoft.policies.failover.baselines import FullColdPolicy
from failsoft.policies.failover.faillite import FailLitePolicy
from failsoft.policies.registry import get_failover_policy
from failsoft.profiles import TESTBED_FAMILIES, load_profile_families
from failsoft.sim import Deployer, SimClock, SimConfig, simulate_failure
from failsoft.synth import ClusterShape, synthesize

SIM_DIR = Path(failsoft.sim.__file__).parent


@pytest.fixture(scope="module")
def cluster():
    families = load_profile_families(families=TESTBED_FAMILIES)
    return synthesize(families, ClusterShape(12, 3, 60, headroom=0.15), seed=3)


def test_deployments_hold_the_registered_policy_objects(cluster):
    deployer = Deployer()
    faillite = deployer.deploy(cluster, "faillite")
    paper = deployer.deploy(cluster, "faillite-paper")
    assert type(faillite.policy) is type(get_failover_policy("faillite")) is FailLitePolicy
    assert type(paper.policy) is FailLitePolicy  # the same class, one parameter changed
    assert (faillite.scenario.policy.reclaim_warm, paper.scenario.policy.reclaim_warm) == (True, False)
    assert paper.proactive is faillite.proactive  # one ILP solve serves both labels
    assert type(deployer.deploy(cluster, "full-cold").policy) is FullColdPolicy


@pytest.mark.parametrize("label", ["faillite", "faillite-paper", "full-warm", "full-cold", "full-warm-k"])
def test_the_simulator_applies_exactly_the_policys_plan(cluster, label):
    deployment = Deployer().deploy(cluster, label)
    actions = 0
    for server in [s.name for s in cluster.servers][:4]:
        plan = deployment.policy.plan_failover(deployment.scenario, [server])
        assert plan.actions or plan.unrecovered  # every server here holds primaries: apps are affected
        actions += len(plan.actions)
        event = simulate_failure(deployment, [server], SimConfig(requests="off"))
        applied = {a: (r.kind, r.server, r.variant) for a, r in event.apps.items() if r.recovered}
        planned = {a.app: (a.kind, a.server, a.final_variant) for a in plan.actions}
        assert applied == planned
        assert {a for a, r in event.apps.items() if not r.recovered} == set(plan.unrecovered)
        assert event.released_warm == len(plan.released)
        assert event.oom_loads == 0  # every plan fits the memory the agents account
    assert actions > 0  # some plan recovered something: the comparison above was not of empty plans


def test_progressive_actions_serve_the_small_first_variant_before_the_final(cluster):
    deployment = Deployer().deploy(cluster, "faillite")
    config = SimConfig(requests="off", trace=True)
    progressive = upgraded = 0
    for server in [s.name for s in cluster.servers]:
        plan = deployment.policy.plan_failover(deployment.scenario, [server])
        actions = {a.app: a for a in plan.actions if a.kind is ActionKind.PROGRESSIVE}
        event = simulate_failure(deployment, [server], config)
        for app, action in actions.items():
            progressive += 1
            record = event.apps[app]
            serving = sorted(
                (e for e in event.log if e.kind == "serving" and e.app == app), key=lambda e: e.t
            )
            served = [e.variant for e in serving]
            family = cluster.family(cluster.app(app).family)
            assert served[0] == action.first_variant and served[-1] == action.final_variant == record.variant
            if action.first_variant != action.final_variant:
                upgraded += 1
                assert served == [action.first_variant, action.final_variant]
                order = [v.name for v in family.variants]  # smallest to largest memory
                assert order.index(served[0]) < order.index(served[1])  # small first, the larger after
                assert serving[0].t < serving[1].t and record.serving_at < record.final_at
            else:
                assert served == [action.final_variant]
    assert progressive > 0 and upgraded > 0  # the checks above ran on real progressive failovers


def test_sim_clock_is_a_clock():
    import simpy

    env = simpy.Environment()
    clock = SimClock(env)
    env.run(until=1.5)
    assert isinstance(clock, Clock) and clock.now() == 1.5


def test_the_simulator_never_imports_ray_fastapi_or_torch():
    code = (
        "import sys, failsoft.sim, failsoft.sim.figures, failsoft.sim.output;"
        "print(sorted(m for m in ('ray', 'fastapi', 'torch', 'uvicorn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_simulator_uses_only_the_public_policy_seams():
    """Policies by name through the registry, never a registered class imported directly (the same
    names then mean the same code in the runtime and the simulator); data types, contracts and pure
    helpers of the policy package may be imported."""
    import importlib

    from failsoft.policies.registry import SEAMS

    registered = {cls for seam in SEAMS.values() for cls in seam.values()}
    for path in SIM_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert not {a.name.split(".")[0] for a in node.names} & {"ray", "fastapi", "torch"}, path
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            assert node.module.split(".")[0] not in {"ray", "fastapi", "torch"}, path
            if node.module.startswith("failsoft.policies"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    obj = getattr(module, alias.name, None)
                    assert obj not in registered, (
                        f"{path.relative_to(SIM_DIR)} imports the registered policy {alias.name} from "
                        f"{node.module}: ask the registry for it by name"
                    )
