"""The client's network as the scheduler sees it: bandwidth, latency budget, frame size, lazy drop.

Jellyfish (section 3.3) splits a client's end-to-end SLO into the time its frame spends on the network
and the time left to the server, the *latency budget*::

    network_ms(j) = frame_kbit(j) / bandwidth_kbps * 1000 + rtt_ms          (eq. 1)
    budget_ms(j)  = slo_ms - network_ms(j) - server_overhead_ms             (0 if negative)

for every variant ``j`` (a larger variant wants a larger frame, which takes longer to send). A variant
whose frames the uplink cannot carry at the client's frame rate (``bandwidth / frame_kbit <= fps``)
gets budget 0: frames would pile up in the uplink however fast the server is.

The pieces, all pure (time is passed in):

* :func:`frame_kbit`: a square frame of ``px`` pixels, JPEG quality 90, as the public code sizes it
  (raw RGB bytes over the minimum compression ratio it measured per resolution; interpolated here).
* :class:`ErrorBasedFilter`: the client's filter on measured upload times (Kim and Noble, "Mobile
  network estimation", MobiCom 2001; gamma 0.6, 10 errors of history), and :class:`UplinkEstimator`,
  which turns a request's round trip minus the server's residence into an upload bandwidth.
* :class:`BandwidthWindow`: the server's estimate, the harmonic mean of the reports of the last second
  (conservative: dominated by the low samples).
* :class:`OverheadTracker`: the server's own overhead (dispatch both ways, pre-processing, noise) as
  EWMAs (alpha 0.5) of what it measures, starting at 1 + 1 + 0 + 2 = 4 ms.
* :func:`next_frame_rung`: frame-size adaptation (the frame the client should send next).
* :func:`server_deadline_s`: the deadline a request has on the server, which the ``batch-lazy-drop``
  queue discipline (:mod:`failsoft.policies.queueing`) uses to drop, when it comes up, a request that
  cannot finish in time even alone.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from dataclasses import dataclass

import numpy as np

from failsoft.errors import ConfigError
from failsoft.policies.adaptation.model import QUEUE_FACTOR, Ladder

MAX_BANDWIDTH_KBPS = 100e6  # 100 Gbit/s: a report above this is absurd, not a fast link
MAX_FPS = 1000.0
WINDOW_S = 1.0  # the server's bandwidth window (section 6: the last second of reports)
FILTER_GAMMA = 0.6
FILTER_HISTORY = 10
WIRE_CONFIDENCE = 0.9  # share of the propagation delay subtracted from a measured upload time
OVERHEAD_ALPHA = 0.5
# Minimum JPEG-90 compression ratio per square resolution, measured on traffic videos (public code).
_COMPRESSION = (
    (128, 4.78), (160, 5.148), (192, 5.365), (224, 5.66), (256, 5.782), (288, 6.133), (320, 6.431),
    (352, 6.556), (384, 6.781), (416, 6.953), (448, 7.158), (480, 7.421), (512, 7.574), (544, 7.739),
    (576, 7.968), (608, 8.131), (640, 8.547),
)  # fmt: skip


def frame_kbit(px: int) -> float:
    """Kilobits on the wire for a ``px`` x ``px`` RGB frame (ratio interpolated, clamped at the ends)."""
    if not 1 <= px <= 8192:
        raise ConfigError(f"frame size must be 1..8192 px; got {px!r}")
    sizes, ratios = zip(*_COMPRESSION, strict=True)
    ratio = float(np.interp(px, sizes, ratios))
    return px * px * 3 / 1024 / ratio * 8


def check_bandwidth(kbps: float, what: str = "bandwidth") -> float:
    if not (isinstance(kbps, int | float) and math.isfinite(kbps) and 0 < kbps <= MAX_BANDWIDTH_KBPS):
        raise ConfigError(f"{what} must be in (0, {MAX_BANDWIDTH_KBPS:.0f}] kbps; got {kbps!r}")
    return float(kbps)


def check_fps(fps: float) -> float:
    if not (isinstance(fps, int | float) and math.isfinite(fps) and 0 < fps <= MAX_FPS):
        raise ConfigError(f"frame rate must be in (0, {MAX_FPS:.0f}] fps; got {fps!r}")
    return float(fps)


def network_ms(kbit: float, bandwidth_kbps: float, rtt_ms: float) -> float:
    """Eq. 1: transfer time of ``kbit`` at ``bandwidth_kbps`` plus the round-trip propagation."""
    return kbit / bandwidth_kbps * 1000.0 + rtt_ms


def check_slo(slo_ms: float, ladder: Ladder) -> float:
    """Refuse an SLO that even the fastest variant, alone and on a perfect network, cannot meet."""
    fastest = float(ladder.latency_ms[0, 0])
    if not (isinstance(slo_ms, int | float) and math.isfinite(slo_ms) and slo_ms > 0):
        raise ConfigError(f"slo_ms must be a positive number; got {slo_ms!r}")
    if slo_ms < QUEUE_FACTOR * fastest:
        raise ConfigError(
            f"slo_ms {slo_ms!r} is below what the fastest variant {ladder.rungs[0].variant.name!r} needs "
            f"({QUEUE_FACTOR:g} x {fastest:.2f} ms: one batch waited for, one run)"
        )
    return float(slo_ms)


def latency_budgets_ms(
    ladder: Ladder, slo_ms: float, fps: float, bandwidth_kbps: float, rtt_ms: float, overhead_ms: float
) -> tuple[float, ...]:
    """Section 3.3: the server's budget for each rung (0 where the uplink cannot carry the frames)."""
    check_slo(slo_ms, ladder)
    check_fps(fps)
    check_bandwidth(bandwidth_kbps)
    if not (math.isfinite(rtt_ms) and rtt_ms >= 0 and math.isfinite(overhead_ms) and overhead_ms >= 0):
        raise ConfigError(f"rtt_ms and overhead_ms must be >= 0; got {rtt_ms!r}, {overhead_ms!r}")
    budgets = []
    for rung in ladder.rungs:
        if bandwidth_kbps / rung.frame_kbit <= fps:
            budgets.append(0.0)
            continue
        budgets.append(max(0.0, slo_ms - network_ms(rung.frame_kbit, bandwidth_kbps, rtt_ms) - overhead_ms))
    return tuple(budgets)


