"""An event's trace in its detail: the trace id, the parent span, the link to open.

Its own module so the detail pane stays a composition of sections; ``outbox-tui event``
renders the same rows.
"""

from __future__ import annotations

from rich.text import Text

from engine.operating.insights import EventDetail
from outbox_tui.safe_text import printable
from outbox_tui.widgets.format import MUTED_STYLE


def trace_link(template: str | None, trace_id: str | None) -> str | None:
    """``template`` (``--trace-url-template``) with the trace id in, when both are known."""
    if not template or not trace_id:
        return None
    return template.replace("{trace_id}", trace_id)


def trace_rows(detail: EventDetail, trace_url_template: str | None) -> list[tuple[str, Text]]:
    """The trace id, the span the event's spans hang under, and the link to the trace."""
    rows = [("trace id", Text(printable(detail.trace_id or "—")))]
    parent = detail.trace_parent
    if parent is not None:
        sampled = "" if parent.sampled else "  not sampled"
        rows.append(("parent span", Text.assemble(parent.span_id, (sampled, MUTED_STYLE))))
    elif detail.columns.get("traceparent"):  # stored, but not a W3C traceparent
        rows.append(("parent span", Text("— (traceparent not W3C)", style=MUTED_STYLE)))
    link = trace_link(trace_url_template, parent.trace_id if parent else detail.trace_id)
    if link is not None:
        rows.append(("trace", Text(printable(link), style=f"link {link}")))
    return rows
