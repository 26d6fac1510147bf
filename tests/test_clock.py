"""The manual clock: virtual time for asyncio components' unit tests."""

import asyncio

import pytest

from failsoft.clock import AsyncClock, ManualClock, MonotonicClock
from tests.asyncwait import until


def test_both_clocks_are_async_clocks():
    assert isinstance(ManualClock(), AsyncClock) and isinstance(MonotonicClock(), AsyncClock)


def test_sleepers_wake_in_order_only_when_time_reaches_them():
    async def main():
        clock = ManualClock(10.0)
        woke: list[tuple[str, float]] = []

        async def nap(name: str, seconds: float) -> None:
            await clock.sleep(seconds)
            woke.append((name, clock.now()))

        tasks = [asyncio.create_task(nap("late", 0.5)), asyncio.create_task(nap("early", 0.2))]
        await until(lambda: clock.next_wakeup == pytest.approx(10.2), "both nappers are parked")
        clock.advance(0.1)
        await clock.run_for(0)  # whatever was woken has run
        assert woke == []
        await clock.run_for(1.0)
        assert woke == [("early", pytest.approx(10.2)), ("late", pytest.approx(10.5))]
        assert clock.now() == pytest.approx(11.1)
        await asyncio.gather(*tasks)

    asyncio.run(main())


def test_a_cancelled_sleeper_does_not_block_later_ones():
    async def main():
        clock = ManualClock()
        first = asyncio.create_task(clock.sleep(1.0))
        second = asyncio.create_task(clock.sleep(2.0))
        await until(lambda: clock.next_wakeup == 1.0, "the first sleeper is parked")
        first.cancel()
        await clock.run_for(2.0)
        assert second.done() and first.cancelled()

    asyncio.run(main())


def test_time_never_goes_back():
    with pytest.raises(ValueError):
        ManualClock().advance(-1)
