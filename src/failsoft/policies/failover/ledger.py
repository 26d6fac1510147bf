"""Free capacity per live server, with worst-fit lookup: the bookkeeping every placement shares.

Placements in FailLite are *worst-fit by memory*: a model goes to the server with the most free
memory that can still hold it in every resource. The ledger keeps servers in a sorted list by free
memory, so finding that server is a walk from the top that usually stops at the first entry
(O(log n) per update), which is what lets Algorithm 1 place thousands of apps in milliseconds.
"""

from __future__ import annotations

from collections.abc import Container, Mapping

from sortedcontainers import SortedList

from failsoft.domain import Demand

_EPS = 1e-9


class Ledger:
    """Mutable free-capacity book of one planning call. Never shared between calls."""

    def __init__(self, free: Mapping[str, Demand]) -> None:
        self._free: dict[str, Demand] = dict(free)
        self._by_memory = SortedList((d.memory_mb, name) for name, d in self._free.items())

    def free(self, server: str) -> Demand:
        return self._free[server]

    def servers(self) -> list[str]:
        return list(self._free)

    def total(self) -> Demand:
        total = Demand()
        for d in self._free.values():
            total += d
        return total

    def __contains__(self, server: object) -> bool:
        return server in self._free

    def take(self, server: str, demand: Demand) -> None:
        """Reserve ``demand`` on ``server``; the caller has checked that it fits."""
        self._set(server, self._free[server] - demand)

    def give(self, server: str, demand: Demand) -> None:
        self._set(server, self._free[server] + demand)

    def fits(self, server: str, demand: Demand) -> bool:
        return demand.fits_in(self._free[server])

    def worst_fit(self, demand: Demand, exclude: Container[str] = ()) -> str | None:
        """The server with the most free memory that holds ``demand`` in every resource."""
        for memory, name in reversed(self._by_memory):
            if memory + _EPS < demand.memory_mb:
                return None  # every remaining server has even less memory
            if name not in exclude and demand.compute <= self._free[name].compute + _EPS:
                return name
        return None

    def _set(self, server: str, free: Demand) -> None:
        old = self._free[server]
        self._by_memory.remove((old.memory_mb, server))
        self._free[server] = free
        self._by_memory.add((free.memory_mb, server))
