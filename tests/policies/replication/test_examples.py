"""Concrete runs: what each policy does to one crash, and the registry's replication seam."""

import itertools

import pytest

from failsoft.policies import registry
from failsoft.policies.replication.interface import (
    ApplyState,
    Crashed,
    PlaceBackup,
    Role,
    StateApplied,
    StateShipped,
    Topology,
)
from tests.policies.replication.test_protocol_machine import GRAPH
from tests.policies.replication.world import World


def _run(policy, nonces, **params):
    """Three requests through the graph, s1's primary crashes, one more request, all drained."""
    world = World(registry.make("replication", policy, GRAPH, **params))
    for value in (1, 2, 3):
        world.request(value)
    world.drain(lambda: next(nonces))
    before = dict(world.client)
    world.crash("s1", Role.PRIMARY)
    world.request(4)
    world.drain(lambda: next(nonces))
    return world, before


def test_none_answers_what_no_failure_free_run_answers():
    world, before = _run("none", itertools.repeat(0))
    assert world.consistent() is False
    assert world.client[4] != world.reference()[4] and before.items() <= world.client.items()


@pytest.mark.parametrize("policy", ["nspb", "stop-and-copy", "checkpoint-replay"])
def test_deterministic_models_come_back_consistent(policy):
    world, _ = _run(policy, itertools.repeat(0), **({"interval": 2} if policy == "checkpoint-replay" else {}))
    assert world.consistent() and sorted(world.client) == [1, 2, 3, 4]


def test_checkpoint_replay_diverges_with_a_non_deterministic_model_and_nspb_does_not():
    # s1 computes request 3 again from the checkpoint after 2, and its kernel picks another nonce
    nonces = itertools.cycle([0, 1, 2])
    world, _ = _run("checkpoint-replay", nonces, interval=2)
    assert world.consistent() is False
    world, _ = _run("nspb", itertools.cycle([0, 1, 2]))
    assert world.consistent() and sorted(world.client) == [1, 2, 3, 4]


def test_nspb_applies_a_downstream_state_only_once_upstream_is_durable():
    world = World(registry.make("replication", "nspb", GRAPH))
    world.request(7)
    while world.computable():
        world.compute(world.computable()[0])
    s2 = next(i for i, t in enumerate(world.transfers) if t.node == "s2")
    world.land(s2)  # s2's state after 1 is buffered, but s1's is not durable yet
    assert world.backups["s2"].seq == 0 and 1 not in world.client
    s1 = next(i for i, t in enumerate(world.transfers) if t.node == "s1")
    world.land(s1)
    assert world.backups["s1"].seq == 1 and world.backups["s2"].seq == 1


def test_a_state_from_before_a_role_change_is_ignored():
    protocol = registry.make("replication", "nspb", GRAPH)
    assert protocol.handle(Crashed("s1", Role.BACKUP)) == [PlaceBackup("s1")]
    assert protocol.handle(StateShipped("s1", 1, 0)) == [] and protocol.handle(StateApplied("s1", 1, 0)) == []
    with pytest.raises(TypeError, match="not a replication event"):
        protocol.handle(ApplyState("s1", 1, 1))


def test_the_replication_seam_names_the_four_policies_and_topology_finds_stateful_neighbours():
    assert registry.names("replication") == ["checkpoint-replay", "none", "nspb", "stop-and-copy"]
    topo = Topology(GRAPH)
    assert topo.previous_stateful("s2") == {"s1"} and topo.next_stateful("s1") == {"s2"}
    assert topo.previous_stateful("j") == {"s2", "s3"} and topo.sinks == ("j",)
    with pytest.raises(ValueError, match="interval must be >= 1; got 0"):
        registry.make("replication", "checkpoint-replay", GRAPH, interval=0)


def test_nspb_answers_a_client_only_once_every_state_behind_the_answer_is_durable():
    world = World(registry.make("replication", "nspb", GRAPH))
    for value in (1, 2, 3):
        world.request(value)
    while world.computable():  # every output released downstream, no state transfer landed
        world.compute(world.computable()[0], nonce=1)
    assert world.out["j"].keys() == {1, 2, 3} and world.client == {}
    world.crash("s1", Role.PRIMARY)  # its outputs after 0 were consumed by s2 and j, then lost
    world.drain(lambda: 2)  # the replay's kernels choose otherwise
    assert sorted(world.client) == [1, 2, 3] and world.consistent()
    assert world.attempts[("s1", 1)] == 2  # s1 computed request 1 again, and s2 and j with it
