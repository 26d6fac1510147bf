"""The operator's view: ``failsoft serve`` in its own process, ``status``, ``chaos``, Ctrl-C.

The cluster here keeps its state in SQLite (the default store), and its controller is killed and
resumes from that file.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from failsoft.cli import main
from tests.runtime.conftest import wait_for

pytestmark = [pytest.mark.runtime, pytest.mark.slow]


def cli(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FAILSOFT_STATE": str(state.parent)}
    return subprocess.run(
        [sys.executable, "-m", "failsoft", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.fixture
def config_file(tiny_zoo, tmp_path) -> Path:
    data = {
        "name": "cli-test",
        "repository": str(tiny_zoo.root),
        "servers": [
            {"name": "s1", "site": "a", "memory_mb": 200},
            {"name": "s2", "site": "b", "memory_mb": 200},
        ],
        "apps": [
            {"name": "cam", "family": "digits_mlp", "critical": True, "primary": {"server": "s1"}},
            {"name": "ocr", "family": "digits_mlp", "primary": {"server": "s2", "variant": "mlp_m"}},
        ],
        "gateway": {"port": 0},
        "agents": {"restart": False},
        "state_dir": str(tmp_path / "state" / "cli-test"),
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_bad_config_is_refused_in_one_line_before_anything_starts(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "servers: [{name: s1, site: a, memory_mb: 10}]\napps: [{name: x, family: f, colour: red}]\n"
    )
    started = time.monotonic()
    assert main(["serve", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {path}: apps[0] ('x'): unknown field 'colour'"
    assert time.monotonic() - started < 5  # refused before Ray or any process started


@pytest.fixture
def no_zoo_config(tmp_path) -> Path:
    """A config whose repository does not exist: prepare() fails there, after the security checks."""
    path = tmp_path / "c.yaml"
    data = {
        "name": "sec",
        "repository": str(tmp_path / "no-zoo"),
        "servers": [{"name": "s1", "site": "a", "memory_mb": 10}],
        "apps": [{"name": "x", "family": "digits_mlp"}],
        "state_dir": str(tmp_path / "state"),
    }
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_serve_refuses_a_non_loopback_admin_plane_unless_opted_in(no_zoo_config, host, capsys):
    assert main(["serve", str(no_zoo_config), "--admin-host", host]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: admin host {host!r} is not a loopback address")
    assert (
        "--allow-remote-admin" in err and "gateway.allow_remote: true" in err and len(err.splitlines()) == 1
    )


def test_inference_may_listen_beyond_loopback_the_admin_plane_staying_on_it(no_zoo_config, capsys, caplog):
    with caplog.at_level(logging.WARNING, logger="failsoft.runtime.security"):
        assert main(["serve", str(no_zoo_config), "--host", "0.0.0.0"]) == 2
    assert "model repository" in capsys.readouterr().err  # past the host checks: stopped further on
    assert "the inference API listens on 0.0.0.0:8000" in caplog.text and "SECURITY" not in caplog.text


def test_an_opted_in_remote_admin_plane_passes_the_check_with_a_loud_warning(no_zoo_config, capsys, caplog):
    argv = ["serve", str(no_zoo_config), "--admin-host", "0.0.0.0", "--allow-remote-admin"]
    with caplog.at_level(logging.WARNING, logger="failsoft.runtime.security"):
        assert main(argv) == 2
    assert "model repository" in capsys.readouterr().err  # past the host check: stopped further on
    assert "SECURITY: the admin API listens on 0.0.0.0:8001" in caplog.text
    assert "plaintext" in caplog.text
    data = yaml.safe_load(no_zoo_config.read_text())
    data["gateway"] = {"admin_host": "0.0.0.0", "allow_remote": True}  # the config key opts in as well
    no_zoo_config.write_text(yaml.safe_dump(data))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="failsoft.runtime.security"):
        assert main(["serve", str(no_zoo_config)]) == 2
    assert "SECURITY" in caplog.text and "model repository" in capsys.readouterr().err


def test_loopback_hosts_need_no_opt_in(no_zoo_config, capsys):
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert main(["serve", str(no_zoo_config), "--admin-host", host]) == 2
        assert "model repository" in capsys.readouterr().err


def test_a_short_admin_token_is_refused_wherever_it_comes_from(no_zoo_config, capsys, monkeypatch):
    monkeypatch.setenv("FAILSOFT_ADMIN_TOKEN", "fifteen-chars!!")
    assert main(["serve", str(no_zoo_config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the admin token from $FAILSOFT_ADMIN_TOKEN has 15 characters: at least 16")
    assert "fifteen-chars" not in err  # never echoed
    monkeypatch.delenv("FAILSOFT_ADMIN_TOKEN")
    data = yaml.safe_load(no_zoo_config.read_text())
    (no_zoo_config.parent / "state").mkdir()
    (no_zoo_config.parent / "state" / "admin_token").write_text("short\n")
    assert main(["serve", str(no_zoo_config)]) == 2
    assert "admin token from file" in capsys.readouterr().err
    data["admin_token"] = "x" * 15
    no_zoo_config.write_text(yaml.safe_dump(data))
    assert main(["serve", str(no_zoo_config)]) == 2
    assert "admin_token" in capsys.readouterr().err


def test_client_commands_take_the_token_from_a_file_never_from_argv(tmp_path, capsys):
    assert main(["status", "--token", "a-token-on-the-command-line"]) == 2
    assert "No such option: --token" in capsys.readouterr().err
    (tmp_path / "tok").write_text("short\n")
    assert main(["status", "--token-file", str(tmp_path / "tok"), "--admin-url", "http://127.0.0.1:9"]) == 2
    assert "has 5 characters: at least 16" in capsys.readouterr().err


def test_serve_status_chaos_and_ctrl_c(config_file, tmp_path):
    state = tmp_path / "state" / "cli-test"
    proc = subprocess.Popen(
        [sys.executable, "-m", "failsoft", "serve", str(config_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: (state / "gateway.json").is_file() or proc.poll() is not None, 120.0, "the gateway")
        assert proc.poll() is None, proc.stderr.read()
        family = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}

        status = json.loads(cli("status", "--json", "--state-dir", str(state), state=state).stdout)
        assert [s["state"] for s in status["servers"]] == ["up", "up"]
        routes = {a["name"]: a["route"] for a in status["apps"]}
        assert routes == {
            "cam": {"server": "s1", "variant": "mlp_l"},
            "ocr": {"server": "s2", "variant": "mlp_m"},
        }
        assert status["apps"][0]["warm_backups"][0]["server"] == "s2"
        table = cli("status", "--state-dir", str(state), state=state).stdout
        assert "cam" in table and "s1/mlp_l" in table
        token_file = ["--token-file", str(state / "admin_token")]  # the token never on argv
        by_file = cli("status", "--json", "--admin-url", _admin_url(state), *token_file, state=state)
        assert json.loads(by_file.stdout)["servers"] == status["servers"], by_file.stderr
        token = (state / "admin_token").read_text().strip()
        _planes_apart(state, token)
        assert not [p.pid for p in psutil.Process(proc.pid).children(recursive=True) if token in _argv(p)]

        _controller_restart_resumes_from_sqlite(state)

        killed = json.loads(
            cli("chaos", "kill", "s1", "--json", "--state-dir", str(state), state=state).stdout
        )
        assert killed["killed"][0]["server"] == "s1"

        def moved() -> bool:  # asked in this process: a command per poll is a second of a core
            out = _admin_status(state)
            return {a["name"]: a["route"] and a["route"]["server"] for a in out["apps"]}["cam"] == "s2"

        wait_for(moved, 30.0, "cam served by its warm backup on s2", 0.2)
        slow = cli("chaos", "slow", "s2", "--ms", "5", "--json", "--state-dir", str(state), state=state)
        assert json.loads(slow.stdout)["ms"] == 5
        bad = cli("chaos", "kill", "--state-dir", str(state), state=state)
        assert bad.returncode == 2 and "name a SERVER (or several) or a --site SITE" in bad.stderr
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "admin API at http://127.0.0.1:" in err and token not in err  # said where, never the token
    assert not (state / "gateway.json").exists()
    leftovers = [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert leftovers == [], "Ray, agents, sidecars and the controller stop with the server"


def _controller_restart_resumes_from_sqlite(state: Path) -> None:
    before = json.loads(cli("status", "--json", "--state-dir", str(state), state=state).stdout)
    full = _admin_status(state)
    assert full["controller"]["store"].startswith("sqlite:///")
    os.kill(full["controller"]["pid"], signal.SIGKILL)

    def resumed() -> dict | None:
        try:
            now = _admin_status(state)
        except Exception:
            return None
        return now if now["controller"]["restarted"] and now["ready"] else None

    wait_for(resumed, 60.0, "the controller resumed from SQLite", 0.2)
    after = json.loads(cli("status", "--json", "--state-dir", str(state), state=state).stdout)
    assert [a["route"] for a in after["apps"]] == [a["route"] for a in before["apps"]]
    assert [a["warm_backups"] for a in after["apps"]] == [a["warm_backups"] for a in before["apps"]]


def _planes_apart(state: Path, token: str) -> None:
    """The inference port has no /admin; the admin port wants the token and serves no inference."""
    where = json.loads((state / "gateway.json").read_text())
    auth = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{where['url']}/admin/status", headers=auth).status_code == 404
    assert httpx.get(f"{where['admin_url']}/admin/status").status_code == 401
    assert httpx.get(f"{where['admin_url']}/admin/status", headers=auth).status_code == 200
    assert httpx.get(f"{where['admin_url']}/v2/health/live").status_code == 404


def _argv(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # gone meanwhile
        return ""


def _admin_url(state: Path) -> str:
    return json.loads((state / "gateway.json").read_text())["admin_url"]


def _admin_status(state: Path) -> dict:
    from failsoft.runtime.discovery import find_admin

    with find_admin(state_dir=state).client(timeout=5.0) as client:
        return client.status()
