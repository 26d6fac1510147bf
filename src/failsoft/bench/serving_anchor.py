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


def make_app(model: Any) -> FastAPI:
    app = FastAPI()

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request) -> Response:
        body = await request.body()
        header_length = request.headers.get("inference-header-content-length")
        head = body if header_length is None else body[: int(header_length)]
        tensor = json.loads(head)["inputs"][0]
        if header_length is None:
            batch = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        else:
            batch = np.frombuffer(body[int(header_length) :], dtype="<f4").reshape(tensor["shape"])
        out = model.predict(batch)
        answer = {
            "model_name": name,
            "outputs": [
                {"name": "output", "datatype": "FP32", "shape": list(out.shape), "data": out.ravel().tolist()}
            ],
        }
        return Response(json.dumps(answer), media_type="application/json")

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
