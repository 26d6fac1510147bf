"""LLM serving for LUMEN: a byte-level target/draft model pair trained here, and an engine with a
paged KV cache, continuous batching, streamed tokens, KV checkpoints and speculative decoding.

torch and transformers are imported here (never in :mod:`failsoft.policies`); the engine's KV
checkpoints are driven by the pure :class:`failsoft.policies.llm_recovery.CheckpointLedger`. See
docs/lumen.md.
"""

from failsoft.llm.checkpoint import CheckpointBuffer, KvChunk
from failsoft.llm.engine import Engine, PagePool, Request, SamplingParams, Verdict
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
    "speculative_generate",
]
