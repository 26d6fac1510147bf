"""The replication protocols against a sequential reference, under any interleaving and one crash.

A hypothesis state machine drives :class:`~tests.policies.replication.world.World`: requests arrive,
nodes compute (in any order the graph allows), state transfers land in any order, a new backup is
placed whenever the protocol asks, and at any point one node crashes: the primary or the backup of a
stateful node, or a stateless node. After every step the answers clients received must be those of a
failure-free run; at the end, once everything under way has finished, every request is answered.

The graph has two stateful models in sequence (s1 -> s2), a third on a parallel branch (s3) and a
fan-in (j joins s2 and s3): the cases the paper's excerpt leaves open.
"""

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from failsoft.policies import registry
from failsoft.policies.replication.interface import Role
from failsoft.services import GraphNode, GraphParams
from tests.policies.replication.world import World

GRAPH = GraphParams(
    (
        GraphNode("e", "e"),
        GraphNode("s1", "s1", stateful=True),
        GraphNode("s2", "s2", stateful=True),
        GraphNode("s3", "s3", stateful=True),
        GraphNode("j", "j", joins=("s2", "s3")),
    ),
    (("e", "s1"), ("s1", "s2"), ("s2", "j"), ("e", "s3"), ("s3", "j")),
)
MAX_REQUESTS = 6
SETTINGS = settings(
    derandomize=True,
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def machine(policy: str, nondeterministic: bool, **params):
    class Protocol(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.world = World(registry.make("replication", policy, GRAPH, **params))
            self.steps = 0
            self.crash_at = 0

        @initialize(after=st.integers(0, 30), victim=st.integers(0, 2 * len(GRAPH.nodes) - 1))
        def schedule_the_crash(self, after, victim):
            """One crash, of a node's primary or backup, after this many steps (any point of a run)."""
            self.crash_at = after
            nodes = self.world.topo.nodes
            self.victim = (nodes[victim % len(nodes)], Role.BACKUP if victim >= len(nodes) else Role.PRIMARY)

        def tick(self):
            self.steps += 1
            w = self.world
            if w.crashes or self.steps < self.crash_at:
                return
            node, role = self.victim
            if role is Role.BACKUP and w.backups.get(node) is None:
                role = Role.PRIMARY
            w.crash(node, role)

        @precondition(lambda self: len(self.world.requests) < MAX_REQUESTS)
        @rule(value=st.integers(0, 50))
        def request(self, value):
            self.world.request(value)
            self.tick()

        @precondition(lambda self: self.world.computable())
        @rule(data=st.data())
        def compute(self, data):
            node = data.draw(st.sampled_from(self.world.computable()))
            nonce = data.draw(st.integers(0, 2)) if nondeterministic else 0
            self.world.compute(node, nonce)
            self.tick()

        @precondition(lambda self: self.world.transfers)
        @rule(data=st.data())
        def land(self, data):
            self.world.land(data.draw(st.integers(0, len(self.world.transfers) - 1)))
            self.tick()

        @precondition(lambda self: self.world.to_place)
        @rule(data=st.data())
        def place(self, data):
            self.world.place(data.draw(st.sampled_from(sorted(self.world.to_place))))
            self.tick()

        @rule()
        def idle(self):
            """Nothing happens (so that a run may end anywhere; the teardown drains it)."""
            self.tick()

        @invariant()
        def answers_are_a_failure_free_runs(self):
            assert self.world.consistent(), (self.world.client, self.world.reference())

        def teardown(self):
            counter = iter(range(10**6))
            self.world.drain(lambda: next(counter) % 3 if nondeterministic else 0)
            assert set(self.world.client) == set(self.world.requests), "a request was never answered"
            assert self.world.consistent()

    Protocol.__name__ = f"Protocol_{policy.replace('-', '_')}"
    return Protocol


CASES = [
    ("nspb", False, {}),
    ("nspb", True, {}),
    ("stop-and-copy", False, {}),
    ("stop-and-copy", True, {}),
    ("checkpoint-replay", False, {"interval": 2}),
]


@pytest.mark.parametrize(("policy", "nondeterministic", "params"), CASES)
def test_answers_are_those_of_a_failure_free_run(policy, nondeterministic, params):
    case = machine(policy, nondeterministic, **params).TestCase
    case.settings = SETTINGS
    case("runTest").runTest()
