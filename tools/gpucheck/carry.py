"""The packages a lent GPU machine lacks, carried to it as one compressed folder.

The device machine has torch, transformers, numpy and most of failsoft's needs, no internet, and
Python 3.12; it lacks Ray, pydantic, FastAPI and a few more (:data:`CARRY`). :func:`prepare` runs
here: it downloads the wheels of exactly the versions installed in this environment (the versions
the tests ran) for the target Python, unpacks them (a wheel unpacked on ``sys.path`` is an
installed package, less its console scripts, which failsoft does not use), drops what failsoft
never imports from Ray (Java jars, the dashboard's web client, RLlib, Tune, Train, Data, Serve,
LLM: a 79 MB wheel becomes ~27 MB compressed) and writes ``site.tar.xz`` and ``manifest.json``.
One device call carries at most 64 MiB with the working tree, so the whole carry must stay under
:data:`LIMIT_MB`. :func:`unpack` runs there, before any check.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

# Distributions failsoft's runtime needs that the device image lacks (or holds at untested versions).
CARRY = (
    "ray",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    "fastapi",
    "starlette",
    "annotated-doc",
    "opentelemetry-api",
    "opentelemetry-sdk",  # failsoft's traces (off by default; the SDK is imported when on)
    "opentelemetry-semantic-conventions",
    "uvicorn",
    "simpy",
    "highspy",
    "websockets",
    "redis",
    "typer",
    "click",
    "rich",
)
RAY_PRUNE = ("jars", "dashboard/client", "rllib", "tune", "train", "data", "serve", "llm")
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)
LIMIT_MB = 56.0  # leaves ~8 MiB of the 64 MiB a call carries for the working tree


def pinned() -> dict[str, str]:
    """Each carried distribution at the version installed here."""
    return {name: metadata.version(name) for name in CARRY}


def prepare(out: Path, python_version: str = "3.12", log: Any = print) -> dict[str, Any]:
    """Download, unpack, prune and compress :data:`CARRY` into ``out``; the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    wheels = wheel_cache() / python_version  # outside ``out``: only the archive travels
    wheels.mkdir(parents=True, exist_ok=True)
    versions = pinned()
    for name, version in versions.items():
        if not _wheel_for(wheels, name, version):
            log(f"downloading {name}=={version} for Python {python_version}")
            _download(wheels, name, version, python_version)
    staging = out / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for name, version in versions.items():
        wheel = _wheel_for(wheels, name, version)
        assert wheel is not None
        _extract(wheel, staging)
    for part in RAY_PRUNE:
        shutil.rmtree(staging / "ray" / part, ignore_errors=True)
    archive = out / "site.tar.xz"
    log(f"compressing {archive} (a few minutes on a small machine)")
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        for path in sorted(staging.iterdir()):
            tar.add(path, arcname=path.name)
    shutil.rmtree(staging)
    size_mb = archive.stat().st_size / 2**20
    manifest = {
        "python": python_version,
        "packages": versions,
        "archive_mb": round(size_mb, 1),
        "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if size_mb > LIMIT_MB:
        raise SystemExit(f"{archive}: {size_mb:.1f} MiB, over the {LIMIT_MB:g} MiB a device call can carry")
    return manifest


def unpack(carry: Path, target: Path) -> dict[str, Any]:
    """Extract ``carry``'s archive into ``target`` once (a marker names its checksum); the manifest."""
    manifest = json.loads((carry / "manifest.json").read_text())
    want = f"{sys.version_info.major}.{sys.version_info.minor}"
    if manifest["python"] != want:
        raise SystemExit(f"{carry} was prepared for Python {manifest['python']}; this is Python {want}")
    marker = target / ".carry-sha256"
    if marker.is_file() and marker.read_text() == manifest["sha256"]:
        return manifest
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    with tarfile.open(carry / "site.tar.xz", "r:xz") as tar:
        tar.extractall(target, filter="data")
    marker.write_text(manifest["sha256"])
    return manifest


def wheel_cache() -> Path:
    """Downloaded wheels, kept between preparations (``$XDG_CACHE_HOME/failsoft/gpu-carry``)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "failsoft" / "gpu-carry"


def _extract(wheel: Path, into: Path) -> None:
    """Unzip a wheel keeping each file's mode: Ray's ``raylet`` and ``gcs_server`` are programs
    (``ZipFile.extractall`` drops the executable bit, and Ray then cannot start them)."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            path = Path(zf.extract(info, into))
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                path.chmod(mode)


def _wheel_for(folder: Path, name: str, version: str) -> Path | None:
    stem = name.replace("-", "_").lower()
    for wheel in folder.glob("*.whl"):
        dist, ver = wheel.name.split("-")[:2]
        if dist.lower() == stem and ver == version:
            return wheel
    return None


def _download(folder: Path, name: str, version: str, python_version: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python_version, "--implementation", "cp", "-d", str(folder)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run([*cmd, f"{name}=={version}"], check=True)
