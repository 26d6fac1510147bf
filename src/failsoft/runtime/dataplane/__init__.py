"""The data plane: inference requests from the gateway to an agent over a direct connection.

Ray is failsoft's substrate for processes, placement and control (loads, unloads, status, chaos);
an inference request does not need what an actor call brings (task specs, the object store's
reference counting, a scheduler hop, a pool thread parked on every waiting request), and on a small
model that call was more than half of a request's time. Each agent therefore serves a ZeroMQ ROUTER
socket on a port of its own (:mod:`.server`); the gateway keeps one persistent DEALER connection
per agent on its event loop (:mod:`.client`), whose endpoint it asks the agent for once, over Ray
(:mod:`.link`). A request is a JSON header and the tensor's raw bytes (:mod:`.frames`); the reply
is the output tensor or a failsoft error by class. Deadlines, withdrawals and request ids are
those of the Ray call; ``$FAILSOFT_DATA_PLANE=ray`` goes back to it.

The connection is also a second, independent failure signal: it ends when the agent's heartbeat
sidecar says the agent died (it watches for that every few milliseconds and tells the gateway over
a watch connection) or when the killed agent's kernel closes the socket, at the end of its
teardown; the gateway then fails the calls waiting on it over to the next route and tells the
controller, without waiting for missed heartbeats.
"""

from failsoft.runtime.dataplane.client import DataPlaneClient
from failsoft.runtime.dataplane.link import ENV, DataPlaneLink, LinkChange, transport
from failsoft.runtime.dataplane.server import DataPlaneServer

__all__ = ["ENV", "DataPlaneClient", "DataPlaneLink", "DataPlaneServer", "LinkChange", "transport"]
