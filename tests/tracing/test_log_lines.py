"""Log lines name the trace and span they were written in: text and JSON."""

from __future__ import annotations

import io
import json
import logging

from engine.tracing import TraceContextFilter
from outbox_tui.cli.log_format import JsonFormatter, TextFormatter

from .conftest import Spans


def logged(formatter: logging.Formatter, spans: Spans | None = None) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(TraceContextFilter())
    logger = logging.getLogger("tests.log_lines")
    logger.addHandler(handler)
    try:
        if spans is None:
            logger.warning("outside")
        else:
            with spans.tracer.start_as_current_span("inside") as span:
                logger.warning("inside")
                context = span.get_span_context()
                expected = f"{context.trace_id:032x}", f"{context.span_id:016x}"
    finally:
        logger.removeHandler(handler)
    return stream.getvalue() if spans is None else stream.getvalue() + "|" + ",".join(expected)


def test_a_text_line_ends_with_its_trace_ids_inside_a_span(spans):
    line, ids = logged(TextFormatter(), spans).split("|")
    trace_id, span_id = ids.split(",")
    assert line.rstrip().endswith(f"tests.log_lines: inside trace_id={trace_id} span_id={span_id}")
    assert logged(TextFormatter()).rstrip().endswith("tests.log_lines: outside")


def test_a_json_line_carries_its_trace_ids_inside_a_span(spans):
    line, ids = logged(JsonFormatter(), spans).split("|")
    record = json.loads(line)
    assert (record["trace_id"], record["span_id"]) == tuple(ids.split(","))
    assert (record["level"], record["logger"], record["message"]) == (
        "WARNING",
        "tests.log_lines",
        "inside",
    )
    outside = json.loads(logged(JsonFormatter()))
    assert "trace_id" not in outside and outside["time"].endswith("Z")
