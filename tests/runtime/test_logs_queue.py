"""Logging never makes a process wait on its stderr: records go through a bounded queue to one
writer thread, and what does not fit is dropped and counted (a real pipe that nobody reads)."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

import pytest

from failsoft.runtime import logs


def until(condition: Callable[[], bool], timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.slow  # waits on a writer thread by the wall clock
def test_a_full_stderr_pipe_never_blocks_the_logger_and_drops_are_reported(monkeypatch) -> None:
    read_fd, write_fd = os.pipe()
    pipe = io.TextIOWrapper(os.fdopen(write_fd, "wb", buffering=0), encoding="utf-8", write_through=True)
    monkeypatch.setattr(sys, "stderr", pipe)
    name = "failsoft_test_queue"
    logs.configure("json", "gateway", logger=name)
    log = logging.getLogger(name)
    log.propagate = False
    before = logs.dropped()

    def flood() -> None:
        token = logs.request_id.set("rid-1")
        try:
            for i in range(3 * logs.QUEUE_RECORDS):
                log.info("request %d", i, extra={"status": 200})
        finally:
            logs.request_id.reset(token)

    caller = threading.Thread(target=flood, daemon=True)
    caller.start()
    caller.join(timeout=60)
    # nobody has read the pipe (64 KiB): a blocking handler would still be inside the first records
    assert not caller.is_alive(), "logging blocked on a full stderr pipe"
    assert logs.dropped() - before >= logs.QUEUE_RECORDS

    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(os.fdopen(read_fd, encoding="utf-8")), daemon=True)
    reader.start()
    writer = logs._writers[-1]
    assert until(lambda: writer.records.qsize() == 0, timeout_s=60)  # stderr moves again: the queue drains
    log.info("after the flood")
    for handler in list(log.handlers):
        log.removeHandler(handler)
    writer.stop()  # the writer drains its queue as a process exit would
    pipe.close()
    reader.join(timeout=30)

    records = [json.loads(line) for line in lines if line.startswith("{")]
    served = [r for r in records if r["message"].startswith("request ")]
    assert served and all(r["request_id"] == "rid-1" and r["status"] == 200 for r in served)
    assert any("log records dropped" in r["message"] for r in records)
    assert records[-1]["message"] == "after the flood"
