"""Finding a running gateway's two planes and the admin token (``failsoft infer``, ``status``, ``chaos``).

``failsoft serve`` writes ``<state_dir>/gateway.json`` (the inference ``url``, the ``admin_url``, and
the certificate files of an HTTPS plane) and keeps the admin token in ``<state_dir>/admin_token``.
A client command looks, in order, at: ``--url`` / ``--admin-url`` / ``--token-file``;
``$FAILSOFT_URL`` / ``$FAILSOFT_ADMIN_URL`` / ``$FAILSOFT_ADMIN_TOKEN``; the state directory of
``--config`` (or ``--state-dir``); else every ``<default state dir>/*/gateway.json``, which must name
exactly one. An HTTPS plane's certificate is trusted as written in ``gateway.json`` (a self-signed
one is its own authority); a URL given by hand is checked against the system's CAs, or the bundle
in ``$SSL_CERT_FILE``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from failsoft.errors import ConfigError
from failsoft.runtime.config import default_state_dir, load_config

if TYPE_CHECKING:
    from failsoft.client import AsyncClient, Client

URL_ENV = "FAILSOFT_URL"
ADMIN_URL_ENV = "FAILSOFT_ADMIN_URL"
TOKEN_ENV = "FAILSOFT_ADMIN_TOKEN"


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None = field(repr=False)
    state_dir: Path | None
    admin_url: str | None = None
    verify: bool | str = True
    admin_verify: bool | str = True

    def client(self, timeout: float = 30.0) -> Client:
        """A client of both planes, with the token for the admin one."""
        from failsoft.client import Client

        return Client(self.url, timeout, self.token, self.admin_url, self.verify, self.admin_verify)

    def async_client(self, timeout: float = 30.0, max_connections: int = 64) -> AsyncClient:
        """The asyncio twin of :meth:`client`."""
        from failsoft.client import AsyncClient

        return AsyncClient(
            self.url, timeout, self.token, max_connections, self.admin_url, self.verify, self.admin_verify
        )


def find_gateway(
    url: str | None = None,
    token: str | None = None,
    config: Path | None = None,
    state_dir: Path | None = None,
    admin_url: str | None = None,
) -> Target:
    """Both planes (the admin one where known); the state directory is read when the inference URL
    is not given."""
    return _find(url, admin_url, token, config, state_dir, admin=False)


def find_admin(
    admin_url: str | None = None,
    token: str | None = None,
    config: Path | None = None,
    state_dir: Path | None = None,
) -> Target:
    """The admin plane and its token (``failsoft status``, ``failsoft chaos``); the state directory
    is read when the admin URL is not given. A ConfigError when there is no token or admin URL."""
    target = _find(None, admin_url, token, config, state_dir, admin=True)
    if not target.token:
        raise ConfigError("no admin token: pass --token-file, set $FAILSOFT_ADMIN_TOKEN or use --state-dir")
    if target.admin_url is None:
        raise ConfigError(
            f"no admin URL in {str(target.state_dir)!r}/gateway.json: "
            f"pass --admin-url or set ${ADMIN_URL_ENV}"
        )
    return target


def _find(
    url: str | None,
    admin_url: str | None,
    token: str | None,
    config: Path | None,
    state_dir: Path | None,
    admin: bool,
) -> Target:
    if config is not None:
        state_dir = load_config(config).state_dir
    url = url or os.environ.get(URL_ENV)
    admin_url = admin_url or os.environ.get(ADMIN_URL_ENV)
    token = token or os.environ.get(TOKEN_ENV)
    where: dict[str, Any] = {}
    if (admin_url if admin else url) is None or (state_dir is not None and None in (url, admin_url)):
        state_dir = state_dir or _only_running()
        where = _read(state_dir)
    verify = where.get("certfile") if url is None else None
    admin_verify = where.get("admin_certfile") if admin_url is None else None
    url = url or where.get("url") or ""
    admin_url = admin_url or where.get("admin_url")
    if token is None and state_dir is not None and (state_dir / "admin_token").is_file():
        token = (state_dir / "admin_token").read_text().strip()
    return Target(
        str(url).rstrip("/"),
        token,
        state_dir,
        None if admin_url is None else str(admin_url).rstrip("/"),
        verify or True,
        admin_verify or True,
    )


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


def _read(state_dir: Path) -> dict[str, Any]:
    path = state_dir / "gateway.json"
    try:
        where = json.loads(path.read_text())
        str(where["url"])
    except FileNotFoundError as exc:
        raise ConfigError(
            f"no running failsoft for {str(state_dir)!r} (no {path.name}): is 'failsoft serve' up?"
        ) from exc
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}") from exc
    return dict(where)
