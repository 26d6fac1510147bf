"""Dispatchers: one per service mode, behind one contract (:mod:`.interface`).

:data:`DISPATCHERS` maps each mode to its class; a mode that is not there yet has no dispatcher,
and a config that names it is refused by :func:`check_dispatchable` before anything is deployed.
A new mechanism's dispatcher goes in a module of its own here (``coded.py``, ``slo.py``, ...) and
one line in that map.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from failsoft.errors import ConfigError
from failsoft.runtime.gateway.dispatch.coded import CodedDispatcher
from failsoft.runtime.gateway.dispatch.graph import GraphDispatcher
from failsoft.runtime.gateway.dispatch.interface import Answer, DispatchContext, Dispatcher, Move, Request
from failsoft.runtime.gateway.dispatch.llm import LlmDispatcher
from failsoft.runtime.gateway.dispatch.single import SingleDispatcher
from failsoft.runtime.gateway.dispatch.slo import SloDispatcher
from failsoft.services import Service, ServiceMode

DISPATCHERS: Mapping[ServiceMode, type[Dispatcher]] = {
    ServiceMode.SINGLE: SingleDispatcher,
    ServiceMode.SLO: SloDispatcher,
    ServiceMode.CODED: CodedDispatcher,
    ServiceMode.GRAPH: GraphDispatcher,
    ServiceMode.LLM: LlmDispatcher,
}


def dispatcher_class(service: Service) -> type[Dispatcher]:
    """The class that serves ``service``'s mode; ConfigError naming the service when none does."""
    cls = DISPATCHERS.get(service.mode)
    if cls is None:
        have = ", ".join(m.value for m in DISPATCHERS)
        raise ConfigError(
            f"service {service.name!r}: mode {service.mode.value!r} cannot be served yet: this gateway "
            f"has no dispatcher for it (modes served: {have})"
        )
    return cls


def check_dispatchable(services: Iterable[Service]) -> None:
    """Refuse a deployment with a service no dispatcher serves (before any process starts)."""
    for service in services:
        dispatcher_class(service)


def build_dispatchers(services: Iterable[Service], context: DispatchContext) -> dict[str, Dispatcher]:
    """One dispatcher per service, by the service's name (the gateway's model namespace)."""
    return {s.name: dispatcher_class(s)(s, context) for s in services}


__all__ = [
    "DISPATCHERS",
    "Answer",
    "CodedDispatcher",
    "DispatchContext",
    "Dispatcher",
    "GraphDispatcher",
    "LlmDispatcher",
    "Move",
    "Request",
    "SingleDispatcher",
    "SloDispatcher",
    "build_dispatchers",
    "check_dispatchable",
    "dispatcher_class",
]
