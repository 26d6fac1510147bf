"""The agents' (and LLM workers') metrics, served at the gateway's ``/metrics`` beside its own.

At each scrape the gateway asks every agent for its figures (Prometheus text,
:mod:`failsoft.runtime.agent_metrics`), all at once with a short time box, and serves them through
a prometheus_client collector registered in its own registry: one scrape target holds the fleet.

* ``failsoft_agent_up{server}``: 1 when the agent answered this scrape, else 0 (its figures are
  then left out, not served stale: a failed server's queue is not "still 3 deep");
* ``failsoft_agent_scrape_seconds{server}``: how long it took to answer.

Any source that renders Prometheus text can be added (:meth:`FleetFigures.add_source`): an LLM
worker's figures (:mod:`failsoft.runtime.llm_metrics`) come the same way, labelled by ``worker``.
Two sources naming the same metric family are merged into one family (their label sets differ by
``server``), as the exposition format requires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
SCRAPE_TIMEOUT_S = 2.0

Fetch = Callable[[], Awaitable[bytes]]


class FleetFigures(Collector):
    """The last scrape of every source; :meth:`refresh` before rendering the registry."""

    def __init__(self, timeout_s: float = SCRAPE_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._extra: dict[str, Callable[[], Mapping[str, Fetch]]] = {}
        self._texts: dict[tuple[str, str], str | None] = {}
        self._took: dict[tuple[str, str], float] = {}

    def add_source(self, label: str, sources: Callable[[], Mapping[str, Fetch]]) -> None:
        """Scrape ``sources()`` (name -> fetch) too; ``label`` names them (``server``, ``worker``)."""
        self._extra[label] = sources

    async def refresh(self, agents: Mapping[str, Any]) -> None:
        """Ask each agent (``AgentRef.metrics``) and each added source, in parallel."""
        fetches = {("server", name): self._agent_fetch(agent) for name, agent in agents.items()}
        for label, sources in self._extra.items():
            fetches.update({(label, name): fetch for name, fetch in sources().items()})
        keys = list(fetches)
        results = await asyncio.gather(*(self._one(fetches[k]) for k in keys))
        self._texts = {k: text for k, (text, _) in zip(keys, results, strict=True)}
        self._took = {k: took for k, (_, took) in zip(keys, results, strict=True)}

    def _agent_fetch(self, agent: Any) -> Fetch:
        async def fetch() -> bytes:
            return bytes(await agent.metrics(timeout_s=self.timeout_s))

        return fetch

    async def _one(self, fetch: Fetch) -> tuple[str | None, float]:
        started = time.perf_counter()
        try:
            raw = await asyncio.wait_for(fetch(), self.timeout_s)
            return raw.decode("utf-8"), time.perf_counter() - started
        except Exception as exc:  # a gone or hung agent: it is down for this scrape
            log.debug("metrics scrape failed: %s", exc)
            return None, time.perf_counter() - started

    def collect(self) -> Iterator[Metric]:
        labels = sorted({label for label, _ in self._texts})
        for label in labels:
            up = GaugeMetricFamily(
                f"failsoft_{_kind(label)}_up", "1 when it answered the scrape", labels=[label]
            )
            took = GaugeMetricFamily(
                f"failsoft_{_kind(label)}_scrape_seconds", "Time it took to answer the scrape", labels=[label]
            )
            for (lab, name), text in sorted(self._texts.items()):
                if lab == label:
                    up.add_metric([name], 0.0 if text is None else 1.0)
                    took.add_metric([name], self._took.get((lab, name), 0.0))
            yield up
            yield took
        yield from merged(text for text in self._texts.values() if text is not None)


def _kind(label: str) -> str:
    return {"server": "agent", "worker": "llm_worker"}.get(label, label)


def merged(texts: Iterator[str] | list[str]) -> Iterator[Metric]:
    """The families of several expositions, one family per name with every source's samples."""
    families: dict[str, Metric] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            seen = families.get(family.name)
            if seen is None:
                families[family.name] = family
            else:
                seen.samples.extend(family.samples)
    yield from families.values()
