"""Tiny models made here (no download), with random weights of a wide initialisation so that
greedy outputs vary with the context (a barely trained tiny model mostly repeats one token, which
would make every equality trivially true):

* :func:`byte_pair`: a byte-level Llama (tokens are bytes) and a draft of it (the target with
  noise added, so that some drafts are accepted and some rejected);
* :func:`train_tokenizer` and :func:`save_model`: a byte-level BPE tokenizer trained with
  ``tokenizers`` on generated text, with a chat template, and random-weight Llama, Qwen2 or
  Mistral models saved with ``save_pretrained`` beside it, as :func:`failsoft.llm.hf.load_hf`
  loads them."""

from __future__ import annotations

import copy
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


def byte_pair():
    """(target, draft) :class:`~failsoft.llm.models.LoadedLm` of the byte-level Llama."""
    from transformers import LlamaForCausalLM

    from failsoft.llm.models import LmSpec, wrap

    spec = LmSpec(64, 2, 4, 2, 128, 128, steps=0, batch=1, seq_len=8, lr=0.0, seed=0)
    config = spec.config()
    config.initializer_range = 0.3
    torch.manual_seed(0)
    target = LlamaForCausalLM(config).eval()
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    return wrap("test-target", target, "cpu", "test-target"), wrap("test-draft", draft, "cpu", "test-draft")
