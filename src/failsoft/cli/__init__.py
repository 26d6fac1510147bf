"""The ``failsoft`` command line: one Typer app, one module per verb group.

Every failsoft error becomes one line on stderr and exit code 2; nothing prints a traceback for a
user mistake. Commands that print results print JSON on stdout, so they compose with ``jq``.
"""

from __future__ import annotations

import sys

import typer

from failsoft.errors import FailsoftError

app = typer.Typer(
    name="failsoft",
    help="Fail-soft model serving: keep answering when servers, sites or networks fail.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from failsoft.cli import bench, plan, simulate

    app.add_typer(plan.app, name="plan")
    app.add_typer(bench.app, name="bench")
    app.command("simulate")(simulate.simulate)
    from failsoft.cli import zoo

    app.add_typer(zoo.app, name="zoo")
    from failsoft.cli import chaos, demo, serve, status

    app.command("serve")(serve.serve)
    app.command("status")(status.status)
    app.add_typer(chaos.app, name="chaos")
    app.command("demo")(demo.demo)


_register()


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    try:
        app(args=argv, standalone_mode=False)
    except FailsoftError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 130
    except KeyboardInterrupt:
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            return exc.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
