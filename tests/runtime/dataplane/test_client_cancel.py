"""A withdrawal the data plane cannot send (the agent's queue full, or the agent gone before the
gateway noticed) is dropped quietly: it is fire and forget, and asyncio must not log "Future
exception was never retrieved" for each one (seen by the dozen in ``bench failover`` at a kill).

The real :class:`~failsoft.runtime.dataplane.DataPlaneClient`, made towards a port where nobody
listens any more (an agent gone), is given withdrawals before it has noticed: its socket queues
the first thousand (its send high-water mark) and cannot take the rest.
"""

from __future__ import annotations

import asyncio
import gc
import socket
from typing import Any

from failsoft.runtime.dataplane import DataPlaneClient
from tests.runtime.gateway.fakes import sync

WITHDRAWALS = 3000  # past the socket's queue (its send high-water mark, 1000 by default)


def a_closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@sync
async def test_withdrawals_that_cannot_be_sent_are_dropped_without_an_unretrieved_error() -> None:
    reported: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: reported.append(context))
    client = DataPlaneClient(f"tcp://127.0.0.1:{a_closed_port()}", "s1")
    try:
        for i in range(WITHDRAWALS):  # before the client has had a chance to see that nobody is there
            client.cancel_nowait(f"r{i}")
        await asyncio.sleep(0.1)
        gc.collect()
        await asyncio.sleep(0)
        assert [c.get("message") for c in reported] == []
    finally:
        client.close()
