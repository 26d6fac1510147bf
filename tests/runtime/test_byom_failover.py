"""Users' models under ``failsoft serve``: one family in three formats fails over across formats.

A ``transformers`` image classifier directory, its ONNX export and its ``torch.export`` program (one
model, random weights, a tiny config) are added with ``zoo add`` and served on a real embedded
cluster (Ray, agents, the HTTP gateway). The primary's server is killed under client traffic: no
request fails, the app answers from a variant of another format on the other server, and every
answer equals the model's in this process.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest

from failsoft.client import Client
from failsoft.runtime.config import config_from_dict
from failsoft.zoo import ModelRepository
from failsoft.zoo.add import AddRequest, add_variant
from failsoft.zoo.formats import examples
from failsoft.zoo.profiler import QUICK
from tests.runtime.conftest import serving, wait_for

pytestmark = [pytest.mark.runtime, pytest.mark.slow]
PIXELS = np.random.default_rng(7).random((4, 3, 32, 32), dtype=np.float32)
# the primary (hf) declares the lowest accuracy, so the warm backup FailLite places is another format
ACCURACY = {"hf": 0.70, "onnx": 0.80, "pt2": 0.79}


@pytest.fixture(scope="module")
def byom_zoo(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRepository, np.ndarray]:
    import torch
    from transformers import AutoModelForImageClassification

    out = tmp_path_factory.mktemp("byom")
    hf_dir = examples.image_classifier(out / "hf")
    examples.hf_image_exports(hf_dir, out / "model.onnx", out / "model.pt2")
    np.save(out / "sample.npy", PIXELS)
    repo = ModelRepository(out / "zoo")
    paths = {"hf": hf_dir, "onnx": out / "model.onnx", "pt2": out / "model.pt2"}
    (out / "labels.txt").write_text("\n".join(examples.IMAGE_LABELS) + "\n")  # the exports name no classes
    for variant, path in paths.items():
        labels = None if variant == "hf" else out / "labels.txt"
        request = AddRequest(
            "img",
            variant,
            path,
            accuracy=ACCURACY[variant],
            sample_file=out / "sample.npy",
            labels_file=labels,
        )
        add_variant(repo, request, QUICK)
    texts = out / "texts.txt"
    texts.write_text("\n".join(examples.TEXTS) + "\n")
    text_dir = examples.text_classifier(out / "text")
    add_variant(repo, AddRequest("sentiment", "bert", text_dir, accuracy=0.5, sample_file=texts), QUICK)
    model = AutoModelForImageClassification.from_pretrained(hf_dir, local_files_only=True).eval()
    with torch.no_grad():
        expected = model(pixel_values=torch.from_numpy(PIXELS)).logits.numpy()
    return repo, expected


@pytest.fixture(scope="module")
def cluster(byom_zoo, tmp_path_factory):
    repo, _ = byom_zoo
    config = config_from_dict(
        {
            "name": "byom-test",
            "repository": str(repo.root),
            "servers": [
                {"name": "s1", "site": "a", "memory_mb": 2000, "compute": 4.0},
                {"name": "s2", "site": "b", "memory_mb": 2000, "compute": 4.0},
            ],
            "apps": [
                {
                    "name": "img-app",
                    "family": "img",
                    "critical": True,
                    "rate_rps": 2,
                    "primary": {"server": "s1", "variant": "hf"},
                },
                {"name": "text-app", "family": "sentiment", "primary": {"server": "s2", "variant": "bert"}},
            ],
            "failover": {"policy": "faillite", "alpha": 0.1},
            "gateway": {"port": 0},
            "agents": {"restart": False, "drain_ms": 100},
            "state_dir": str(tmp_path_factory.mktemp("state")),
        },
        source="test",
    )
    with serving(config) as running:
        yield running


def _ready(client: Client) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        status = client.status()
        app = next(a for a in status["apps"] if a["name"] == "img-app")
        warm = app["warm_backups"] and all(w["state"] == "warm" for w in app["warm_backups"])
        home = all(a["route"] == a["primary"] for a in status["apps"])
        return status if home and warm and status["idle"] else None

    return wait_for(check, 90.0, "img-app at home on s1 with a warm backup, idle", 0.2)


def test_a_family_in_three_formats_fails_over_across_formats_with_no_failed_request(byom_zoo, cluster):
    _, expected = byom_zoo
    session, client = cluster
    status = _ready(client)
    (backup,) = next(a for a in status["apps"] if a["name"] == "img-app")["warm_backups"]
    assert backup["server"] == "s2" and backup["variant"] != "hf", backup

    first = client.infer("img-app", PIXELS)
    assert (first.server, first.variant) == ("s1", "hf")
    np.testing.assert_allclose(first.outputs, expected, rtol=1e-4, atol=1e-4)

    answers: list[tuple[float, Any]] = []
    errors: list[str] = []
    stop = threading.Event()

    def traffic() -> None:
        with Client(session.url, timeout=20.0) as own:
            while not stop.is_set():
                sent = time.time()
                try:
                    answers.append((sent, own.infer("img-app", PIXELS, timeout=15.0)))
                except Exception as exc:  # every failure is the test's finding, whatever its kind
                    errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    time.sleep(1.0)
    t_kill = client.admin("kill", server="s1")["killed"][0]["at"]
    wait_for(lambda: any(s > t_kill and r.server == "s2" for s, r in answers), 30.0, "answers from s2", 0.1)
    time.sleep(1.0)
    stop.set()
    worker.join(timeout=30)

    assert not errors, errors[:3]
    after = [r for s, r in answers if s > t_kill and r.server == "s2"]
    assert after and {r.variant for r in after} == {backup["variant"]}  # another format answered
    for result in (r for _, r in answers):
        np.testing.assert_allclose(result.outputs, expected, rtol=1e-4, atol=1e-4)
    failovers = [
        e for e in client.recoveries()["events"] if e["type"] == "failover" and e["timestamp"] >= t_kill
    ]
    assert failovers and failovers[0]["kind"] == "warm", failovers
    top = httpx.post(f"{session.url}/v2/models/img-app/infer", json=_classification_request(), timeout=20.0)
    best = int(expected[0].argmax())
    assert top.json()["outputs"][0]["data"] == [f"{expected[0, best]:f}:{best}:{examples.IMAGE_LABELS[best]}"]


def test_a_text_classifier_answers_texts_sent_as_bytes(byom_zoo, cluster):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    repo, _ = byom_zoo
    session, client = cluster

    def text_app_home() -> bool:
        app = next(a for a in client.status()["apps"] if a["name"] == "text-app")
        return app["route"] == app["primary"]

    wait_for(text_app_home, 90.0, "text-app served by its primary", 0.2)  # s1 may have been killed
    texts = ["a good film", "a dull story and bad acting"]
    tensor = {"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": texts}
    answer = httpx.post(f"{session.url}/v2/models/text-app/infer", json={"inputs": [tensor]}, timeout=20.0)
    assert answer.status_code == 200, answer.text
    out = answer.json()["outputs"][0]
    directory = repo.variant_dir("sentiment", "bert") / "model"
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(directory, local_files_only=True).eval()
    with torch.no_grad():
        expected = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits.numpy()
    np.testing.assert_allclose(np.reshape(out["data"], out["shape"]), expected, rtol=1e-4, atol=1e-4)
    numbers = {"name": "text", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}
    refused = httpx.post(f"{session.url}/v2/models/text-app/infer", json={"inputs": [numbers]}, timeout=20.0)
    assert refused.status_code == 400 and "takes BYTES" in refused.json()["error"]


def _classification_request() -> dict[str, Any]:
    """Row 0 of the pixels, asking for its best class by Triton's classification extension."""
    tensor = {
        "name": "input",
        "shape": [1, 3, 32, 32],
        "datatype": "FP32",
        "data": PIXELS[0].ravel().tolist(),
    }
    return {"inputs": [tensor], "outputs": [{"name": "output", "parameters": {"classification": 1}}]}


def test_the_added_variants_profile_like_built_ones(byom_zoo):
    repo, _ = byom_zoo
    family = next(f for f in repo.families() if f.name == "img")
    assert {v.name for v in family.variants} == {"hf", "onnx", "pt2"}
    assert all(v.memory_mb > 0 and v.load_ms > 0 and v.latency_ms > 0 for v in family.variants)
    assert {repo.config("img", v.name).model_format for v in family.variants} == {"hf", "onnx", "pt2"}
