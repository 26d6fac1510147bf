"""A user's sample inputs and labelled evaluation data, read for ``failsoft zoo add``.

Inputs come as numpy files (read with ``allow_pickle=False``) for numeric tensors, or as text (one per
line in a ``.txt``, or ``{"text": ...}`` per line in a ``.jsonl``) for a BYTES input. Labelled data is
an ``.npz`` of inputs (``x`` or ``inputs``) and labels (``y`` or ``labels``), or a ``.jsonl`` of
``{"text": ..., "label": ...}``; a label is a class index or one of the model's label names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from failsoft.errors import ConfigError, ModelNotFoundError
from failsoft.zoo.formats.interface import Signature, TensorSpec, records

INPUT_KEYS = ("x", "inputs")
LABEL_KEYS = ("y", "labels")


def read_sample(path: Path, signature: Signature) -> np.ndarray:
    """The rows of ``path`` as a batch of the model's first input; for a model of several inputs, an
    ``.npz`` with one array per input name, as one structured batch (one field per input)."""
    if len(signature.inputs) > 1:
        return _several(_numpy(path), signature, path)
    spec = signature.inputs[0]
    suffix = path.suffix.lower()
    if suffix in (".txt", ".jsonl"):
        return _texts(spec, [row[0] for row in _text_rows(path, with_labels=False)])
    arrays = _numpy(path)
    key = next((k for k in (spec.name, *INPUT_KEYS) if k in arrays), None)
    if key is None and len(arrays) == 1:
        key = next(iter(arrays))
    if key is None:
        raise ConfigError(
            f"{str(path)!r} has arrays {sorted(arrays)}; none is named {spec.name!r}, 'x' or 'inputs'"
        )
    return _as_input(arrays[key], spec, path)


def read_eval(path: Path, signature: Signature) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and integer labels from labelled data."""
    spec = signature.inputs[0]
    if path.suffix.lower() == ".jsonl":
        rows = _text_rows(path, with_labels=True)
        inputs = _texts(spec, [r[0] for r in rows])
        return inputs, _labels([r[1] for r in rows], signature, path)
    arrays = _numpy(path)
    y = next((arrays[k] for k in LABEL_KEYS if k in arrays), None)
    if len(signature.inputs) > 1 and y is not None:
        x = _several({k: v for k, v in arrays.items() if k not in LABEL_KEYS}, signature, path)
        if len(x) != len(y) or len(y) == 0:
            raise ConfigError(f"{str(path)!r} holds {len(x)} inputs and {len(y)} labels")
        return x, _labels(list(y), signature, path)
    x = next((arrays[k] for k in INPUT_KEYS if k in arrays), None)
    if x is None or y is None:
        raise ConfigError(f"{str(path)!r} must hold inputs ('x' or 'inputs') and labels ('y' or 'labels')")
    if len(x) != len(y) or len(y) == 0:
        raise ConfigError(f"{str(path)!r} holds {len(x)} inputs and {len(y)} labels")
    return _as_input(x, spec, path), _labels(list(y), signature, path)


def _several(arrays: dict[str, np.ndarray], signature: Signature, path: Path) -> np.ndarray:
    """One array per named input, as one structured batch; a missing or extra name is refused."""
    names = [t.name for t in signature.inputs]
    missing = [n for n in names if n not in arrays]
    extra = sorted(set(arrays) - set(names))
    if missing or extra:
        raise ConfigError(
            f"{str(path)!r} must hold one array per input ({', '.join(names)}): "
            + "; ".join(p for p in (_listed("missing", missing), _listed("unknown", extra)) if p)
        )
    batches = {t.name: _as_input(arrays[t.name], t, path) for t in signature.inputs}
    if len({len(b) for b in batches.values()}) > 1:
        rows = ", ".join(f"{n} {len(b)}" for n, b in batches.items())
        raise ConfigError(f"{str(path)!r}: the inputs hold different numbers of rows ({rows})")
    return records(batches, signature.inputs)


def _listed(what: str, names: list[str]) -> str:
    return f"{what} {', '.join(map(repr, names))}" if names else ""


def _numpy(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise ModelNotFoundError(f"{str(path)!r} does not exist")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ConfigError(f"{str(path)!r} is not a numpy file readable without pickle: {exc}") from exc
    if isinstance(loaded, np.ndarray):
        return {"x": loaded}
    with loaded:
        return {k: loaded[k] for k in loaded.files}


def _as_input(array: np.ndarray, spec: TensorSpec, path: Path) -> np.ndarray:
    if spec.datatype == "BYTES":
        return np.asarray([_utf8(v) for v in array.reshape(-1)], dtype=object).reshape(array.shape)
    if array.dtype.kind not in "fiub":
        raise ConfigError(f"{str(path)!r} holds {array.dtype} values; input {spec.describe()} is numeric")
    if array.ndim == len(spec.shape):  # one request without its batch dimension
        array = array[None]
    if len(array) == 0:
        raise ConfigError(f"{str(path)!r} holds no rows")
    return array


def _text_rows(path: Path, with_labels: bool) -> list[tuple[str, Any]]:
    if not path.is_file():
        raise ModelNotFoundError(f"{str(path)!r} does not exist")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix.lower() == ".txt" and not with_labels:
        return [(line, None) for line in lines]
    rows = []
    for n, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{str(path)!r} line {n} is not JSON: {exc.msg}") from exc
        if not isinstance(row, dict) or "text" not in row or (with_labels and "label" not in row):
            want = '{"text": ..., "label": ...}' if with_labels else '{"text": ...}'
            raise ConfigError(f"{str(path)!r} line {n} is not {want}")
        rows.append((str(row["text"]), row.get("label")))
    if not rows:
        raise ConfigError(f"{str(path)!r} holds no rows")
    return rows


def _texts(spec: TensorSpec, texts: list[str]) -> np.ndarray:
    if spec.datatype != "BYTES":
        raise ConfigError(f"text was given, but input {spec.describe()} is not BYTES")
    return np.asarray([t.encode("utf-8") for t in texts], dtype=object).reshape(len(texts), 1)


def _utf8(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _labels(values: list[Any], signature: Signature, path: Path) -> np.ndarray:
    index = {name: i for i, name in enumerate(signature.labels)}
    out = []
    for v in values:
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            out.append(int(v))
        elif str(v) in index:
            out.append(index[str(v)])
        else:
            raise ConfigError(
                f"{str(path)!r}: label {v!r} is neither a class index nor one of the model's labels"
            )
    return np.asarray(out, dtype=np.int64)
