"""failsoft: model serving that keeps answering when servers, sites or networks fail.

It trades a little accuracy or latency for availability instead of failing hard, bringing
FailLite, ParM, HAMS, Jellyfish and LUMEN into one system: pure policies (``failsoft.policies``)
shared by a real runtime on Ray (``failsoft.runtime``) and a SimPy simulator (``failsoft.sim``).
"""

from failsoft.domain import (
    ActionKind,
    App,
    Demand,
    FailoverAction,
    FailoverPlan,
    Family,
    Placement,
    PolicyParams,
    ProactivePlan,
    Scenario,
    Server,
    Site,
    Variant,
    WarmBackup,
)
from failsoft.errors import ConfigError, FailsoftError
from failsoft.scenario import load_scenario, scenario_from_dict

__version__ = "0.1.0"

__all__ = [
    "ActionKind",
    "App",
    "ConfigError",
    "Demand",
    "FailoverAction",
    "FailoverPlan",
    "FailsoftError",
    "Family",
    "Placement",
    "PolicyParams",
    "ProactivePlan",
    "Scenario",
    "Server",
    "Site",
    "Variant",
    "WarmBackup",
    "__version__",
    "load_scenario",
    "scenario_from_dict",
]
