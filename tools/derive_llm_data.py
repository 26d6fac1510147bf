"""Derive the LUMEN simulator's shipped data (src/failsoft/data/llm/) from the shared LLM data.

Run once from the repository root with the shared data folder as the argument:

    python tools/derive_llm_data.py /path/to/shared/data/llm

It writes:

* ``step_times.csv`` (``kind,x,time_ms``): Llama-2-70B, tensor-parallel 4, H100-80GB, measured by
  Splitwise (``perf_model.csv``). ``prefill`` rows: x = prompt tokens in the iteration (prompt size x
  batch size), time = mean ``prompt_time``; ``decode`` rows: x = batch size, time = mean
  ``token_time`` at prompt 512; ``draft_ratio`` row: the MLP/projection time of Llama-2-7B (TP 1,
  32 layers) over Llama-2-70B (TP 4, 80 layers) per decode token, from Vidur's H100 ``mlp.csv``
  profiles, averaged over 1..64 tokens (the draft model's step cost relative to the target's).
* ``azure_conv.csv`` / ``azure_code.csv`` (``arrival_s,prompt_tokens,output_tokens``): the first 15
  minutes of the Azure LLM inference 2023 conversation and code traces, arrivals from 0.
* ``sharegpt.csv`` (``prompt_tokens,output_tokens``): the first 4000 rows of the ShareGPT length
  statistics (sarathi-serve).
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

OUT = Path("src/failsoft/data/llm")
WINDOW_S = 900.0
SHAREGPT_ROWS = 4000
_OPS = (
    "attn_pre_proj",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "input_layernorm",
    "post_attention_layernorm",
    "attn_rope",
    "add",
)


def step_times(root: Path) -> list[tuple[str, float, float]]:
    prefill: dict[int, list[float]] = defaultdict(list)
    decode: dict[int, list[float]] = defaultdict(list)
    with (root / "traces/splitwise_sim/perf_model.csv").open() as fh:
        for r in csv.DictReader(fh):
            if (r["model"], r["hardware"], r["tensor_parallel"]) != ("llama2-70b", "h100-80gb", "4"):
                continue
            prompt, batch = int(r["prompt_size"]), int(r["batch_size"])
            prefill[prompt * batch].append(float(r["prompt_time"]))
            if prompt == 512:
                decode[batch].append(float(r["token_time"]))
    rows = [("prefill", float(x), sum(v) / len(v)) for x, v in sorted(prefill.items())]
    rows += [("decode", float(x), sum(v) / len(v)) for x, v in sorted(decode.items())]
    rows.append(("draft_ratio", 0.0, _draft_ratio(root)))
    return rows


def _layer_ms(path: Path, tp: int) -> dict[int, float]:
    out: dict[int, float] = {}
    with path.open() as fh:
        for r in csv.DictReader(fh):
            if int(r["num_tensor_parallel_workers"]) == tp and int(r["num_tokens"]) <= 64:
                out[int(r["num_tokens"])] = sum(float(r[f"time_stats.{op}.mean"]) for op in _OPS)
    return out


def _draft_ratio(root: Path) -> float:
    base = root / "vidur/data/profiling/compute/h100/meta-llama"
    draft = _layer_ms(base / "Llama-2-7b-hf/mlp.csv", 1)
    target = _layer_ms(base / "Llama-2-70b-hf/mlp.csv", 4)
    shared = sorted(set(draft) & set(target))
    ratios = [32 * draft[n] / (80 * target[n]) for n in shared]
    return sum(ratios) / len(ratios)


def azure(path: Path) -> list[tuple[float, int, int]]:
    rows = []
    start = None
    with path.open() as fh:
        for r in csv.DictReader(fh):
            t = datetime.fromisoformat(r["TIMESTAMP"][:26])
            start = start or t
            at = (t - start).total_seconds()
            if at > WINDOW_S:
                break
            rows.append((round(at, 3), int(r["ContextTokens"]), int(r["GeneratedTokens"])))
    return rows


def main(root: Path) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "step_times.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["kind", "x", "time_ms"])
        w.writerows((k, f"{x:g}", f"{t:.3f}") for k, x, t in step_times(root))
    for name in ("conv", "code"):
        with (OUT / f"azure_{name}.csv").open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["arrival_s", "prompt_tokens", "output_tokens"])
            w.writerows(azure(root / f"traces/azure_llm_2023/AzureLLMInferenceTrace_{name}.csv"))
    with (
        (root / "traces/sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv").open() as src,
        (OUT / "sharegpt.csv").open("w", newline="") as fh,
    ):
        w = csv.writer(fh)
        w.writerow(["prompt_tokens", "output_tokens"])
        for i, r in enumerate(csv.DictReader(src)):
            if i >= SHAREGPT_ROWS:
                break
            w.writerow([r["num_prefill_tokens"], r["num_decode_tokens"]])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
