"""The gateway: KServe v2 HTTP, routing with deadlines and retries, events, metrics, admin."""

from failsoft.runtime.gateway.app import Gateway
from failsoft.runtime.gateway.protocol import ModelMeta

__all__ = ["Gateway", "ModelMeta"]
