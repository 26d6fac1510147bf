"""OpenTelemetry traces of a request, from the gateway through the call to the agent and back.

One inference request makes one trace:

* ``POST /v2/models/{name}/infer`` (kind SERVER), in the gateway, around the whole request
  (:mod:`failsoft.runtime.gateway.access`); a ``traceparent`` header the client sent is its parent;
* ``agent.call`` (CLIENT), in the gateway, around each call to an agent (a retry on a newer route
  is a second one), :func:`call_span`;
* ``agent.infer`` (SERVER), in the agent's process, with its two children ``agent.queue`` (the
  request waiting in the model's serving queue) and ``model.predict`` (the batch it ran in:
  ``failsoft.batch_rows`` says how many rows it held), :func:`serve`.

The context crosses the process boundary as W3C Trace Context (``traceparent``, ``tracestate``) in
a plain ``dict[str, str]`` the call carries beside the batch (its ``meta``): whatever transport
carries the call carries the dict.

**Off by default, and nearly free when off**: no tracer provider is made, :func:`enabled` is
False, and every helper here returns at its first test (no span objects, an empty ``meta``, the
queue called directly). Turned on per process by :func:`configure` from the config's
``telemetry: {traces: console | otlp | none}`` or the environment (``FAILSOFT_TRACES`` wins over
the config; ``otlp`` reads the standard ``OTEL_EXPORTER_OTLP_*`` variables, which the agents are started
with as the gateway's process has them, and needs the ``opentelemetry-exporter-otlp-proto-http``
package: ``pip install failsoft[otlp]``). Each process (gateway, every agent) exports its own
spans; a collector joins them by trace id.

This module keeps its provider to itself rather than installing OpenTelemetry's global one, which
can be set once per process: tests install an SDK provider with an ``InMemorySpanExporter``
(:func:`use_provider`) and remove it afterwards.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from failsoft.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

    from failsoft.runtime.serving import ServingQueue

TRACES_ENV = "FAILSOFT_TRACES"
EXPORTERS = ("none", "console", "otlp")
SCOPE = "failsoft"

_provider: TracerProvider | None = None
_tracer: Tracer | None = None


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    """The config's ``telemetry`` section. ``traces``: where spans go (``none``; ``console``: JSON
    on stdout; ``otlp``: an OTLP/HTTP collector); ``log_format``: ``text`` or ``json``
    (:mod:`failsoft.runtime.logs`); ``access_log``: one line per HTTP request at the gateway."""

    traces: str = "none"
    log_format: str = "text"
    access_log: bool = True

    def __post_init__(self) -> None:
        from failsoft.runtime.logs import FORMATS

        if self.traces not in EXPORTERS:
            raise ConfigError(f"telemetry.traces must be one of {', '.join(EXPORTERS)}; got {self.traces!r}")
        if self.log_format not in FORMATS:
            raise ConfigError(
                f"telemetry.log_format must be one of {', '.join(FORMATS)}; got {self.log_format!r}"
            )


def traces_from_env(configured: str, environ: Mapping[str, str] | None = None) -> str:
    """``FAILSOFT_TRACES`` over the configured exporter; one clear error for a name not known."""
    env = os.environ if environ is None else environ
    chosen = env.get(TRACES_ENV, "").strip().lower() or configured
    if chosen not in EXPORTERS:
        raise ConfigError(f"{TRACES_ENV} must be one of {', '.join(EXPORTERS)}; got {chosen!r}")
    return chosen


def configure(settings: TelemetrySettings, service: str) -> bool:
    """Set this process's exporter from ``settings`` (the environment applied); True when tracing.
    ``service`` names the process in every span (``failsoft-gateway``, ``failsoft-agent``)."""
    traces = traces_from_env(settings.traces)
    if traces == "none":
        use_provider(None)
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = SdkProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(_exporter(traces)))
    use_provider(provider)
    return True


def _exporter(kind: str) -> Any:
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    try:  # an optional package: OTEL_EXPORTER_OTLP_ENDPOINT and the other standard variables apply
        module = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    except ImportError as exc:
        raise ConfigError(
            "telemetry.traces: otlp needs the OTLP exporter: "
            "pip install opentelemetry-exporter-otlp-proto-http"
        ) from exc
    return module.OTLPSpanExporter()


def forwarded_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that steer tracing and logs (``OTEL_*``, ``FAILSOFT_TRACES``,
    ``FAILSOFT_LOG_FORMAT``) in this process, for the agents it starts: their spans go where the
    gateway's go, on whichever node they run."""
    env = os.environ if environ is None else environ
    keep = (TRACES_ENV, "FAILSOFT_LOG_FORMAT")
    return {k: v for k, v in env.items() if k.startswith("OTEL_") or k in keep}


