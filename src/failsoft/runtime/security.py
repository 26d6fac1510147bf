"""What failsoft refuses so that a default deployment exposes nothing (see ``docs/security.md``).

The admin API (``/admin``: status, and chaos that kills processes) is served apart from inference,
on its own port (``gateway.admin_host``/``admin_port``, default ``127.0.0.1`` and the inference
port + 1), protected by a bearer token, in plain HTTP unless ``gateway.admin_tls`` is set. So:

* the admin plane binds a non-loopback address only when the operator opted in
  (``gateway.allow_remote: true``, or ``failsoft serve --allow-remote-admin``), and then says loudly
  when the token would travel in clear text (no ``admin_tls``);
* the inference plane may listen where the config says; beyond loopback it is logged, as it
  answers anyone who reaches it (no authentication, like Triton's and KServe's);
* a TLS certificate and key are loaded once before any process starts (:func:`check_tls`);
* an admin token shorter than :data:`MIN_TOKEN_CHARS` is refused, wherever it comes from;
* a token is never read from the command line, where ``ps`` shows it to every local user: it comes
  from the config, ``$FAILSOFT_ADMIN_TOKEN``, or a file (``--token-file``, the state directory's
  ``admin_token``); it is never logged.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from failsoft.errors import ConfigError

log = logging.getLogger(__name__)
MIN_TOKEN_CHARS = 16
REMOTE_FLAG = "--allow-remote-admin"


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """Files that exist (checked when the config is read); their contents are checked at start."""

    certfile: Path
    keyfile: Path


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


def check_bind(host: str, port: int, allow_remote: bool, tls: bool = False) -> None:
    """Refuse a non-loopback admin address unless opted in; warn loudly when opted in without TLS."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ConfigError(
            f"admin host {host!r} is not a loopback address: it would expose the admin API (a bearer "
            "token, able to kill servers) to the network. Bind 127.0.0.1, or opt in "
            f"with {REMOTE_FLAG} ({REMOTE_KEY} in the config), with gateway.admin_tls set; "
            "see docs/security.md"
        )
    if tls:
        log.warning("SECURITY: the admin API listens on %s:%d, beyond this machine (HTTPS)", host, port)
        return
    log.warning(
        "SECURITY: the admin API listens on %s:%d, beyond this machine, and speaks plaintext HTTP: the "
        "admin token (which can kill servers) crosses the network in clear text. Set gateway.admin_tls "
        "or put a TLS-terminating proxy in front, and firewall the port (docs/security.md)",
        host,
        port,
    )


def note_inference_bind(host: str, port: int, tls: bool) -> None:
    """Say so when the unauthenticated inference API is reachable beyond this machine."""
    if not is_loopback(host):
        scheme = "HTTPS" if tls else "plaintext HTTP"
        log.warning(
            "the inference API listens on %s:%d, beyond this machine, in %s and without authentication "
            "(the admin API stays on its own port)",
            host,
            port,
            scheme,
        )


def check_tls(tls: TlsSettings | None, where: str) -> None:
    """Load a certificate and its key once, so that a bad pair is one error before anything starts."""
    if tls is None:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(tls.certfile, tls.keyfile)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"{where}: cannot use certfile {str(tls.certfile)!r} with keyfile {str(tls.keyfile)!r}: "
            f"{getattr(exc, 'reason', None) or exc}"
        ) from exc


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
