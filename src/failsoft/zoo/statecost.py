"""What moving a stateful model's state costs: ``python -m failsoft.zoo.statecost [ROOT]``.

A HAMS backup (DSN'20, III-A) is only as fresh as the last state shipped to it, so the price of one
shipment bounds how often it can be done: the bytes on the wire, the sender's ``state()`` +
``to_bytes()`` and the receiver's ``apply_state(bytes)``. This measures them for every stateful
variant in a repository, the zoo's own and users' stateful handlers alike (the network aside). It
sits above :mod:`failsoft.zoo.repository`, which loads the models, and :mod:`failsoft.zoo.state`,
the interface both kinds share.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np

from failsoft.zoo.repository import ModelRepository, resolve_repository
from failsoft.zoo.state import Stateful


def transfer_cost(model: Stateful, repeats: int = 200) -> dict[str, Any]:
    """What moving ``model``'s state costs: bytes on the wire, and the median time of ``state()`` +
    ``to_bytes()`` on the sender and ``apply_state(bytes)`` on the receiver (the network aside)."""

    def median_ms(work: Any) -> float:
        samples = []
        for _ in range(repeats):
            began = time.perf_counter()
            work()
            samples.append((time.perf_counter() - began) * 1000.0)
        return round(float(np.median(samples)), 4)

    blob = model.state().to_bytes()
    return {
        "model": model.model_id,
        "state_arrays": {k: list(v.shape) for k, v in model.state().arrays.items()},
        "state_bytes": model.state().nbytes,
        "wire_bytes": len(blob),
        "state_ms": median_ms(lambda: model.state().to_bytes()),
        "apply_ms": median_ms(lambda: model.apply_state(blob)),
        "compute_ms": median_ms(lambda: model.compute(np.zeros((1, *model.input_shape), np.float32))),
    }


def main(argv: list[str] | None = None) -> int:
    """The transfer cost of every stateful variant built in the repository ``ROOT``
    (``$FAILSOFT_ZOO`` by default), as JSON lines (CPU, one torch thread)."""
    import torch

    args = sys.argv[1:] if argv is None else argv
    repo = ModelRepository(resolve_repository(args[0] if args else None))
    torch.set_num_threads(1)
    for family in repo.family_names():
        for variant in repo.variant_names(family):
            if repo.config(family, variant).stateful:
                model = repo.load(family, variant, "cpu")
                assert isinstance(model, Stateful)
                print(json.dumps({"family": family, "variant": variant} | transfer_cost(model)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
