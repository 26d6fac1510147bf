"""LUMEN: load-aware KV checkpointing, locality-aware recovery dispatch and draft-model progressive
recovery for LLM workers (the review of arXiv 2606.17787; ``docs/lumen.md``).

Pure: frozen snapshots (:class:`ClusterView`) and :class:`~failsoft.services.LlmParams` in, frozen
decisions out; time is never read. :mod:`.placement` (Alg. 1, Eq. 5), :mod:`.dispatch` (Eq. 6,
Alg. 2), :mod:`.progressive` (Alg. 3, Eq. 3), bundled by name in :mod:`.policy`.
"""

from failsoft.policies.llm_recovery.dispatch import (
    HolderFirst,
    Interrupted,
    LocalityAware,
    RecomputeAll,
    RecoveryDispatch,
    Route,
)
from failsoft.policies.llm_recovery.load import (
    PAGE_TOKENS,
    ClusterView,
    WorkerLoad,
    kv_mb_per_token,
    pages,
    recovery_load,
)
from failsoft.policies.llm_recovery.placement import (
    Checkpoint,
    CheckpointLedger,
    CheckpointPlacement,
    LoadAware,
    NoCheckpoint,
    PlacementDecision,
    RingNeighbour,
)
from failsoft.policies.llm_recovery.policy import (
    POLICIES,
    FixedCheckpointing,
    LlmRecoveryPolicy,
    Lumen,
    LumenNoLoadAware,
    LumenNoLocality,
    LumenNoProgressive,
    StopAndRestart,
)
from failsoft.policies.llm_recovery.progressive import (
    ProgressiveDecision,
    ProgressiveRecovery,
    Recovering,
    SpeculationCost,
    expected_tokens,
)

__all__ = [
    "PAGE_TOKENS",
    "POLICIES",
    "Checkpoint",
    "CheckpointLedger",
    "CheckpointPlacement",
    "ClusterView",
    "FixedCheckpointing",
    "HolderFirst",
    "Interrupted",
    "LlmRecoveryPolicy",
    "LoadAware",
    "LocalityAware",
    "Lumen",
    "LumenNoLoadAware",
    "LumenNoLocality",
    "LumenNoProgressive",
    "NoCheckpoint",
    "PlacementDecision",
    "ProgressiveDecision",
    "ProgressiveRecovery",
    "RecomputeAll",
    "Recovering",
    "RecoveryDispatch",
    "RingNeighbour",
    "Route",
    "SpeculationCost",
    "StopAndRestart",
    "WorkerLoad",
    "expected_tokens",
    "kv_mb_per_token",
    "pages",
    "recovery_load",
]
