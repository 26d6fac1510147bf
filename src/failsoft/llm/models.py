"""The LLM pair: a target causal LM and a draft LM sharing its byte vocabulary, trained here.

Both are ``transformers`` Llama models (``LlamaConfig``: RoPE, RMSNorm, SwiGLU, grouped KV heads
possible) built from a config, never downloaded, and trained deterministically on the standard
library corpus (:mod:`failsoft.llm.corpus`). Two sizes:

``tiny``   for tests: trains in a few seconds on one CPU core (the outputs are barely English,
           but every equality the engine guarantees holds for any weights);
``small``  the default, built on request (``failsoft llm build``), minutes on a CPU.

A built pair is stored like a zoo family, in its own repository root (``$FAILSOFT_LLM``, else
``~/.cache/failsoft/llm``)::

    <root>/llm/<size>-target/model.safetensors   weights
    <root>/llm/<size>-target/config.json         LlamaConfig, training, held-out loss, weight hash
    <root>/llm/<size>-target/profile.json        load time, decode step, KV bytes per token, machine
    <root>/llm/<size>-draft/...                  the same, plus the measured acceptance rate

Random-weight models of real sizes (TinyLlama-1.1B, Llama-2-7B/13B/70B shapes, for reload times
and KV volumes) are in :mod:`failsoft.llm.realsize`.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from failsoft.errors import ConfigError, CorruptModelError, ModelNotFoundError
from failsoft.llm.corpus import BOS, EOS, PAD, VOCAB_SIZE, Corpus, load_corpus
from failsoft.llm.tokens import BYTES, Tokenizer, eos_ids

if TYPE_CHECKING:
    import torch

FAMILY = "llm"
FORMAT = "failsoft-llm/1"


@dataclass(frozen=True)
class LmSpec:
    """One model's shape and training recipe."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    context: int
    steps: int
    batch: int
    seq_len: int
    lr: float
    seed: int

    def config(self) -> Any:
        return llama_config(
            self,
            VOCAB_SIZE,
            bos_token_id=BOS,
            eos_token_id=EOS,
            pad_token_id=PAD,
            attn_implementation="eager",  # a PretrainedConfig keyword
        )


