"""An event's trace in the detail pane: its trace id, the span it hangs under, and the
link ``--trace-url-template`` makes of them; the same in ``outbox-tui event --json``."""

from __future__ import annotations

import io

from rich.console import Console
from sqlalchemy import text

from engine import EventRegistry, create_engine, create_schema
from engine.operating.insights import OutboxInsights
from outbox_tui.output import event_detail_record
from outbox_tui.widgets.event_detail import EventDetailPane, render_detail
from outbox_tui.widgets.event_table import EventTable

from .conftest import SIZE, console, started, until

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
PAYLOAD = '{"tenant_id": "acme", "actor_id": "a", "request_id": "r", "trace_id": "legacy-1"}'


async def write(url: str, event_id: str, traceparent: str | None) -> None:
    engine = create_engine(url)
    try:
        await create_schema(engine)
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO outbox_events (id, tenant_id, event_type, event_version,"
                    " aggregate_type, aggregate_id, payload, traceparent) VALUES (:id, 'acme',"
                    " 'orders.placed', 1, 'order', 'o-1', :payload, :traceparent)"
                ),
                dict(id=event_id, payload=PAYLOAD, traceparent=traceparent),
            )
    finally:
        await engine.dispose()


def registry() -> EventRegistry:
    found = EventRegistry()
    found.register_event("orders.placed", 1)
    return found


async def test_the_detail_shows_the_trace_and_links_to_it(sqlite_url):
    await write(sqlite_url, "0190a8e0-0000-7000-8000-000000000001", f"00-{TRACE}-{SPAN}-01")
    template = "https://tempo.example/trace/{trace_id}"
    app = console(sqlite_url, registry(), trace_url_template=template)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        assert app.main.query_one(EventTable).highlighted is not None
        await pilot.press("enter")
        pane = app.main.query_one(EventDetailPane)
        await until(pilot, lambda: pane.detail is not None, "the detail")
        assert pane.detail is not None
        out = Console(width=120, record=True, file=io.StringIO())
        out.print(render_detail(pane.detail, app.clock(), trace_url_template=template))
        shown = out.export_text()
    assert f"trace id          {TRACE}" in shown
    assert f"parent span       {SPAN}" in shown
    assert f"trace             https://tempo.example/trace/{TRACE}" in shown


async def test_without_a_stored_context_the_payloads_trace_id_is_shown_as_before(sqlite_url):
    await write(sqlite_url, "0190a8e0-0000-7000-8000-000000000002", None)
    await write(sqlite_url, "0190a8e0-0000-7000-8000-000000000003", "not-w3c")
    engine = create_engine(sqlite_url)
    try:
        plain = await OutboxInsights(engine).event_detail("0190a8e0-0000-7000-8000-000000000002")
        odd = await OutboxInsights(engine).event_detail("0190a8e0-0000-7000-8000-000000000003")
    finally:
        await engine.dispose()
    out = Console(width=120, record=True, file=io.StringIO())
    out.print(render_detail(plain, plain.columns["created_at"]))
    out.print(render_detail(odd, odd.columns["created_at"]))
    shown = out.export_text()
    assert shown.count("trace id          legacy-1") == 2
    assert "parent span       — (traceparent not W3C)" in shown
    assert "https://" not in shown  # no template, no link
    assert (
        event_detail_record(plain)["trace_id"],
        event_detail_record(plain)["parent_span_id"],
    ) == (
        "legacy-1",
        None,
    )


def test_a_template_without_the_trace_id_is_refused_in_one_line(sqlite_url):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "outbox_tui", "--trace-url-template", "https://tempo/trace",
         "--database-url", sqlite_url],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "outbox-tui: error: OUTBOX_CONSOLE__TRACE_URL_TEMPLATE / --trace-url-template must be "
        "an http(s) URL containing {trace_id}, got https://tempo/trace"
    ]
