"""The serving runtime: FailLite's controller, agents and gateway on Ray (FailLite 3.4, 4).

::

    clients ── HTTP (KServe v2) · /v2/events websocket · failsoft.client
       │
    gateway      routes pushed by the controller, deadlines and retries, metrics, admin
       │  Ray actor calls
    controller   heartbeats -> failure detection -> failover policy -> warm switch / progressive load
       │         restore, warm backups re-planned; state in SQLite or Redis
    agents       one per server: local model repository, load/unload, inference, 20 ms heartbeats

Modules: :mod:`~failsoft.runtime.config` (YAML), :mod:`~failsoft.runtime.deployment` (primaries),
:mod:`~failsoft.runtime.cluster` (the only module that imports Ray), :mod:`~failsoft.runtime.agent`,
:mod:`~failsoft.runtime.controller` with :mod:`~failsoft.runtime.orchestrator`,
:mod:`~failsoft.runtime.state`, :mod:`~failsoft.runtime.store`, :mod:`~failsoft.runtime.gateway`,
:mod:`~failsoft.runtime.chaos`, and :mod:`~failsoft.runtime.session`, which starts and stops it all.

Importing this package imports neither Ray nor torch.
"""

from failsoft.runtime.config import RuntimeConfig, config_from_dict, load_config

__all__ = ["RuntimeConfig", "config_from_dict", "load_config"]
