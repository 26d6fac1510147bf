"""Jellyfish's inputs shipped with failsoft: bandwidth traces, client sets, and the variant ladder.

* Traces (``data/jellyfish/traces``, Mbps, one number a line, from the Jellyfish repository): the
  synthetic staircase (each value held 20 s), a WiFi and an LTE uplink trace (1 s per value).
* Client sets (``data/jellyfish/clients``): the paper's experiment mixes, one client a line; the last
  two columns are the SLO (ms) and the frame rate.
* The ladder: EfficientNet B0-B7 from the bundled A2 profiles (input 224 to 600 px, ImageNet top-1
  77.7% to 84.1%). It is the one family in the profiles whose variants differ, like Jellyfish's
  YOLOv4 family, by input resolution with accuracy growing along it; the per-batch latency follows
  :meth:`~failsoft.domain.Variant.latency_at` with ``batch_cost`` (the profiles hold batch 1 only).
* Low-resolution feeds (``low_res_px``): the paper's client sends, when its uplink cannot carry the
  smallest model's frames, "the maximum possible size" (section 3.1), which the server upscales. Its
  YOLOv4 ladder starts at 128 px, ours at EfficientNet-B0's 224 px, so on demand the ladder gets
  rungs of B0 fed 128, 160 or 192 px frames (the paper's 32 px grid), at B0's cost and at a declared
  accuracy (:func:`upscaled_accuracy`).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from failsoft.errors import ConfigError
from failsoft.policies.adaptation.model import Ladder, Rung
from failsoft.policies.adaptation.network import frame_kbit
from failsoft.profiles import bundled_profile_path, load_profile_families

TRACE_STEP_S = {"synthetic": 20.0, "wifi": 1.0, "lte": 1.0}
_TRACE_FILES = {"synthetic": "synthetic_trace.txt", "wifi": "wifi_trace.txt", "lte": "lte_upload_trace.txt"}
MAX_TRACE_MBPS = 100_000.0
# Top-1 (%) of MobileNetV2 1.0 trained at each square resolution (the TF-slim checkpoint table of
# Sandler et al., "MobileNetV2", CVPR 2018): how much ImageNet accuracy a smaller frame costs.
_LOW_RES_TOP1 = {224: 71.8, 192: 70.7, 160: 68.8, 128: 65.3}
LOW_RES_PX = (128, 160, 192)  # below EfficientNet-B0's 224 px, on the paper's 32 px frame grid
UPSCALE_PENALTY = 2.0  # the loss is doubled: B0 was trained at 224 px, not at the frame's size
# The public code's synthetic latency model: l(b) = l(1) * (1 + (b - 1) / 3) (0.75 L + 0.25 L (b - 1)).
DEFAULT_BATCH_COST = 1.0 / 3.0


@dataclass(frozen=True)
class Trace:
    name: str
    mbps: tuple[float, ...]
    step_s: float

    def at(self, t_s: float, offset_s: float = 0.0) -> float:
        """Mbps at ``t_s`` seconds, looping, starting ``offset_s`` into the trace."""
        i = math.floor((t_s + offset_s) / self.step_s) % len(self.mbps)
        return self.mbps[i]


def _data_dir() -> Path:
    return Path(str(resources.files("failsoft") / "data" / "jellyfish"))


def read_trace(path: str | Path, step_s: float = 1.0) -> Trace:
    """A bandwidth trace: one positive number (Mbps) a line; blank lines are skipped.

    An empty file, or a line that is not a positive finite number, is refused with the file and line.
    """
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read bandwidth trace {str(path)!r}: {exc.strerror or exc}") from exc
    values = []
    for n, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(
                f"bandwidth trace {str(path)!r} line {n}: {text[:40]!r} is not a number"
            ) from None
        if not (math.isfinite(value) and 0 < value <= MAX_TRACE_MBPS):
            raise ConfigError(
                f"bandwidth trace {str(path)!r} line {n}: {value!r} Mbps is not in (0, {MAX_TRACE_MBPS:g}]"
            )
        values.append(value)
    if not values:
        raise ConfigError(f"bandwidth trace {str(path)!r} is empty")
    return Trace(path.stem, tuple(values), step_s)


def bundled_trace(name: str) -> Trace:
    """``synthetic``, ``wifi`` or ``lte``."""
    if name not in _TRACE_FILES:
        raise ConfigError(f"unknown bandwidth trace {name!r} (known: {', '.join(_TRACE_FILES)})")
    trace = read_trace(_data_dir() / "traces" / _TRACE_FILES[name], TRACE_STEP_S[name])
    return Trace(name, trace.mbps, trace.step_s)


def read_client_set(path: str | Path) -> tuple[tuple[float, float], ...]:
    """``(slo_ms, fps)`` per client of a Jellyfish client-set file (last two columns of each line)."""
    path = Path(path)
    clients = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        try:
            slo, fps = float(fields[-2]), float(fields[-1])
        except (ValueError, IndexError):
            raise ConfigError(
                f"client set {str(path)!r} line {n}: needs SLO (ms) and fps as its last two fields"
            ) from None
        clients.append((slo, fps))
    if not clients:
        raise ConfigError(f"client set {str(path)!r} is empty")
    return tuple(clients)


def bundled_client_set(clients: int, fps: str, slo: str) -> tuple[tuple[float, float], ...]:
    """The paper's set ``client_cfg_template_<clients>_<fps>_<slo>.txt`` (``var`` for mixed)."""
    name = f"client_cfg_template_{clients}_{fps}_{slo}"
    path = _data_dir() / "clients" / f"{name}.txt"
    if not path.is_file():
        known = sorted(p.stem.removeprefix("client_cfg_template_") for p in path.parent.glob("*.txt"))
        raise ConfigError(f"no client set {name!r} ships with failsoft (clients_fps_slo: {', '.join(known)})")
    return read_client_set(path)


