"""How log records look on stderr: text lines, or JSON lines with ``--json``.

Both carry the trace and span a record was written in (``engine.tracing.TraceContextFilter``
sets them while a span is current, as when a handler logs inside its event's ``process``
span), so a log line leads to its trace.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``, then `` trace_id=... span_id=...`` inside a span."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        trace_id = getattr(record, "trace_id", None)
        if trace_id is None:
            return line
        first, newline, rest = line.partition("\n")  # after the message, before a traceback
        ids = f" trace_id={trace_id} span_id={getattr(record, 'span_id', None)}"
        return first + ids + newline + rest


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, RFC 3339), ``level``, ``logger``,
    ``message``, ``trace_id`` and ``span_id`` inside a span, ``exception`` when one was
    logged."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        trace_id = getattr(record, "trace_id", None)
        if trace_id is not None:
            line["trace_id"] = trace_id
            line["span_id"] = getattr(record, "span_id", None)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False)
