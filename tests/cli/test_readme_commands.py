"""Every command of the README's tour runs as written, on a fresh default model repository.

The tour is the ```bash block under "## A tour" in README.md, parsed here: a command added to it
must be added to :data:`SMALL` (run here, with the small sizes named there, if any) or to
:data:`ELSEWHERE` (run by the test named, for the reason given), or
:func:`test_every_tour_command_is_run_by_a_test` fails.

The commands run in order, in-process through ``failsoft.cli.main`` (the console script's own entry
point, so each argv is exactly the README's), from a scratch working directory that sees the
repository's ``examples/``, with ``$FAILSOFT_ZOO`` unset and ``$XDG_CACHE_HOME`` in the scratch
directory: the default repository, as a new user has it, is fresh. One shortcut, said here: the
``digits_mlp`` family is copied in from the session's tiny zoo (the same build, quick profiles,
that the zoo tests make), so that ``zoo build`` trains only ``digits_cnn`` here; the build's
idempotence is what lets the README's command run over it.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from failsoft.cli import main
from failsoft.zoo import ModelRepository

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# the commands run here, in the README's order, with the small sizes this test adds (and why)
SMALL: dict[str, list[str]] = {
    "failsoft zoo build -f digits_mlp,digits_cnn --quick": [],
    "failsoft zoo list": [],
    "failsoft scenario examples/edge.yaml --out edge.json": [],
    "failsoft plan proactive edge.json": [],
    "failsoft plan failover edge.json --failed a1": [],
    "failsoft simulate headroom --seeds 1": ["--failures", "2"],  # 100 failures per point: ~50 s
    "failsoft parity train digits_mlp/mlp_m --k 2 --quick": ["--epochs", "1"],  # 300 epochs: ~1 min
}

_LIVE = (
    "a live cluster of examples/edge.yaml on the fixed port 8000 (six agent processes): "
    "tests/runtime/test_cli.py runs `serve`, `status` and `chaos kill` as subprocesses on a "
    "two-server cluster, tests/cli/test_client_classification.py runs `failsoft infer ... --digits`, "
    "tests/cli/test_examples.py checks that the gateway takes examples/request.json; here, "
    "`serve`'s own checks of edge.yaml run against the fresh repository the tour built"
)
_DEPLOY = (
    "a running cluster: tests/runtime/test_deploy_live.py runs `failsoft deploy` (its plan, then a "
    "second run that changes nothing) against a live cluster, and deploys changed configs under load"
)
ELSEWHERE: dict[str, str] = {
    "failsoft serve examples/edge.yaml": _LIVE,
    "failsoft status": _LIVE,
    "failsoft infer cam-1 --digits 7": _LIVE,
    "curl -s -XPOST 127.0.0.1:8000/v2/models/cam-1/infer -d @examples/request.json": _LIVE,
    "failsoft chaos kill a1": _LIVE,
    "failsoft deploy examples/edge.yaml --dry-run": _DEPLOY,
    "failsoft deploy examples/edge.yaml": _DEPLOY,
}


def tour_commands(text: str) -> list[str]:
    """The tour block's commands, in order: comments dropped, ``a && b`` split."""
    section = text.split("\n## A tour\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    commands = []
    for line in block.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).strip()
        if line and not line.startswith("#"):
            commands += [part.strip() for part in line.split(" && ")]
    return commands


def test_the_tour_parser_reads_commands_comments_and_chains():
    text = "x\n## A tour\n\n```bash\na b   # says\n# aside\nc && d e  # more\n```\n## Next\n"
    assert tour_commands(text) == ["a b", "c", "d e"]


def test_every_tour_command_is_run_by_a_test():
    commands = tour_commands(README.read_text())
    untested = [c for c in commands if c not in SMALL and c not in ELSEWHERE]
    assert untested == [], "README tour commands no test runs: add them to SMALL or ELSEWHERE"
    stale = [c for c in [*SMALL, *ELSEWHERE] if c not in commands]
    assert stale == [], "commands tested here that the README no longer shows"
    assert [c for c in commands if c in SMALL] == list(SMALL), "SMALL runs in the README's order"


@pytest.fixture
def fresh_user(tiny_zoo, tmp_path, monkeypatch) -> Path:
    """A scratch working directory that sees examples/, and a fresh default repository."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(work)
    monkeypatch.delenv("FAILSOFT_ZOO", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FAILSOFT_STATE", str(tmp_path / "state"))
    default = tmp_path / "cache" / "failsoft" / "zoo"
    shutil.copytree(tiny_zoo.root / "digits_mlp", default / "digits_mlp")
    return default


@pytest.mark.slow
def test_the_tour_runs_as_written_on_a_fresh_default_repository(fresh_user, capsys):
    said: dict[str, str] = {}
    for command in SMALL:
        argv = shlex.split(command)[1:] + SMALL[command]
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 0, f"{command!r} exited {code}: {err[-2000:]}"
        said[command] = out
    repo = ModelRepository(fresh_user)
    assert repo.family_names() == ["digits_cnn", "digits_mlp", "digits_mlp_parity"]
    assert "digits_cnn" in said["failsoft zoo list"] and "measured" in said["failsoft zoo list"]
    scenario = json.loads(Path("edge.json").read_text())
    assert set(scenario["families"]) == {"digits_cnn", "digits_mlp"}
    for plan in ("failsoft plan proactive edge.json", "failsoft plan failover edge.json --failed a1"):
        json.loads(said[plan])  # one JSON document
    parity = json.loads(said["failsoft parity train digits_mlp/mlp_m --k 2 --quick"])
    assert parity["root"] == str(fresh_user)
    # `failsoft serve examples/edge.yaml` (ELSEWHERE): its checks pass on the repository just built
    from failsoft.runtime.config import load_config
    from failsoft.runtime.session import prepare

    assert prepare(load_config("examples/edge.yaml")).repository == fresh_user


def test_ci_runs_exactly_the_readmes_second_command():
    first_block = README.read_text().split("```bash\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert len(first_block) == 2 and "failsoft demo" in first_block[0] and "pytest" in first_block[1]
    ci = (ROOT / ".ci" / "run").read_text().rstrip().splitlines()[-1]
    assert ci == first_block[1]
