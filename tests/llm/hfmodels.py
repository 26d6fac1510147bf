"""Tiny Hugging Face models made here (no download): a byte-level BPE tokenizer trained with
``tokenizers`` on generated text, with a chat template, and random-weight Llama, Qwen2 or Mistral
models saved with ``save_pretrained`` beside it, as :func:`failsoft.llm.hf.load_hf` loads them."""

from __future__ import annotations

import random

import torch

WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "node",
    "page",
    "cache",
    "token",
    "model",
    "serve",
    "fail",
    "recover",
    "draft",
    "verify",
    "batch",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


def train_tokenizer():
    """A byte-level BPE trained on generated text (319 tokens: the merges run out before the 320
    asked), as a PreTrainedTokenizerFast with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    text = [" ".join(rng.choice(WORDS) for _ in range(24)) for _ in range(300)]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(text, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def hf_config(arch: str, tok, hidden: int, layers: int, vocab_pad: int = 0):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[arch]
    return cls(
        vocab_size=len(tok) + vocab_pad,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.3,  # wide: greedy outputs then depend on the context
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def save_model(tmp, arch: str, tok, hidden: int, layers: int, seed: int, vocab_pad: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(arch, tok, hidden, layers, vocab_pad)).eval()
    where = tmp / f"{arch}-{hidden}"
    model.save_pretrained(where)
    tok.save_pretrained(where)
    return where
