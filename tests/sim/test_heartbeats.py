"""The heartbeat feed hands the detector exactly what per-heartbeat SimPy processes pushed."""

from __future__ import annotations

import random

import simpy

from failsoft.sim.heartbeats import HeartbeatFeed

INTERVAL, CHECK = 0.020, 0.005


def pushed_by_processes(phases: dict[str, float], crash: dict[str, float], until: float) -> list[tuple]:
    """The old way: one SimPy process per agent, one event per heartbeat; what a check every
    ``CHECK`` seconds (at phase CHECK / 3) would have seen as each agent's latest heartbeat."""
    env = simpy.Environment()
    last: dict[str, float] = {}
    alive = dict.fromkeys(phases, True)

    def beats(name: str, phase: float):
        k = 0
        while True:
            due = phase + k * INTERVAL
            if due > env.now:
                yield env.timeout(due - env.now)
            if not alive[name]:
                return
            last[name] = env.now
            k += 1

    def kill(name: str, at: float):
        yield env.timeout(at)
        alive[name] = False

    seen = []

    def checks():
        k = 0
        while True:
            k += 1
            yield env.timeout(CHECK / 3 + k * CHECK - env.now)
            seen.append((env.now, dict(last)))

    for name, phase in phases.items():
        env.process(beats(name, phase))
    for name, at in crash.items():
        env.process(kill(name, at))
    env.process(checks())
    env.run(until=until)
    return seen


def test_the_feed_gives_the_latest_heartbeat_of_each_agent_to_the_bit_at_every_check():
    rng = random.Random(7)
    phases = {f"s{i}": rng.uniform(0.0, INTERVAL) for i in range(20)} | {"z0": 0.0, "z1": 0.0}
    crash = {"s3": 0.3, "z1": 0.3}  # z1 crashes at one of its heartbeat instants: that one is not sent
    expected = pushed_by_processes(phases, crash, until=0.6)
    feed = HeartbeatFeed(phases.items(), INTERVAL)
    last: dict[str, float] = {}
    crashed = False
    for now, seen in expected:
        if not crashed and now > 0.3:
            for name, at in crash.items():
                feed.crashed(name, at)
            crashed = True
        feed.catch_up(now, last.__setitem__)
        assert last == seen, now
    assert last["z1"] < 0.3 and last["s3"] < 0.3 < last["s1"]
