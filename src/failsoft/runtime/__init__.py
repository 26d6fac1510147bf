"""The serving runtime: FailLite's controller, agents and gateway on Ray (FailLite 3.4, 4), and
the services the other mechanisms add (ParM, Jellyfish, HAMS, LUMEN).

::

    clients ── HTTP (KServe v2, OpenAI for llm services) · /v2/events websocket · failsoft.client
       │
    gateway      one dispatcher per service mode: routes pushed by the controller, deadlines,
       │         retries, fencing; /metrics for the whole fleet; the admin API on its own port
       │  requests: ZeroMQ data plane to each agent · control: Ray actor calls
    controller   drives the orchestration core: heartbeats -> failure detection -> plans ->
       │         loads, switches, upgrades, warm backups, pinned copies, replicas, deploys;
       │         the LLM workers' fleet; state in SQLite or Redis
    agents       one per server: local model repository, load/unload, serving queues, inference,
                 a heartbeat sidecar (signed UDP, and a notice when its agent dies)

Modules: :mod:`~failsoft.runtime.config` (YAML) and :mod:`~failsoft.runtime.llm_config`,
:mod:`~failsoft.runtime.deployment` (primaries), :mod:`~failsoft.runtime.cluster` (the only module
that imports Ray), :mod:`~failsoft.runtime.agent` with :mod:`~failsoft.runtime.serving` (queues)
and :mod:`~failsoft.runtime.dataplane`, :mod:`~failsoft.runtime.controller` with
:mod:`~failsoft.runtime.core_driver` (the core's driver), :mod:`~failsoft.runtime.llm_fleet` and
:mod:`~failsoft.runtime.llm_worker`, :mod:`~failsoft.runtime.redeploy` (``failsoft deploy``),
:mod:`~failsoft.runtime.store`, :mod:`~failsoft.runtime.gateway`, :mod:`~failsoft.runtime.chaos`,
:mod:`~failsoft.runtime.telemetry` and :mod:`~failsoft.runtime.logs`, :mod:`~failsoft.runtime.netns`
(network namespaces for multi-node tests), and :mod:`~failsoft.runtime.session`, which starts and
stops it all.

Importing this package imports neither Ray nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from failsoft.runtime.config import RuntimeConfig, config_from_dict, load_config

__all__ = ["RuntimeConfig", "config_from_dict", "load_config"]


def __getattr__(name: str) -> Any:
    # the config's names on first use: an agent's or a worker's process, which imports a module of
    # this package, never reads a config (its import is about half a second of a core)
    if name in __all__:
        from failsoft.runtime import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
