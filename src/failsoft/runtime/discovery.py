"""Finding a running gateway and its admin token, for ``failsoft status`` and ``failsoft chaos``.

``failsoft serve`` writes ``<state_dir>/gateway.json`` (the URL) and keeps the admin token in
``<state_dir>/admin_token``. A client command looks, in order, at: ``--url`` / ``--token-file``;
``$FAILSOFT_URL`` / ``$FAILSOFT_ADMIN_TOKEN``; the state directory of ``--config`` (or
``--state-dir``); else every ``<default state dir>/*/gateway.json``, which must name exactly one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from failsoft.errors import ConfigError
from failsoft.runtime.config import default_state_dir, load_config

URL_ENV = "FAILSOFT_URL"
TOKEN_ENV = "FAILSOFT_ADMIN_TOKEN"


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None
    state_dir: Path | None


def find_gateway(
    url: str | None = None,
    token: str | None = None,
    config: Path | None = None,
    state_dir: Path | None = None,
) -> Target:
    if config is not None:
        state_dir = load_config(config).state_dir
    url = url or os.environ.get(URL_ENV)
    token = token or os.environ.get(TOKEN_ENV)
    if url is None:
        state_dir = state_dir or _only_running()
        url = _read_url(state_dir)
    if token is None and state_dir is not None and (state_dir / "admin_token").is_file():
        token = (state_dir / "admin_token").read_text().strip()
    return Target(url.rstrip("/"), token, state_dir)


def _only_running() -> Path:
    root = default_state_dir()
    running = sorted(p.parent for p in root.glob("*/gateway.json")) if root.is_dir() else []
    if not running:
        raise ConfigError(
            f"no running failsoft found under {str(root)!r}: start one with 'failsoft serve CONFIG.yaml', "
            f"or name it with --url, --config or ${URL_ENV}"
        )
    if len(running) > 1:
        names = ", ".join(p.name for p in running)
        raise ConfigError(
            f"several failsoft clusters are running ({names}): pick one with --config or --state-dir"
        )
    return running[0]


def _read_url(state_dir: Path) -> str:
    path = state_dir / "gateway.json"
    try:
        return str(json.loads(path.read_text())["url"])
    except FileNotFoundError as exc:
        raise ConfigError(
            f"no running failsoft for {str(state_dir)!r} (no {path.name}): is 'failsoft serve' up?"
        ) from exc
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}") from exc
