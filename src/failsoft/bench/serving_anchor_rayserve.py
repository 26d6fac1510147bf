"""The serving benchmark's Ray Serve anchor: one replica over the same model, as a Ray Serve user writes it.

A Ray Serve deployment (one replica) behind Ray Serve's HTTP proxy on 127.0.0.1, answering KServe v2
infer requests (JSON, or the binary tensor extension) with the FastAPI anchor's decoding and answer
(:func:`failsoft.bench.serving_anchor.decode_infer`, :func:`~failsoft.bench.serving_anchor.encode_answer`),
so that the anchors differ only in the server around ``predict``. Without ``--max-batch-size`` every
request calls ``predict`` alone; with it, requests are gathered by ``@serve.batch`` (up to that many,
waiting at most ``--batch-wait-timeout-s`` for more) and answered from one ``predict``. Run as::

    python -m failsoft.bench.serving_anchor_rayserve REPOSITORY FAMILY VARIANT PORT TORCH_THREADS \\
        [--max-batch-size N --batch-wait-timeout-s S] [--max-ongoing-requests N]

This is the system failsoft is compared with, not a part of failsoft: it starts a Ray instance of its
own in this process (``address="local"``, on 127.0.0.1, no dashboard), never the one failsoft serves
on, and stops Serve and that instance on SIGTERM or SIGINT. The benchmark starts it, waits for an
answer and stops it (:mod:`failsoft.bench.serving_anchor_process`). Its Ray workers (the proxy, the
controller, the replica) run at nice 0, as failsoft's agents do, rather than at Ray's default 15.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any

import numpy as np
from ray import serve  # the module runs only where Ray Serve is: the anchor's process, its workers
from starlette.requests import Request
from starlette.responses import Response

from failsoft.bench.serving_anchor import decode_infer, encode_answer

APP_NAME = "failsoft-anchor"
HEADER = "inference-header-content-length"


def _model_name(path: str) -> str:
    """``/v2/models/NAME/infer`` -> ``NAME`` (the answer names the model it was asked for)."""
    parts = path.strip("/").split("/")
    return parts[2] if len(parts) == 4 and parts[:2] == ["v2", "models"] else "model"


class _Replica:
    """The model, loaded once per replica at the benchmark's torch threads."""

    def __init__(self, repository: str, family: str, variant: str, threads: int) -> None:
        import torch

        from failsoft.zoo import ModelRepository

        torch.set_num_threads(threads)
        self.model = ModelRepository(repository).load(family, variant)


class Plain(_Replica):
    """Every request its own ``predict``."""

    async def __call__(self, request: Request) -> Response:
        batch = decode_infer(await request.body(), request.headers.get(HEADER))
        answer = encode_answer(_model_name(request.url.path), self.model.predict(batch))
        return Response(answer, media_type="application/json")


class Batched(_Replica):
    """Requests gathered by ``@serve.batch`` into one ``predict``; the batch's limits are set when
    the replica starts (``set_max_batch_size``, ``set_batch_wait_timeout_s``: Ray Serve's own knobs)."""

    def __init__(
        self,
        repository: str,
        family: str,
        variant: str,
        threads: int,
        max_batch_size: int,
        batch_wait_timeout_s: float,
    ) -> None:
        super().__init__(repository, family, variant, threads)
        self.predict_many.set_max_batch_size(max_batch_size)  # type: ignore[attr-defined]
        self.predict_many.set_batch_wait_timeout_s(batch_wait_timeout_s)  # type: ignore[attr-defined]

    @serve.batch
    async def predict_many(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        out = self.model.predict(np.concatenate(batches))
        return np.split(out, np.cumsum([len(b) for b in batches])[:-1])

    async def __call__(self, request: Request) -> Response:
        batch = decode_infer(await request.body(), request.headers.get(HEADER))
        out = await self.predict_many(batch)
        return Response(encode_answer(_model_name(request.url.path), out), media_type="application/json")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m failsoft.bench.serving_anchor_rayserve")
    parser.add_argument("repository")
    parser.add_argument("family")
    parser.add_argument("variant")
    parser.add_argument("port", type=int)
    parser.add_argument("threads", type=int)
    parser.add_argument("--max-batch-size", type=int, default=None, help="batch with @serve.batch")
    parser.add_argument("--batch-wait-timeout-s", type=float, default=0.002)
    parser.add_argument("--max-ongoing-requests", type=int, default=64)
    return parser.parse_args(argv)


def application(args: argparse.Namespace) -> Any:
    """The Serve application: one replica of :class:`Plain` or :class:`Batched`."""
    model = (args.repository, args.family, args.variant, args.threads)
    options = {"num_replicas": 1, "max_ongoing_requests": args.max_ongoing_requests}
    if args.max_batch_size is None:
        return serve.deployment(name="plain", **options)(Plain).bind(*model)
    deployment = serve.deployment(name="batched", **options)(Batched)
    return deployment.bind(*model, args.max_batch_size, args.batch_wait_timeout_s)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_worker_niceness", "0")  # read by the raylet this ray.init starts
    import ray

    from failsoft.runtime.cluster import OBJECT_STORE_BYTES, _loopback_bootstrap

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with _loopback_bootstrap(None):  # keeps every Ray server on 127.0.0.1 (see there)
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            object_store_memory=OBJECT_STORE_BYTES,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        serve.run(application(args), name=APP_NAME, route_prefix="/", blocking=False)
        print(f"ray-serve anchor ready on 127.0.0.1:{args.port}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
