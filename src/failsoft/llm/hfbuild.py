"""A Hugging Face causal-LM directory made here, of a size whose load takes real time, with its draft.

LUMEN's recovery is about models whose reload is long; the byte pair reloads in milliseconds. This
builds, with nothing downloaded, what a user would bring: a ``save_pretrained`` directory (config,
safetensors weights, a tokenizer with a chat template) of a Llama or Qwen2 of a chosen size, and a
*draft* sharing its tokenizer::

    <out>/target/   config.json, model.safetensors, tokenizer.json, ..., failsoft.json
    <out>/draft/    the same, ``draft_layers`` layers deep

* **Tokenizer**: a byte-level BPE trained with ``tokenizers`` on the corpus the byte pair trains on
  (:mod:`failsoft.llm.corpus`), ``vocab`` tokens, with ChatML special tokens and chat template.
* **Weights**: random (seeded, ``initializer_range``), float32. The target's layers past the
  draft's have their output projections (attention ``o_proj``, MLP ``down_proj``) zero, so they add
  nothing to the residual stream: the target then computes what its first ``draft_layers`` layers
  compute, which *is* the draft (it copies them), and the draft's greedy tokens are the target's.
  The target still loads and computes every layer (zeros cost what other weights cost), so its
  load time, step time and KV size are those of its full size; only the draft's acceptance rate is
  ideal (1.0, an upper bound on what a distilled draft gives; the review expects 0.5-0.7).

:func:`build_hf_pair` is idempotent: a directory whose ``failsoft.json`` records the same build is
left as it is.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from failsoft.errors import ConfigError

META_FILE = "failsoft.json"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass(frozen=True)
class HfBuild:
    """The shape of the target (and of its draft) and how it is drawn."""

    arch: Literal["llama", "qwen2"] = "llama"
    hidden: int = 512
    layers: int = 16
    heads: int = 8
    kv_heads: int = 4
    intermediate: int = 1536
    vocab: int = 4096
    context: int = 256
    draft_layers: int = 2
    initializer_range: float = 0.2  # wide: greedy outputs then vary with the context
    seed: int = 0

    def check(self) -> None:
        if self.arch not in ("llama", "qwen2"):
            raise ConfigError(f"arch must be llama or qwen2; got {self.arch!r}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ConfigError(
                f"hidden {self.hidden} must divide by heads {self.heads}, heads by kv_heads {self.kv_heads}"
            )
        if not 1 <= self.draft_layers < self.layers:
            raise ConfigError(f"draft_layers must be in [1, layers {self.layers}); got {self.draft_layers}")
        if self.vocab < 300 or self.context < 16:
            raise ConfigError(f"vocab must be >= 300 and context >= 16; got {self.vocab}, {self.context}")


def train_tokenizer(vocab: int) -> Any:
    """A byte-level BPE of ``vocab`` tokens trained on the corpus, with ChatML's special tokens
    and chat template (``<|im_end|>`` ends a turn: it is the EOS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from failsoft.llm.corpus import load_corpus

    text = load_corpus().train.decode(errors="ignore").splitlines()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(text, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def model_config(build: HfBuild, tok: Any, layers: int) -> Any:
    from transformers import LlamaConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[build.arch]
    return cls(
        vocab_size=len(tok),
        hidden_size=build.hidden,
        intermediate_size=build.intermediate,
        num_hidden_layers=layers,
        num_attention_heads=build.heads,
        num_key_value_heads=build.kv_heads,
        max_position_embeddings=build.context,
        initializer_range=build.initializer_range,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def _built(where: Path, meta: dict[str, Any]) -> bool:
    try:
        return bool(json.loads((where / META_FILE).read_text()) == meta)
    except (OSError, ValueError):
        return False


def build_hf_pair(out: str | Path, build: HfBuild | None = None) -> dict[str, Any]:
    """Build ``out/target`` and ``out/draft`` (see the module); what was built, with sizes."""
    import torch
    from transformers import AutoModelForCausalLM

    b = build or HfBuild()
    b.check()
    root = Path(out).expanduser()
    meta = {"format": "failsoft-hf-pair/1", **asdict(b)}
    target_dir, draft_dir = root / "target", root / "draft"
    if not (_built(target_dir, meta) and _built(draft_dir, meta)):
        tok = train_tokenizer(b.vocab)
        torch.manual_seed(b.seed)
        target = AutoModelForCausalLM.from_config(model_config(b, tok, b.layers)).eval()
        with torch.no_grad():
            for layer in target.model.layers[b.draft_layers :]:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
        draft = AutoModelForCausalLM.from_config(model_config(b, tok, b.draft_layers)).eval()
        missing = draft.load_state_dict(target.state_dict(), strict=False).missing_keys
        if missing:
            raise ConfigError(f"the draft's weights are not all the target's: {missing[:3]}")
        for module, where in ((target, target_dir), (draft, draft_dir)):
            where.mkdir(parents=True, exist_ok=True)
            module.save_pretrained(where, safe_serialization=True)
            tok.save_pretrained(where)
            (where / META_FILE).write_text(json.dumps(meta, indent=2))
    return {
        "target": str(target_dir),
        "draft": str(draft_dir),
        "build": meta,
        "weight_bytes": {
            "target": sum(p.stat().st_size for p in target_dir.glob("*.safetensors")),
            "draft": sum(p.stat().st_size for p in draft_dir.glob("*.safetensors")),
        },
    }


__all__ = ["HfBuild", "build_hf_pair", "model_config", "train_tokenizer"]
