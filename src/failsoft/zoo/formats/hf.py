"""The ``hf`` format: a local Hugging Face ``transformers`` directory.

The directory holds ``config.json`` and safetensors weights, with its image processor or tokenizer
files where it has them. It is read with ``from_pretrained(path, local_files_only=True,
use_safetensors=True)``: nothing is downloaded and nothing unpickled, so a directory with only a
``pytorch_model.bin`` (a pickle) is refused. Two tasks, read from the config's ``architectures``
(``...ForImageClassification``, ``...ForSequenceClassification``) unless the ``task`` option says:

* ``image-classification``: input ``pixel_values`` FP32 ``[C, H, W]`` (H and W from the image
  processor's size, else the config's ``image_size``, else 224); an ``image`` BYTES input (PNG or
  JPEG, decoded with Pillow, resized and normalised by the image processor) is accepted too;
* ``text-classification``: input ``text`` BYTES ``[1]`` (UTF-8), tokenized by the directory's
  tokenizer, which must be there.

The output is ``logits`` FP32 ``[num_labels]``; the labels are the config's ``id2label``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from failsoft.errors import ConfigError, CorruptModelError, InvalidRequestError
from failsoft.zoo.formats.images import ImageInput
from failsoft.zoo.formats.interface import Handler, Signature, TensorSpec

TASKS = ("image-classification", "text-classification")
_SUFFIXES = {
    "ForImageClassification": "image-classification",
    "ForSequenceClassification": "text-classification",
}
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")


def read_task(directory: Path, override: str | None = None) -> str:
    """The directory's task: ``override`` if given, else from the config's ``architectures``."""
    if override is not None:
        if override not in TASKS:
            raise ConfigError(f"unknown task {override!r} (known: {', '.join(TASKS)})")
        return override
    from failsoft.zoo.layout import read_json

    architectures = read_json(directory / "config.json").get("architectures") or []
    for arch in architectures:
        for suffix, task in _SUFFIXES.items():
            if str(arch).endswith(suffix):
                return task
    raise ConfigError(
        f"{str(directory)!r}: cannot tell the task from config.json architectures {architectures}; "
        f"give --task ({', '.join(TASKS)})"
    )


def check_directory(directory: Path, task: str) -> None:
    """Refuse, with one line, what ``from_pretrained`` would need pickle or a download for."""
    if not (directory / "config.json").is_file():
        raise CorruptModelError(f"{str(directory)!r} is not a transformers directory: it has no config.json")
    if not any(directory.glob("*.safetensors")):
        pickled = [p.name for p in directory.glob("*.bin")]
        why = f"only a pickle checkpoint ({', '.join(pickled)})" if pickled else "no weights"
        raise CorruptModelError(
            f"{str(directory)!r} holds {why}: failsoft loads safetensors only "
            "(save it with save_pretrained(dir, safe_serialization=True))"
        )
    if task == "text-classification" and not any((directory / f).is_file() for f in _TOKENIZER_FILES):
        raise CorruptModelError(
            f"{str(directory)!r} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}): "
            "save the tokenizer into the directory with tokenizer.save_pretrained(dir)"
        )


class TransformersHandler(Handler):
    """A ``transformers`` classifier with its processor or tokenizer."""

    _model: Any = None
    _processor: Any = None
    _device = "cpu"
    _task = ""
    _side: tuple[int, int] = (224, 224)

    def import_code(self) -> None:
        """transformers and the modeling code of the directory's architecture (by its config)."""
        from transformers import AutoConfig
        from transformers.models.auto import modeling_auto
        from transformers.utils import logging

        logging.disable_progress_bar()
        mapping = (
            modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING
            if read_task(self.artefact, self.options.get("task")) == "image-classification"
            else modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING
        )
        config = AutoConfig.from_pretrained(self.artefact, local_files_only=True)
        _ = mapping[type(config)]

    def load(self, device: str) -> Signature:
        from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification
        from transformers.utils import logging

        logging.disable_progress_bar()

        self._task = read_task(self.artefact, self.options.get("task"))
        check_directory(self.artefact, self._task)
        image = self._task == "image-classification"
        auto = AutoModelForImageClassification if image else AutoModelForSequenceClassification
        try:
            model = auto.from_pretrained(self.artefact, local_files_only=True, use_safetensors=True)
            self._processor = self._read_image_processor() if image else self._read_tokenizer()
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CorruptModelError(
                f"transformers directory {str(self.artefact)!r} does not load: {first}"
            ) from exc
        self._model = model.to(device).eval()
        self._device = device
        config = self._model.config
        labels = tuple(str(config.id2label[i]) for i in range(config.num_labels)) if config.id2label else ()
        outputs = (TensorSpec("logits", "FP32", (config.num_labels,)),)
        if image:
            self._side = self._image_side(config)
            inputs = (TensorSpec("pixel_values", "FP32", (int(config.num_channels), *self._side)),)
        else:
            inputs = (TensorSpec("text", "BYTES", (1,)),)
        return Signature(inputs, outputs, labels)

    def _read_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.artefact, local_files_only=True)

    def _read_image_processor(self) -> Any:
        if not (self.artefact / "preprocessor_config.json").is_file():
            return None
        from transformers import AutoImageProcessor

        return AutoImageProcessor.from_pretrained(self.artefact, local_files_only=True)

    def _image_side(self, config: Any) -> tuple[int, int]:
        if "image_size" in self.options:
            side = int(self.options["image_size"])
            return side, side
        size = getattr(self._processor, "size", None) or {}
        if "height" in size and "width" in size:
            return int(size["height"]), int(size["width"])
        side = int(size.get("shortest_edge") or getattr(config, "image_size", 224) or 224)
        return side, side

    def preprocess(self, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        import torch

        if self._task == "text-classification":
            texts = [_text(v) for v in np.asarray(inputs["text"], dtype=object).reshape(-1)]
            encoded = self._processor(texts, padding=True, truncation=True, return_tensors="pt")
            return {k: v.to(self._device) for k, v in encoded.items()}
        if "image" in inputs:
            pixels = self._decode_images(np.asarray(inputs["image"], dtype=object).reshape(-1))
        else:
            pixels = np.ascontiguousarray(inputs["pixel_values"], dtype=np.float32)
        return {"pixel_values": torch.from_numpy(pixels).to(self._device)}

    def _decode_images(self, encoded: np.ndarray) -> np.ndarray:
        """PNG or JPEG bytes through the directory's image processor (a resize without one)."""
        processor_dir = str(self.artefact) if self._processor is not None else None
        channels = int(self._model.config.num_channels)
        return ImageInput(channels, *self._side, processor_dir).decode(list(encoded))

    def predict(self, batch: dict[str, Any]) -> Any:
        import torch

        if self._model is None:
            raise ConfigError(f"transformers model {str(self.artefact)!r} is not loaded")
        with torch.inference_mode():
            return self._model(**batch).logits

    def postprocess(self, raw: Any) -> dict[str, np.ndarray]:
        return {"logits": raw.float().cpu().numpy()}

    def parameters(self) -> int:
        return 0 if self._model is None else int(self._model.num_parameters())

    def close(self) -> None:
        self._model = None
        self._processor = None


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequestError(f"a 'text' input is not UTF-8: {exc}") from exc
    if isinstance(value, np.ndarray):  # a 0-d array of one string
        value = value.item()
    return str(value)
