"""The SDK client's pure parts: the shaped uplink and the per-frame backoff. Against a real gateway it
is tested in tests/runtime/test_slo_service.py."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from failsoft.adaptation_data import Trace
from failsoft.errors import ConfigError
from failsoft.policies.adaptation.network import frame_kbit
from failsoft.slo_client import SloStream, TraceUplink

SIZES = (128, 160, 192, 224, 260, 456, 600)


def test_frames_leave_the_shaped_uplink_one_at_a_time_at_the_traces_bandwidth():
    uplink = TraceUplink(Trace("steps", (10.0, 2.0), 1.0), rtt_ms=4.0)
    kbit = frame_kbit(224)  # ~208 kbit: 20.8 ms at 10 Mbit/s
    start, arrival = uplink.schedule(0.0, kbit)
    assert start == 0.0 and arrival == pytest.approx(kbit / 10_000 + 0.002)
    # a frame ready while the first is still on the link waits for it
    start2, arrival2 = uplink.schedule(0.01, kbit)
    assert start2 == pytest.approx(kbit / 10_000) and arrival2 == pytest.approx(2 * kbit / 10_000 + 0.002)
    # a second later the trace has dropped to 2 Mbit/s: five times slower
    start3, arrival3 = uplink.schedule(1.0, kbit)
    assert arrival3 - start3 == pytest.approx(kbit / 2_000 + 0.002)
    with pytest.raises(ConfigError, match="rtt_ms must be >= 0; got -1"):
        TraceUplink(Trace("t", (1.0,), 1.0), rtt_ms=-1)


def test_the_client_backs_off_to_the_largest_frame_its_own_estimate_carries():
    stream = SloStream(httpx.AsyncClient(), "svc", slo_ms=100, fps=15)
    stream.frame_sizes_px, stream.frame_px = SIZES, 456
    assert stream.backoff_px() == 456  # no measurement yet: what the server asked for
    stream.bandwidth_kbps = 20_000.0  # 456 px (675 kbit) x 15 fps needs ~10 Mbit/s: carried
    assert stream.backoff_px() == 456
    stream.bandwidth_kbps = 9_000.0  # not any more: the next size down that is carried
    assert stream.backoff_px() == 260
    stream.bandwidth_kbps = 1_500.0  # a deep dip: below 224 px, the upscaled feeds
    assert stream.backoff_px() == 128 and 1_500 / frame_kbit(128) > 15
    stream.bandwidth_kbps = 100.0  # nothing is carried: the smallest frame
    assert stream.backoff_px() == 128
    stream.frame_px, stream.bandwidth_kbps = 224, 1e6  # never above what the server asked for
    assert stream.backoff_px() == 224


def test_a_frame_stuck_behind_uploads_past_its_slo_is_skipped_not_sent_late():
    import asyncio

    uplink = TraceUplink(Trace("slow", (1.0,), 1.0), rtt_ms=2.0)
    stream = SloStream(httpx.AsyncClient(base_url="http://127.0.0.1:9"), "svc", 100, 15, uplink=uplink)
    stream.client_id, stream.bandwidth_kbps, stream.frame_px = "c", 1_000.0, 224
    uplink.schedule(0.0, frame_kbit(600))  # a big frame holds the 1 Mbit/s link for ~1 s
    result = asyncio.run(stream.send(np.zeros(64, dtype=np.float32)))
    # nothing was sent (the gateway address is closed: a send would have failed, not been dropped)
    assert (result.dropped, result.missed, result.drop_reason, result.error) == (True, True, "stale", None)
    assert uplink.free_at == pytest.approx(frame_kbit(600) / 1_000)  # the skipped frame took no link time