def llama_config(shape: Any, vocab_size: int, **extra: Any) -> Any:
    """A ``transformers`` Llama config of ``shape``'s numbers (``hidden``, ``intermediate``,
    ``layers``, ``heads``, ``kv_heads``, ``context``), embeddings untied, plus ``extra`` keywords:
    the trained pair here and the real-size shapes (``llm/realsize.py``) alike."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.context,
        tie_word_embeddings=False,
        **extra,
    )


@dataclass(frozen=True)
class PairSpec:
    target: LmSpec
    draft: LmSpec


SIZES: dict[str, PairSpec] = {
    "tiny": PairSpec(
        target=LmSpec(64, 2, 4, 4, 128, 256, steps=40, batch=8, seq_len=64, lr=3e-3, seed=1),
        draft=LmSpec(32, 1, 2, 2, 64, 256, steps=40, batch=8, seq_len=64, lr=3e-3, seed=2),
    ),
    "small": PairSpec(
        target=LmSpec(128, 4, 4, 4, 352, 1024, steps=400, batch=8, seq_len=128, lr=3e-3, seed=1),
        draft=LmSpec(64, 2, 2, 2, 176, 1024, steps=400, batch=8, seq_len=128, lr=3e-3, seed=2),
    ),
}
DEFAULT_SIZE = "small"


def default_llm_path() -> Path:
    """``$FAILSOFT_LLM``, else ``$XDG_CACHE_HOME/failsoft/llm``, else ``~/.cache/failsoft/llm``."""
    if env := os.environ.get("FAILSOFT_LLM"):
        return Path(env).expanduser()
    if cache := os.environ.get("XDG_CACHE_HOME"):
        return Path(cache).expanduser() / "failsoft" / "llm"
    return Path.home() / ".cache" / "failsoft" / "llm"


def pick_device(device: str | None = None) -> str:
    """CUDA when present (or asked for), else CPU; as the zoo chooses."""
    from failsoft.zoo.repository import _pick_device

    return _pick_device(device)


def spec_of(size: str) -> PairSpec:
    try:
        return SIZES[size]
    except KeyError:
        raise ConfigError(f"unknown llm size {size!r}; known: {', '.join(SIZES)}") from None


def train_lm(spec: LmSpec, corpus: Corpus, device: str = "cpu") -> tuple[torch.nn.Module, dict[str, Any]]:
    """Build ``spec``'s model from its seed and train it on random windows of the corpus."""
    import numpy as np
    import torch
    from transformers import LlamaForCausalLM

    from failsoft.zoo.train import deterministic

    if device.startswith("cuda"):  # deterministic cuBLAS needs a fixed workspace, set before first use
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    data = torch.from_numpy(np.frombuffer(corpus.train, dtype=np.uint8).astype(np.int64))
    began = time.perf_counter()
    with deterministic(spec.seed, threads=1 if device == "cpu" and spec.hidden <= 64 else None):
        model = LlamaForCausalLM(spec.config())
        model.to(device)  # type: ignore[arg-type]  # transformers types .to as a dtype converter
        gen = torch.Generator().manual_seed(spec.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=spec.lr, total_steps=spec.steps, pct_start=0.1
        )
        model.train()
        loss = torch.tensor(0.0)
        for _ in range(spec.steps):
            starts = torch.randint(0, len(data) - spec.seq_len - 1, (spec.batch,), generator=gen)
            batch = torch.stack([data[s : s + spec.seq_len + 1] for s in starts.tolist()]).to(device)
            loss = model(input_ids=batch, labels=batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        model.eval()
    detail = {
        "steps": spec.steps,
        "batch": spec.batch,
        "seq_len": spec.seq_len,
        "lr": spec.lr,
        "seed": spec.seed,
        "final_train_loss": round(loss.item(), 4),
        "seconds": round(time.perf_counter() - began, 2),
        "device": device,
    }
    return model, detail


def _held_out_windows(corpus: Corpus, seq_len: int, limit: int) -> Any:
    import numpy as np
    import torch

    held = np.frombuffer(corpus.held_out, dtype=np.uint8).astype(np.int64)
    n = min(limit, len(held) // seq_len)
    return torch.from_numpy(held[: n * seq_len].reshape(n, seq_len))


def held_out_bits_per_byte(
    model: torch.nn.Module, corpus: Corpus, seq_len: int = 128, limit: int = 64
) -> float:
    import torch

    windows = _held_out_windows(corpus, seq_len, limit).to(next(model.parameters()).device)
    with torch.inference_mode():
        loss = model(input_ids=windows, labels=windows).loss
    return float(loss) / math.log(2)


def greedy_agreement(
    target: torch.nn.Module, draft: torch.nn.Module, corpus: Corpus, seq_len: int = 128, limit: int = 64
) -> dict[str, float | int]:
    """The draft's acceptance rate under greedy verification, measured on held-out text: the
    fraction of held-out positions where the draft's next token equals the target's (the
    probability that one drafted token is accepted, ``a`` in Eq. 3)."""
    import torch

    device = next(target.parameters()).device
    windows = _held_out_windows(corpus, seq_len, limit).to(device)
    with torch.inference_mode():
        t = target(input_ids=windows).logits.argmax(-1)
        d = draft(input_ids=windows).logits.argmax(-1)
    agree = int((t == d).sum())
    total = int(t.numel())
    return {"acceptance": round(agree / total, 4), "positions": total, "seq_len": seq_len}


@dataclass
class LoadedLm:
    """A model ready to serve: the module (eval mode, on ``device``), its config, identity and
    tokenizer. ``vocab_size`` bounds the token ids a request may carry; ``eos_ids`` end a
    generation; ``kv_element_bytes`` is the KV cache's element size (the weights' dtype)."""

    name: str
    module: Any
    device: str
    fingerprint: str
    context: int
    layers: int
    kv_heads: int
    head_dim: int
    tokenizer: Tokenizer = BYTES
    vocab_size: int = VOCAB_SIZE
    eos_ids: frozenset[int] = frozenset({EOS})
    kv_element_bytes: int = 4

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_element_bytes  # K and V

    @property
    def kv_mb_per_token(self) -> float:
        return self.kv_bytes_per_token / 2**20


def serving_context(cfg: Any) -> int:
    """The longest context served exactly: ``max_position_embeddings``, cut to the sliding window
    where one applies (Mistral, Qwen2 with ``use_sliding_window``): the engine's cache is full
    attention, which equals windowed attention only within one window."""
    context = int(cfg.max_position_embeddings)
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if window and (layer_types is None or "sliding_attention" in layer_types):
        context = min(context, int(window))
    return context


def wrap(
    name: str, module: Any, device: str, fingerprint: str, tokenizer: Tokenizer | None = None
) -> LoadedLm:
    """A ``transformers`` causal LM as a :class:`LoadedLm`; ``tokenizer`` defaults to bytes."""
    cfg = module.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return LoadedLm(
        name,
        module.eval(),
        device,
        fingerprint,
        serving_context(cfg),
        cfg.num_hidden_layers,
        kv_heads,
        head_dim,
        tokenizer if tokenizer is not None else BYTES,
        int(cfg.vocab_size),
        eos_ids(module, getattr(tokenizer, "tok", None)),
        next(module.parameters()).element_size(),
    )


def train_pair(size: str, device: str | None = None) -> tuple[LoadedLm, LoadedLm, dict[str, Any]]:
    """Train ``size``'s target and draft in memory (tests use ``tiny``); return them and what was
    measured (held-out bits per byte of each, the draft's acceptance rate)."""
    pair = spec_of(size)
    dev = pick_device(device)
    corpus = load_corpus()
    target, t_detail = train_lm(pair.target, corpus, dev)
    draft, d_detail = train_lm(pair.draft, corpus, dev)
    measured = {
        "target": t_detail | {"held_out_bits_per_byte": round(held_out_bits_per_byte(target, corpus), 4)},
        "draft": d_detail | {"held_out_bits_per_byte": round(held_out_bits_per_byte(draft, corpus), 4)},
        "acceptance": greedy_agreement(target, draft, corpus),
        "corpus": corpus.describe(),
    }
    return (
        wrap(f"{size}-target", target, dev, f"{size}-target-trained"),
        wrap(f"{size}-draft", draft, dev, f"{size}-draft-trained"),
        measured,
    )


def build_pair(
    root: str | Path | None = None, size: str = DEFAULT_SIZE, device: str | None = None
) -> dict[str, Any]:
    """Train and store ``size``'s pair under ``root`` (idempotent: skipped when both are built)."""
    from failsoft.zoo.build import install_variant
    from failsoft.zoo.layout import CONFIG_FILE, WEIGHTS_FILE, write_json
    from failsoft.zoo.network import save_weights
    from failsoft.zoo.repository import ModelRepository

    repo = ModelRepository(root if root is not None else default_llm_path())
    repo.root.mkdir(parents=True, exist_ok=True)
    names = (f"{size}-target", f"{size}-draft")
    if all(_is_built(repo.root / FAMILY / n) for n in names):
        return {"built": False, "root": str(repo.root), "variants": list(names)}
    target, draft, measured = train_pair(size, device)
    pair = spec_of(size)
    for lm, spec, role in ((target, pair.target, "target"), (draft, pair.draft, "draft")):

        def write(scratch: Path, lm: LoadedLm = lm, spec: LmSpec = spec, role: str = role) -> None:
            nbytes, sha = save_weights(lm.module, scratch / WEIGHTS_FILE)
            config = {
                "format": FORMAT,
                "family": FAMILY,
                "variant": lm.name,
                "role": role,
                "architecture": lm.module.config.to_dict(),
                "spec": asdict(spec),
                "parameters": sum(p.numel() for p in lm.module.parameters()),
                "weights": {"file": WEIGHTS_FILE, "bytes": nbytes, "sha256": sha},
                "training": measured[role],
                "corpus": measured["corpus"],
                "kv_bytes_per_token": lm.kv_bytes_per_token,
            }
            if role == "draft":
                config["acceptance"] = measured["acceptance"] | {"against": target.name}
            write_json(scratch / CONFIG_FILE, config)
            write_json(scratch / "profile.json", profile_lm(scratch, lm.device))

        install_variant(repo, FAMILY, lm.name, write)
    return {"built": True, "root": str(repo.root), "variants": list(names), "measured": measured}


def _is_built(variant_dir: Path) -> bool:
    """True when the config reads back and the weights have the hash it records."""
    from failsoft.zoo.layout import read_json
    from failsoft.zoo.network import file_sha256

    try:
        sha = str(read_json(variant_dir / "config.json")["weights"]["sha256"])
        return file_sha256(variant_dir / "model.safetensors") == sha
    except (KeyError, TypeError, OSError, ModelNotFoundError, CorruptModelError):
        return False


def load_lm(root: str | Path | None, name: str, device: str | None = None) -> LoadedLm:
    """Load a built model (``tiny-target``, ``small-draft``, ...) onto ``device``."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from failsoft.zoo.layout import read_json

    where = Path(root if root is not None else default_llm_path()) / FAMILY / name
    config = read_json(where / "config.json")
    if config.get("format") != FORMAT:
        raise CorruptModelError(f"{str(where / 'config.json')!r} is not a failsoft llm config")
    dev = pick_device(device)
    arch = LlamaConfig.from_dict(config["architecture"])
    module = LlamaForCausalLM(arch)  # built on the CPU: the rotary tables are buffers, not weights
    try:
        module.load_state_dict(load_file(str(where / "model.safetensors"), device="cpu"), strict=True)
    except (OSError, RuntimeError, ValueError) as exc:
        raise CorruptModelError(f"{str(where)!r}: weights cannot be loaded: {exc}") from exc
    module.to(dev)  # type: ignore[arg-type]  # transformers types .to as a dtype converter
    return wrap(name, module, dev, str(config["weights"]["sha256"]))


def profile_lm(variant_dir: Path, device: str) -> dict[str, Any]:
    """Load time, one decode step (batch 1, 64 tokens of context) and KV size of a stored model."""
    import torch

    from failsoft.zoo.layout import read_json
    from failsoft.zoo.machine import machine_info

    config = read_json(variant_dir / "config.json")
    began = time.perf_counter()
    module = load_lm(variant_dir.parent.parent, variant_dir.name, device).module
    load_ms = (time.perf_counter() - began) * 1000
    ids = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.inference_mode():
        out = module(input_ids=ids, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        steps = []
        for _ in range(10):
            t0 = time.perf_counter()
            out = module(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
            steps.append((time.perf_counter() - t0) * 1000)
    steps.sort()
    return {
        "load_ms": round(load_ms, 2),
        "decode_step_ms_median": round(steps[len(steps) // 2], 3),
        "kv_bytes_per_token": int(config["kv_bytes_per_token"]),
        "weights_mb": round(int(config["weights"]["bytes"]) / 2**20, 3),
        "machine": machine_info(device),
    }
