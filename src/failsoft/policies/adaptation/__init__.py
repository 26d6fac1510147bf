"""Jellyfish (RTSS 2022; journal version 2024): serving clients on fluctuating networks under end-to-end
latency SLOs, by choosing which variant each worker runs and which clients it serves.

==================  ==========================================================  ===============
module              what                                                        paper section
==================  ==========================================================  ===============
``model``           the variant ladder, the frozen snapshot in, the plan out   4.1 (Table 1)
``network``         latency budget, bandwidth estimation, frame size, drop     3.3, 6
``mapping``         client-to-worker mapping, DP over batch sizes              4.2 (Alg. 1)
``selection``       simulated-annealing variant selection; EDF baselines       4.3 (Alg. 2)
``exact``           the exact MILP (HiGHS) of mapping + selection              4.1 (P1)
==================  ==========================================================  ===============

Pure: numpy, scipy and HiGHS only; time is passed in. Policies are registered in
:mod:`failsoft.policies.registry` under the ``adaptation`` seam.
"""
