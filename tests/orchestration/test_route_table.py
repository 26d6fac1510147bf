"""The routing table lists each app's loaded warm backups on live servers (``warm``): where the
gateway moves a call whose server's connection ended before the controller's route comes.

The cluster of :mod:`tests.orchestration.test_core`: ``s0`` serves A, B and C on ``big``; A has a
warm ``small`` backup on ``s1``; ``s2`` is empty.
"""

from __future__ import annotations

from failsoft.domain import BackupState
from failsoft.orchestration import CopyRequest
from tests.orchestration.test_core import Harness, cluster


def warm(h: Harness, app: str) -> list[dict]:
    return h.state.routes()[app]["warm"]


def test_a_loaded_warm_backup_is_listed_with_what_an_answer_from_it_would_say():
    h = Harness(cluster())
    assert warm(h, "A") == [{"server": "s1", "variant": "small", "degraded": True, "accuracy": 0.70}]
    assert warm(h, "B") == [] and warm(h, "C") == []


def test_a_loading_backup_is_not_listed():
    h = Harness(cluster())
    h.state.warm[("A", "s1")].state = BackupState.LOADING
    assert warm(h, "A") == []


def test_a_backup_on_a_failed_server_is_not_listed():
    h = Harness(cluster())
    h.beat_until(0.105, silent=("s1",), silent_from=0.07)
    t = 0.0025
    while t <= 0.105:
        h.check(t)
        t = round(t + 0.005, 6)
    assert h.state.servers["s1"].state.value == "failed"
    assert warm(h, "A") == []


def test_a_mechanisms_pinned_copy_is_not_listed_as_a_warm_backup():
    """A pinned copy is its owner's (a HAMS backup is promoted by the core, never by the gateway)."""
    h = Harness(cluster())
    _, out = h.core.pin(CopyRequest("B", "small", "graph:g", "s2"), 1.0)
    h.take(out)
    h.finish("B", "small", 1.2)
    assert h.state.routes()["B"]["pinned"][0]["ready"]
    assert warm(h, "B") == []
