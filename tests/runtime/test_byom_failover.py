"""Users' models under ``failsoft serve``: one family in three formats fails over across formats.

A ``transformers`` image classifier directory, its ONNX export and its ``torch.export`` program (one
model, random weights, a tiny config) are added with ``zoo add`` and served on a real embedded
cluster (Ray, agents, the HTTP gateway). The primary's server is killed under client traffic: no
request fails, the app answers from a variant of another format on the other server, and every
answer equals the model's in this process.
"""

from __future__ import annotations

import json
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
            image_processor=hf_dir if variant == "onnx" else None,  # the hf model's, kept beside it
        )
        add_variant(repo, request, QUICK)
    texts = out / "texts.txt"
    texts.write_text("\n".join(examples.TEXTS) + "\n")
    text_dir = examples.text_classifier(out / "text")
    add_variant(repo, AddRequest("sentiment", "bert", text_dir, accuracy=0.5, sample_file=texts), QUICK)
    tokens = examples.token_artefacts(out / "tokens")  # two named inputs, two outputs
    add_variant(
        repo, AddRequest("tok", "onnx", tokens["onnx"], accuracy=0.5, sample_file=tokens["sample"]), QUICK
    )
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
                {"name": "tok-app", "family": "tok", "primary": {"server": "s2", "variant": "onnx"}},
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


def test_images_sent_as_png_bytes_answer_as_the_model_does_on_them_and_a_corrupt_one_is_a_400(
    byom_zoo, cluster
):
    import base64
    import io

    from PIL import Image

    from failsoft.zoo.formats.hf import TransformersHandler

    repo, _ = byom_zoo
    session, _ = cluster
    files = []
    for seed in (1, 2):
        buf = io.BytesIO()
        rgb = np.random.default_rng(seed).integers(0, 256, (40, 48, 3), dtype=np.uint8)
        Image.fromarray(rgb).save(buf, format="PNG")
        files.append(buf.getvalue())
    handler = TransformersHandler(repo.variant_dir("img", "hf") / "model", {})
    handler.load("cpu")  # in this process: the hf variant's processor on the same files
    expected = handler.infer({"image": np.array(files, dtype=object)})["logits"]
    url = f"{session.url}/v2/models/img-app/infer"
    b64 = [base64.b64encode(f).decode() for f in files]
    tensor = {"name": "image", "shape": [2], "datatype": "BYTES", "data": b64}
    answer = httpx.post(url, json={"inputs": [tensor]}, timeout=20.0)
    assert answer.status_code == 200, answer.text
    out = answer.json()["outputs"][0]
    np.testing.assert_allclose(np.reshape(out["data"], out["shape"]), expected, rtol=1e-4, atol=1e-4)
    raw = b"".join(len(f).to_bytes(4, "little") + f for f in files)
    params = {"binary_data_size": len(raw)}
    binary_tensor = {"name": "image", "shape": [2], "datatype": "BYTES", "parameters": params}
    header = json.dumps({"inputs": [binary_tensor]}).encode()
    binary = httpx.post(
        url, content=header + raw, headers={"Inference-Header-Content-Length": str(len(header))}, timeout=20.0
    )
    assert binary.status_code == 200, binary.text
    np.testing.assert_array_equal(binary.json()["outputs"][0]["data"], out["data"])
    corrupt = {**tensor, "shape": [1], "data": [base64.b64encode(files[0][:60]).decode()]}
    refused = httpx.post(url, json={"inputs": [corrupt]}, timeout=20.0)
    assert refused.status_code == 400
    assert "'image': element 0 is not a PNG or JPEG image" in refused.json()["error"]


def test_a_model_of_two_inputs_and_two_outputs_is_served_by_name(cluster):
    import torch

    session, _ = cluster
    url = f"{session.url}/v2/models/tok-app"
    meta = httpx.get(url, timeout=20.0).json()
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("input_ids", "INT64", [-1, 8]),
        ("attention_mask", "INT64", [-1, 8]),
    ]
    assert [t["name"] for t in meta["outputs"]] == ["logits", "pooled"]
    values = examples.token_inputs(3, seed=9)
    with torch.no_grad():
        logits, pooled = examples.token_module()(*(torch.from_numpy(values[k]) for k in values))
    inputs = [
        {"name": k, "shape": list(v.shape), "datatype": "INT64", "data": v.ravel().tolist()}
        for k, v in reversed(values.items())
    ]
    both = httpx.post(f"{url}/infer", json={"inputs": inputs}, timeout=20.0)
    assert both.status_code == 200, both.text
    (got_logits, got_pooled) = both.json()["outputs"]
    assert (got_logits["name"], got_pooled["name"]) == ("logits", "pooled")
    np.testing.assert_allclose(np.reshape(got_logits["data"], (3, 3)), logits.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.reshape(got_pooled["data"], (3, 4)), pooled.numpy(), rtol=1e-5, atol=1e-5)
    one = httpx.post(f"{url}/infer", json={"inputs": inputs, "outputs": [{"name": "pooled"}]}, timeout=20.0)
    assert [o["name"] for o in one.json()["outputs"]] == ["pooled"]
    missing = httpx.post(f"{url}/infer", json={"inputs": inputs[:1]}, timeout=20.0)
    assert missing.status_code == 400 and "needs input(s) 'input_ids'" in missing.json()["error"]
    mistyped = [{**inputs[0], "datatype": "FP32"}, inputs[1]]
    refused = httpx.post(f"{url}/infer", json={"inputs": mistyped}, timeout=20.0)
    assert refused.status_code == 400 and "'attention_mask': datatype 'FP32'" in refused.json()["error"]


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
