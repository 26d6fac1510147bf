"""Encoded images (PNG, JPEG) to the pixel batch an image classifier takes, as its processor says.

A client sends an image classifier its images as they are on disk: a BYTES tensor whose elements
are PNG or JPEG files (OpenVINO Model Server and Triton's image clients do the same). They are
decoded with Pillow and made into the model's ``pixel_values`` by the model's own image processor
(``preprocessor_config.json``, read by ``transformers``' ``AutoImageProcessor``: resize, rescale,
normalise exactly as at training), or, for a model that has none, resized to the input's height and
width and scaled to ``[0, 1]``.

:class:`ImageInput` names how a family's images are prepared; it is small, frozen and picklable, so
the gateway can hold it and decode requests before any server sees them (a corrupt image is the
client's mistake: one 400 naming the element). The ``hf`` handler decodes its own ``image`` input
with the same code.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from failsoft.errors import ConfigError, InvalidRequestError

PROCESSOR_FILE = "preprocessor_config.json"  # transformers' name for an image processor's config


@dataclass(frozen=True)
class ImageInput:
    """How a model's images become its pixel input: ``[channels, height, width]`` FP32, through the
    image processor in ``processor_dir`` (a directory holding ``preprocessor_config.json``) or, with
    none, a plain resize and scale to ``[0, 1]``."""

    channels: int
    height: int
    width: int
    processor_dir: str | None = None

    def __post_init__(self) -> None:
        if self.channels not in (1, 3) or self.height < 1 or self.width < 1:
            raise ConfigError(
                f"an image input is [1 or 3, H, W], got [{self.channels}, {self.height}, {self.width}]"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.channels, self.height, self.width

    def decode(self, encoded: Sequence[bytes], name: str = "image") -> np.ndarray:
        """PNG or JPEG bytes, one per row, to an FP32 batch ``[N, C, H, W]``; a corrupt element is
        an :class:`InvalidRequestError` naming the input and the element's index."""
        images = [_open(bytes(data), name, i, self.channels) for i, data in enumerate(encoded)]
        processor = _processor(self.processor_dir) if self.processor_dir else None
        if processor is not None:
            pixels = np.asarray(processor(images=images, return_tensors="np")["pixel_values"], np.float32)
        else:
            size = (self.width, self.height)
            arrays = [np.asarray(im.resize(size), dtype=np.float32) / np.float32(255.0) for im in images]
            stacked = np.stack(arrays)
            pixels = (stacked[:, None] if stacked.ndim == 3 else stacked.transpose(0, 3, 1, 2)).copy()
        if pixels.shape[1:] != self.shape:
            raise ConfigError(
                f"the image processor in {self.processor_dir!r} makes pixels of shape "
                f"{list(pixels.shape[1:])}; the model takes {list(self.shape)}"
            )
        return pixels


def _open(data: bytes, name: str, index: int, channels: int) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        image.load()  # decode now: a truncated file fails here, not inside the processor
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidRequestError(
            f"input {name!r}: element {index} is not a PNG or JPEG image ({len(data)} bytes): {exc}"
        ) from exc
    return image.convert("RGB" if channels == 3 else "L")


@functools.lru_cache(maxsize=16)
def _processor(directory: str) -> Any:
    """The image processor saved in ``directory`` (read once per process)."""
    from transformers import AutoImageProcessor
    from transformers.utils import logging

    logging.disable_progress_bar()
    try:
        return AutoImageProcessor.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"the image processor in {directory!r} does not load: {first}") from exc


def image_input(shape: Sequence[int], processor_dir: Path | None) -> ImageInput | None:
    """The :class:`ImageInput` of a model whose pixel input has ``shape`` ``[C, H, W]``; None when
    the shape is not an image's."""
    if len(shape) != 3 or shape[0] not in (1, 3) or min(shape) < 1:
        return None
    has = processor_dir is not None and (processor_dir / PROCESSOR_FILE).is_file()
    return ImageInput(int(shape[0]), int(shape[1]), int(shape[2]), str(processor_dir) if has else None)
