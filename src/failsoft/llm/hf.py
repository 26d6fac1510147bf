"""Serve a local Hugging Face causal LM: weights, tokenizer and chat template from its directory.

A model directory is what ``save_pretrained`` writes (``config.json``, ``*.safetensors``, the
tokenizer's files, possibly ``generation_config.json`` and a chat template). :func:`load_hf` loads
it with ``transformers`` (``AutoModelForCausalLM`` with ``use_safetensors=True`` and
``local_files_only=True``, ``AutoTokenizer``): nothing is downloaded, and pickled weights
(``pytorch_model.bin``) are refused, since unpickling runs code from the file.

The engine needs the standard KV layout: a cache of one key and one value tensor per layer, each
``(batch, kv_heads, tokens, head_dim)``, that ``transformers``' ``DynamicCache`` holds for Llama,
Qwen2, Mistral and most decoder-only families. :func:`load_hf` checks it with a forward of two
tokens and refuses a model whose cache has another shape (multi-latent attention, state-space
layers, ...) with an error naming what it found.

The model's *fingerprint* (which a KV checkpoint must match to be restored) hashes its config and
each safetensors shard's size, header and 16 evenly spaced 64 KiB blocks of its data: different
weights differ there, and a 14 GB model is identified without reading it all.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from failsoft.errors import ConfigError, CorruptModelError, ModelNotFoundError
from failsoft.llm.models import LoadedLm, pick_device, wrap
from failsoft.llm.tokens import HfTokenizer

SAMPLE_BLOCKS = 16
SAMPLE_BYTES = 64 * 1024


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors shards of a model directory; a clear error when there are none (and when
    the weights are pickled instead)."""
    where = Path(path)
    if not where.is_dir():
        raise ModelNotFoundError(f"{str(where)!r} is not a directory")
    if not (where / "config.json").is_file():
        raise ModelNotFoundError(
            f"{str(where)!r} is not a Hugging Face model directory: it has no config.json"
        )
    shards = sorted(where.glob("*.safetensors"))
    if shards:
        return shards
    pickled = sorted(p.name for p in where.glob("*.bin"))
    if pickled:
        raise ConfigError(
            f"{str(where)!r} holds only pickled weights ({', '.join(pickled)}); failsoft loads "
            f"safetensors only: convert them (model.save_pretrained(dir, safe_serialization=True))"
        )
    raise ModelNotFoundError(f"{str(where)!r} has no weights: no *.safetensors file")


def fingerprint(path: str | Path) -> str:
    """A model's identity: its config and, per shard, size, header and sampled data blocks."""
    where = Path(path)
    h = hashlib.sha256((where / "config.json").read_bytes())
    for shard in weight_files(where):
        size = shard.stat().st_size
        h.update(f"{shard.name}:{size}".encode())
        with shard.open("rb") as f:
            head = int.from_bytes(f.read(8), "little")
            h.update(f.read(head))
            data = 8 + head
            span = max(size - data - SAMPLE_BYTES, 0)
            for i in range(SAMPLE_BLOCKS):
                f.seek(data + span * i // max(SAMPLE_BLOCKS - 1, 1))
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()[:32]


def _check_causal(config: Any, where: Path) -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    archs = list(getattr(config, "architectures", None) or [])
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not any(
        a.endswith("ForCausalLM") for a in archs
    ):
        raise ConfigError(
            f"{str(where)!r} is a {config.model_type!r} model ({', '.join(archs) or 'no architecture'}), "
            f"not a causal LM that transformers can generate with"
        )


def check_kv_layout(lm: LoadedLm, tokens: int = 2) -> None:
    """Run a forward of ``tokens`` tokens and check that its cache has the standard layout the
    engine pages: per layer one key and one value of (1, kv_heads, tokens, head_dim)."""
    import torch

    ids = torch.zeros((1, tokens), dtype=torch.long, device=lm.device)
    with torch.inference_mode():
        out = lm.module(input_ids=ids, use_cache=True)
    past = getattr(out, "cache", None)
    past = past if past is not None else getattr(out, "past_key_values", None)
    layers = getattr(past, "layers", None)
    want = (1, lm.kv_heads, tokens, lm.head_dim)
    found = [tuple(getattr(layer, "keys", torch.empty(0)).shape) for layer in layers or []]
    values = [tuple(getattr(layer, "values", torch.empty(0)).shape) for layer in layers or []]
    if len(found) != lm.layers or any(s != want for s in found + values):
        raise ConfigError(
            f"model {lm.name!r} does not keep the standard KV layout the engine pages: expected "
            f"{lm.layers} layers of keys and values {want}, found {type(past).__name__} with keys "
            f"{found[:2]}{'...' if len(found) > 2 else ''}"
        )


def load_hf(
    path: str | Path, device: str | None = None, dtype: str = "auto", name: str | None = None
) -> LoadedLm:
    """Load the causal LM in ``path`` with its tokenizer onto ``device`` (CUDA when present),
    in ``dtype`` (``auto``: as saved; or ``float32``, ``bfloat16``, ``float16``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where = Path(path).expanduser()
    weight_files(where)
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16; got {dtype!r}")
    try:
        config = AutoConfig.from_pretrained(where, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise CorruptModelError(f"{str(where / 'config.json')!r} cannot be read: {exc}") from exc
    _check_causal(config, where)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptModelError(f"{str(where)!r}: the tokenizer cannot be loaded: {exc}") from exc
    dev = pick_device(device)
    try:
        module = AutoModelForCausalLM.from_pretrained(
            where, use_safetensors=True, local_files_only=True, dtype=dtype
        )
    except (OSError, ValueError, RuntimeError) as exc:
        raise CorruptModelError(f"{str(where)!r}: the weights cannot be loaded: {exc}") from exc
    module.to(dev)  # type: ignore[arg-type]  # transformers types .to as a dtype converter
    label = name or where.name
    lm = wrap(label, module, dev, fingerprint(where), HfTokenizer(tokenizer, label))
    check_kv_layout(lm)
    return lm
