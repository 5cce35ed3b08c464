"""Log records that say which trace and span they were written in.

``TraceContextFilter`` sets ``trace_id`` and ``span_id`` (lower-case hex) on every record
it sees while a valid span is current, such as a handler's log lines inside an event's
``process`` span, and ``None`` otherwise, so a format string may name them always. Add it
to a handler (``handler.addFilter(TraceContextFilter())``): the CLI adds it to its own.
"""

from __future__ import annotations

import logging

from opentelemetry import trace


class TraceContextFilter(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` to each record; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = trace.format_trace_id(context.trace_id)
            record.span_id = trace.format_span_id(context.span_id)
        else:
            record.trace_id = record.span_id = None
        return True
