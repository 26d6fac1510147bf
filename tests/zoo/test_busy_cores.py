"""The host's busy cores, read from the kernel's counters: the simulator's twin of a runtime run is
given the host's real load, everyone's."""

from __future__ import annotations

import threading
import time

from failsoft.zoo.machine import BusyCores, usable_cores


def test_a_spinning_thread_shows_as_about_one_busy_core():
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    meter = BusyCores()
    worker = threading.Thread(target=spin)
    worker.start()
    try:
        time.sleep(1.0)
        busy = meter.read()
    finally:
        stop.set()
        worker.join()
    # our thread alone keeps one core busy (more if other tenants run); never past the cores we have
    assert 0.8 <= busy <= usable_cores()
