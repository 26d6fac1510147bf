"""The training corpus: Python standard-library sources, which every Python install ships.

The LLM pair is trained here, not downloaded, so the draft's acceptance rate against the target is a
real, measured number. The corpus must exist on every machine without a download, so it is the
source of a few standard-library modules, read from ``sysconfig``'s ``stdlib`` directory (the
documentation is not installed everywhere; the sources are). They are mostly English docstrings
and comments around idiomatic code, so a byte-level model learns both words and code structure.

``TRAIN_FILES`` are the training text; ``HELD_OUT_FILES`` are never trained on and serve for the
held-out loss and the draft's acceptance rate. The files change between Python versions, so the
corpus's SHA-256 and the Python version are recorded beside the weights.

Tokens are bytes (0..255) plus three specials; no tokenizer is needed.
"""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from failsoft.errors import ConfigError

BYTE_TOKENS = 256
BOS, EOS, PAD = 256, 257, 258
VOCAB_SIZE = 259

TRAIN_FILES = ("argparse.py", "dataclasses.py", "shutil.py", "tempfile.py", "string.py", "heapq.py")
HELD_OUT_FILES = ("textwrap.py", "shlex.py")


def encode(text: str | bytes) -> list[int]:
    """Byte tokens of ``text`` (UTF-8)."""
    return list(text.encode() if isinstance(text, str) else text)


def decode(tokens: list[int] | tuple[int, ...]) -> str:
    """The text of ``tokens``; specials are dropped, broken UTF-8 is replaced."""
    return bytes(t for t in tokens if t < BYTE_TOKENS).decode(errors="replace")


@dataclass(frozen=True)
class Corpus:
    train: bytes
    held_out: bytes
    sha256: str
    files: dict[str, list[str]]

    def describe(self) -> dict[str, object]:
        return {
            "source": "CPython standard library sources (sysconfig stdlib)",
            "python": platform.python_version(),
            "files": self.files,
            "train_bytes": len(self.train),
            "held_out_bytes": len(self.held_out),
            "sha256": self.sha256,
        }


def _read(names: tuple[str, ...]) -> bytes:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in names:
        path = root / name
        try:
            parts.append(path.read_bytes())
        except OSError as exc:
            raise ConfigError(f"corpus file {str(path)!r} cannot be read: {exc.strerror or exc}") from exc
    return b"\n".join(parts)


def load_corpus() -> Corpus:
    train, held = _read(TRAIN_FILES), _read(HELD_OUT_FILES)
    sha = hashlib.sha256(train + b"\0" + held).hexdigest()
    return Corpus(train, held, sha, {"train": list(TRAIN_FILES), "held_out": list(HELD_OUT_FILES)})
