"""A discrete-event simulator of failsoft clusters on SimPy, running the runtime's own policies.

FailLite (like LUMEN and Jellyfish) backs its prototype with large-scale simulation (5.1, 5.3-5.6,
5.8). failsoft's simulator runs the *same* policy objects as the runtime
(``failsoft.policies.failover.get_failover_policy``) and the *same* heartbeat detector
(``failsoft.policies.detection.HeartbeatDetector``, on a :class:`SimClock`), over SimPy twins of
what the runtime does: agents that load and unload models with durations from measured profiles and
push heartbeats (:mod:`.agent`), a controller that detects failures, plans and applies plans
(:mod:`.controller`), and clients whose requests are queued, batched and served (:mod:`.requests`).

* :func:`simulate_failure` runs one failure event on a :class:`Deployment`;
  :func:`simulate_model_loss` one model lost on a live server (promoted, warm switch or reload in
  place, as the core decides); :func:`simulate_pin` one mechanism's copy (a Jellyfish ladder
  switch) on a cluster in steady state, and :func:`simulate_pins` several at once (``bench
  fidelity``'s control probe);
* :func:`run_experiment` runs one of FailLite's experiments (:data:`EXPERIMENTS`) over policies
  and seeds; :func:`write_outputs` writes its CSV, summary and figure.

The simulator imports SimPy, numpy and matplotlib (for figures), never Ray, FastAPI or torch.
"""

from failsoft.sim.clock import SimClock
from failsoft.sim.config import PageCache, RequestMode, SimConfig
from failsoft.sim.deploy import DEFAULT_POLICIES, Deployer, Deployment, policy_labels
from failsoft.sim.engine import simulate_failure, simulate_model_loss, simulate_pin, simulate_pins
from failsoft.sim.experiments import EXPERIMENTS, Experiment, Point, get_experiment, load_families
from failsoft.sim.metrics import AppRecord, EventResult, summarize
from failsoft.sim.output import write_outputs
from failsoft.sim.runner import ExperimentResult, run_experiment

__all__ = [
    "DEFAULT_POLICIES",
    "EXPERIMENTS",
    "AppRecord",
    "Deployer",
    "Deployment",
    "EventResult",
    "Experiment",
    "ExperimentResult",
    "PageCache",
    "Point",
    "RequestMode",
    "SimClock",
    "SimConfig",
    "get_experiment",
    "load_families",
    "policy_labels",
    "run_experiment",
    "simulate_failure",
    "simulate_model_loss",
    "simulate_pin",
    "simulate_pins",
    "summarize",
    "write_outputs",
]
