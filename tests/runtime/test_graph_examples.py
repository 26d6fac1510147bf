"""The public-graph example configs parse, and the auto-pilot one (HAMS's auto-pilot graph: two
stateful GRUs in sequence, a fan-out and a fan-in on the two-input GRU) serves on a real cluster
with answers bit-equal to the same models walked through the graph in this process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from failsoft.bench.replication import ReplicationBenchSettings, graph_reference, plans_of
from failsoft.runtime.config import config_from_dict
from failsoft.runtime.session import Session
from failsoft.zoo import ModelRepository
from failsoft.zoo.stateful import sp500_series
from tests.runtime.conftest import wait_for
from tests.zoos import tiny_zoo_of

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GRAPH_EXAMPLES = ("graph-echo-chain.yaml", "graph-auto-pilot.yaml")


@pytest.mark.parametrize("name", GRAPH_EXAMPLES)
def test_the_graph_examples_parse(name: str) -> None:
    (service,) = config_from_dict(yaml.safe_load((EXAMPLES / name).read_text()), source=name).services
    assert service.mode.value == "graph" and any(n.stateful for n in service.params.nodes)


@pytest.fixture(scope="module")
def gru_zoo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    """Both SP500 GRU families, quickly profiled once per run (~30 s; :mod:`tests.zoos`)."""
    return tiny_zoo_of(tmp_path_factory, ("sp500_gru", "sp500_gru2"))


@pytest.mark.runtime
@pytest.mark.slow
def test_the_auto_pilot_example_serves_with_the_answers_of_its_models(gru_zoo, tmp_path) -> None:
    data = yaml.safe_load((EXAMPLES / "graph-auto-pilot.yaml").read_text())
    data |= {"repository": str(gru_zoo.root), "state_dir": str(tmp_path / "state")}
    data["gateway"] = {**data["gateway"], "port": 0}
    config = config_from_dict(data, source="graph-auto-pilot.yaml")
    (plan,) = plans_of(data, ReplicationBenchSettings().kill_node, "example")
    series = sp500_series()
    inputs = [np.asarray([[series[i]]], dtype=np.float32) for i in range(3)]
    answers = []
    with Session(config, num_cpus=2) as session:
        client = session.client(timeout=30.0)
        try:
            wait_for(client.ready, 90.0, "the graph service deployed", 0.2)
            for x in inputs:
                raw = client.infer("autopilot", x, timeout=20.0)
                answers.append((int(raw.raw["parameters"]["seq"]), np.asarray(raw.outputs)))
        finally:
            client.close()
    expected = graph_reference(str(gru_zoo.root), config.services[0].params, plan, inputs)
    assert [seq for seq, _ in answers] == [1, 2, 3]
    for (seq, got), want in zip(answers, expected, strict=True):
        np.testing.assert_array_equal(got, want, err_msg=f"request {seq}")
    assert answers[0][1].shape == (1, 1)  # c6's one prediction, from its two joined inputs
