"""The shared-CPU model: weighted processor sharing with a one-core cap per job, as Linux's CFS."""

from __future__ import annotations

import pytest
import simpy

from failsoft.sim.cpu import SharedCPU, cfs_weight


def finish_times(
    cores: float,
    jobs: list[tuple[float, float, int]],
    busy: float = 0.0,
    groups: tuple[float, ...] = (),
    competitors: float = 0.0,
    ahead: frozenset[int] = frozenset(),
) -> list[float]:
    """Run ``(start_s, work_s, nice)`` jobs on a fresh CPU beside a background (``busy`` cores of
    demand and other ``groups``, or ``competitors``), those whose index is in ``ahead`` ahead of the
    others; when each finished."""
    env = simpy.Environment()
    cpu = SharedCPU(env, cores, busy, other_groups=groups, competitors=competitors)
    done: list[float] = [0.0] * len(jobs)

    def job(i: int, start: float, work: float, nice: int):
        yield env.timeout(start)
        assert (yield from cpu.run(work, nice, ahead=i in ahead))
        done[i] = env.now

    for i, (start, work, nice) in enumerate(jobs):
        env.process(job(i, start, work, nice))
    env.run()
    return done


def test_cfs_weights_are_the_kernels():
    assert cfs_weight(0) == 1024.0
    assert cfs_weight(5) == pytest.approx(335, rel=0.01)  # kernel table: 335
    assert cfs_weight(15) == pytest.approx(36, rel=0.03)  # kernel table: 36


def test_a_job_alone_or_with_a_free_core_takes_its_work():
    assert finish_times(2, [(0, 1.0, 0)]) == [pytest.approx(1.0)]
    assert finish_times(2, [(0, 1.0, 0), (0, 0.5, 5)]) == [pytest.approx(1.0), pytest.approx(0.5)]


def test_equal_jobs_beyond_the_cores_share_them_equally():
    # Three 1 s jobs on two cores: each runs at 2/3 of a core, all end at 1.5 s.
    assert finish_times(2, [(0, 1.0, 0)] * 3) == [pytest.approx(1.5)] * 3


def test_a_lower_priority_job_yields_but_is_never_starved():
    # One core: inference (nice 0) and a load (nice 5) share it about 1024:335.
    inference, load = finish_times(1, [(0, 1.0, 0), (0, 1.0, 5)])
    share = cfs_weight(0) / (cfs_weight(0) + cfs_weight(5))
    assert inference == pytest.approx(1.0 / share)
    # the load got 1 - share of the core meanwhile, then the whole core
    assert load == pytest.approx(inference + (1.0 - inference * (1 - share)))


def test_the_cap_gives_the_surplus_to_the_others():
    # Two cores, a heavy job and two light ones: the heavy one is capped at one core, the light ones
    # share the other equally (not 2 * 36/(1024+72) each).
    heavy, light1, light2 = finish_times(2, [(0, 1.0, 0), (0, 1.0, 15), (0, 1.0, 15)])
    assert heavy == pytest.approx(1.0)
    assert light1 == pytest.approx(light2) == pytest.approx(1.5)  # 0.5 core for 1 s, then 1 core


def test_a_job_ahead_takes_a_core_from_long_ones_whatever_their_priority():
    # one core, two long loads at nice 5 and 0.02 s of control work at nice 0 arriving at 0.1 s
    beside = finish_times(1, [(0, 1.0, 5), (0, 1.0, 5), (0.1, 0.02, 0)])
    ahead = finish_times(1, [(0, 1.0, 5), (0, 1.0, 5), (0.1, 0.02, 0)], ahead=frozenset({2}))
    share = cfs_weight(0) / (cfs_weight(0) + 2 * cfs_weight(5))
    assert beside[2] == pytest.approx(0.1 + 0.02 / share)  # at its fluid share: stretched
    assert ahead[2] == pytest.approx(0.12)  # ahead: the whole core, at once
    assert ahead[:2] == [pytest.approx(2.02)] * 2  # the loads lost what it took, no more
    # ... and ahead of the background's competitors too, which keep what it leaves
    assert finish_times(1, [(0, 0.02, 0)], competitors=3.0, ahead=frozenset({0})) == [pytest.approx(0.02)]


def test_jobs_ahead_share_the_cores_among_themselves_one_core_each_at_most():
    # three controls ahead on two cores beside a long load: they share the two cores, the load waits
    controls = [(0.0, 0.03, 0)] * 3
    done = finish_times(2, [(0, 1.0, 5), *controls], ahead=frozenset({1, 2, 3}))
    assert done[1:] == [pytest.approx(0.045)] * 3
    assert done[0] == pytest.approx(1.045)  # no core until they were done, then its own
    # one ahead on two cores leaves the other core to the rest
    lone = finish_times(2, [(0, 1.0, 5), (0, 1.0, 5), (0, 0.03, 0)], ahead=frozenset({2}))
    assert lone[2] == pytest.approx(0.03) and lone[0] == pytest.approx(1.015)


def test_a_job_arriving_later_slows_the_running_ones_from_then_on():
    first, second = finish_times(1, [(0, 1.0, 0), (0.5, 1.0, 0)])
    assert first == pytest.approx(1.5)  # 0.5 s alone, then half a core for the other 0.5 s of work
    assert second == pytest.approx(2.0)


