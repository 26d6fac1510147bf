"""Small ladders and seeded instances for the adaptation tests."""

from __future__ import annotations

import numpy as np
import pytest

from failsoft.domain import Variant
from failsoft.policies.adaptation.model import ClientSnapshot, Ladder, Rung, Snapshot
from failsoft.policies.adaptation.network import frame_kbit


def toy_ladder(max_batch: int = 4) -> Ladder:
    """Three rungs with round numbers: batch-1 latency 5, 10, 20 ms; a batch of b costs (1 + (b-1)/2)."""
    rungs = []
    for name, px, acc, lat in (("s", 224, 0.70, 5.0), ("m", 300, 0.78, 10.0), ("l", 380, 0.82, 20.0)):
        rungs.append(Rung(Variant(name, 100.0, acc, 100.0, lat), px, frame_kbit(px)))
    return Ladder.build(rungs, max_batch, batch_cost=0.5)


def random_snapshot(ladder: Ladder, workers: int, clients: int, seed: int) -> Snapshot:
    """Budgets drawn per client, shrinking with the rung (a larger frame takes longer to send)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(clients):
        base = float(rng.uniform(5, 120))
        shrink = float(rng.uniform(0, 25))
        budgets = tuple(max(0.0, base - shrink * j) for j in range(ladder.size))
        out.append(ClientSnapshot(f"c{i}", float(rng.choice([5.0, 10.0, 15.0, 25.0])), budgets))
    return Snapshot(ladder, tuple(out), tuple(f"w{k}" for k in range(workers)))


@pytest.fixture
def ladder() -> Ladder:
    return toy_ladder()
