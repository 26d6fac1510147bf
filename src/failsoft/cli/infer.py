"""``failsoft infer APP``: one request through the gateway, and how it was served.

The input is a NumPy file (``--input FILE.npy``: one row or a batch of the app's input shape), a
KServe v2 request body (``--input examples/request.json``), or one of the held-out digits images
the digits families were measured on (``--digits N``, the default being image 0), whose true label
is then printed beside the answer. The gateway ranks the classes itself (Triton's classification
extension), so the answer reads without post-processing logits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from failsoft.cli.status import ConfigOpt, StateOpt, UrlOpt
from failsoft.errors import ConfigError

DIGITS_HELD_OUT = 360  # images in the fixed held-out split of scikit-learn's digits


def infer(
    app: Annotated[str, typer.Argument(help="The app to ask (see 'failsoft status')", show_default=False)],
    input_file: Annotated[
        Path | None,
        typer.Option("--input", help="A .npy array (one row or a batch) or a KServe v2 request .json"),
    ] = None,
    digits: Annotated[
        int | None,
        typer.Option(min=0, max=DIGITS_HELD_OUT - 1, help="Held-out digits image N (default: 0)"),
    ] = None,
    top: Annotated[int, typer.Option(min=1, max=1000, help="Classes to show per row, best first")] = 3,
    timeout: Annotated[float, typer.Option(min=0.001, max=600, help="Deadline in seconds")] = 5.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the gateway's JSON answer")] = False,
    url: UrlOpt = None,
    config: ConfigOpt = None,
    state_dir: StateOpt = None,
) -> None:
    """Send one request to APP through the gateway; print the answer and who served it."""
    from failsoft.runtime.discovery import find_gateway

    if input_file is not None and digits is not None:
        raise ConfigError("give --input FILE or --digits N, not both")
    batch, labels = read_input(input_file) if input_file is not None else digit(digits or 0)
    target = find_gateway(url, None, config, state_dir)
    with target.client(timeout=timeout) as client:
        result = client.infer(app, batch, timeout=timeout, classification=top)
    if as_json:
        typer.echo(json.dumps(result.raw, indent=2))
        return
    for line in describe(result, labels, top):
        typer.echo(line)


def digit(index: int) -> tuple[np.ndarray, list[int]]:
    """Held-out digits image ``index`` (64 pixels in [0, 1]) and its true label."""
    from failsoft.zoo.digits import load_digits_split

    split = load_digits_split()
    return split.x_test[index : index + 1], [int(split.y_test[index])]


def read_input(path: Path) -> tuple[np.ndarray, list[int]]:
    """A batch from a ``.npy`` file or from the first input of a KServe v2 request body."""
    try:
        if path.suffix == ".json":
            return _from_request(json.loads(path.read_text()), path), []
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read input {str(path)!r}: {exc}") from exc
    if not np.issubdtype(array.dtype, np.number) or array.size == 0:
        raise ConfigError(f"input {str(path)!r} holds no numbers (dtype {array.dtype}, shape {array.shape})")
    return array.astype(np.float32), []


def _from_request(body: Any, path: Path) -> np.ndarray:
    try:
        tensor = body["inputs"][0]
        return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"input {str(path)!r} is not a KServe v2 request with one input of 'shape' and 'data' ({exc!r})"
        ) from exc


def describe(result: Any, labels: list[int], top: int = 3) -> list[str]:
    """The answer in words: who served it and how, then each row's best classes (ranked here from
    the logits when the gateway answered without the classification extension)."""
    how = [
        f"{result.app}: answered by {result.server}/{result.variant} in {result.latency_ms:.1f} ms",
        f"  kind {result.kind or '-'}, attempts {result.attempts}, "
        f"degraded {_yes(result.degraded)} (a smaller variant than the primary)",
        f"  reconstructed {_yes(result.reconstructed)} (decoded from parity), "
        f"dropped {_yes(result.dropped)} (shed, not computed)",
    ]
    if result.classes is None and result.outputs is None:  # dropped: nothing was computed
        return how
    rows = result.classes or tuple(_ranked(row, top) for row in result.outputs)
    for i, row in enumerate(rows):
        best = "  ".join(f"{index} ({score:.3g})" for index, score in row)
        truth = ""
        if i < len(labels):
            truth = f"   label {labels[i]}: {'right' if row[0][0] == labels[i] else 'wrong'}"
        how.append(f"  row {i}: {best}{truth}")
    return how


def _ranked(logits: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
    order = np.argsort(-logits, kind="stable")[:k]
    return tuple((int(i), float(logits[i])) for i in order)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
