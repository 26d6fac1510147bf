"""What a repository records about a Hugging Face causal LM when it is added: sizes and speeds.

:func:`hf_record` loads a model directory with :func:`failsoft.llm.hf.load_hf` and measures what
serving and recovery decisions need about it (a ``zoo add NAME PATH --format hf`` for causal LMs
writes it beside the model):

- ``weights``: the bytes of its safetensors shards on disk and of its parameters in memory;
- ``kv_bytes_per_token``: ``2 * layers * kv_heads * head_dim * element size`` from the config
  (LUMEN's Eq. 1), checked against the cache a real forward leaves (an error when they differ: the
  engine's pages would then be the wrong size);
- ``load_ms``: the load, from the directory to a model ready on the device (the page cache as the
  machine has it: a first load after a reboot reads the disk, a second one memory);
- ``batches``: per batch size, the engine's mean TTFT, mean TPOT and tokens per second for
  ``batch`` requests of ``prompt_tokens`` random tokens each generating ``new_tokens`` tokens,
  submitted together (so TTFT includes the wait behind the other prefills of the batch).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from failsoft.errors import ConfigError
from failsoft.llm.engine import Engine, SamplingParams
from failsoft.llm.hf import load_hf, weight_files
from failsoft.llm.realsize import forward_kv_bytes_per_token
from failsoft.zoo.machine import machine_info


def _measure_batch(lm: Any, batch: int, prompt_tokens: int, new_tokens: int, seed: int) -> dict[str, Any]:
    page = 16
    pages = batch * -(-(prompt_tokens + new_tokens) // page)
    engine = Engine(lm, kv_pages=pages, page_size=page, max_batch=batch)
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, lm.vocab_size, (batch, prompt_tokens), generator=gen).tolist()
    params = SamplingParams(max_tokens=new_tokens, stop_at_eos=False)
    began = time.perf_counter()
    reqs = [engine.submit(p, params) for p in prompts]
    engine.run()
    seconds = time.perf_counter() - began
    ttft = [r.ttft_ms for r in reqs if r.ttft_ms is not None]
    tpot = [r.tpot_ms for r in reqs if r.tpot_ms is not None]
    return {
        "batch": batch,
        "ttft_ms": round(statistics.fmean(ttft), 3),
        "tpot_ms": round(statistics.fmean(tpot), 3) if tpot else None,
        "tokens_per_s": round(batch * new_tokens / seconds, 1),
    }


def hf_record(
    path: str | Path,
    device: str | None = None,
    dtype: str = "auto",
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    prompt_tokens: int = 32,
    new_tokens: int = 16,
    seed: int = 0,
) -> dict[str, Any]:
    """Load the model in ``path`` and measure its record (see the module docstring)."""
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ConfigError(f"batch sizes must be >= 1; got {list(batch_sizes)!r}")
    if prompt_tokens < 1 or new_tokens < 1:
        raise ConfigError(f"prompt_tokens and new_tokens must be >= 1; got {prompt_tokens}, {new_tokens}")
    shards = weight_files(path)
    began = time.perf_counter()
    lm = load_hf(path, device, dtype)
    load_ms = (time.perf_counter() - began) * 1000
    if prompt_tokens + new_tokens > lm.context:
        raise ConfigError(
            f"prompt_tokens {prompt_tokens} + new_tokens {new_tokens} exceed the model's context {lm.context}"
        )
    forward = forward_kv_bytes_per_token(lm.module)
    if forward["forward"] != lm.kv_bytes_per_token or not forward["equal"]:
        raise ConfigError(
            f"model {lm.name!r}: a forward keeps {forward['forward']} KV bytes per token, the config says "
            f"{lm.kv_bytes_per_token}; the engine cannot page this cache"
        )
    cfg = lm.module.config
    params = list(lm.module.parameters())
    return {
        "format": "hf",
        "name": lm.name,
        "path": str(Path(path).resolve()),
        "fingerprint": lm.fingerprint,
        "architecture": {
            "model_type": cfg.model_type,
            "architectures": list(getattr(cfg, "architectures", None) or []),
            "layers": lm.layers,
            "kv_heads": lm.kv_heads,
            "head_dim": lm.head_dim,
            "context": lm.context,
            "vocab_size": lm.vocab_size,
            "dtype": str(params[0].dtype).removeprefix("torch."),
        },
        "tokenizer": {
            "eos_ids": sorted(lm.eos_ids),
            "chat_template": bool(getattr(getattr(lm.tokenizer, "tok", None), "chat_template", None)),
        },
        "weights": {
            "files": [s.name for s in shards],
            "file_bytes": sum(s.stat().st_size for s in shards),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
            "parameters": sum(p.numel() for p in params),
        },
        "kv_bytes_per_token": lm.kv_bytes_per_token,
        "kv_bytes_per_token_forward": forward["forward"],
        "load_ms": round(load_ms, 2),
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "batches": [_measure_batch(lm, b, prompt_tokens, new_tokens, seed) for b in batch_sizes],
        "machine": machine_info(lm.device),
    }
