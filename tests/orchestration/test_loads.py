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


def test_a_load_of_a_few_milliseconds_work_runs_at_the_inference_priority():
    from failsoft.domain import Variant
    from failsoft.orchestration.loads import (
        BACKGROUND_NICE,
        INFERENCE_NICE,
        LOAD_NICE,
        SMALL_LOAD_MS,
        load_nice,
    )

    tiny = Variant("cnn_xs", 4, 0.87, load_ms=2.1, latency_ms=0.04, load_cpu_ms=2.0)
    # a cold load of 60 ms whose work is 4 ms (the rest waits for the disk): small too
    disk_bound = Variant("v", 40, 0.8, load_ms=60.0, latency_ms=1.0, load_cpu_ms=4.0)
    big = Variant("resnet18", 70, 0.7, load_ms=98.7, latency_ms=44.0, load_cpu_ms=69.1)
    unsplit = Variant("csv", 70, 0.7, load_ms=SMALL_LOAD_MS, latency_ms=1.0)  # no CPU split: all work
    assert load_nice(tiny) == load_nice(disk_bound) == INFERENCE_NICE
    assert load_nice(big) == load_nice(unsplit) == LOAD_NICE
    assert load_nice(tiny, background=True) == load_nice(big, background=True) == BACKGROUND_NICE


def test_loads_of_one_priority_start_shortest_first_and_ties_keep_arrival():
    q = LoadQueue(["s1"], slots=1)
    assert q.submit("s1", 1, Priority.FAILOVER, load_ms=50.0)
    assert not q.submit("s1", 2, Priority.FAILOVER, load_ms=900.0)
    assert not q.submit("s1", 3, Priority.UPGRADE, load_ms=1.0)  # an upgrade waits, however short
    assert not q.submit("s1", 4, Priority.FAILOVER, load_ms=30.0)
    assert not q.submit("s1", 5, Priority.FAILOVER, load_ms=30.0)
    assert [q.finish(1), q.finish(4), q.finish(5), q.finish(2)] == [[4], [5], [2], [3]]


def test_shortest_first_gives_the_smallest_mean_finish_time():
    from itertools import accumulate, permutations

    from failsoft.orchestration.loads import shortest_first_finish_ms

    loads = [400.0, 30.0, 120.0, 30.0, 900.0]
    assert shortest_first_finish_ms(loads, slots=1) == [580.0, 30.0, 180.0, 60.0, 1480.0]
    assert shortest_first_finish_ms(loads, slots=2) == [430.0, 30.0, 150.0, 30.0, 1050.0]
    best = min(sum(accumulate(order)) for order in permutations(loads))
    assert sum(shortest_first_finish_ms(loads, slots=1)) == best  # no order of one slot does better
    with pytest.raises(ValueError, match="at least one load slot"):
        shortest_first_finish_ms(loads, slots=0)


def test_heavy_loads_take_their_own_slots_and_small_ones_pass_a_held_heavy_one():
    q = LoadQueue(["s1"], slots=3, heavy_slots=1)
    assert q.submit("s1", 1, Priority.FAILOVER, load_ms=400.0, heavy=True)
    assert not q.submit("s1", 2, Priority.FAILOVER, load_ms=300.0, heavy=True)  # held: one heavy at once
    assert q.submit("s1", 3, Priority.FAILOVER, load_ms=5.0)  # a small load runs beside it
    assert q.submit("s1", 4, Priority.UPGRADE, load_ms=3.0)  # slots are left: even an upgrade
    assert not q.submit("s1", 5, Priority.FAILOVER, load_ms=4.0)  # every slot taken
    assert q.finish(3) == [5]  # the small one waiting, not the heavy one held behind load 1
    assert q.finish(1) == [2]  # the heavy slot is free
    assert (q.running("s1"), q.waiting("s1")) == (3, 0)


def test_on_a_shared_host_the_heavy_slots_are_the_hosts_and_a_freed_one_starts_another_servers_load():
    q = LoadQueue(["s1", "s2", "s3"], slots=2, heavy_slots=1, heavy_per_host=True)
    assert q.submit("s1", 1, Priority.FAILOVER, load_ms=400.0, heavy=True)
    assert not q.submit("s2", 2, Priority.FAILOVER, load_ms=300.0, heavy=True)  # the host's slot is taken
    assert not q.submit("s3", 3, Priority.FAILOVER, load_ms=200.0, heavy=True)
    assert q.submit("s2", 4, Priority.FAILOVER, load_ms=5.0)  # small loads need no heavy slot
    assert q.finish(1) == [3]  # the host's slot freed on s1 starts s3's load: the shortest waiting
    assert q.finish(3) == [2]
    # a failed server's heavy load frees the host's slot too: admit starts what now may
    assert not q.submit("s3", 5, Priority.FAILOVER, load_ms=100.0, heavy=True)  # s2's load 2 holds it
    assert sorted(q.clear("s2")) == [2, 4]
    assert q.admit() == [5]
    # per server (the default), two servers run one heavy load each
    apart = LoadQueue(["s1", "s2"], slots=2, heavy_slots=1)
    assert apart.submit("s1", 1, Priority.FAILOVER, 400.0, heavy=True)
    assert apart.submit("s2", 2, Priority.FAILOVER, 300.0, heavy=True)


def test_heavy_slots_never_exceed_the_slots_and_one_is_needed():
    assert LoadQueue(["s1"], slots=2, heavy_slots=5).heavy_slots == 2
    assert LoadQueue(["s1"], slots=2).heavy_slots == 2  # default: every slot
    with pytest.raises(ValueError, match="at least one slot for heavy loads"):
        LoadQueue(["s1"], slots=2, heavy_slots=0)


def test_the_heavy_slots_are_one_per_core_left_once_one_answers():
    from failsoft.domain import Variant
    from failsoft.orchestration.loads import SMALL_LOAD_MS, heavy_load_slots, is_heavy

    assert [heavy_load_slots(c) for c in (1.0, 2.0, 2.5, 4.0, 16.0)] == [1, 1, 1, 3, 15]
    assert heavy_load_slots(8.0, reserved_cores=0.0) == 8
    with pytest.raises(ValueError, match="cores must be positive"):
        heavy_load_slots(0.0)
    small = Variant("cnn_xs", 4, 0.87, load_ms=60.0, latency_ms=0.04, load_cpu_ms=2.0)  # disk-bound
    big = Variant("resnet18", 70, 0.7, load_ms=98.7, latency_ms=44.0, load_cpu_ms=SMALL_LOAD_MS)
    assert not is_heavy(small) and is_heavy(big)
