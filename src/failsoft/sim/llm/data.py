"""The shipped LLM data (``failsoft/data/llm``, see its PROVENANCE.md) and what is derived from it.

* :class:`StepTimes`: iteration times of Llama-2-70B on 4 H100s (tensor-parallel 4), measured by
  Splitwise: ``prefill_ms(tokens)`` (9 points, 128..32768 prompt tokens in one iteration) and
  ``decode_ms(batch)`` (7 points, batch 1..64), interpolated linearly between the points and
  extrapolated from the last two; and ``draft_ratio``, a Llama-2-7B decode step over a Llama-2-70B
  one, from Vidur's H100 operator profiles (0.386: both are weight-bandwidth bound at these batches).
* :func:`load_trace`: request arrivals and lengths, the Azure LLM inference 2023 conversation or code
  trace (first 15 minutes) or ShareGPT lengths with the conversation trace's arrival times.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from importlib import resources

import numpy as np

from failsoft.errors import ConfigError

WORKLOADS = ("conv", "code", "sharegpt")


def _rows(name: str) -> list[dict[str, str]]:
    text = resources.files("failsoft").joinpath(f"data/llm/{name}").read_text()
    return list(csv.DictReader(text.splitlines()))


def _interp(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    if x <= xs[-1]:
        return float(np.interp(x, xs, ys))
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return float(ys[-1] + slope * (x - xs[-1]))


@dataclass(frozen=True)
class StepTimes:
    prefill_x: np.ndarray
    prefill_ms_: np.ndarray
    decode_x: np.ndarray
    decode_ms_: np.ndarray
    draft_ratio: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "_memo", {})

    def prefill_ms(self, tokens: float) -> float:
        key = ("p", tokens)
        memo: dict[tuple[str, float], float] = self._memo  # type: ignore[attr-defined]
        if key not in memo:
            memo[key] = _interp(tokens, self.prefill_x, self.prefill_ms_)
        return memo[key]

    def decode_ms(self, batch: float) -> float:
        key = ("d", batch)
        memo: dict[tuple[str, float], float] = self._memo  # type: ignore[attr-defined]
        if key not in memo:
            memo[key] = _interp(batch, self.decode_x, self.decode_ms_)
        return memo[key]

    def step_ms(self, prefill_tokens: int, batch: int) -> float:
        """One continuous-batching iteration: ``batch`` decoding requests plus ``prefill_tokens``
        prompt tokens. A mixed iteration costs a prefill of all its tokens (linear layers dominate,
        as Sarathi-Serve observes), never less than the decode step of its batch."""
        if prefill_tokens <= 0:
            return self.decode_ms(batch) if batch else 0.0
        return max(self.decode_ms(batch) if batch else 0.0, self.prefill_ms(prefill_tokens + batch))

    def verify_ms(self, batch: int, draft_tokens: int) -> float:
        """The target verifying ``draft_tokens`` drafts (plus its own token) of ``batch`` requests."""
        return max(self.decode_ms(batch), self.prefill_ms(batch * (draft_tokens + 1)))


@functools.cache
def step_times() -> StepTimes:
    rows = _rows("step_times.csv")
    prefill = sorted((float(r["x"]), float(r["time_ms"])) for r in rows if r["kind"] == "prefill")
    decode = sorted((float(r["x"]), float(r["time_ms"])) for r in rows if r["kind"] == "decode")
    ratio = next(float(r["time_ms"]) for r in rows if r["kind"] == "draft_ratio")
    return StepTimes(
        np.array([x for x, _ in prefill]),
        np.array([t for _, t in prefill]),
        np.array([x for x, _ in decode]),
        np.array([t for _, t in decode]),
        ratio,
    )


@functools.cache
def load_trace(workload: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival_s, prompt_tokens, output_tokens) of ``workload`` (conv, code or sharegpt)."""
    if workload not in WORKLOADS:
        raise ConfigError(f"unknown LLM workload {workload!r} (known: {', '.join(WORKLOADS)})")
    conv = _rows("azure_conv.csv")
    arrivals = np.array([float(r["arrival_s"]) for r in conv])
    if workload == "sharegpt":
        share = _rows("sharegpt.csv")
        n = min(len(share), len(conv))
        prompt = np.array([int(r["prompt_tokens"]) for r in share[:n]])
        output = np.array([int(r["output_tokens"]) for r in share[:n]])
        return arrivals[:n], prompt, output
    rows = conv if workload == "conv" else _rows("azure_code.csv")
    return (
        np.array([float(r["arrival_s"]) for r in rows]),
        np.array([int(r["prompt_tokens"]) for r in rows]),
        np.array([int(r["output_tokens"]) for r in rows]),
    )


def capacity_per_worker(workload: str, max_batch: int = 64) -> float:
    """Requests/s one worker serves at full batches, estimated from the step times: a request costs
    the prefill of its prompt (averaged over the trace's prompts, clipped at 8192 tokens) plus its
    output's share of full-batch decode steps."""
    _, prompt, output = load_trace(workload)
    steps = step_times()
    prefill_s = sum(steps.prefill_ms(float(min(p, 8192))) for p in prompt) / len(prompt) / 1000
    decode_s = float(output.mean()) * steps.decode_ms(max_batch) / 1000 / max_batch
    return 1.0 / (prefill_s + decode_s)
