"""Capture at publish: each outbox row stores the trace context it was written in.

``publish_spans(rows)`` wraps a publisher's INSERT. With a tracer it starts one PRODUCER
span per row (a child of the caller's current span) and stores that span's context in
the row's ``traceparent`` and ``tracestate``; the spans end when the INSERT has run,
recording its error if it raised. Without one it stores the current span's context when
there is a valid one (a service that extracts contexts with the API alone), and
otherwise changes nothing: the row is written exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import Any

from opentelemetry.trace import Span

from engine.tracing import spans
from engine.tracing.propagation import context_of, current_context
from engine.tracing.tracer import active_tracer

_NOTHING: AbstractContextManager[None] = nullcontext()


def publish_spans(rows: Sequence[dict[str, Any]]) -> AbstractContextManager[None]:
    """Stamp ``rows`` with their trace context; the PRODUCER spans end on exit."""
    tracer = active_tracer()
    if tracer is None:
        found = current_context()
        if found is not None:
            for row in rows:
                row["traceparent"], row["tracestate"] = found
        return _NOTHING
    started = []
    for row in rows:
        span = spans.start_publish(tracer, row)
        stored = context_of(span)
        row["traceparent"], row["tracestate"] = stored if stored is not None else (None, None)
        started.append(span)
    return _PublishSpans(started)


class _PublishSpans:
    """Ends the spans of one INSERT, with its error if it raised."""

    def __init__(self, started: list[Span]) -> None:
        self._spans = started

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for span in self._spans:
            if exc is None:
                spans.end(span, "written")
            else:
                spans.record_failure(span, exc)
                spans.end(span, "not_written", f"{type(exc).__name__}: {exc}")
