"""Failover policies (FailLite): warm backups planned ahead, recovery planned on failure.

The contract is :mod:`~failsoft.policies.failover.interface`; the implementations are
:mod:`~failsoft.policies.failover.faillite` and :mod:`~failsoft.policies.failover.baselines`; look
them up by name in :mod:`failsoft.policies.registry`. This package module imports nothing, so
importing any of its modules never drags in the others.
"""
