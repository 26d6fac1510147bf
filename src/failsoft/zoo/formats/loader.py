"""Loading a user's variant: its handler opened by format, its signature checked against its
``config.json``, wrapped as a :class:`~failsoft.zoo.formats.model.HandlerModel` or, for a stateful
handler, a :class:`~failsoft.zoo.formats.stateful_handler.StatefulHandlerModel` (kept apart from
both so that neither module imports the other)."""

from __future__ import annotations

from pathlib import Path

from failsoft.errors import CorruptModelError
from failsoft.zoo.formats.interface import Signature, is_stateful
from failsoft.zoo.formats.model import HandlerModel, read_sample
from failsoft.zoo.formats.registry import open_handler
from failsoft.zoo.formats.stateful_handler import StatefulHandlerModel
from failsoft.zoo.layout import VariantConfig


def load_handler_model(variant_dir: Path, config: VariantConfig, device: str) -> HandlerModel:
    """Load a user's variant through its format's handler; its declared signature must still hold.

    A stateful handler (one that defines ``state()`` and ``apply_state()``) loads as a
    :class:`~failsoft.zoo.formats.stateful_handler.StatefulHandlerModel`; a variant whose
    ``config.json`` says ``stateful`` must still have one."""
    handler = open_handler(config.model_format, variant_dir / config.weights_file, config.handler)
    stateful = is_stateful(type(handler))
    if config.stateful and not stateful:
        raise CorruptModelError(
            f"{config.family}/{config.variant}: config.json says stateful, but its handler "
            f"{config.handler.get('class', config.model_format)!r} defines no state() and apply_state()"
        )
    signature = handler.load(device)
    declared = Signature(config.inputs, config.outputs) if config.inputs and config.outputs else None
    if declared is not None and (why := declared.mismatch(signature)) is not None:
        handler.close()
        raise CorruptModelError(f"{config.family}/{config.variant} no longer matches its config.json: {why}")
    kind = StatefulHandlerModel if stateful else HandlerModel
    try:
        return kind(config, device, handler, signature, read_sample(variant_dir))
    except BaseException:
        handler.close()
        raise
