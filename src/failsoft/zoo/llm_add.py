"""``failsoft zoo add FAMILY/VARIANT DIR --format hf`` for a causal LM: copied, loaded, measured.

A Hugging Face directory whose ``architectures`` name a ``...ForCausalLM`` (or added with ``--task
text-generation``) is an LLM, which the classifier variants' checks (a sample answered with
logits, an accuracy) do not fit. It is added as::

    <root>/<family>/<variant>/model/     the directory, without pickle files
    <root>/<family>/<variant>/llm.json   what it measured (failsoft.llm.record.hf_record)

``llm.json`` records its weight bytes, KV bytes per token (checked against a real forward), load
time, and TTFT / TPOT / tokens per second per batch size: what serving and LUMEN's recovery need
to know of a model (how long a restart reloads it, how large its checkpoints grow). The variant has
no ``config.json`` of the classifier layout, so the image and text classifiers' listings and plans
leave it out; an ``llm`` service serves it with ``model: {path: <root>/<family>/<variant>/model}``.

As for every ``zoo add``, the work is done in a hidden staging directory inside the root and
renamed into place: a refusal leaves the repository as it was.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from failsoft.errors import ConfigError
from failsoft.zoo.layout import check_name, read_json, write_json

RECORD_FILE = "llm.json"
MODEL_DIR = "model"
TEXT_GENERATION = "text-generation"


def is_causal_lm(path: Path, task: str | None = None) -> bool:
    """Whether ``path`` is a Hugging Face causal-LM directory (``task`` ``text-generation`` says
    so; another task says not)."""
    if task is not None:
        return task == TEXT_GENERATION
    if not path.is_dir() or not (path / "config.json").is_file():
        return False
    architectures = read_json(path / "config.json").get("architectures") or []
    return any(str(a).endswith("ForCausalLM") for a in architectures)


def add_llm(
    root: Path,
    family: str,
    variant: str,
    path: Path,
    device: str | None = None,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
) -> dict[str, Any]:
    """Copy the causal LM in ``path`` under ``root/family/variant``, measure it, write its record;
    the record (``path`` in it: the copied model directory)."""
    from failsoft.llm.hf import weight_files
    from failsoft.llm.record import hf_record
    from failsoft.zoo.add import _copy

    family, variant = check_name("family", family), check_name("variant", variant)
    weight_files(path)  # one clear error for a directory without safetensors weights
    if (root / family / variant).exists():
        raise ConfigError(f"{family}/{variant} is already in {str(root)!r}: remove it first")
    created_root = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".add-", dir=root))
    try:
        staged = staging / variant
        _copy(path, staged / MODEL_DIR)  # without pickle files, as every zoo add
        record = hf_record(staged / MODEL_DIR, device, batch_sizes=batch_sizes)
        final = root / family / variant
        record |= {"family": family, "variant": variant, "path": str(final / MODEL_DIR), "source": str(path)}
        write_json(staged / RECORD_FILE, record)
        (root / family).mkdir(exist_ok=True)
        staged.rename(final)
    except BaseException:
        if created_root:
            shutil.rmtree(root, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return record


def summary(record: dict[str, Any]) -> str:
    """One line a person reads after ``zoo add``."""
    batches = ", ".join(
        f"b{b['batch']} TTFT {b['ttft_ms']:.1f} ms TPOT {b['tpot_ms']:.1f} ms" for b in record["batches"]
    )
    return (
        f"added {record['family']}/{record['variant']} (hf causal LM {record['architecture']['model_type']}, "
        f"{record['weights']['parameters']} parameters, {record['weights']['file_bytes'] / 2**20:.1f} MiB, "
        f"{record['kv_bytes_per_token']} KV bytes per token): load {record['load_ms']:.0f} ms; {batches}; "
        f"serve it with model: {{path: {record['path']}}}"
    )


__all__ = ["MODEL_DIR", "RECORD_FILE", "TEXT_GENERATION", "add_llm", "is_causal_lm", "summary"]
