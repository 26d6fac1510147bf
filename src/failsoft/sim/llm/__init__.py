"""LUMEN's LLM cluster on SimPy (:mod:`.cluster`), its metrics, experiments and outputs."""

from failsoft.sim.llm.cluster import LlmCluster, LlmSimConfig
from failsoft.sim.llm.experiment import (
    ALL_POLICIES,
    BASELINE,
    LLM_EXPERIMENTS,
    LlmExperiment,
    LlmResult,
    get_llm_experiment,
    run_llm_experiment,
)

__all__ = [
    "ALL_POLICIES",
    "BASELINE",
    "LLM_EXPERIMENTS",
    "LlmCluster",
    "LlmExperiment",
    "LlmResult",
    "LlmSimConfig",
    "get_llm_experiment",
    "run_llm_experiment",
]
