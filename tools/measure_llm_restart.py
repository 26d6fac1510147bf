"""Where a restarted LLM worker's time goes: Ray actor process start, imports, model load, engine.

    PYTHONPATH=src python tools/measure_llm_restart.py [--size tiny] [--repeats 3]

Each repeat spawns a fresh actor (a new worker process, as ``LlmSession.restart_worker`` does)
and times, inside it, the imports of torch, transformers and failsoft.llm, then ``load_lm`` of the
target and the draft and the engine's construction; the spawn is timed from the driver (the call
to the first answer of an actor that has imported nothing). Prints one JSON line per repeat and
the means.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


class _Probe:
    def ping(self) -> float:
        return time.perf_counter()

    def measure(self, root: str, size: str) -> dict[str, float]:
        out: dict[str, float] = {}
        t = time.perf_counter()
        import torch

        out["import_torch_ms"] = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        import transformers  # noqa: F401
        from transformers import LlamaForCausalLM  # noqa: F401  (the lazy module's real import)

        out["import_transformers_ms"] = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        from failsoft.llm import Engine
        from failsoft.llm.models import load_lm

        out["import_failsoft_llm_ms"] = (time.perf_counter() - t) * 1000
        torch.set_num_threads(1)
        t = time.perf_counter()
        lm = load_lm(root, f"{size}-target", "cpu")
        out["load_target_ms"] = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        load_lm(root, f"{size}-draft", "cpu")
        out["load_draft_ms"] = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        Engine(lm, 128, 16, 8)
        out["engine_ms"] = (time.perf_counter() - t) * 1000
        return out


def main() -> None:
    import ray

    from failsoft.llm.models import build_pair, default_llm_path
    from failsoft.runtime.cluster import NAMESPACE, RayCluster

    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    root = str(default_llm_path())
    build_pair(root, args.size, "cpu")
    cluster = RayCluster((), None, 2)
    cluster.start()
    rows: list[dict[str, Any]] = []
    try:
        for i in range(args.repeats):
            t0 = time.perf_counter()
            actor = ray.remote(_Probe).options(num_cpus=0, namespace=NAMESPACE).remote()  # type: ignore[attr-defined]
            ray.get(actor.ping.remote())
            row: dict[str, Any] = {"repeat": i, "spawn_ms": (time.perf_counter() - t0) * 1000}
            row.update(ray.get(actor.measure.remote(root, args.size)))
            row["total_ms"] = (time.perf_counter() - t0) * 1000
            rows.append({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()})
            print(json.dumps(rows[-1]), flush=True)
            ray.kill(actor)
    finally:
        cluster.shutdown()
    keys = [k for k in rows[0] if k != "repeat"]
    print(json.dumps({"mean": {k: round(sum(r[k] for r in rows) / len(rows), 1) for k in keys}}))


if __name__ == "__main__":
    main()
