"""Log records as JSON lines, each with the request it belongs to.

``telemetry: {log_format: json}`` in the config, or ``FAILSOFT_LOG_FORMAT=json``, makes every
failsoft process (the CLI's, the gateway's, each agent's) write one JSON object per record on
stderr::

    {"ts": "2026-11-27T03:12:45.120Z", "level": "INFO", "logger": "failsoft.access",
     "message": "POST /v2/models/cam/infer 200 3.1 ms", "component": "gateway",
     "request_id": "5f0c...", "method": "POST", "path": "/v2/models/cam/infer", "status": 200,
     "ms": 3.1, "service": "cam"}

``request_id`` is the id the gateway gave the request (also its ``X-Request-Id`` response header,
and the id its calls to agents are named by): a :class:`contextvars.ContextVar` set for the
request's task, so every record logged while serving it carries it. The fields a call passes in
``extra=`` are written as they are; a record's exception as ``exc_info`` text.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import os
import sys
from typing import Any

from failsoft.errors import ConfigError

FORMAT_ENV = "FAILSOFT_LOG_FORMAT"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("failsoft_request_id", default=None)

# the attributes every LogRecord has: what is left in __dict__ came in through extra=
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


_OURS = "_failsoft_handler"  # marks the handlers configure() added, the only ones it replaces


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ms), level, logger, message, the component (the
    process: ``gateway``, ``agent s1``), the request id in context, and the record's ``extra`` fields."""

    def __init__(self, component: str = "failsoft") -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        out: dict[str, Any] = {
            "ts": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "component": self.component,
        }
        rid = request_id.get()
        if rid is not None:
            out["request_id"] = rid
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def log_format(configured: str = "text") -> str:
    """The format to use: ``FAILSOFT_LOG_FORMAT`` over ``configured``; one clear error otherwise."""
    chosen = os.environ.get(FORMAT_ENV, "").strip().lower() or configured
    if chosen not in FORMATS:
        raise ConfigError(f"log format must be one of {', '.join(FORMATS)}; got {chosen!r} ({FORMAT_ENV})")
    return chosen


def formatter(fmt: str, component: str) -> logging.Formatter:
    return JsonFormatter(component) if fmt == "json" else logging.Formatter(TEXT_FORMAT)


def configure(fmt: str, component: str, level: int = logging.INFO, logger: str = "failsoft") -> None:
    """Send ``logger``'s records (``""``: the root's) to stderr in ``fmt`` (``text`` or ``json``,
    ``FAILSOFT_LOG_FORMAT`` first), in place of the handler an earlier call added: a process
    configures once, at its start. Handlers others attached (an application's, pytest's) stay."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format(fmt), component))
    setattr(handler, _OURS, True)
    target = logging.getLogger(logger)
    for old in list(target.handlers):
        if getattr(old, _OURS, False):
            target.removeHandler(old)
    target.addHandler(handler)
    target.setLevel(level)
