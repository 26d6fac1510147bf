"""The data plane's wire format: one JSON header frame, then the tensor's raw bytes.

A message is a ZeroMQ multipart message. Its first frame is a small JSON object (the header: what
the message is, the request's id, and for a tensor its dtype and shape); the tensor follows as its
own frame of raw bytes, C order, the sender's native byte order (both ends are failsoft processes
on machines of one cluster). Receivers view that frame with :func:`numpy.frombuffer`: no copy, no
parse. A BYTES tensor (an object array of ``bytes`` or ``str``: texts, encoded images) travels as
one frame of elements each led by its 4-byte little-endian length, Triton's layout.

Requests (gateway -> agent)::

    {"op": "infer", "id": ID, "app": APP, "variant": V, "timeout_s": T|null, "sent_at": WALL,
     "dtype": "float32", "shape": [N, ...]}                    + 1 tensor frame
    {"op": "cancel", "id": ID}                                  (no reply)
    {"op": "ping", "id": ID}                                    -> {"id": ID, "ok": true, ...}

Replies (agent -> gateway)::

    {"id": ID, "ok": true, "dtype": D, "shape": S}             + 1 tensor frame
    {"id": ID, "ok": false, "error": CLASS, "message": M, ...}  (a failsoft error, re-raised as is)

An error is named by its class in :mod:`failsoft.errors` and rebuilt on the gateway: the
dispatchers' rules (a refusal is back-pressure, a missing model moves the call) see the same
classes as over a Ray call. Any other exception the agent raised arrives as
:class:`~failsoft.errors.ServingError`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from failsoft import errors
from failsoft.errors import FailsoftError, InvalidRequestError, OverloadedError, ServingError

Frames = Sequence[Any]  # bytes, or zmq.Frame / memoryview (anything with the buffer protocol)
BYTES_KINDS = {"bytes": bytes, "str": str}  # an object array's element type, by header name
RECORD = "record"  # a structured array: its dtype travels as numpy's ``descr``
_LENGTH = struct.Struct("<I")


class FrameError(ServingError):
    """A message that is not in this format (a peer of another version, or not failsoft)."""


# headers ------------------------------------------------------------------------------------------
def header(frame: Any) -> dict[str, Any]:
    """The JSON header of a message; FrameError when it is not one."""
    try:
        value = json.loads(bytes(frame))
    except (ValueError, TypeError) as exc:
        raise FrameError(f"data plane: unreadable header ({exc})") from exc
    if not isinstance(value, dict):
        raise FrameError(f"data plane: a header must be a JSON object, got {type(value).__name__}")
    return value


def dump(head: dict[str, Any]) -> bytes:
    return json.dumps(head, separators=(",", ":")).encode()


# tensors ------------------------------------------------------------------------------------------
def tensor_frames(array: Any) -> tuple[dict[str, Any], Any]:
    """``array``'s header fields (dtype, shape) and its one data frame (a buffer, not a copy)."""
    arr = np.asarray(array)
    if arr.dtype == object:
        kinds = {type(x) for x in arr.flat}
        kind = next((name for name, t in BYTES_KINDS.items() if kinds == {t}), None)
        if kind is None:
            raise ServingError(f"data plane: object tensors must hold only bytes or only str, got {kinds}")
        items = [x.encode() if kind == "str" else x for x in arr.flat]
        data = b"".join(_LENGTH.pack(len(x)) + x for x in items)
        return {"dtype": kind, "shape": list(arr.shape)}, data
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if arr.dtype.names is not None:  # a model of several named inputs: one field per input
        return {"dtype": RECORD, "fields": arr.dtype.descr, "shape": list(arr.shape)}, arr.tobytes()
    data = memoryview(arr).cast("B") if arr.size else b""  # type: ignore[arg-type]  # ndarray is a buffer
    return {"dtype": arr.dtype.str, "shape": list(arr.shape)}, data


def tensor(head: dict[str, Any], frame: Any) -> np.ndarray:
    """The tensor a header and its data frame describe: a read-only view of the frame's buffer."""
    try:
        shape = tuple(int(d) for d in head["shape"])
        kind = str(head["dtype"])
    except (KeyError, TypeError, ValueError) as exc:
        raise FrameError(f"data plane: tensor header without a valid dtype and shape ({exc})") from exc
    buffer = frame.buffer if hasattr(frame, "buffer") else frame
    if kind in BYTES_KINDS:
        return _objects(buffer, shape, kind)
    try:
        dtype = np.dtype(_descr(head.get("fields"))) if kind == RECORD else np.dtype(kind)
        arr = np.frombuffer(buffer, dtype=dtype)
        return arr.reshape(shape)
    except (TypeError, ValueError) as exc:
        raise FrameError(f"data plane: {len(buffer)} bytes are no {kind} tensor of shape {shape}") from exc


def _descr(fields: Any) -> list[tuple[Any, ...]]:
    """A structured dtype's ``descr`` back from its JSON (lists where numpy wrote tuples)."""
    if not isinstance(fields, list) or not fields:
        raise TypeError(f"a record tensor needs its fields, got {fields!r}")
    out = []
    for field in fields:
        name, fmt, *rest = field
        fmt = _descr(fmt) if isinstance(fmt, list) else fmt
        out.append((name, fmt, *(tuple(r) for r in rest)))
    return out


def _objects(buffer: Any, shape: tuple[int, ...], kind: str) -> np.ndarray:
    raw, items, at = bytes(buffer), [], 0
    count = int(np.prod(shape)) if shape else 1
    for _ in range(count):
        if at + 4 > len(raw):
            raise FrameError(f"data plane: a BYTES tensor of shape {shape} overruns its frame")
        (size,) = _LENGTH.unpack_from(raw, at)
        item = raw[at + 4 : at + 4 + size]
        items.append(item.decode() if kind == "str" else item)
        at += 4 + size
    out = np.empty(count, dtype=object)
    out[:] = items
    return out.reshape(shape)


# errors -------------------------------------------------------------------------------------------
def error_fields(exc: BaseException) -> dict[str, Any]:
    """A reply header's fields for ``exc``: its failsoft class, or ServingError for anything else."""
    if not isinstance(exc, FailsoftError):
        return {"error": "ServingError", "message": f"inference failed: {type(exc).__name__}: {exc}"}
    fields: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, OverloadedError):
        fields["retry_after_s"] = exc.retry_after_s
    if isinstance(exc, InvalidRequestError):
        fields["status"] = exc.status
    return fields


def error_of(head: dict[str, Any]) -> FailsoftError:
    """The failsoft error a reply header names (ServingError for a class this side lacks)."""
    name, message = str(head.get("error", "ServingError")), str(head.get("message", ""))
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, FailsoftError)):
        return ServingError(f"{name}: {message}")
    if issubclass(cls, OverloadedError):
        return cls(message, float(head.get("retry_after_s", 1.0)))
    if issubclass(cls, InvalidRequestError):
        return cls(message, int(head.get("status", 400)))
    return cls(message)
