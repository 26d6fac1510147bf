"""A control loop that cannot die (Ray Serve ``ServeController.run_control_loop_step``).

The controller's loop runs a few *steps* over and over: check heartbeats, start failovers, reconcile,
persist. A step that raises must not stop the others, a step that is slow must be visible. Each step
therefore runs inside :meth:`StepRunner.run`, which

* catches every exception (logged with its traceback, counted per step), so the loop goes on;
* measures the step's duration (count, last, max, total seconds: reported by ``stats()`` and on the
  gateway's ``/metrics``);
* warns when a step takes longer than its budget.

Long work (model loads) never runs inside a step: steps start tasks and return.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class StepStats:
    count: int = 0
    errors: int = 0
    slow: int = 0
    last_s: float = 0.0
    max_s: float = 0.0
    total_s: float = 0.0
    last_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "errors": self.errors,
            "slow": self.slow,
            "last_s": round(self.last_s, 6),
            "max_s": round(self.max_s, 6),
            "total_s": round(self.total_s, 6),
            "last_error": self.last_error,
        }


class StepRunner:
    """Runs named steps with error isolation, duration metrics and slow-step warnings."""

    def __init__(self, slow_s: float = 0.050) -> None:
        self.slow_s = slow_s
        self.stats: dict[str, StepStats] = {}

    async def run(
        self, name: str, step: Callable[[], Awaitable[Any] | Any], slow_s: float | None = None
    ) -> Any:
        stats = self.stats.setdefault(name, StepStats())
        started = time.perf_counter()
        result = None
        try:
            result = step()
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                result = await result
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            stats.errors += 1
            stats.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("control-loop step %r failed; the loop goes on", name)
        finally:
            elapsed = time.perf_counter() - started
            stats.count += 1
            stats.last_s = elapsed
            stats.total_s += elapsed
            stats.max_s = max(stats.max_s, elapsed)
            if elapsed > (slow_s if slow_s is not None else self.slow_s):
                stats.slow += 1
                log.warning("control-loop step %r took %.1f ms", name, elapsed * 1000.0)
        return result

    def to_dict(self) -> dict[str, Any]:
        return {name: s.to_dict() for name, s in self.stats.items()}


def spawn(coro: Awaitable[Any], name: str, tasks: set[asyncio.Task[Any]]) -> asyncio.Task[Any]:
    """Start a background task, keep a strong reference, and log (never lose) its exception."""
    task = asyncio.ensure_future(coro)
    task.set_name(name)
    tasks.add(task)

    def _done(t: asyncio.Task[Any]) -> None:
        tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.error("task %s failed", name, exc_info=t.exception())

    task.add_done_callback(_done)
    return task
