"""The SDK's classification extension and answer parameters, against a real HTTP server on 127.0.0.1.

The server here is a plain ``http.server`` that parses requests and builds answers with the gateway's
own protocol functions (``failsoft.runtime.gateway.protocol``) around a fixed linear model, so the
client is tested against the wire format the gateway serves without starting a cluster. (The whole
path through a live gateway is covered by the runtime tests.)
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import numpy as np
import pytest

from failsoft.cli import main
from failsoft.cli.infer import describe
from failsoft.client import AsyncClient, Client, parse_classification
from failsoft.errors import ConfigError, InvalidRequestError
from failsoft.runtime.gateway.protocol import ModelMeta, infer_response, parse_infer_request

WEIGHTS = np.random.default_rng(7).normal(size=(64, 10)).astype(np.float32)
META = ModelMeta((64,), 10)
SERVED = {"variant": "mlp_xs", "server": "c1", "degraded": True, "reconstructed": True, "dropped": False}


class _Handler(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        length = self.headers.get("Inference-Header-Content-Length")
        try:
            request = parse_infer_request(body, "cam-1", META, 64, int(length) if length else None)
        except InvalidRequestError as exc:
            return self._send(exc.status, {"error": str(exc)})
        self.seen.append(json.loads(body[: int(length)] if length else body))
        answer = infer_response("cam-1", request.batch @ WEIGHTS, request, {**SERVED, "attempts": 2})
        return self._send(200, answer)

    def _send(self, status: int, doc: dict) -> None:
        raw = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Handler.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _expected_top(batch: np.ndarray, k: int) -> list[list[int]]:
    return np.argsort(-(batch @ WEIGHTS), axis=1, kind="stable")[:, :k].tolist()


def test_classification_answers_each_rows_top_k_with_scores(gateway):
    batch = np.random.default_rng(1).random((5, 64), dtype=np.float32)
    with Client(gateway) as client:
        result = client.infer("cam-1", batch, classification=3)
    assert _Handler.seen[0]["outputs"] == [{"name": "output", "parameters": {"classification": 3}}]
    assert result.outputs is None
    assert [[i for i, _ in row] for row in result.classes] == _expected_top(batch, 3)
    logits = batch @ WEIGHTS
    for r, row in enumerate(result.classes):
        assert [s for _, s in row] == pytest.approx([logits[r, i] for i, _ in row], abs=1e-5)
    assert result.predictions.tolist() == [row[0] for row in _expected_top(batch, 1)]
    assert (result.server, result.variant, result.degraded) == ("c1", "mlp_xs", True)
    assert result.reconstructed is True and result.dropped is False and result.attempts == 2


def test_without_classification_the_logits_come_back(gateway):
    batch = np.random.default_rng(2).random((2, 64), dtype=np.float32)
    with Client(gateway) as client:
        result = client.infer("cam-1", batch)
    assert "outputs" not in _Handler.seen[0]
    assert result.classes is None
    np.testing.assert_allclose(result.outputs, batch @ WEIGHTS, rtol=1e-5)


def test_big_batches_travel_as_binary_with_classification(gateway):
    batch = np.random.default_rng(3).random((64, 64), dtype=np.float32)  # 4096 values: binary
    with Client(gateway) as client:
        result = client.infer("cam-1", batch, classification=2)
    assert _Handler.seen[0]["outputs"][0]["parameters"] == {"classification": 2}
    assert [[i for i, _ in row] for row in result.classes] == _expected_top(batch, 2)


def test_the_async_client_asks_the_same(gateway):
    batch = np.random.default_rng(4).random((3, 64), dtype=np.float32)

    async def ask():
        async with AsyncClient(gateway) as client:
            return await client.infer("cam-1", batch, classification=4)

    result = asyncio.run(ask())
    assert [[i for i, _ in row] for row in result.classes] == _expected_top(batch, 4)


def test_a_refused_classification_count_is_the_gateways_message(gateway):
    with Client(gateway) as client, pytest.raises(InvalidRequestError, match="classification"):
        client.infer("cam-1", np.zeros(64, np.float32), classification=11)  # the app has 10 classes


@pytest.mark.parametrize("k", [0, -1, True, 2.5])
def test_a_bad_classification_count_is_refused_before_sending(gateway, k):
    with Client(gateway) as client, pytest.raises(ConfigError, match="classification"):
        client.infer("cam-1", np.zeros(64, np.float32), classification=k)
    assert _Handler.seen == []


def test_parse_classification_reads_tritons_strings_and_labels():
    output = {"datatype": "BYTES", "shape": [2, 2], "data": ["3.5:7", "-1.25:2", "0.5:0:zero", "0.25:9:nine"]}
    assert parse_classification(output) == (((7, 3.5), (2, -1.25)), ((0, 0.5), (9, 0.25)))
    with pytest.raises(ValueError, match="shape"):
        parse_classification({"datatype": "BYTES", "shape": [2, 2], "data": ["1:1"]})


def test_failsoft_infer_prints_who_answered_and_the_top_classes(gateway, capsys):
    code = main(["infer", "cam-1", "--digits", "5", "--top", "2", "--url", gateway])
    out, err = capsys.readouterr()
    assert code == 0, err
    from failsoft.zoo.digits import load_digits_split

    split = load_digits_split()
    best = _expected_top(split.x_test[5:6], 2)[0]
    lines = out.splitlines()
    assert lines[0].startswith("cam-1: answered by c1/mlp_xs in ")
    assert "attempts 2" in lines[1] and "degraded yes" in lines[1]
    assert "reconstructed yes" in lines[2] and "dropped no" in lines[2]
    assert lines[3].startswith(f"  row 0: {best[0]} (") and f"  {best[1]} (" in lines[3]
    assert f"label {split.y_test[5]}" in lines[3]


def test_failsoft_infer_sends_a_npy_file_and_a_request_body(gateway, capsys, tmp_path):
    batch = np.random.default_rng(5).random((2, 64), dtype=np.float32)
    np.save(tmp_path / "x.npy", batch)
    assert main(["infer", "cam-1", "--input", str(tmp_path / "x.npy"), "--url", gateway, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["outputs"][0]["shape"] == [2, 3]
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": batch[0].tolist()}]}
    (tmp_path / "r.json").write_text(json.dumps(body))
    assert main(["infer", "cam-1", "--input", str(tmp_path / "r.json"), "--url", gateway]) == 0
    assert f"row 0: {_expected_top(batch[:1], 1)[0][0]} (" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--input", "{tmp}/none.npy"], "cannot read input"),
        (["--input", "{tmp}/x.npy", "--digits", "1"], "not both"),
        (["--input", "{tmp}/bad.json"], "is not a KServe v2 request"),
    ],
)
def test_failsoft_infer_refuses_bad_input_in_one_line(capsys, tmp_path, argv, message):
    np.save(tmp_path / "x.npy", np.zeros(64, np.float32))
    (tmp_path / "bad.json").write_text('{"inputs": []}')
    code = main(["infer", "cam-1", *[a.format(tmp=tmp_path) for a in argv], "--url", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_describe_ranks_logits_when_the_gateway_sends_no_classes():
    class Answer:
        app, server, variant, latency_ms, kind, attempts = "ocr-1", "a1", "mlp_l", 1.0, None, 1
        degraded = reconstructed = dropped = False
        classes = None
        outputs = np.array([[0.1, 2.0, -1.0, 0.5]], np.float32)

    lines = describe(Answer(), [1], top=2)
    assert lines[-1] == "  row 0: 1 (2)  3 (0.5)   label 1: right"


class _Dropping(_Handler):
    """Answers every request as an slo service answers a frame it shed (the gateway's own
    ``infer_response`` with no outputs)."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = parse_infer_request(body, "cam-1", META, 64, None)
        params = {**SERVED, "dropped": True, "drop_reason": "deadline"}
        return self._send(200, infer_response("cam-1", None, request, params))


def test_a_shed_frame_is_a_dropped_answer_not_a_malformed_one_nor_a_failed_request():
    from failsoft.runtime.loadgen import LoadSpec, _one

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dropping)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with Client(url) as client:
            result = client.infer("cam-1", np.zeros((1, 64), np.float32))
        assert result.dropped is True and result.outputs is None and result.server == "c1"
        said = describe(result, [3])
        assert "dropped yes" in said[2] and len(said) == 3  # no rows: nothing was computed

        async def sample() -> list:
            out: list = []
            async with AsyncClient(url) as client:
                await _one(client, "cam-1", np.zeros(64, np.float32), 3, LoadSpec(url, {"cam-1": (64,)}), out)
            return out

        (recorded,) = asyncio.run(sample())
        assert recorded.dropped and not recorded.ok and recorded.error == "dropped: deadline"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
