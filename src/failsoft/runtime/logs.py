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

Records reach stderr through a bounded queue and one writer thread (the standard library's
:class:`~logging.handlers.QueueHandler` and :class:`~logging.handlers.QueueListener`): a process
that logs never waits on its stderr. Without it, a full pipe (a supervisor that stopped reading,
a terminal on hold) blocks the gateway's event loop inside its access-log line, and every request
with it. When the queue is full (:data:`QUEUE_RECORDS` records waiting), a record is dropped and
counted (:func:`dropped`); the writer reports the count once stderr moves again.
"""

from __future__ import annotations

import atexit
import contextvars
import copy
import datetime
import json
import logging
import logging.handlers
import os
import queue
import sys
import threading
from typing import Any

from failsoft.errors import ConfigError

FORMAT_ENV = "FAILSOFT_LOG_FORMAT"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("failsoft_request_id", default=None)

# the attributes every LogRecord has: what is left in __dict__ came in through extra=
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


_OURS = "_failsoft_handler"  # marks the handlers configure() added, the only ones it replaces
_RID = "_failsoft_request_id"  # the request id in context when the record was made (before the queue)
QUEUE_RECORDS = 10_000  # records waiting for stderr before new ones are dropped
FLUSH_S = 5.0  # how long an exiting process waits for a blocked stderr to take what is queued


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
        rid = getattr(record, _RID, None) or request_id.get()
        if rid is not None:
            out["request_id"] = rid
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        return json.dumps(out, default=str)


def log_format(configured: str = "text") -> str:
    """The format to use: ``FAILSOFT_LOG_FORMAT`` over ``configured``; one clear error otherwise."""
    chosen = os.environ.get(FORMAT_ENV, "").strip().lower() or configured
    if chosen not in FORMATS:
        raise ConfigError(f"log format must be one of {', '.join(FORMATS)}; got {chosen!r} ({FORMAT_ENV})")
    return chosen


def formatter(fmt: str, component: str) -> logging.Formatter:
    return JsonFormatter(component) if fmt == "json" else logging.Formatter(TEXT_FORMAT)


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    """Hands records to the writer thread; never blocks: a full queue drops the record and counts it.

    A record is made ready to cross threads here, while its context is still the caller's: the
    message resolved, the exception rendered, the request id in context kept on the record."""

    def __init__(self, records: queue.Queue[logging.LogRecord]) -> None:
        super().__init__(records)
        self.dropped = 0
        self._lock = threading.Lock()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        ready = copy.copy(record)
        ready.msg = record.getMessage()
        ready.args = None
        ready.message = ready.msg
        if record.exc_info and not record.exc_text:
            ready.exc_text = logging.Formatter().formatException(record.exc_info)
        ready.exc_info = None
        setattr(ready, _RID, request_id.get())
        return ready

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            with self._lock:
                self.dropped += 1


class _Stderr(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is when the record is written, not when it was made:
    the writer thread outlives a stream that was swapped and closed (a test's capture, a daemon's
    redirection)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class _Writer:
    """The writer thread of one :func:`configure` call and the handler that feeds it."""

    def __init__(self, stream: logging.Handler) -> None:
        self.records: queue.Queue[logging.LogRecord | None] = queue.Queue(QUEUE_RECORDS)
        self.handler = _DroppingQueueHandler(self.records)  # type: ignore[arg-type]
        self.stream = stream
        self._reported = 0
        self.thread = threading.Thread(target=self._write, name="failsoft-log-writer", daemon=True)
        self.thread.start()

    def _write(self) -> None:
        while (record := self.records.get()) is not None:
            dropped = self.handler.dropped
            if dropped > self._reported:
                self.stream.handle(
                    logging.LogRecord(
                        "failsoft.logs",
                        logging.WARNING,
                        __file__,
                        0,
                        "%d log records dropped: stderr did not keep up",
                        (dropped - self._reported,),
                        None,
                    )
                )
                self._reported = dropped
            self.stream.handle(record)

    def stop(self, timeout_s: float = FLUSH_S) -> None:
        """Write what waits, then end the thread (at exit, or when configure() replaces it); a
        stderr that stays blocked gets ``timeout_s``, then the thread is left to the exit."""
        if not self.thread.is_alive():
            return
        try:
            self.records.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self.thread.join(timeout_s)


_writers: list[_Writer] = []


def dropped() -> int:
    """Log records dropped since the process started because stderr did not keep up."""
    return sum(w.handler.dropped for w in _writers)


@atexit.register
def _flush_at_exit() -> None:
    for writer in _writers:
        writer.stop()


def configure(fmt: str, component: str, level: int = logging.INFO, logger: str = "failsoft") -> None:
    """Send ``logger``'s records (``""``: the root's) to stderr in ``fmt`` (``text`` or ``json``,
    ``FAILSOFT_LOG_FORMAT`` first) through the writer thread, in place of the handler an earlier
    call added: a process configures once, at its start. Handlers others attached (an
    application's, pytest's) stay."""
    stream = _Stderr(sys.stderr)
    stream.setFormatter(formatter(log_format(fmt), component))
    writer = _Writer(stream)
    setattr(writer.handler, _OURS, True)
    target = logging.getLogger(logger)
    for old in list(target.handlers):
        if getattr(old, _OURS, False):
            target.removeHandler(old)
            for gone in [w for w in _writers if w.handler is old]:
                gone.stop()
                _writers.remove(gone)
    _writers.append(writer)
    target.addHandler(writer.handler)
    target.setLevel(level)
