"""The serving benchmark's anchor: a plain FastAPI app over the same model, as a user would write it.

No queue, no batching, no deadlines, no failover: read the body, decode the tensor (KServe v2 JSON,
or the binary tensor extension's raw bytes after ``Inference-Header-Content-Length`` bytes of JSON),
call ``predict``, answer the logits as JSON. Run in a process of its own by uvicorn on 127.0.0.1::

    python -m failsoft.bench.serving_anchor REPOSITORY FAMILY VARIANT PORT TORCH_THREADS

It loads the variant from the same model repository as failsoft's agents, with the same torch
threads, so the two systems differ only in what stands between the client and ``predict``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
from fastapi import FastAPI, Request, Response  # at module level: FastAPI reads the handler's annotations


def decode_infer(body: bytes, header_length: str | None) -> np.ndarray:
    """The request's first input tensor: KServe v2 JSON (``data``), or, with the binary tensor
    extension, the raw little-endian float32 bytes after ``header_length`` bytes of JSON. Every
    anchor decodes with this, so that they differ only in the server around it."""
    head = body if header_length is None else body[: int(header_length)]
    tensor = json.loads(head)["inputs"][0]
    if header_length is None:
        return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
    return np.frombuffer(body[int(header_length) :], dtype="<f4").reshape(tensor["shape"])


def encode_answer(name: str, out: np.ndarray) -> bytes:
    """The logits as a KServe v2 JSON answer."""
    answer = {
        "model_name": name,
        "outputs": [
            {"name": "output", "datatype": "FP32", "shape": list(out.shape), "data": out.ravel().tolist()}
        ],
    }
    return json.dumps(answer).encode()


def make_app(model: Any) -> FastAPI:
    app = FastAPI()

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request) -> Response:
        batch = decode_infer(await request.body(), request.headers.get("inference-header-content-length"))
        return Response(encode_answer(name, model.predict(batch)), media_type="application/json")

    return app


def main(argv: list[str]) -> None:
    import torch
    import uvicorn

    from failsoft.zoo import ModelRepository

    repository, family, variant, port, threads = argv
    torch.set_num_threads(int(threads))
    model = ModelRepository(repository).load(family, variant)
    uvicorn.run(make_app(model), host="127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
