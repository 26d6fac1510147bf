"""Module skeletons built ahead of need: a load that finds one skips the skeleton phase.

A cold load is: map the weights, build the module's *skeleton* on PyTorch's ``meta`` device, assign
the tensors to it, answer once (:mod:`failsoft.zoo.network`). The skeleton is pure Python work (one
object per layer: hundreds for a ResNet or a ConvNeXt) and about a tenth of a cold load, yet it
depends only on the variant's ``config.json``, so it can be built before the load is asked for, in
a thread that runs when nothing else wants the core.

A skeleton is *consumed* by its load: ``load_state_dict(assign=True)`` makes it the loaded model.
So :class:`Skeletons` holds at most one per variant, :meth:`Skeletons.take` hands it out once (the
next take of that variant finds none until :meth:`Skeletons.build` made another), and a skeleton is
handed out only for the very config it was built from (a variant re-added to the repository since
then gets a fresh one, built in the load as before).

What one costs: on ``meta`` no parameter has storage, so a skeleton is its Python objects only:
about 0.5 MiB for ResNet-18 or ConvNeXt-Tiny, 0.9 MiB for ConvNeXt-Large, 2 MiB for ResNet-152
(tracemalloc, building one). It is not counted against a server's model memory: it is no model.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from failsoft.domain import Variant
from failsoft.zoo.layout import VariantConfig
from failsoft.zoo.network import Skeleton, build_network

__all__ = ["Skeleton", "Skeletons", "skeleton_targets"]


class Skeletons:
    """At most one prepared skeleton per ``(family, variant)``. Thread-safe.

    Guarantees: a skeleton is handed out at most once; :meth:`take` never builds (it returns None
    when none is ready, and the load builds its own); a skeleton built from another config than the
    one a load reads is dropped, never used.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[tuple[str, str], Skeleton] = {}
        self.taken = 0  # skeletons handed to loads
        self.built = 0  # skeletons built here
        self.stale = 0  # dropped: their variant's config had changed

    def build(self, config: VariantConfig) -> bool:
        """Build a skeleton of ``config``'s variant in the calling thread unless one is ready;
        True when one was built."""
        key = (config.family, config.variant)
        with self._lock:
            if key in self._ready and self._ready[key].config == config:
                return False
        module, forward = build_network(config, on_meta=True)
        with self._lock:
            self._ready[key] = Skeleton(config, module, forward)
            self.built += 1
        return True

    def take(self, config: VariantConfig) -> Skeleton | None:
        """The skeleton of ``config``'s variant, removed from here; None when none fits."""
        with self._lock:
            skeleton = self._ready.pop((config.family, config.variant), None)
            if skeleton is not None and skeleton.config != config:
                self.stale += 1
                return None
            if skeleton is not None:
                self.taken += 1
            return skeleton

    def ready(self) -> list[tuple[str, str]]:
        """The variants with a skeleton ready, sorted."""
        with self._lock:
            return sorted(self._ready)

    def stats(self) -> dict[str, object]:
        with self._lock:
            ready = [f"{f}/{v}" for f, v in sorted(self._ready)]
        return {"ready": ready, "built": self.built, "taken": self.taken, "stale": self.stale}


def skeleton_targets(
    profiles: Iterable[tuple[str, Variant]], families: Iterable[str]
) -> frozenset[tuple[str, str]]:
    """The ``(family, variant)`` pairs an agent keeps a skeleton of, from the profiled variants
    (``(family, variant)`` pairs) and the families it may serve: each family's smallest (least
    ``memory_mb``) variant, which is what a progressive failover loads first wherever it recovers
    an app (FailLite 3.3: any app may fail over to any server, so every agent may be asked)."""
    wanted = set(families)
    smallest: dict[str, Variant] = {}
    for family, variant in profiles:
        best = smallest.get(family)
        if family in wanted and (
            best is None or (variant.memory_mb, variant.name) < (best.memory_mb, best.name)
        ):
            smallest[family] = variant
    return frozenset((family, variant.name) for family, variant in smallest.items())
