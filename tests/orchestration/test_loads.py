"""Per-server load slots: how many loads run at once, and which waiting one starts next."""

import pytest

from failsoft.orchestration import LoadQueue, Priority


def test_loads_start_up_to_the_slots_then_by_priority_then_arrival():
    q = LoadQueue(["s1", "s2"], slots=2)
    assert q.submit("s1", 1, Priority.UPGRADE) and q.submit("s1", 2, Priority.WARM)
    assert not q.submit("s1", 3, Priority.UPGRADE)
    assert not q.submit("s1", 4, Priority.FAILOVER)
    assert not q.submit("s1", 5, Priority.CRITICAL)
    assert q.submit("s2", 6, Priority.UPGRADE)  # another server's slots are its own
    assert q.finish(1) == [5]  # the critical load jumps the queue
    assert q.finish(5) == [4]
    assert q.finish(2) == [3]
    assert (q.running("s1"), q.waiting("s1")) == (2, 0)


def test_a_waiting_load_can_be_withdrawn_and_frees_nothing():
    q = LoadQueue(["s1"], slots=1)
    q.submit("s1", 1, Priority.FAILOVER)
    q.submit("s1", 2, Priority.FAILOVER)
    q.submit("s1", 3, Priority.FAILOVER)
    assert q.finish(2) == []  # withdrawn while waiting: the running one keeps its slot
    assert q.finish(1) == [3]
    assert q.finish(99) == []  # unknown: nothing happens


def test_a_failed_server_forgets_its_loads():
    q = LoadQueue(["s1"], slots=1)
    q.submit("s1", 1, Priority.FAILOVER)
    q.submit("s1", 2, Priority.FAILOVER)
    assert sorted(q.clear("s1")) == [1, 2]
    assert q.finish(1) == [] and q.running("s1") == 0
    assert q.submit("s1", 3, Priority.UPGRADE)  # the slot is free for the server's next life


def test_a_server_needs_a_slot():
    with pytest.raises(ValueError, match="at least one load slot"):
        LoadQueue(["s1"], slots=0)
