"""``failsoft zoo``: list, scenario and build from the command line; one-line errors, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

from failsoft.cli import main
from tests.test_import_boundary import imported_by


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_shows_every_variant_with_its_numbers(capsys, tiny_zoo):
    code, out, _ = run(capsys, "zoo", "list", str(tiny_zoo.root))
    assert code == 0
    for name in (
        "mlp_xs",
        "mlp_l",
        "measured",
        "memory MB",
        "load ms",
        "of it CPU",
        "warm load",
        "latency p50",
    ):
        assert name in out
    code, out, _ = run(capsys, "zoo", "list", str(tiny_zoo.root), "--json")
    rows = json.loads(out)["variants"]
    assert [r["variant"] for r in rows] == ["mlp_xs", "mlp_s", "mlp_m", "mlp_l"]
    assert all(r["memory_mb"] and r["load_ms"] and r["latency_p50_ms"] for r in rows)
    assert all(0 < r["load_cpu_ms"] <= r["load_ms"] and r["warm_load_ms"] > 0 for r in rows)


def test_scenario_prints_the_families_section(capsys, tiny_zoo):
    code, out, _ = run(capsys, "zoo", "scenario", str(tiny_zoo.root))
    assert code == 0
    families = json.loads(out)["families"]
    assert list(families) == ["digits_mlp"]
    assert set(families["digits_mlp"][0]) >= {"variant", "memory_mb", "accuracy", "load_ms", "latency_ms"}


def test_scenario_from_the_profile_csv(capsys, tmp_path):
    from failsoft.profiles import bundled_profile_path

    code, out, _ = run(
        capsys, "zoo", "scenario", "--profile-csv", str(bundled_profile_path()), "-f", "resnet"
    )
    assert code == 0
    assert json.loads(out)["families"]["resnet"][0]["variant"] == "resnet18"


def test_errors_are_one_line_with_exit_2(capsys, tmp_path):
    code, _, err = run(capsys, "zoo", "build", "--out", str(tmp_path), "--families", "vgg")
    assert code == 2 and err.startswith("error: unknown zoo family 'vgg'")
    code, _, err = run(capsys, "zoo", "list", str(tmp_path / "empty"))
    assert code == 2 and "failsoft zoo build" in err
    code, _, err = run(capsys, "zoo", "profile", str(tmp_path), "-f", "digits_mlp")
    assert code == 2 and "not built" in err


def test_build_prints_plain_lines_when_not_on_a_terminal(tiny_zoo):
    entry = "import sys; from failsoft.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", entry, "zoo", "build", "--out", str(tiny_zoo.root), "-f", "digits_mlp"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "[1/4] build digits_mlp/mlp_xs: skipped (0.0 s)"
    assert lines[-1].endswith("0 steps done, 8 already up to date")


def test_importing_the_zoo_does_not_import_torch():
    assert not imported_by("failsoft.zoo, failsoft.cli.zoo") & {"torch", "transformers", "safetensors"}