def use_provider(provider: TracerProvider | None) -> None:
    """Trace with ``provider`` in this process (None: stop tracing)."""
    global _provider, _tracer
    _provider = provider
    _tracer = None if provider is None else provider.get_tracer(SCOPE)


def enabled() -> bool:
    return _tracer is not None


def tracer() -> Tracer:
    """The process's tracer (OpenTelemetry's no-op one when tracing is off)."""
    if _tracer is not None:
        return _tracer
    from opentelemetry import trace

    return trace.NoOpTracer()


def inject() -> dict[str, str]:
    """The current span's context as W3C headers (empty when tracing is off or no span is open)."""
    if _tracer is None:
        return {}
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> Any:
    """The OpenTelemetry context a ``meta`` dict (or HTTP headers) carries; None when none."""
    if _tracer is None or not carrier or "traceparent" not in carrier:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(dict(carrier))


@contextlib.contextmanager
def call_span(server: str, app: str, variant: str) -> Iterator[dict[str, str]]:
    """Around one call to an agent: the ``meta`` to send with it (empty when tracing is off)."""
    if _tracer is None:
        yield {}
        return
    from opentelemetry.trace import SpanKind

    attributes = {"failsoft.server": server, "failsoft.app": app, "failsoft.variant": variant}
    with _tracer.start_as_current_span("agent.call", kind=SpanKind.CLIENT, attributes=attributes):
        yield inject()


def serve(
    queue: ServingQueue,
    batch: Any,
    timeout_s: float | None,
    request_id: str | None,
    meta: Mapping[str, str] | None,
    attributes: Mapping[str, str],
) -> Any:
    """The agent's side of a call: ``queue.infer`` inside ``agent.infer``, ``agent.queue`` and
    ``model.predict`` spans when tracing is on and the call carried a context; else the queue alone."""
    parent = extract(meta)
    if parent is None or _tracer is None:
        return queue.infer(batch, timeout_s, request_id)
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(
        "agent.infer", context=parent, kind=SpanKind.SERVER, attributes=dict(attributes)
    ):
        ticket = queue.submit(batch, timeout_s, request_id)
        try:
            return queue.wait(ticket)
        finally:
            _record_stages(_tracer, ticket, None)


def submit(
    queue: ServingQueue,
    batch: Any,
    timeout_s: float | None,
    request_id: str | None,
    meta: Mapping[str, str] | None,
    attributes: Mapping[str, str],
    wake: bool = True,
) -> Any:
    """The data plane's side of a call (:meth:`failsoft.runtime.agent.Agent.submit_infer`): the
    ticket's future, with no thread waiting on it. When tracing is on and the call carried a
    context, the same ``agent.infer``, ``agent.queue`` and ``model.predict`` spans as :func:`serve`
    are recorded once the answer is done, from the ticket's own time stamps. ``wake`` False: the
    caller runs the queue next (:meth:`~failsoft.runtime.serving.ServingQueue.run_here`)."""
    ticket = queue.submit(batch, timeout_s, request_id, wake=wake)
    if _tracer is None or not meta:  # tracing off: nothing more per request
        return ticket.future
    parent = extract(meta)
    if parent is None:
        return ticket.future
    tracer = _tracer
    entered = ticket.stamps[0]

    def record(_: Any) -> None:
        import time

        from opentelemetry.trace import SpanKind, set_span_in_context

        root = tracer.start_span(
            "agent.infer",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=dict(attributes),
            start_time=entered,
        )
        _record_stages(tracer, ticket, set_span_in_context(root))
        root.end(end_time=time.time_ns())

    ticket.future.add_done_callback(record)
    return ticket.future


def _record_stages(tracer: Tracer, ticket: Any, context: Any) -> None:
    """A served ticket's queue wait and batch as ``agent.queue`` and ``model.predict`` spans, from
    its own time stamps, children of ``context`` (None: the span current in this thread)."""
    queued, taken, started, ended = ticket.stamps
    if taken:  # it ran (a request withdrawn or refused before its batch has no stages)
        tracer.start_span("agent.queue", context=context, start_time=queued).end(end_time=taken)
        predict = tracer.start_span(
            "model.predict",
            context=context,
            start_time=started,
            attributes={"failsoft.batch_rows": int(ticket.batch_rows)},
        )
        predict.end(end_time=ended)
