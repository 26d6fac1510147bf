"""Failover policies (FailLite): warm backups planned ahead, recovery planned on failure."""

from failsoft.policies.failover.baselines import FullColdPolicy, FullWarmKPolicy, FullWarmPolicy
from failsoft.policies.failover.faillite import FailLitePolicy
from failsoft.policies.failover.interface import FailoverPolicy, get_failover_policy, policy_names

__all__ = [
    "FailLitePolicy",
    "FailoverPolicy",
    "FullColdPolicy",
    "FullWarmKPolicy",
    "FullWarmPolicy",
    "get_failover_policy",
    "policy_names",
]
