"""Bounds written once, on the field: ``Annotated[float, Ge(0), Le(1)]``.

failsoft's parameter dataclasses (policy parameters, service parameters) carry their bounds as
``annotated_types`` metadata. pydantic enforces those annotations where a config or scenario file is
parsed; :func:`check_bounds` enforces the same ones where such an object is built in code. So a bound
exists in one place and every entry point agrees on it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any

from annotated_types import Ge, Gt, Le, Lt

# pydantic reads this as ``__pydantic_config__`` on the dataclasses that a config or scenario embeds:
# unknown keys are refused, as everywhere else in failsoft's inputs.
STRICT: dict[str, Any] = {"extra": "forbid"}


def check_bounds(obj: Any) -> None:
    """Raise ``ValueError`` naming the class, field and value when a field breaks its bounds."""
    cls: type = type(obj)  # typed as ``type``: mypy does not see ``type[Any]`` as Hashable for the cache
    for name, checks in _bounds_of(cls):
        value = getattr(obj, name)
        if value is None:
            continue
        for check in checks:
            if not _within(value, check):
                raise ValueError(f"{type(obj).__name__}.{name} must be {_describe(check)}; got {value!r}")


@functools.cache
def _bounds_of(cls: type) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        meta = getattr(hints.get(f.name), "__metadata__", ())
        checks = tuple(m for m in meta if isinstance(m, (Ge, Gt, Le, Lt)))
        if checks:
            out.append((f.name, checks))
    return tuple(out)


def _within(value: Any, check: Any) -> bool:
    if isinstance(value, float) and math.isnan(value):
        return False
    if isinstance(check, Ge):
        return bool(value >= check.ge)
    if isinstance(check, Gt):
        return bool(value > check.gt)
    if isinstance(check, Le):
        return bool(value <= check.le)
    return bool(value < check.lt)


def _describe(check: Any) -> str:
    if isinstance(check, Ge):
        return f">= {check.ge}"
    if isinstance(check, Gt):
        return f"> {check.gt}"
    if isinstance(check, Le):
        return f"<= {check.le}"
    return f"< {check.lt}"