def test_cancelling_an_owner_frees_its_share_and_reports_false():
    env = simpy.Environment()
    cpu = SharedCPU(env, 1)
    results: dict[str, tuple[bool, float]] = {}

    def job(name: str, owner: str):
        ok = yield from cpu.run(1.0, 0, owner=owner)
        results[name] = (ok, env.now)

    def crash():
        yield env.timeout(0.5)
        cpu.cancel("s1")

    env.process(job("a", "s1"))
    env.process(job("b", "s2"))
    env.process(crash())
    env.run()
    assert results["a"] == (False, 0.5)
    assert results["b"][0] and results["b"][1] == pytest.approx(1.25)  # 0.25 done by 0.5 s, then alone
    assert cpu.running == 0


def test_interrupting_a_process_removes_its_work():
    env = simpy.Environment()
    cpu = SharedCPU(env, 1)
    ends: list[float] = []

    def stoppable():
        try:
            yield from cpu.run(10.0)
        except simpy.Interrupt:
            return

    def other():
        yield from cpu.run(1.0)
        ends.append(env.now)

    victim = env.process(stoppable())
    env.process(other())

    def stop():
        yield env.timeout(0.2)
        victim.interrupt()

    env.process(stop())
    env.run()
    assert ends == [pytest.approx(1.1)]  # half speed for 0.2 s (0.1 done), then the rest alone


def test_bad_core_counts_are_refused():
    with pytest.raises(ValueError, match="cores"):
        SharedCPU(simpy.Environment(), 0)


def test_background_demand_leaves_a_load_only_what_it_does_not_take():
    # 2 cores, 1.5 of them busy (two nice-0 background jobs wanting 0.75 each): one load at nice 5
    # gets the free half core, so 1 s of work takes 2 s.
    assert finish_times(2, [(0, 1.0, 5)], busy=1.5) == [pytest.approx(2.0)]
    # three loads together: the background no longer gets its whole demand, every job its weight's
    # share: 2 * w5 / (2 * w0 + 3 * w5) of a core per load
    share = 2 * cfs_weight(5) / (2 * cfs_weight(0) + 3 * cfs_weight(5))
    assert finish_times(2, [(0, 1.0, 5)] * 3, busy=1.5) == [pytest.approx(1.0 / share)] * 3


def test_background_demand_is_bounded_by_the_cores():
    with pytest.raises(ValueError, match="busy_cores"):
        SharedCPU(simpy.Environment(), 2, busy_cores=2.5)
    env = simpy.Environment()
    cpu = SharedCPU(env, 2, busy_cores=1.2)
    assert cpu.background_rate == pytest.approx(1.2)  # nothing else runs: it gets its demand


def test_another_group_takes_a_groups_share_whatever_our_priorities():
    # Two cores; another session busy on 1.5 of them. Our load (nice 5) alone in our group: the
    # groups split the cores equally (1 each), so the load runs at a full core, not the ~0.3 of a
    # core that 1.5 cores of nice-0 threads *inside* our group would leave it.
    assert finish_times(2, [(0, 1.0, 5)], 0.0, (1.5,)) == [pytest.approx(1.0)]
    inside = finish_times(2, [(0, 1.0, 5)], busy=1.5)[0]
    assert inside > 1.5
    # our group's own background shares our group's core with the load by nice weight
    share = cfs_weight(5) / (cfs_weight(0) + cfs_weight(5))
    (load,) = finish_times(2, [(0, 1.0, 5)], 0.5, (1.5,))
    # our group gets 1 core (demand 1.5): the background (demand 0.5) at nice 0 against the load
    assert load == pytest.approx(1.0 / max(1.0 - 0.5, share), rel=0.01)


def test_other_groups_below_their_share_leave_us_the_rest():
    # a light other group (0.3 cores) leaves our two loads 1.7 cores: 0.85 each
    assert finish_times(2, [(0, 1.0, 5), (0, 1.0, 5)], 0.0, (0.3,)) == [pytest.approx(1 / 0.85)] * 2


def test_other_groups_are_validated():
    with pytest.raises(ValueError, match="other_groups"):
        SharedCPU(simpy.Environment(), 2, 1.0, other_groups=(1.5,))


@pytest.mark.parametrize("share", [0.9, 0.5, 0.3, 0.2, 0.05])
def test_equivalent_competitors_leave_a_load_exactly_the_measured_share(share):
    from failsoft.sim.cpu import equivalent_competitors

    n = equivalent_competitors(2, share)
    assert finish_times(2, [(0, 1.0, 5)], competitors=n) == [pytest.approx(1.0 / share, rel=1e-4)]


def test_more_loads_beside_the_competitors_get_less_each():
    from failsoft.sim.cpu import equivalent_competitors

    n = equivalent_competitors(2, 0.2)
    done = finish_times(2, [(0, 1.0, 5)] * 3, competitors=n)
    # three loads add their weights: each gets C * w5 / (n * w0 + 3 * w5) < 0.2 of a core
    each = 2 * cfs_weight(5) / (n * cfs_weight(0) + 3 * cfs_weight(5))
    assert each < 0.2
    assert done == [pytest.approx(1.0 / each, rel=1e-4)] * 3


def test_a_whole_free_core_needs_no_competitors_and_competitors_stand_alone():
    from failsoft.sim.cpu import equivalent_competitors

    assert equivalent_competitors(2, 1.0) == 0.0
    with pytest.raises(ValueError, match="share"):
        equivalent_competitors(2, 0.0)
    with pytest.raises(ValueError, match="competitors"):
        SharedCPU(simpy.Environment(), 2, busy_cores=0.5, competitors=1.0)