def upscaled_accuracy(accuracy: float, frame_px: int, input_px: int = 224) -> float:
    """Declared accuracy of a 224 px model fed ``frame_px`` frames upscaled to its input.

    The model's accuracy times ``1 - 2 x`` the relative loss MobileNetV2 shows when trained at
    ``frame_px`` instead of 224 px (192: -1.5%, 160: -4.2%, 128: -9.1%, so doubled: -3.1%, -8.4%,
    -18.1%). Doubled because a model fed upscaled frames it was not trained on loses more than one
    trained at that size (Touvron et al., "Fixing the train-test resolution discrepancy", 2019).
    Not measured here: a declared cost, stated in docs/jellyfish.md.
    """
    if input_px != 224 or frame_px not in _LOW_RES_TOP1 or frame_px >= input_px:
        known = ", ".join(str(px) for px in LOW_RES_PX)
        raise ConfigError(
            f"no declared accuracy for {frame_px!r} px frames into a {input_px!r} px model "
            f"(known: {known} px into 224 px)"
        )
    loss = 1.0 - _LOW_RES_TOP1[frame_px] / _LOW_RES_TOP1[224]
    return accuracy * (1.0 - UPSCALE_PENALTY * loss)


def efficientnet_ladder(
    max_batch: int = 8, batch_cost: float = DEFAULT_BATCH_COST, low_res_px: tuple[int, ...] = ()
) -> Ladder:
    """EfficientNet B0-B7 (bundled A2 profiles) as an adaptation ladder, batches up to ``max_batch``.

    ``low_res_px``: add rungs of B0 fed frames of these sizes, upscaled on the server (B0's latency,
    :func:`upscaled_accuracy`), so a client whose uplink cannot carry 224 px frames is still served.
    """
    (family,) = load_profile_families(families=["efficientnet"])
    with bundled_profile_path().open(newline="") as fh:
        shapes = {row["model_variant"]: row["input_shape"] for row in csv.DictReader(fh)}
    rungs = []
    for v in family.variants:
        if not re.fullmatch(r"efficientnet_b\d", v.name):
            continue
        px = int(re.findall(r"\d+", shapes[v.name])[-1])
        rungs.append(Rung(v, px, frame_kbit(px)))
    smallest = min(rungs, key=lambda r: r.input_px)
    for px in sorted(set(low_res_px)):
        accuracy = upscaled_accuracy(smallest.accuracy, px, smallest.input_px)
        rungs.append(Rung(smallest.variant, smallest.input_px, frame_kbit(px), px, accuracy))
    return Ladder.build(rungs, max_batch, batch_cost)
