"""LUMEN's recovery policies and their baselines, each a bundle of the three mechanisms.

==========================  ==============  =================  ===========================
name                        placement       dispatch           progressive recovery
==========================  ==============  =================  ===========================
``lumen``                   load-aware      locality-aware     draft + peer verification
``lumen-no-load-aware``     ring            locality-aware     draft + peer verification
``lumen-no-locality``       load-aware      holder first       draft + peer verification
``lumen-no-progressive``    load-aware      locality-aware     none (idle while reloading)
``fixed-checkpointing``     ring            holder first       none
``stop-and-restart``        none            recompute all      none
==========================  ==============  =================  ===========================

The three ``lumen-no-*`` ablations switch one mechanism off each (the review has no ablation; its
critique asks for these). Both the runtime controller and the simulator build a policy by name
from the registry's ``llm_recovery`` seam and call its three parts with frozen snapshots.
"""

from __future__ import annotations

from typing import ClassVar

from failsoft.policies.llm_recovery.dispatch import HolderFirst, LocalityAware, RecomputeAll, RecoveryDispatch
from failsoft.policies.llm_recovery.placement import (
    CheckpointPlacement,
    LoadAware,
    NoCheckpoint,
    RingNeighbour,
)
from failsoft.policies.llm_recovery.progressive import ProgressiveRecovery
from failsoft.services import LlmParams


class LlmRecoveryPolicy:
    """A named bundle: ``placement``, ``dispatch``, and ``progressive`` (None: the restarted worker
    idles until its full model is back). ``params`` defaults to :class:`LlmParams` ()."""

    name: ClassVar[str]
    _placement: ClassVar[type[CheckpointPlacement]] = LoadAware
    _dispatch: ClassVar[type[RecoveryDispatch]] = LocalityAware
    _progressive: ClassVar[bool] = True

    def __init__(self, params: LlmParams | None = None) -> None:
        self.params = params if params is not None else LlmParams()
        self.placement: CheckpointPlacement = self._placement()
        self.dispatch: RecoveryDispatch = self._dispatch()
        self.progressive: ProgressiveRecovery | None = ProgressiveRecovery() if self._progressive else None

    @property
    def checkpoints(self) -> bool:
        return not isinstance(self.placement, NoCheckpoint) and self.params.checkpoint_budget_mb > 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"


class Lumen(LlmRecoveryPolicy):
    name = "lumen"


class LumenNoLoadAware(LlmRecoveryPolicy):
    name = "lumen-no-load-aware"
    _placement = RingNeighbour


class LumenNoLocality(LlmRecoveryPolicy):
    name = "lumen-no-locality"
    _dispatch = HolderFirst


class LumenNoProgressive(LlmRecoveryPolicy):
    name = "lumen-no-progressive"
    _progressive = False


class FixedCheckpointing(LlmRecoveryPolicy):
    name = "fixed-checkpointing"
    _placement = RingNeighbour
    _dispatch = HolderFirst
    _progressive = False


class StopAndRestart(LlmRecoveryPolicy):
    name = "stop-and-restart"
    _placement = NoCheckpoint
    _dispatch = RecomputeAll
    _progressive = False


POLICIES: tuple[type[LlmRecoveryPolicy], ...] = (
    Lumen,
    FixedCheckpointing,
    StopAndRestart,
    LumenNoLoadAware,
    LumenNoLocality,
    LumenNoProgressive,
)
