"""Running the failover policies without stalling the controller.

The controller's event loop must keep reading heartbeats and answering long-polls every few
milliseconds, but FailLite's proactive step is an ILP (3.2) that HiGHS may solve for a second or more
while holding the interpreter. :class:`Planner` therefore runs the two steps differently:

* ``plan_failover`` (Algorithm 1, on the MTTR's critical path) runs on the controller's loop for
  small clusters (about a millisecond for a few hundred apps) and in a thread for larger ones: never
  in a queue behind a long solve;
* ``plan_proactive`` (the ILP, off the critical path) runs in a child process
  (``python -m failsoft.runtime.planner``) fed pickled snapshots through a pipe, so a long solve
  costs the controller nothing. If the child dies, it is started again on the next call; if it
  cannot start, the plan is made in-process (slower to react, never wrong).

The child exits when its stdin closes, so it never outlives the controller. It answers on a private
copy of its standard output and points descriptor 1 at its standard error, so that nothing a library
prints (HiGHS's banner, a stray ``print``) can fall between two frames; a frame that still comes out
of step is refused by its size, and the child is replaced.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Collection
from typing import IO, Any

import scipy.sparse  # noqa: F401  the solvers' matrices: loaded now, not inside a plan that is timed

from failsoft.domain import FailoverPlan, ProactivePlan, Scenario
from failsoft.errors import PlanningError
from failsoft.policies.registry import get_failover_policy

log = logging.getLogger(__name__)
INLINE_APPS = 200  # up to this many apps, Algorithm 1 runs on the controller's loop directly
MAX_FRAME_BYTES = 1 << 30  # a plan or a scenario is far smaller: a larger size means the pipe is out of step


class Planner:
    def __init__(self, policy: str) -> None:
        self.name = policy
        self.policy = get_failover_policy(policy)
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    async def failover(self, scenario: Scenario, failed: Collection[str]) -> FailoverPlan:
        if len(scenario.apps) <= INLINE_APPS:  # about a millisecond: a thread hop would cost more
            return self.policy.plan_failover(scenario, sorted(failed))
        return await asyncio.to_thread(self.policy.plan_failover, scenario, sorted(failed))

    async def proactive(self, scenario: Scenario) -> ProactivePlan:
        return await asyncio.to_thread(self._proactive, scenario)

    def _proactive(self, scenario: Scenario) -> ProactivePlan:
        with self._lock:
            try:
                return self._ask(scenario)
            except (OSError, EOFError, pickle.UnpicklingError, MemoryError) as exc:
                log.warning("planner process failed (%s): planning in-process", exc)
                self._stop_child()
                return self.policy.plan_proactive(scenario)

    def _ask(self, scenario: Scenario) -> ProactivePlan:
        child = self._ensure_child()
        assert child.stdin is not None and child.stdout is not None
        _send(child.stdin, scenario)
        result = _receive(child.stdout)
        if isinstance(result, BaseException):
            raise result
        return result

    def _ensure_child(self) -> subprocess.Popen[bytes]:
        if self._child is None or self._child.poll() is not None:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "failsoft.runtime.planner", self.name],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        return self._child

    def _stop_child(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    def close(self) -> None:
        with self._lock:
            self._stop_child()


def _send(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(len(data).to_bytes(8, "big") + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    header = _exactly(stream, 8)
    size = int.from_bytes(header, "big")
    if size > MAX_FRAME_BYTES:
        raise pickle.UnpicklingError(f"planner pipe out of step (a frame header of {header!r})")
    return pickle.loads(_exactly(stream, size))


def _exactly(stream: IO[bytes], n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("planner pipe closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def main(argv: list[str]) -> int:
    """The child: read scenarios from stdin, write proactive plans (or the error) to stdout."""
    policy = get_failover_policy(argv[0])
    stdin, stdout = sys.stdin.buffer, _private_stdout()
    while True:
        try:
            scenario = _receive(stdin)
        except EOFError:
            return 0
        try:
            result: Any = policy.plan_proactive(scenario)
        except Exception as exc:
            result = exc if isinstance(exc, PlanningError) else PlanningError(f"{type(exc).__name__}: {exc}")
        _send(stdout, result)


def _private_stdout() -> IO[bytes]:
    """The pipe to the controller on a descriptor of its own; descriptor 1 goes to standard error."""
    sys.stdout.flush()
    private = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return private


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
