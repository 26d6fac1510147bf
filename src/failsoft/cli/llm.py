"""``failsoft llm``: build the LUMEN target/draft pair, and generate with the engine.

``build`` trains and stores a size's pair (idempotent; ``tiny`` in seconds, ``small``, the default,
in minutes on a CPU) and prints what it measured as JSON: held-out bits per byte of each model and
the draft's greedy acceptance rate. ``generate`` streams one prompt's tokens and prints TTFT, time
per output token and, with ``--draft-tokens``, the speculative acceptance; ``--model DIR`` serves a
local Hugging Face causal LM instead of the pair (``--draft-model DIR`` its draft, ``--chat`` the
prompt through its chat template). An ``llm`` service is served by ``failsoft serve`` (a config
with a ``mode: llm`` service, ``examples/llm.yaml``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Build and run the LLM pair LUMEN serves.", no_args_is_help=True)

RootArg = Annotated[
    Path | None, typer.Argument(help="Repository root (default: $FAILSOFT_LLM or ~/.cache/failsoft/llm)")
]
SizeOpt = Annotated[str, typer.Option("--size", "-s", help="tiny (tests) or small (default)")]
DeviceOpt = Annotated[str | None, typer.Option(help="cpu, cuda, cuda:1 ... (default: cuda if available)")]


@app.command("build")
def build(root: RootArg = None, size: SizeOpt = "small", device: DeviceOpt = None) -> None:
    """Train and store the target and draft models of one size; print what was measured."""
    from failsoft.llm.models import build_pair

    typer.echo(json.dumps(build_pair(root, size, device), indent=2))


@app.command("build-hf")
def build_hf(
    out: Annotated[Path, typer.Argument(help="Directory to write target/ and draft/ into")],
    arch: Annotated[str, typer.Option(help="llama or qwen2")] = "llama",
    hidden: Annotated[int, typer.Option(min=16, max=16384)] = 512,
    layers: Annotated[int, typer.Option(min=2, max=256)] = 16,
    heads: Annotated[int, typer.Option(min=1, max=256)] = 8,
    kv_heads: Annotated[int, typer.Option(min=1, max=256)] = 4,
    intermediate: Annotated[int, typer.Option(min=16, max=65536)] = 1536,
    vocab: Annotated[int, typer.Option(min=300, max=262144, help="BPE tokens trained on the corpus")] = 4096,
    context: Annotated[int, typer.Option(min=16, max=131072)] = 256,
    draft_layers: Annotated[int, typer.Option(min=1, max=255, help="The draft's depth")] = 2,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """A local Hugging Face causal LM (random weights, a BPE tokenizer trained here, a chat
    template) of a chosen size, and its draft with the same tokenizer (docs/lumen.md); JSON."""
    from typing import Any, cast

    from failsoft.llm.hfbuild import HfBuild, build_hf_pair

    build = HfBuild(
        cast(Any, arch),
        hidden,
        layers,
        heads,
        kv_heads,
        intermediate,
        vocab,
        context,
        draft_layers,
        seed=seed,
    )  # arch is checked by HfBuild.check
    typer.echo(json.dumps(build_hf_pair(out, build), indent=2))


@app.command("real-size")
def real_size(
    shape: Annotated[
        list[str] | None,
        typer.Argument(help="Shapes: tinyllama-1.1b, llama-2-7b, llama-2-13b, llama-2-70b (default: all)"),
    ] = None,
    root: Annotated[Path | None, typer.Option(help="Where the random-weight models are stored")] = None,
    dtype: Annotated[str, typer.Option(help="bfloat16, float16 or float32")] = "bfloat16",
    device: DeviceOpt = None,
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Cold and warm reloads per shape")] = 2,
    analytic: Annotated[bool, typer.Option(help="Only the analytic numbers: build and load nothing")] = False,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON here")] = None,
) -> None:
    """Reload time and KV bytes per token of random-weight models of real LLM shapes; those that
    do not fit this machine are extrapolated analytically (JSON)."""
    from failsoft.llm.models import default_llm_path, pick_device
    from failsoft.llm.realsize import SHAPES, shape_of

    shapes = [shape_of(s) for s in shape] if shape else list(SHAPES.values())
    if analytic:
        result = {"shapes": {s.name: s.describe(dtype) | {"measured": False} for s in shapes}}
    else:
        from failsoft.bench.llm_realsize import run

        progress = lambda m: typer.echo(m, err=True)  # noqa: E731
        result = run(
            shapes, root or default_llm_path(), dtype, pick_device(device), repeats, progress=progress
        )
    text = json.dumps(result, indent=2)
    typer.echo(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


@app.command("generate")
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt text")],
    root: Annotated[Path | None, typer.Option(help="Repository root")] = None,
    size: SizeOpt = "small",
    model: Annotated[
        Path | None, typer.Option(help="A local Hugging Face causal-LM directory instead of the pair")
    ] = None,
    draft_model: Annotated[
        Path | None, typer.Option(help="Its draft (same tokenizer), for --draft-tokens")
    ] = None,
    chat: Annotated[bool, typer.Option(help="PROMPT is a user message, through the chat template")] = False,
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate")] = 64,
    temperature: Annotated[float, typer.Option(help="0: greedy")] = 0.0,
    draft_tokens: Annotated[int, typer.Option(help="> 0: speculative decoding with the draft")] = 0,
    device: DeviceOpt = None,
) -> None:
    """Stream the continuation of PROMPT to stderr; print metrics as JSON on stdout."""
    from failsoft.errors import ConfigError
    from failsoft.llm import Engine, SamplingParams, speculative_generate
    from failsoft.llm.hf import load_hf
    from failsoft.llm.models import load_lm

    if draft_tokens > 0 and model and not draft_model:
        raise ConfigError("--draft-tokens with --model needs --draft-model (a smaller model, same tokenizer)")
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
    target = Engine(load_hf(model, device) if model else load_lm(root, f"{size}-target", device))
    tok = target.tokenizer
    ids = tok.chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
    if draft_tokens > 0:
        if model and not draft_model:
            raise ConfigError(
                "--draft-tokens with --model needs --draft-model (a smaller model, same tokenizer)"
            )
        draft = Engine(
            load_hf(draft_model, device) if draft_model else load_lm(root, f"{size}-draft", device)
        )
        result = speculative_generate(target, draft, ids, params, draft_tokens)
        sys.stderr.write(tok.decode(list(result.tokens)) + "\n")
        summary = {
            "tokens": len(result.tokens),
            "steps": result.steps,
            "acceptance": round(result.acceptance, 4),
            "tokens_per_step": round(result.tokens_per_step, 3),
        }
    else:
        req = target.submit(ids, params)
        shown = ""
        for _ in target.stream(req):
            text = tok.decode(req.output)  # whole-text decode: a BPE token may end mid-character
            sys.stderr.write(text[len(shown) :] if text.startswith(shown) else text)
            sys.stderr.flush()
            shown = text
        sys.stderr.write("\n")
        summary = {
            "tokens": len(req.output),
            "finish_reason": req.finish_reason,
            "ttft_ms": round(req.ttft_ms or 0.0, 3),
            "tpot_ms": round(req.tpot_ms or 0.0, 3),
        }
    typer.echo(json.dumps(summary, indent=2))
