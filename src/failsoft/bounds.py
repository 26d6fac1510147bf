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
from pydantic import ValidationError

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


def describe_validation_error(exc: ValidationError, data: Any) -> str:
    """The first pydantic error as one line: where (with the entry's name), what, and the bad value.

    ``servers[1] ('s2'): missing required field 'memory_mb'``,
    ``servers[0] ('s1').memory_mb: Input should be greater than or equal to 0 (got -5)``.
    """
    err = exc.errors()[0]
    loc = list(err["loc"])
    if err["type"] in ("missing", "extra_forbidden", "unexpected_keyword_argument", "missing_argument"):
        field_name, loc = loc[-1], loc[:-1]
        missing = err["type"] in ("missing", "missing_argument")
        message = f"{'missing required' if missing else 'unknown'} field {field_name!r}"
    elif err["type"] == "value_error":  # a check of our own: its message names field and value
        message = str(err.get("ctx", {}).get("error", err["msg"]))
    else:
        shown = "input" in err and not isinstance(err["input"], (dict, list))
        message = err["msg"] + (f" (got {err['input']!r})" if shown else "")
    path, node = "", data
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        node = _child(node, part)
        name = (node.get("name") or node.get("variant")) if isinstance(node, dict) else None
        if isinstance(part, int) and isinstance(name, str):
            path += f" ({name!r})"
    more = len(exc.errors()) - 1
    suffix = f"; and {more} more problem{'s' if more > 1 else ''}" if more else ""
    return f"{path or 'top level'}: {message}{suffix}"


def _child(node: Any, part: Any) -> Any:
    """``node[part]`` where the input has it, else None."""
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return node[part]
    return None
