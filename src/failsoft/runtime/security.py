"""What failsoft refuses so that a default deployment exposes nothing (see ``docs/security.md``).

The gateway's admin API (``/admin``: status, and chaos that kills processes) is protected by a
bearer token over plain HTTP. That is safe on the loopback interface only, so:

* the gateway binds a non-loopback address only when the operator opted in
  (``gateway.allow_remote: true``, or ``failsoft serve --allow-remote-admin``), and then says loudly
  that the token travels in clear text (put a TLS-terminating proxy in front);
* an admin token shorter than :data:`MIN_TOKEN_CHARS` is refused, wherever it comes from;
* a token is never read from the command line, where ``ps`` shows it to every local user: it comes
  from the config, ``$FAILSOFT_ADMIN_TOKEN``, or a file (``--token-file``, the state directory's
  ``admin_token``).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from pathlib import Path

from failsoft.errors import ConfigError

log = logging.getLogger(__name__)
MIN_TOKEN_CHARS = 16
REMOTE_FLAG = "--allow-remote-admin"
REMOTE_KEY = "gateway.allow_remote: true"


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback one (``0.0.0.0`` and ``::`` are not)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def check_bind(host: str, port: int, allow_remote: bool) -> None:
    """Refuse a non-loopback gateway address unless opted in; warn loudly when opted in."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ConfigError(
            f"gateway host {host!r} is not a loopback address: it would expose the admin API (a bearer "
            "token over plaintext HTTP, able to kill servers) to the network. Bind 127.0.0.1, or opt in "
            f"with {REMOTE_FLAG} ({REMOTE_KEY} in the config) behind a TLS-terminating proxy; "
            "see docs/security.md"
        )
    log.warning(
        "SECURITY: the gateway listens on %s:%d, beyond this machine, and speaks plaintext HTTP: the "
        "admin token (which can kill servers) crosses the network in clear text. Put a TLS-terminating "
        "proxy in front and firewall the port (docs/security.md)",
        host,
        port,
    )


def checked_token(token: str, source: str) -> str:
    """``token`` if it is long enough; else a ConfigError naming ``source`` (never the token)."""
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"the admin token from {source} has {len(token)} characters: at least {MIN_TOKEN_CHARS} are "
            "required (make one with: python -c 'import secrets; print(secrets.token_urlsafe(24))')"
        )
    return token


def read_token_file(path: str | Path) -> str:
    """The admin token kept in a file (its first line, stripped), checked like any other."""
    path = Path(path).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the admin token file {str(path)!r}: {exc.strerror or exc}") from exc
    lines = text.splitlines()
    return checked_token(lines[0] if lines else "", f"file {str(path)!r}")
