"""LLM serving for LUMEN: an engine with a paged KV cache, continuous batching, streamed tokens, KV
checkpoints and speculative decoding, serving a byte-level target/draft pair trained here (the
zero-download default) or any local Hugging Face causal LM with its tokenizer and chat template
(:func:`load_hf`; :func:`hf_record` measures what a repository records about one).

torch and transformers are imported here (never in :mod:`failsoft.policies`); the engine's KV
checkpoints are driven by the pure :class:`failsoft.policies.llm_recovery.CheckpointLedger`. See
docs/lumen.md.
"""

from failsoft.llm.checkpoint import CheckpointBuffer, KvChunk
from failsoft.llm.engine import Engine, PagePool, Request, SamplingParams, Verdict
from failsoft.llm.hf import load_hf
from failsoft.llm.record import hf_record
from failsoft.llm.speculative import SpeculativeResult, speculative_generate

__all__ = [
    "CheckpointBuffer",
    "Engine",
    "KvChunk",
    "PagePool",
    "Request",
    "SamplingParams",
    "SpeculativeResult",
    "Verdict",
    "hf_record",
    "load_hf",
    "speculative_generate",
]
