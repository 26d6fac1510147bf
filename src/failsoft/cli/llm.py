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