class ErrorBasedFilter:
    """Kim and Noble's adaptive filter: the gain follows how wrong the estimate has recently been.

    ``err`` is an EWMA (``gamma``) of ``|observation - estimate|``; ``alpha = 1 - err / max(recent
    errs)``; ``estimate = alpha * estimate + (1 - alpha) * observation``. When every recent error is 0
    the estimate is exact and is kept (the public code divides by zero there).
    """

    def __init__(self, gamma: float = FILTER_GAMMA, history: int = FILTER_HISTORY) -> None:
        if not (0 <= gamma < 1 and history >= 1):
            raise ConfigError(f"filter gamma must be in [0, 1) and history >= 1; got {gamma!r}, {history!r}")
        self.gamma = gamma
        self._errors: deque[float] = deque(maxlen=history)
        self.estimate: float | None = None
        self._err: float | None = None

    def reset(self) -> None:
        self._errors.clear()
        self.estimate = self._err = None

    def update(self, observation: float) -> float:
        if self.estimate is None:
            self.estimate = observation
            return observation
        err = abs(observation - self.estimate)
        self._err = err if self._err is None else self.gamma * self._err + (1 - self.gamma) * err
        self._errors.append(self._err)
        worst = max(self._errors)
        alpha = 1.0 - self._err / worst if worst > 0 else 1.0
        self.estimate = alpha * self.estimate + (1 - alpha) * observation
        return self.estimate


class UplinkEstimator:
    """The client's bandwidth estimate from its requests' round trips (public client, section 6).

    Per answered request: upload time = round trip - server residence (no clock sync needed); it is
    filtered, and the bandwidth is ``kbit / (filtered - 0.9 * one-way propagation)``. The filter is
    reset when the frame size changes (the times of different sizes are not comparable).
    """

    def __init__(self, one_way_ms: float = 0.5) -> None:
        if not (math.isfinite(one_way_ms) and one_way_ms >= 0):
            raise ConfigError(f"one-way propagation must be >= 0 ms; got {one_way_ms!r}")
        self.one_way_ms = one_way_ms
        self.filter = ErrorBasedFilter()
        self._kbit: float | None = None

    def observe(self, kbit: float, round_trip_ms: float, server_ms: float) -> float | None:
        """The bandwidth (kbps) after this answer, or ``None`` if the times make no sense (skipped)."""
        if kbit != self._kbit:
            self.filter.reset()
            self._kbit = kbit
        upload = round_trip_ms - server_ms
        if not (math.isfinite(upload) and upload > 0):
            return None
        smoothed = self.filter.update(upload)
        transfer = smoothed - WIRE_CONFIDENCE * self.one_way_ms
        if transfer <= 0:
            return None
        return min(kbit / transfer * 1000.0, MAX_BANDWIDTH_KBPS)


