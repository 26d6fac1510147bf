"""The adaptation seam's contract (registered in :mod:`failsoft.policies.registry` as ``adaptation``).

Who calls it: the slo service's dispatcher in the gateway every re-plan period
(``SloParams.replan_s``) and when a client joins or leaves or a worker fails; the simulator at the
same moments; ``failsoft bench adaptation-plan``. Each builds a frozen
:class:`~failsoft.policies.adaptation.model.Snapshot` (clients with their budgets, live workers with
the variant each holds) and applies the frozen
:class:`~failsoft.policies.adaptation.model.Plan` it gets back: load the variants (in the background),
route each client's frames to its worker, set the batch size, tell each client its next frame size.
A policy keeps no state between calls except its random generator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from failsoft.policies.adaptation.model import Plan, Snapshot


class AdaptationPolicy(ABC):
    """Variant selection and client mapping: ``plan(snapshot) -> Plan``. Pure; time is never read."""

    name: ClassVar[str]

    @abstractmethod
    def plan(self, snapshot: Snapshot) -> Plan:
        """The workers' variants and batch sizes and the clients each serves."""
