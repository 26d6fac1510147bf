"""The page cache of model files: drop them from it, read them into it, see how much is in it.

A load whose weights are in the page cache reads memory; one whose weights were dropped reads the
disk, and on the machines failsoft runs on that can take several times longer than the load's own
work (the profiler measures both, ``load_ms`` and ``warm_load_ms``). The profiler, the fidelity
benchmark and the LLM reload benchmark set this state on purpose, for the files they name only:
nobody else's cache is dropped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

READ_CHUNK = 1 << 24


def evict(path: Path) -> bool:
    """Ask the kernel to drop the file's cached pages (clean once synced), so the next read comes
    from the disk; False where the platform cannot. Pages a process still maps stay."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def prefetch(path: Path) -> int:
    """Read the whole file once, so that it is in the page cache; returns its bytes."""
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(READ_CHUNK):
            size += len(chunk)
    return size


def resident_fraction(files: Iterable[Path]) -> float | None:
    """The fraction of ``files``' bytes in the page cache (util-linux ``fincore``; None without)."""
    names = [str(f) for f in files]
    if not names or shutil.which("fincore") is None:
        return None
    try:
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", *names],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    res = sum(int(x) for x in out[0::2])
    size = sum(int(x) for x in out[1::2])
    return round(res / size, 4) if size else None
