"""``failsoft bench llm-engine``: the engine's decode throughput against ``transformers``' own.

On one tiny random-weight Llama (built from a config, nothing downloaded), with the same torch
threads for everything, three timings of the same greedy work (``new_tokens`` tokens after a
``prompt_tokens``-token prompt, EOS never ends a request early):

- ``generate_b1``: ``model.generate(do_sample=False)`` at batch 1, the reference;
- ``engine_b1``: the engine (paged KV cache, one request);
- ``engine_b{batch}``: the engine with ``batch`` requests submitted at once (continuous batching);
- ``generate_b{batch}``: ``generate`` on the same batch, for context.

Each is run ``repeats`` times, interleaved (so a busy machine slows them alike), and its median
tokens per second is reported with the two ratios the engine is held to: batch-1 tokens/s within
1.3x of ``generate``'s, and ``batch`` concurrent requests at least 3x the engine's batch-1 tokens/s.
The engine's batch-1 output is checked against ``generate``'s (``identical``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from failsoft.errors import ConfigError


@dataclass(frozen=True)
class EngineBenchSettings:
    hidden: int = 64
    layers: int = 2
    vocab: int = 320
    prompt_tokens: int = 32
    new_tokens: int = 64
    batch: int = 8
    repeats: int = 5
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "hidden",
            "layers",
            "vocab",
            "prompt_tokens",
            "new_tokens",
            "batch",
            "repeats",
            "threads",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"bench llm-engine: {name} must be >= 1; got {getattr(self, name)!r}")
        if self.hidden % 4:
            raise ConfigError(f"bench llm-engine: hidden must be a multiple of 4 heads; got {self.hidden}")


def tiny_llama(s: EngineBenchSettings) -> Any:
    """The random Llama of the settings, with no EOS (every request runs to ``new_tokens``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        intermediate_size=2 * s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=s.prompt_tokens + s.new_tokens + 8,
        initializer_range=0.3,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(s.seed)
    return LlamaForCausalLM(config).eval()


def run(settings: EngineBenchSettings | None = None) -> dict[str, Any]:
    """Time the four ways of decoding; return the settings, tokens/s per way and the ratios."""
    import torch

    from failsoft.llm import Engine, SamplingParams
    from failsoft.llm.models import wrap

    s = settings or EngineBenchSettings()
    was = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    try:
        model = tiny_llama(s)
        lm = wrap("bench-tiny-llama", model, "cpu", "bench-tiny-llama")
        gen = torch.Generator().manual_seed(s.seed)
        prompts = torch.randint(1, s.vocab, (s.batch, s.prompt_tokens), generator=gen)
        params = SamplingParams(max_tokens=s.new_tokens, stop_at_eos=False)
        pages = s.batch * (-(-(s.prompt_tokens + s.new_tokens) // 16)) + 1
        engine = Engine(lm, kv_pages=pages, page_size=16, max_batch=s.batch)
        outputs: dict[str, list[int]] = {}

        def generate(n: int) -> None:
            ids = prompts[:n]
            with torch.inference_mode():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=s.new_tokens,
                    min_new_tokens=s.new_tokens,
                )
            outputs[f"generate_b{n}"] = out[0, s.prompt_tokens :].tolist()

        def engine_run(n: int) -> None:
            reqs = [engine.submit(prompts[i].tolist(), params) for i in range(n)]
            engine.run()
            outputs[f"engine_b{n}"] = reqs[0].output

        ways: dict[str, tuple[int, Callable[[], None]]] = {
            "generate_b1": (1, lambda: generate(1)),
            "engine_b1": (1, lambda: engine_run(1)),
            f"engine_b{s.batch}": (s.batch, lambda: engine_run(s.batch)),
            f"generate_b{s.batch}": (s.batch, lambda: generate(s.batch)),
        }
        for _, fn in ways.values():  # warm-up: first calls allocate
            fn()
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(s.repeats):
            for name, (_, fn) in ways.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(was)
    tps = {name: round(n * s.new_tokens / statistics.median(times[name]), 1) for name, (n, _) in ways.items()}
    b1_ratio = tps["generate_b1"] / tps["engine_b1"]
    batch_gain = tps[f"engine_b{s.batch}"] / tps["engine_b1"]
    return {
        "benchmark": "llm-engine",
        "settings": asdict(s),
        "tokens_per_s": tps,
        "seconds": {name: [round(t, 4) for t in ts] for name, ts in times.items()},
        "generate_over_engine_b1": round(b1_ratio, 3),
        f"engine_b{s.batch}_over_b1": round(batch_gain, 3),
        "targets": {"b1_within_1_3x": b1_ratio <= 1.3, f"b{s.batch}_at_least_3x": batch_gain >= 3.0},
        "identical": outputs["engine_b1"] == outputs["generate_b1"],
        "parameters": sum(p.numel() for p in model.parameters()),
    }