class BandwidthWindow:
    """The server's bandwidth estimate of one client: harmonic mean of the last ``window_s`` of reports.

    The public server keeps the last ``fps`` reports (one second at the nominal rate); a time window
    is the same at a steady rate and stays right when the client slows down. The newest report is
    always kept, so the estimate never falls back to the initial value once reports arrive.
    """

    def __init__(self, initial_kbps: float, window_s: float = WINDOW_S) -> None:
        self._initial = check_bandwidth(initial_kbps, "initial bandwidth")
        if not (math.isfinite(window_s) and window_s > 0):
            raise ConfigError(f"bandwidth window must be > 0 s; got {window_s!r}")
        self.window_s = window_s
        self._times: list[float] = []
        self._kbps: list[float] = []

    def report(self, now_s: float, kbps: float) -> None:
        check_bandwidth(kbps, "bandwidth report")
        if self._times and now_s < self._times[-1]:
            raise ConfigError(
                f"bandwidth report at {now_s!r} s is older than the last one ({self._times[-1]!r} s)"
            )
        self._times.append(now_s)
        self._kbps.append(float(kbps))

    def estimate(self, now_s: float) -> float:
        first = min(bisect.bisect_left(self._times, now_s - self.window_s), max(len(self._times) - 1, 0))
        del self._times[:first], self._kbps[:first]
        if not self._kbps:
            return self._initial
        return statistics.harmonic_mean(self._kbps)


@dataclass
class OverheadTracker:
    """The server's overhead per request (ms), EWMAs of what it measures (public server defaults).

    ``dispatch_ms`` counts twice (request to the worker, answer back), then pre-processing and noise.
    """

    dispatch_ms: float = 1.0
    preprocess_ms: float = 0.0
    noise_ms: float = 2.0
    alpha: float = OVERHEAD_ALPHA

    def observe(self, dispatch_ms: float, preprocess_ms: float, noise_ms: float) -> None:
        values = (dispatch_ms, preprocess_ms, noise_ms)
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ConfigError(f"measured overheads must be >= 0 ms; got {values!r}")
        a = self.alpha
        self.dispatch_ms = a * dispatch_ms + (1 - a) * self.dispatch_ms
        self.preprocess_ms = a * preprocess_ms + (1 - a) * self.preprocess_ms
        self.noise_ms = a * noise_ms + (1 - a) * self.noise_ms

    @property
    def total_ms(self) -> float:
        return 2 * self.dispatch_ms + self.preprocess_ms + self.noise_ms


def next_frame_rung(
    ladder: Ladder,
    mapped_rung: int | None,
    batch: int,
    slo_ms: float,
    fps: float,
    bandwidth_kbps: float,
    rtt_ms: float,
    overhead_ms: float,
) -> int:
    """Frame-size adaptation (section 6, "best backoff"): the rung whose frame size to send next.

    Start at the worker's variant and step down while the uplink cannot carry that frame size at the
    client's rate, or while its transfer leaves less than ``2 l(b)`` of the worker's variant and batch.
    The smallest frame is the floor. An unmapped client (``mapped_rung`` None) or an idle worker
    (``batch`` 0) is judged at batch 1 (the public code reads the profile at index -1 there).
    """
    check_bandwidth(bandwidth_kbps)
    check_fps(fps)
    if mapped_rung is None:
        mapped_rung = 0
    compute_ms = QUEUE_FACTOR * float(ladder.latency_ms[mapped_rung, max(batch, 1) - 1])
    for j in range(mapped_rung, 0, -1):
        kbit = ladder.rungs[j].frame_kbit
        if bandwidth_kbps / kbit <= fps:
            continue
        if slo_ms - network_ms(kbit, bandwidth_kbps, rtt_ms) - overhead_ms >= compute_ms:
            return j
    return 0


def carried_frame_rung(ladder: Ladder, top_rung: int, fps: float, bandwidth_kbps: float) -> int:
    """The largest frame size up to ``top_rung``'s that the uplink carries at ``fps`` (else the smallest).

    The baselines' client adaptation (section 7.3, as AWStream): throughput only, no latency budget.
    """
    check_bandwidth(bandwidth_kbps)
    check_fps(fps)
    for j in range(top_rung, 0, -1):
        if bandwidth_kbps / ladder.rungs[j].frame_kbit > fps:
            return j
    return 0


def server_deadline_s(
    received_s: float, slo_ms: float, kbit: float, bandwidth_kbps: float, rtt_ms: float, overhead_ms: float
) -> float:
    """When a request received at ``received_s`` must leave the worker to meet its end-to-end SLO.

    Its time on the network is computed from its size and the client's reported bandwidth (no clock
    sync); the overhead covers the answer's way back. Queue it with this deadline in a
    ``batch-lazy-drop`` queue and it is dropped, when it comes up, if it cannot finish even alone.
    """
    spent = network_ms(kbit, check_bandwidth(bandwidth_kbps), rtt_ms) + overhead_ms
    return received_s + (slo_ms - spent) / 1000.0
