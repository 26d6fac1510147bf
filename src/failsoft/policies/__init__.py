"""Pure policies: functions of a cluster snapshot to a plan. No I/O, no Ray, SimPy, FastAPI or torch.

The runtime (``failsoft.runtime``) and the simulator (``failsoft.sim``) both call these, so what is
decided in simulation is what the real system would decide.
"""
