"""KV checkpoints as bytes: incremental chunks of full KV pages, and the buffer a peer keeps.

An engine exports a running request's KV *incrementally*: each chunk carries the pages filled since
the previous export (only full pages: a page still being written is sent once it is full), the
request's token ids so far, and what a restorer must check (model fingerprint, page size, shape).
A chunk is a safetensors blob (numpy arrays + string metadata), so it can cross a process or a
network as is; nothing in it is a Python object.

A holder keeps a request's chunks in a :class:`CheckpointBuffer` (host memory, numpy), which
checks that they are contiguous and of one model, and hands them to an engine's ``restore``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from failsoft.errors import ConfigError


@dataclass(frozen=True)
class KvChunk:
    """One export: ``k`` and ``v`` of shape (layers, pages, page_size, kv_heads, head_dim)."""

    request_id: str
    model: str
    page_size: int
    first_page: int
    prompt_len: int
    tokens: np.ndarray
    k: np.ndarray
    v: np.ndarray
    kv_dtype: str = "float32"  # the engine's KV dtype; bfloat16 travels as its int16 bit pattern

    @property
    def pages(self) -> int:
        return int(self.k.shape[1])

    def to_bytes(self) -> bytes:
        from safetensors.numpy import save

        meta = {
            "request_id": self.request_id,
            "model": self.model,
            "page_size": str(self.page_size),
            "first_page": str(self.first_page),
            "prompt_len": str(self.prompt_len),
            "kv_dtype": self.kv_dtype,
        }
        return save({"k": self.k, "v": self.v, "tokens": self.tokens}, metadata=meta)

    @classmethod
    def from_bytes(cls, blob: bytes) -> KvChunk:
        from safetensors.numpy import load

        try:
            arrays = load(blob)
            meta = _metadata(blob)
            with_meta = {k: meta[k] for k in ("request_id", "model", "page_size", "first_page", "prompt_len")}
        except Exception as exc:  # safetensors raises several kinds on a bad blob
            raise ConfigError(f"not a KV checkpoint chunk: {exc}") from exc
        return cls(
            with_meta["request_id"],
            with_meta["model"],
            int(with_meta["page_size"]),
            int(with_meta["first_page"]),
            int(with_meta["prompt_len"]),
            arrays["tokens"],
            arrays["k"],
            arrays["v"],
            meta.get("kv_dtype", str(arrays["k"].dtype)),
        )


def _metadata(blob: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors blob (8-byte little-endian header length, JSON)."""
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + size])
    return dict(header.get("__metadata__") or {})


class CheckpointBuffer:
    """The chunks of one request's checkpoint, as its holder keeps them (host memory)."""

    def __init__(self) -> None:
        self._k: list[np.ndarray] = []
        self._v: list[np.ndarray] = []
        self.request_id: str | None = None
        self.model: str | None = None
        self.page_size = 0
        self.prompt_len = 0
        self.pages = 0
        self.tokens: list[int] = []
        self.kv_dtype = ""

    def add(self, chunk: bytes | KvChunk) -> None:
        c = chunk if isinstance(chunk, KvChunk) else KvChunk.from_bytes(chunk)
        if self.request_id is None:
            self.request_id, self.model, self.page_size, self.prompt_len, self.kv_dtype = (
                c.request_id,
                c.model,
                c.page_size,
                c.prompt_len,
                c.kv_dtype,
            )
        elif (c.request_id, c.model, c.page_size, c.kv_dtype) != (
            self.request_id,
            self.model,
            self.page_size,
            self.kv_dtype,
        ):
            raise ConfigError(
                f"chunk of request {c.request_id!r} (model {c.model!r}, page size {c.page_size}, KV "
                f"{c.kv_dtype}) does not belong to the checkpoint of {self.request_id!r} (model "
                f"{self.model!r}, page size {self.page_size}, KV {self.kv_dtype})"
            )
        if c.first_page != self.pages:
            raise ConfigError(
                f"chunk starts at page {c.first_page} but the checkpoint of {self.request_id!r} holds "
                f"{self.pages} pages: chunks must arrive in order"
            )
        self._k.append(c.k)
        self._v.append(c.v)
        self.pages += c.pages
        self.tokens = [int(t) for t in c.tokens]

    @property
    def covered_tokens(self) -> int:
        return self.pages * self.page_size

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._k) + sum(a.nbytes for a in self._v)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """K and V of every page held, (layers, pages, page_size, kv_heads, head_dim)."""
        if not self._k:
            raise ConfigError("the checkpoint holds no page")
        return np.concatenate(self._k, axis=1), np.concatenate(self._v, axis=1)
