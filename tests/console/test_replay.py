"""Replay from the console: one dialog, y proceeds, n/escape change nothing, the audit log."""

from __future__ import annotations

import pytest

from engine import create_engine
from engine.operating.insights import EventFilter, OutboxInsights
from outbox_tui.widgets.event_table import EventTable

from .conftest import SIZE, console, counts, dialog, open_dead_letters, paste, started, until


async def detail_of(url: str, event_id: str):
    engine = create_engine(url)
    try:
        return await OutboxInsights(engine).event_detail(event_id)
    finally:
        await engine.dispose()


async def dead_letter_ids(url: str, flt: EventFilter | None = None) -> list[str]:
    engine = create_engine(url)
    try:
        base = flt or EventFilter()
        return await OutboxInsights(engine).matching_ids(
            EventFilter(("dead_letter",), base.event_type, base.tenant_id, base.aggregate_id)
        )
    finally:
        await engine.dispose()


ENTER = "enter in the reason to move the focus to the confirm button"


def notes(app) -> list[str]:
    return [f"{n.title}: {n.message}" for n in app._notifications]


@pytest.mark.all_drivers  # the console on psycopg 3 too
async def test_r_replays_the_highlighted_dead_letter_with_a_reason(seeded_url, orders_registry):
    app = console(seeded_url, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        table = await open_dead_letters(pilot, app)
        target = table.highlighted.id
        before = await counts(seeded_url)
        await pilot.press("r")
        confirm = await dialog(pilot)
        body = str(confirm.query_one("#confirm-body").render())
        assert "1 dead letter" in body and "orders.placed v1" in body
        await pilot.press(*"manual fix", "enter")  # enter moves on, it does not confirm
        await until(pilot, lambda: confirm.focused is confirm.query_one("#confirm"), ENTER)
        assert app.screen is confirm
        await pilot.press("y")
        await until(pilot, lambda: any("back to pending" in n for n in notes(app)), "the toast")
        await until(pilot, lambda: target not in [e.id for e in table.events], "the row to go")
    detail = await detail_of(seeded_url, target)
    assert detail.columns["status"] == "pending" and detail.columns["replay_count"] == 1
    [entry] = detail.replays
    assert entry["operator"] == "tester" and entry["reason"] == "manual fix"
    after = await counts(seeded_url)
    assert after["dead_letter"] == before["dead_letter"] - 1
    assert after["pending"] == before["pending"] + 1


async def test_n_and_escape_cancel_and_change_nothing(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        table = await open_dead_letters(pilot, app)
        target = table.highlighted.id
        before = await counts(sqlite_seeded)
        await pilot.press("r")
        await dialog(pilot)
        await pilot.press("enter", "n")  # n on the buttons (in the reason it is a letter)
        await until(pilot, lambda: app.screen is app.main, "n to close the dialog")
        await pilot.press("r")
        await dialog(pilot)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.main, "escape to close the dialog")
        await pilot.press("R")
        confirm = await dialog(pilot, "the bulk dialog")
        await pilot.press("enter")  # a stray enter only moves to the confirm button
        assert app.screen is confirm
        await pilot.press("tab", "enter")  # Cancel, pressed
        await until(pilot, lambda: app.screen is app.main, "enter on Cancel to close it")
    assert await counts(sqlite_seeded) == before
    assert (await detail_of(sqlite_seeded, target)).replays == []


async def test_r_on_a_row_that_is_not_a_dead_letter_opens_nothing(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        table = app.main.query_one(EventTable)
        assert table.highlighted.status != "dead_letter"
        assert app.main.check_action("replay_one", ()) is None  # shown dimmed in the footer
        await pilot.press("r")
        assert app.screen is app.main


async def test_shift_r_replays_every_dead_letter_matching_the_filter(
    sqlite_seeded, orders_registry
):
    app = console(sqlite_seeded, orders_registry)
    initech = await dead_letter_ids(sqlite_seeded, EventFilter(tenant_id="initech"))
    others = set(await dead_letter_ids(sqlite_seeded)) - set(initech)
    assert initech and others
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        table = await open_dead_letters(pilot, app)
        await pilot.press("slash")
        await pilot.press("tab")  # from the type field to the tenant
        await paste(pilot, "initech")
        await pilot.press("enter")
        await until(pilot, lambda: app.main.view.filter.tenant_id == "initech", "the filter")
        await until(pilot, lambda: {e.id for e in table.events} == set(initech), "initech rows")
        await pilot.press("R")
        body = str((await dialog(pilot)).query_one("#confirm-body").render())
        assert f"{len(initech)} dead letter" in body and "tenant=initech" in body
        assert "orders.placed" in body
        await pilot.press("enter", "y")
        await until(pilot, lambda: not table.events, "the replayed rows to go")
    remaining = set(await dead_letter_ids(sqlite_seeded))
    assert remaining == others
    for event_id in initech:
        assert (await detail_of(sqlite_seeded, event_id)).replays[0]["reason"] is None


async def test_shift_r_explains_when_the_filter_excludes_dead_letters(
    sqlite_seeded, orders_registry
):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        app.main.browser.set_filter(EventFilter(statuses=("pending",)))
        await pilot.press("R")
        await pilot.pause()
        assert app.screen is app.main
        assert any("matches no dead letters" in n for n in notes(app))


async def test_shift_r_replays_exactly_the_dead_letters_it_counted(sqlite_seeded, orders_registry):
    """A dead letter that appears while the dialog is open is not swept up by the confirm."""
    app = console(sqlite_seeded, orders_registry)
    counted = set(await dead_letter_ids(sqlite_seeded))
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await open_dead_letters(pilot, app)
        await pilot.press("R")
        confirm = await dialog(pilot)
        assert f"{len(counted)} dead letter" in str(confirm.query_one("#confirm-body").render())
        engine = create_engine(sqlite_seeded)
        try:  # meanwhile a dispatcher dead-letters one more event
            async with engine.begin() as conn:
                late = (
                    await conn.exec_driver_sql(
                        "UPDATE outbox_events SET status = 'dead_letter' WHERE id = "
                        "(SELECT min(id) FROM outbox_events WHERE status = 'pending') "
                        "RETURNING id"
                    )
                ).scalar_one()
        finally:
            await engine.dispose()
        await pilot.press("enter", "y")
        await until(pilot, lambda: any("back to pending" in n for n in notes(app)), "the toast")
        assert any(f"{len(counted)} dead letters back to pending" in n for n in notes(app))
    assert set(await dead_letter_ids(sqlite_seeded)) == {late}


async def test_typing_in_the_dialog_writes_the_reason(sqlite_seeded, orders_registry):
    """Every letter lands in the reason field, its n's too; enter moves to the buttons."""
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        table = await open_dead_letters(pilot, app)
        target = table.highlighted.id
        await pilot.press("r")
        confirm = await dialog(pilot)
        await pilot.press(*"fixed in deploy", "enter")
        await until(pilot, lambda: confirm.focused is confirm.query_one("#confirm"), ENTER)
        assert app.screen is confirm  # n and enter did not end the dialog
        await pilot.press("y")
        await until(pilot, lambda: any("back to pending" in n for n in notes(app)), "the toast")
    detail = await detail_of(sqlite_seeded, target)
    assert detail.replays[0]["reason"] == "fixed in deploy"
