"""Policies by name, one explicit map per seam (a contract per seam, a factory by name).

Each seam's contract lives in its own ``interface`` module, which imports no implementation; this
module imports the implementations and maps names to classes. Nothing in ``failsoft.policies``
imports this module back, so the policy package's import graph has no circle (a test checks it).

================  ===============================================  ===============================
seam              contract                                         who calls it
================  ===============================================  ===============================
``failover``      ``policies.failover.interface.FailoverPolicy``   controller, simulator, ``plan``
``queueing``      ``policies.queueing.QueueDiscipline``            agents' serving queues, simulator
``coding``        ``policies.coding.interface`` (ParM)             gateway (coded services), simulator
``adaptation``    Jellyfish mapping and variant selection          gateway (slo services), simulator
``replication``   HAMS state propagation                           gateway and agents (graphs)
``llm_recovery``  LUMEN checkpoint placement and dispatch          controller (llm services)
================  ===============================================  ===============================

A seam whose mechanism has not landed yet has an empty map: asking it for a name is a clear
:class:`~failsoft.errors.UnknownNameError`, never an import error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from failsoft.errors import UnknownNameError
from failsoft.policies.adaptation.exact import MilpPolicy
from failsoft.policies.adaptation.interface import AdaptationPolicy
from failsoft.policies.adaptation.selection import EdfLarge, EdfMedium, EdfSmall, JellyfishPolicy
from failsoft.policies.coding.decoders import LinearDecoder, SubtractionDecoder
from failsoft.policies.coding.encoders import AddEncoder, ConcatEncoder
from failsoft.policies.coding.interface import Decoder, Encoder
from failsoft.policies.failover.baselines import FullColdPolicy, FullWarmKPolicy, FullWarmPolicy
from failsoft.policies.failover.faillite import FailLitePolicy
from failsoft.policies.failover.interface import FailoverPolicy
from failsoft.policies.llm_recovery.policy import POLICIES as LLM_RECOVERY_POLICIES
from failsoft.policies.llm_recovery.policy import LlmRecoveryPolicy
from failsoft.policies.queueing import BatchLazyDrop, Edf, Fifo, QueueDiscipline
from failsoft.policies.replication.baselines import CheckpointReplay, NoReplication, StopAndCopy
from failsoft.policies.replication.interface import ReplicationProtocol
from failsoft.policies.replication.nspb import Nspb

FAILOVER: Mapping[str, type[FailoverPolicy]] = {
    "faillite": FailLitePolicy,
    "full-warm": FullWarmPolicy,
    "full-warm-k": FullWarmKPolicy,
    "full-cold": FullColdPolicy,
}

QUEUEING: Mapping[str, type[QueueDiscipline]] = {
    "fifo": Fifo,
    "batch-lazy-drop": BatchLazyDrop,
    "edf": Edf,
}

ADAPTATION: Mapping[str, type[AdaptationPolicy]] = {
    "jellyfish": JellyfishPolicy,
    "edf-small": EdfSmall,
    "edf-medium": EdfMedium,
    "edf-large": EdfLarge,
    "milp": MilpPolicy,
}

CODING: Mapping[str, type[Encoder] | type[Decoder]] = {
    "add": AddEncoder,
    "concat": ConcatEncoder,
    "sub": SubtractionDecoder,
    "linear": LinearDecoder,
}

LLM_RECOVERY: Mapping[str, type[LlmRecoveryPolicy]] = {p.name: p for p in LLM_RECOVERY_POLICIES}

REPLICATION: Mapping[str, type[ReplicationProtocol]] = {
    "nspb": Nspb,
    "stop-and-copy": StopAndCopy,
    "checkpoint-replay": CheckpointReplay,
    "none": NoReplication,
}

SEAMS: dict[str, Mapping[str, type]] = {
    "failover": FAILOVER,
    "queueing": QUEUEING,
    "coding": CODING,
    "adaptation": ADAPTATION,
    "replication": REPLICATION,
    "llm_recovery": LLM_RECOVERY,
}


def names(seam: str) -> list[str]:
    """The policy names registered for ``seam``, sorted."""
    return sorted(_seam(seam))


def policy_class(seam: str, name: str) -> type:
    registered = _seam(seam)
    try:
        return registered[name]
    except KeyError:
        known = ", ".join(sorted(registered)) or "none yet"
        raise UnknownNameError(f"unknown {seam.replace('_', ' ')} policy {name!r} (known: {known})") from None


def make(seam: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """A new instance of the policy registered as ``name`` for ``seam``."""
    return policy_class(seam, name)(*args, **kwargs)


def get_failover_policy(name: str) -> FailoverPolicy:
    """The failover policy ``name`` (``faillite``, ``full-warm``, ``full-cold``, ``full-warm-k``)."""
    policy: FailoverPolicy = make("failover", name)
    return policy


def failover_names() -> list[str]:
    return names("failover")


def get_encoder(name: str, k: int, r: int = 1, input_shape: tuple[int, ...] = (64,)) -> Encoder:
    """The ParM encoder ``name`` (``add``, ``concat``) for k queries of ``input_shape`` and r parities."""
    cls = CODING.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Encoder)):
        known = ", ".join(sorted(n for n, c in CODING.items() if issubclass(c, Encoder)))
        raise UnknownNameError(f"unknown coding encoder {name!r} (known: {known})")
    return cls(k, r, input_shape)


def get_decoder(k: int, r: int = 1) -> Decoder:
    """The decoder of a (k, r) code: ``sub`` (the paper's subtraction) for r = 1, else ``linear``."""
    decoder: Decoder = make("coding", "sub" if r == 1 else "linear", k, r)
    return decoder


def _seam(seam: str) -> Mapping[str, type]:
    try:
        return SEAMS[seam]
    except KeyError:
        raise UnknownNameError(f"unknown policy seam {seam!r} (seams: {', '.join(SEAMS)})") from None
