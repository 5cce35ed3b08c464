"""An event's cause and chain in the detail pane: which event a handler published it for,
and the whole chain from its first event, this one marked."""

from __future__ import annotations

import io

from rich.console import Console

from outbox_tui.widgets.event_detail import EventDetailPane, render_detail
from outbox_tui.widgets.event_table import EventTable
from outbox_tui.widgets.format import short_id
from tests.chains import chain_registry, seed_chain

from .conftest import SIZE, console, started, until


async def test_the_detail_of_a_follow_up_shows_its_cause_and_its_chain(sqlite_url):
    registry = chain_registry()
    first, _follow_up = await seed_chain(sqlite_url, registry)
    app = console(sqlite_url, registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        table = app.main.query_one(EventTable)
        follow_up = table.highlighted  # the newest event comes first
        assert follow_up is not None and follow_up.id != first
        await pilot.press("enter")
        pane = app.main.query_one(EventDetailPane)
        await until(pilot, lambda: pane.event_id == follow_up.id, "the follow-up's detail")
        assert pane.detail is not None
        out = Console(width=120, record=True, file=io.StringIO())
        out.print(render_detail(pane.detail, app.clock()))
        text = out.export_text()
    assert f"caused by         {first}" in text
    assert "Chain (2 events)" in text
    chain = text[text.index("Chain (2 events)") :].splitlines()[1:3]
    assert "orders.placed" in chain[0] and short_id(first) in chain[0]
    assert "└" in chain[1] and "invoices.issued" in chain[1] and "◀ this event" in chain[1]
