"""Usage errors: one line on stderr (a command group named alone: its help) and exit code 2, no
traceback. typer 0.29 raises its own copy of click's exceptions; these run on the installed typer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from failsoft.cli import main


@pytest.mark.parametrize(
    ("argv", "message", "command"),
    [
        (["nosuch"], "No such command 'nosuch'", "failsoft"),
        (["plan", "proactive"], "Missing argument", "failsoft plan proactive"),
        (["serve", "--port", "abc"], "Invalid value for '--port'", "failsoft serve"),
        (["zoo", "list", "--bogus"], "--bogus", "failsoft zoo list"),
        (
            ["bench", "fidelity", "examples/bench.yaml", "--host", "guess"],
            "--host: must be one of probe, steady, pin, recovery; got 'guess'",
            "failsoft bench fidelity",
        ),
        (
            ["bench", "fidelity-set", "--control", "sleep"],
            "--control: must be one of wait, work, ahead; got 'sleep'",
            "failsoft bench fidelity-set",
        ),
        (
            ["serve", "examples/edge.yaml", "--node-ip-address", "10.20.0.1"],
            "--node-ip-address: needs --address",
            "failsoft serve",
        ),
        (
            ["bench", "partition", "examples/partition.yaml", "--fault", "flood"],
            "--fault: must be one of partition, kill; got 'flood'",
            "failsoft bench partition",
        ),
        (
            ["bench", "fidelity", "examples/bench.yaml", "--page-cache", "hot"],
            "--page-cache: must be one of warm, cold; got 'hot'",
            "failsoft bench fidelity",
        ),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(capsys, argv, message, command):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err
    assert err.rstrip().endswith(f"(see '{command} --help')")
    assert "Traceback" not in err


@pytest.mark.parametrize(("argv", "commands"), [([], ["plan", "zoo", "infer"]), (["zoo"], ["build", "list"])])
def test_a_group_named_alone_prints_its_help_and_exits_2(capsys, argv, commands):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in out + err
    assert all(c in out + err for c in commands)


def test_the_console_entry_point_exits_2_without_a_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "failsoft", "serve", "--port", "abc"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("error: Invalid value for '--port'") and "Traceback" not in done.stderr
