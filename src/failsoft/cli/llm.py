"""``failsoft llm``: build the LUMEN target/draft pair, and generate with the engine.

``build`` trains and stores a size's pair (idempotent; ``tiny`` in seconds, ``small``, the default,
in minutes on a CPU) and prints what it measured as JSON: held-out bits per byte of each model and
the draft's greedy acceptance rate. ``generate`` streams one prompt's tokens and prints TTFT, time
per output token and, with ``--draft-tokens``, the speculative acceptance.
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
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate")] = 64,
    temperature: Annotated[float, typer.Option(help="0: greedy")] = 0.0,
    draft_tokens: Annotated[int, typer.Option(help="> 0: speculative decoding with the draft")] = 0,
    device: DeviceOpt = None,
) -> None:
    """Stream the continuation of PROMPT to stderr; print metrics as JSON on stdout."""
    from failsoft.llm import Engine, SamplingParams, speculative_generate
    from failsoft.llm.corpus import decode
    from failsoft.llm.models import load_lm

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
    target = Engine(load_lm(root, f"{size}-target", device))
    if draft_tokens > 0:
        draft = Engine(load_lm(root, f"{size}-draft", device))
        result = speculative_generate(target, draft, prompt, params, draft_tokens)
        sys.stderr.write(decode(list(result.tokens)) + "\n")
        summary = {
            "tokens": len(result.tokens),
            "steps": result.steps,
            "acceptance": round(result.acceptance, 4),
            "tokens_per_step": round(result.tokens_per_step, 3),
        }
    else:
        req = target.submit(prompt, params)
        for token in target.stream(req):
            sys.stderr.write(decode([token]))
            sys.stderr.flush()
        sys.stderr.write("\n")
        summary = {
            "tokens": len(req.output),
            "finish_reason": req.finish_reason,
            "ttft_ms": round(req.ttft_ms or 0.0, 3),
            "tpot_ms": round(req.tpot_ms or 0.0, 3),
        }
    typer.echo(json.dumps(summary, indent=2))


@app.command("serve")
def serve(
    config: Annotated[Path, typer.Argument(help="An llm deployment config (examples/llm.yaml)")],
    port: Annotated[int | None, typer.Option(help="Override the gateway's port")] = None,
) -> None:
    """Build the model pair if needed, start the LLM workers and the generate gateway; Ctrl-C stops."""
    from failsoft.runtime.llm_session import LlmSession, load_llm_config

    cfg = load_llm_config(config)
    if port is not None:
        spec = cfg.spec.model_copy(update={"gateway": cfg.spec.gateway.model_copy(update={"port": port})})
        cfg = type(cfg)(spec, cfg.params, cfg.root)

    session = LlmSession(cfg)
    typer.echo(f"building/loading the {cfg.spec.model.size} model under {cfg.root} ...", err=True)
    try:
        session.start(background=True)
        typer.echo(
            f"serving {cfg.spec.service.name!r} ({cfg.spec.service.workers} workers, policy "
            f"{cfg.spec.service.policy}) on {session.url}; try:\n  curl -N {session.url}/v2/models/"
            f'{cfg.spec.service.name}/generate_stream -d \'{{"text_input": "def main(", '
            f'"parameters": {{"max_tokens": 64}}}}\'',
            err=True,
        )
        session.wait()
    except KeyboardInterrupt:
        pass
    finally:
        session.stop()
