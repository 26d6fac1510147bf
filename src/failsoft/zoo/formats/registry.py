"""The format factory: a handler class by format name, the way a dispatch mode is picked by name.

``onnx``, ``pt2`` and ``hf`` are failsoft's own handlers, imported only when asked for (a process
that serves ONNX models never imports ``transformers``). ``python`` is a user's
:class:`~failsoft.zoo.formats.interface.Handler` subclass named in the variant's options as
``package.module:Class``; it must be importable where the model is served (on ``PYTHONPATH`` of the
agents' processes).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from failsoft.errors import ConfigError
from failsoft.zoo.formats.interface import Handler

# format -> (module, class) of failsoft's handler for it
HANDLERS: dict[str, tuple[str, str]] = {
    "onnx": ("failsoft.zoo.formats.onnx", "OnnxHandler"),
    "pt2": ("failsoft.zoo.formats.pt2", "ExportedHandler"),
    "hf": ("failsoft.zoo.formats.hf", "TransformersHandler"),
}
USER_FORMATS = (*HANDLERS, "python")
# the artefact's name inside the variant directory, per format
ARTEFACTS = {"onnx": "model.onnx", "pt2": "model.pt2", "hf": "model", "python": "model.safetensors"}
HANDLER_PATH_HELP = "a handler class by import path, 'package.module:Class'"


def handler_class(model_format: str, options: Mapping[str, Any]) -> type[Handler]:
    """The handler class of a format; ConfigError naming what is wrong otherwise."""
    if model_format == "python":
        return import_handler(str(options.get("class", "")))
    if model_format not in HANDLERS:
        raise ConfigError(f"unknown model format {model_format!r} (known: {', '.join(USER_FORMATS)})")
    module, name = HANDLERS[model_format]
    cls: type[Handler] = getattr(importlib.import_module(module), name)
    return cls


def import_handler(path: str) -> type[Handler]:
    """A user's handler class from ``package.module:Class``; one-line ConfigError when it fails."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"handler {path!r} is not {HANDLER_PATH_HELP}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may fail to import in any way: name it, keep the cause
        raise ConfigError(f"handler {path!r} does not import: {type(exc).__name__}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not isinstance(cls, type) or not issubclass(cls, Handler):
        raise ConfigError(f"handler {path!r}: {attr!r} is not a subclass of failsoft's Handler")
    return cls


def open_handler(model_format: str, artefact: Path, options: Mapping[str, Any]) -> Handler:
    """A handler (not loaded yet) for the artefact at ``artefact``."""
    return handler_class(model_format, options)(artefact, options)
