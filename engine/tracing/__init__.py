"""OpenTelemetry tracing of the outbox: one trace from the request to every handler.

The engine uses ``opentelemetry-api`` only. A service that configures the SDK gets a
PRODUCER span for each outbox write, a CONSUMER ``process`` span for each delivery (its
handlers run inside it), and a PRODUCER span for each message the relay sends; without
one the engine makes no span and writes rows as before. Pieces: ``tracer`` (whether to
trace), ``propagation`` (the stored W3C context), ``spans`` (names and attributes),
``publishing`` (capture at publish), ``logs`` (trace ids on log records).
"""

from engine.tracing.logs import TraceContextFilter
from engine.tracing.propagation import TraceContext, TraceParent, parse_traceparent
from engine.tracing.tracer import active_tracer, set_tracer_provider

__all__ = [
    "TraceContext",
    "TraceContextFilter",
    "TraceParent",
    "active_tracer",
    "parse_traceparent",
    "set_tracer_provider",
]
