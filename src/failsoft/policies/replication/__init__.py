"""Replication of stateful models in a service graph (HAMS): NSPB and its baselines, pure.

``interface`` is the contract (events in, commands out); ``nspb`` the paper's protocol; ``baselines``
``none``, ``stop-and-copy`` and ``checkpoint-replay``. The registry's ``replication`` seam names them.
"""
