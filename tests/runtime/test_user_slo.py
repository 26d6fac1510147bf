"""A Jellyfish ``slo`` ladder of a user's family on a real embedded cluster: the MLP in three formats
(ONNX, ``torch.export``, a ``python`` handler), added with ``zoo add`` with declared accuracies, is
the ladder; a client registers with the service and its frames are answered within its SLO by a
variant the policy picked, every answer equal to the model's in this process."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from failsoft.runtime.config import config_from_dict
from failsoft.runtime.session import Session
from failsoft.zoo import ModelRepository
from failsoft.zoo.add import AddRequest, add_variant
from failsoft.zoo.formats import examples
from failsoft.zoo.profiler import QUICK
from tests.runtime.conftest import wait_for

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
ACCURACY = {"python": 0.70, "pt2": 0.80, "onnx": 0.90}  # the ladder's order, least accurate first
WORKERS = ("w1", "w2")


@pytest.fixture(scope="module")
def user_slo(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("user-slo")
    paths = examples.mlp_artefacts(out / "mlp")
    repo = ModelRepository(out / "zoo")
    for fmt, accuracy in ACCURACY.items():
        handler = "failsoft.zoo.formats.examples:MlpHandler" if fmt == "python" else None
        add_variant(repo, AddRequest("mlp", fmt, paths[fmt], accuracy=accuracy, handler=handler), QUICK)
    config = config_from_dict(
        {
            "name": "user-slo",
            "repository": str(repo.root),
            "servers": [{"name": s, "site": s, "memory_mb": 2000, "compute": 4.0} for s in ("e1", "e2")],
            "apps": [
                {"name": w, "family": "mlp", "rate_rps": 10, "primary": {"server": e, "variant": "pt2"}}
                for w, e in zip(WORKERS, ("e1", "e2"), strict=True)
            ],
            "services": [
                {"name": "mlp-slo", "mode": "slo", "members": list(WORKERS), "params": {"replan_s": 0.5}}
            ],
            "agents": {"restart": False, "drain_ms": 100},
            "gateway": {"port": 0},
            "state_dir": str(tmp_path_factory.mktemp("state")),
        },
        source="test",
    )
    with Session(config, num_cpus=2) as session, httpx.Client(base_url=session.url, timeout=20.0) as http:
        client = session.client(timeout=20.0)
        try:
            wait_for(client.ready, 90.0, "the gateway ready")
            yield http
        finally:
            client.close()


def test_a_users_family_is_an_slo_ladder_whose_frames_are_answered_as_the_model_does(user_slo):
    import torch

    http = user_slo
    ladder = http.post("/v2/repository/index").json()
    (entry,) = [e for e in ladder if e["name"] == "mlp-slo"]
    assert {rung.split("@")[0] for rung in entry["variants"]} == set(ACCURACY)  # and low-res feeds
    registered = http.post(
        "/v2/clients", json={"service": "mlp-slo", "slo_ms": 500, "fps": 5, "bandwidth_kbps": 20_000}
    )
    assert registered.status_code == 200, registered.text
    client_id = registered.json()["client"]
    rows = np.random.default_rng(4).normal(size=(6, examples.MLP_SIZES[0])).astype(np.float32)
    with torch.no_grad():
        expected = examples.mlp_module(examples.mlp_weights())(torch.from_numpy(rows)).numpy()
    answered = []
    for row, want in zip(rows, expected, strict=True):
        body = {
            "inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP32", "data": row.tolist()}],
            "parameters": {"client": client_id, "bandwidth_kbps": 20_000},
        }
        response = http.post("/v2/models/mlp-slo/infer", json=body)
        assert response.status_code == 200, response.text
        out = response.json()
        if not out["parameters"]["dropped"]:  # a frame dropped to keep the others in their SLO has none
            np.testing.assert_allclose(out["outputs"][0]["data"], want, rtol=1e-4, atol=1e-4)
            answered.append(out["parameters"]["variant"].split("@")[0])
        time.sleep(0.2)
    assert answered and set(answered) <= set(ACCURACY)
