"""The client side of an ``slo`` service (Jellyfish, section 6): measure the uplink, adapt the frame
size, send frames under an end-to-end SLO, and optionally replay a bandwidth trace.

Usage::

    import httpx
    from failsoft.adaptation_data import bundled_trace
    from failsoft.slo_client import SloStream, TraceUplink

    async with httpx.AsyncClient(base_url="http://127.0.0.1:8000") as http:
        stream = SloStream(http, "digits", slo_ms=100, fps=15, uplink=TraceUplink(bundled_trace("lte")))
        await stream.register()
        result = await stream.send(frame)     # FrameResult: e2e_ms, missed, variant, next frame size
        await stream.leave()

What the client does, as the paper's does:

* **Bandwidth**: every answer gives a round trip (upload start to answer) and the server's residence
  time (``residence_ms``); their difference is the upload time, filtered (Kim and Noble's error-based
  filter) and turned into kbit/s by :class:`~failsoft.policies.adaptation.network.UplinkEstimator`.
  The estimate rides on the next frame (``parameters.bandwidth_kbps``), which feeds the server's
  one-second harmonic mean.
* **Frame size**: the next frame is sent at the size the server's answer asks for
  (``next_frame_px``); its wire size is :func:`~failsoft.policies.adaptation.network.frame_kbit`.
* **Trace replay**: a :class:`TraceUplink` shapes the client's own uplink: a frame starts uploading
  when the one before it has left, and takes its wire size over the trace's bandwidth at that moment
  (plus half the RTT); only then is it posted. On the loopback the real transfer is negligible, so the
  trace alone sets the network time, and the server, which only sees the reported bandwidth, cannot
  tell it from a real link. A frame's tensor stays what the model takes (digits, 64 values): the
  frame size is declared, not rendered.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from failsoft.adaptation_data import Trace
from failsoft.client import checked_body, request_kwargs
from failsoft.errors import ConfigError, FailsoftError
from failsoft.policies.adaptation.network import UplinkEstimator, check_fps, frame_kbit

DEFAULT_FRAME_PX = 224  # the first frame, before the server has said what it wants


@dataclass(frozen=True, slots=True)
class FrameResult:
    """One frame as its client saw it. ``missed``: dropped by the server, failed, or answered after the
    SLO (the paper's deadline miss)."""

    captured_s: float  # monotonic, when the frame was taken
    e2e_ms: float
    upload_ms: float  # the shaped transfer (0 without a trace)
    frame_px: int
    dropped: bool
    missed: bool
    variant: str | None = None
    accuracy: float | None = None  # the serving variant's accuracy (its profile)
    outputs: list[float] | None = None
    error: str | None = None
    # the server's (unmapped, deadline) or the client's own ("stale": skipped, it could not reach the
    # server within its SLO behind the frames still uploading)
    drop_reason: str | None = None


class TraceUplink:
    """A client's uplink shaped to a bandwidth trace: frames leave one at a time, in order."""

    def __init__(self, trace: Trace, offset_s: float = 0.0, rtt_ms: float = 1.0) -> None:
        if not (math.isfinite(offset_s) and offset_s >= 0):
            raise ConfigError(f"trace offset must be >= 0 s; got {offset_s!r}")
        if not (math.isfinite(rtt_ms) and rtt_ms >= 0):
            raise ConfigError(f"rtt_ms must be >= 0; got {rtt_ms!r}")
        self.trace, self.offset_s, self.rtt_ms = trace, offset_s, rtt_ms
        self._free_at = -math.inf

    @property
    def free_at(self) -> float:
        """When the frames already scheduled will have left (seconds on the caller's clock)."""
        return self._free_at

    def schedule(self, now_s: float, kbit: float) -> tuple[float, float]:
        """``(start, arrival)`` in seconds on the caller's clock for a frame of ``kbit`` ready at
        ``now_s``: it starts when the link is free and arrives after its transfer and half the RTT."""
        start = max(now_s, self._free_at)
        mbps = self.trace.at(start, self.offset_s)
        self._free_at = start + kbit / (mbps * 1000.0)
        return start, self._free_at + self.rtt_ms / 2000.0


class SloStream:
    """One registered client of an slo service on a gateway (an :class:`httpx.AsyncClient` with its
    ``base_url``); frames may be sent concurrently (a frame does not wait for the previous answer)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        service: str,
        slo_ms: float,
        fps: float,
        *,
        uplink: TraceUplink | None = None,
        rtt_ms: float | None = None,
    ) -> None:
        if not (math.isfinite(slo_ms) and slo_ms > 0):
            raise ConfigError(f"slo_ms must be > 0; got {slo_ms!r}")
        self.http, self.service = http, service
        self.slo_ms, self.fps = float(slo_ms), check_fps(fps)
        self.uplink = uplink
        self.rtt_ms = rtt_ms if rtt_ms is not None else (uplink.rtt_ms if uplink else 1.0)
        self.estimator = UplinkEstimator(one_way_ms=self.rtt_ms / 2)
        self.client_id: str | None = None
        self.frame_px = DEFAULT_FRAME_PX  # the size the server asked for last
        self.frame_sizes_px: tuple[int, ...] = ()  # the sizes the service takes, from registration
        self.bandwidth_kbps: float | None = None
        self._t0 = time.monotonic()

    async def register(self, bandwidth_kbps: float | None = None) -> dict[str, Any]:
        """Register with the service (a refusal raises the failsoft error its status stands for:
        InvalidRequestError naming the value for a 4xx); the first bandwidth guess is the trace's,
        when replaying one."""
        if bandwidth_kbps is None and self.uplink is not None:
            bandwidth_kbps = self.uplink.trace.at(0.0, self.uplink.offset_s) * 1000.0
        body: dict[str, Any] = {"service": self.service, "slo_ms": self.slo_ms, "fps": self.fps}
        body["rtt_ms"] = self.rtt_ms
        if bandwidth_kbps is not None:
            body["bandwidth_kbps"] = bandwidth_kbps
            self.bandwidth_kbps = bandwidth_kbps
        response = await self.http.post("/v2/clients", json=body)
        answer = checked_body(response)
        self.client_id = answer["client"]
        self.frame_px = int(answer.get("frame_px") or self.frame_px)
        self.frame_sizes_px = tuple(sorted(int(px) for px in answer.get("frame_sizes_px") or ()))
        self._t0 = time.monotonic()
        return answer

    async def send(self, frame: np.ndarray, timeout_s: float | None = None) -> FrameResult:
        """Upload (shaped, when replaying a trace) and infer one frame; never raises for a served,
        dropped or failed frame: the result says which."""
        if self.client_id is None:
            raise ConfigError("register the stream before sending frames")
        captured = time.monotonic()
        px = self.backoff_px()
        kbit = frame_kbit(px)
        start, arrival = captured, captured
        if self.uplink is not None:
            if self._stale(captured, kbit):
                return FrameResult(captured, 0.0, 0.0, px, True, True, drop_reason="stale")
            start, arrival = self.uplink.schedule(captured - self._t0, kbit)
            start, arrival = start + self._t0, arrival + self._t0
            await asyncio.sleep(max(arrival - time.monotonic(), 0.0))
        params: dict[str, Any] = {"client": self.client_id, "frame_px": px}
        if self.bandwidth_kbps is not None:
            params["bandwidth_kbps"] = round(self.bandwidth_kbps, 3)
        timeout = timeout_s if timeout_s is not None else max(self.slo_ms / 1000.0 * 4, 1.0)
        request = request_kwargs(frame, timeout, None, parameters=params)
        try:
            answer = checked_body(await self.http.post(f"/v2/models/{self.service}/infer", **request))
        except (httpx.HTTPError, FailsoftError) as exc:
            return self._failed(captured, arrival - start, px, f"{type(exc).__name__}: {exc}")
        if self.uplink is not None:
            await asyncio.sleep(self.uplink.rtt_ms / 2000.0)  # the answer's way back
        done = time.monotonic()
        p = answer.get("parameters") or {}
        kbps = self.estimator.observe(kbit, (done - start) * 1000.0, float(p.get("residence_ms", 0.0)))
        if kbps is not None:
            self.bandwidth_kbps = kbps
        if p.get("next_frame_px"):
            self.frame_px = int(p["next_frame_px"])
        e2e = (done - captured) * 1000.0
        dropped = bool(p.get("dropped"))
        outputs = answer["outputs"][0]["data"] if answer.get("outputs") else None
        return FrameResult(
            captured, e2e, (arrival - start) * 1000.0, px, dropped, dropped or e2e > self.slo_ms,
            p.get("variant"), p.get("accuracy"), outputs, None, p.get("drop_reason"),
        )  # fmt: skip

    def _stale(self, captured: float, kbit: float) -> bool:
        """True when the frame, queued behind the ones still uploading, would reach the server after
        its SLO by the client's own estimate: a live camera skips it rather than delay every frame
        after it (a miss either way, but one miss instead of a run of late frames)."""
        if self.uplink is None or self.bandwidth_kbps is None:
            return False
        wait_s = max(self.uplink.free_at - (captured - self._t0), 0.0)
        if wait_s <= 0:
            return False
        arrive_ms = (wait_s + kbit / self.bandwidth_kbps) * 1000.0 + self.uplink.rtt_ms / 2
        return arrive_ms > self.slo_ms

    def backoff_px(self) -> int:
        """The frame size to send now (the public client's "best backoff"): the largest the service
        takes, up to the one it asked for, that the client's own bandwidth estimate carries at its
        frame rate; the smallest when none does. The server's ask lags a falling uplink by up to a
        plan; this follows the client's latest measurement, frame by frame."""
        if self.bandwidth_kbps is None or not self.frame_sizes_px:
            return self.frame_px
        sizes = [px for px in self.frame_sizes_px if px <= self.frame_px] or [self.frame_sizes_px[0]]
        for px in reversed(sizes):
            if self.bandwidth_kbps / frame_kbit(px) > self.fps:
                return px
        return sizes[0]

    def _failed(self, captured: float, upload_s: float, px: int, error: str) -> FrameResult:
        e2e = (time.monotonic() - captured) * 1000.0
        return FrameResult(captured, e2e, upload_s * 1000.0, px, False, True, error=error[:200])

    async def leave(self) -> None:
        if self.client_id is not None:
            await self.http.delete(f"/v2/clients/{self.client_id}")
            self.client_id = None
