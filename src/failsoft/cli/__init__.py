"""The ``failsoft`` command line: one Typer app, one module per verb group.

Every failsoft error becomes one line on stderr and exit code 2; so does every usage error (an
unknown command or option, a missing argument, a value of the wrong type), with a hint at the
command's ``--help``; a command group named without its subcommand prints its help, also with exit
code 2. Nothing prints a traceback for a user mistake. Commands that print results print JSON on
stdout (or a table, with ``--json`` for JSON), so they compose with ``jq``.
"""

from __future__ import annotations

import importlib
import sys
from functools import cache

import typer

from failsoft.errors import FailsoftError

PROG = "failsoft"
USAGE_EXIT = 2

app = typer.Typer(
    name=PROG,
    help="Fail-soft model serving: keep answering when servers, sites or networks fail.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from failsoft.cli import (
        bench,
        chaos,
        demo,
        deploy,
        infer,
        llm,
        parity,
        plan,
        scenario,
        serve,
        simulate,
        status,
        zoo,
    )

    app.add_typer(plan.app, name="plan")
    app.command("scenario")(scenario.scenario)
    app.add_typer(bench.app, name="bench")
    app.command("simulate")(simulate.simulate)
    app.add_typer(zoo.app, name="zoo")
    app.add_typer(llm.app, name="llm")
    app.add_typer(parity.app, name="parity")
    app.command("serve")(serve.serve)
    app.command("status")(status.status)
    app.command("deploy")(deploy.deploy)
    app.command("infer")(infer.infer)
    app.add_typer(chaos.app, name="chaos")
    app.command("demo")(demo.demo)


_register()


@cache
def _click_errors() -> tuple[type[Exception], ...]:
    """The ClickException classes the installed typer raises: typer 0.29 and later carry their own
    copy of click (``typer._click``), earlier ones raise click's."""
    found = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(importlib.import_module(module).ClickException)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _usage(exc: Exception) -> int:
    """One line for a usage error (the whole help when a group was named without a subcommand)."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        text = ctx.get_help()  # typer prints it itself (with rich) and returns "" where it can
        if text.strip():
            typer.echo(text)
        return USAGE_EXIT
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    typer.echo(f"error: {' '.join(message.split())}{hint}", err=True)
    code = getattr(exc, "exit_code", USAGE_EXIT)
    return code if isinstance(code, int) and code else USAGE_EXIT


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: the command's exit code; 2 for any user mistake."""
    try:
        code = app(args=argv, prog_name=PROG, standalone_mode=False)
    except FailsoftError as exc:
        typer.echo(f"error: {exc}", err=True)
        return USAGE_EXIT
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 130
    except KeyboardInterrupt:
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    except _click_errors() as exc:
        return _usage(exc)
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
