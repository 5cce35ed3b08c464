"""Ordering keys in the console: the blocked-keys view (b), the key filter, the detail's place
in the key, and skip (k) behind the confirmation. Every body runs on SQLite and PostgreSQL."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from sqlalchemy import select
from textual.widgets import Input

from engine import create_engine
from engine.operating.insights import BlockedKey, EventFilter, OutboxInsights
from engine.storage.schema import DEAD_LETTER, replay_log
from engine.writing.registry import EventRegistry
from outbox_tui.screens.filter import FilterModal
from outbox_tui.screens.help import HelpScreen, keys_table
from outbox_tui.widgets.blocked_keys import BlockedKeysTable
from outbox_tui.widgets.event_detail import EventDetailPane, render_detail
from outbox_tui.widgets.event_table import EventTable
from outbox_tui.widgets.overview import CountTile

from .conftest import (
    SIZE,
    console,
    dialog,
    palette_offers,
    paste,
    refreshed,
    seed,
    started,
    until,
)
from .test_replay import detail_of, notes


@pytest.fixture
async def ordered_url(database_url: str, orders_registry: EventRegistry) -> str:
    """Every order's placed event tried once: refused orders hold their keys (one of them
    with its cancellation waiting behind), flaky ones hold theirs until their retry."""
    await seed(database_url, orders_registry, rounds=3)
    return database_url


async def blocked(url: str) -> list[BlockedKey]:
    engine = create_engine(url)
    try:
        return await OutboxInsights(engine).blocked_keys()
    finally:
        await engine.dispose()


async def audit(url: str) -> list[dict[str, object]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return [dict(r) for r in (await conn.execute(select(replay_log))).mappings()]
    finally:
        await engine.dispose()


def ident(keys: list[BlockedKey]) -> list[tuple[str, str, str, int]]:
    """What stays the same between two looks at the blocked keys (ages move on)."""
    return [(k.ordering_key, k.head_id, k.head_status, k.waiting) for k in keys]


def waiting_key(keys: list[BlockedKey]) -> BlockedKey:
    return next(k for k in keys if k.head_status == DEAD_LETTER and k.waiting)


def pane_text(app) -> str:
    pane = app.main.query_one(EventDetailPane)
    out = Console(width=110, record=True, file=io.StringIO())
    out.print(render_detail(pane.detail, app.clock(), waiting=pane.waiting))
    return " ".join(out.export_text().split())


async def open_blocked_keys(pilot, app, expected: int) -> BlockedKeysTable:
    await pilot.press("b")
    table = app.main.query_one(BlockedKeysTable)
    await until(
        pilot,
        lambda: app.main.mode == "blocked_keys" and table.row_count == expected,
        "the blocked keys",
    )
    return table


async def move_to(pilot, table: BlockedKeysTable, key: BlockedKey) -> None:
    row = [k.ordering_key for k in table.blocked_keys].index(key.ordering_key)
    await pilot.press("home", *["down"] * row)
    assert table.highlighted is not None
    assert table.highlighted.ordering_key == key.ordering_key


async def test_b_lists_blocked_keys_and_enter_opens_the_head(ordered_url, orders_registry):
    expected = await blocked(ordered_url)
    key = waiting_key(expected)
    app = console(ordered_url, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        assert app.main.last_snapshot.blocked_keys == len(expected)
        tile = app.main.query_one("#tile-blocked_keys", CountTile)
        # The note is cut to the tile's width, so it is there only once the tile is laid out.
        await until(
            pilot, lambda: str(tile.border_subtitle).startswith("oldest "), "the tile's note"
        )
        assert str(len(expected)) in str(tile.render())
        assert str(tile.border_subtitle).startswith("oldest ")

        table = await open_blocked_keys(pilot, app, len(expected))
        assert ident(table.blocked_keys) == ident(expected)  # the engine's: oldest head first
        box = app.main.query_one("#list")
        assert str(box.border_title).startswith("Blocked keys")
        assert f"{len(expected)} shown" in str(box.border_subtitle)

        await move_to(pilot, table, key)
        await pilot.press("enter")
        pane = app.main.query_one(EventDetailPane)
        await until(pilot, lambda: pane.event_id == key.head_id, "the head's detail")
        await until(pilot, lambda: pane.waiting == key.waiting, "what waits behind it")
        text = pane_text(app)
        assert f"ordering key {key.ordering_key}" in text
        assert "earlier in key none: it is the head of its key" in text
        assert f"waiting behind {key.waiting} event" in text and "k skips it" in text

        await pilot.press("escape", "e")
        await until(pilot, lambda: app.main.mode == "events", "the events view")
        assert app.main.query_one(EventTable).display
        assert not table.display


async def test_the_filter_and_w_show_a_keys_undelivered_events(ordered_url, orders_registry):
    key = waiting_key(await blocked(ordered_url))
    app = console(ordered_url, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        table = app.main.query_one(EventTable)
        await pilot.press("slash")
        assert isinstance(app.screen, FilterModal)
        await pilot.press("ctrl+l", "tab", "tab", "tab", "tab")
        assert app.screen.focused is app.screen.query_one("#filter-key", Input)
        await paste(pilot, key.ordering_key)
        await pilot.press("enter")
        wanted = EventFilter(ordering_key=key.ordering_key)
        await until(pilot, lambda: app.main.view.filter == wanted, "the key filter")
        await until(pilot, lambda: table.row_count == key.waiting + 1, "the key's events")
        rows = table.events
        assert {e.ordering_key for e in rows} == {key.ordering_key}
        assert rows[-1].id == key.head_id and rows[-1].status == DEAD_LETTER  # newest first
        assert f"key={key.ordering_key}" in str(app.main.query_one("#list").border_title)

        # The newest waiting event: one undelivered event of its key (the head) comes first.
        await pilot.press("home", "enter")
        pane = app.main.query_one(EventDetailPane)
        await until(pilot, lambda: pane.event_id == rows[0].id, "the waiting event's detail")
        text = pane_text(app)
        assert f"earlier in key {key.waiting} undelivered event" in text
        assert pane.waiting is None  # a pending event holds nothing back

        await pilot.press("escape", "slash", "ctrl+l", "enter")
        await until(pilot, lambda: app.main.view.filter == EventFilter(), "the cleared filter")
        blocked_table = await open_blocked_keys(pilot, app, app.main.last_snapshot.blocked_keys)
        await move_to(pilot, blocked_table, key)
        await pilot.press("w")
        await until(pilot, lambda: app.main.mode == "events", "w: the events view")
        assert app.main.view.filter == wanted
        await until(pilot, lambda: table.row_count == key.waiting + 1, "w: the key's events")


async def test_k_skips_a_blocked_head_after_the_confirmation(ordered_url, orders_registry):
    keys = await blocked(ordered_url)
    key = waiting_key(keys)
    app = console(ordered_url, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        table = await open_blocked_keys(pilot, app, len(keys))
        await move_to(pilot, table, key)
        await pilot.press("k")
        confirm = await dialog(pilot, "the confirmation")
        body = " ".join(str(confirm.query_one("#confirm-body").render()).split())
        assert "Skip dead letter" in body and key.ordering_key in body
        assert f"releases {key.waiting} waiting event" in body
        await pilot.press(*"refund by hand", "enter")
        await until(
            pilot,
            lambda: confirm.focused is confirm.query_one("#confirm"),
            "enter in the reason to move the focus to the confirm button",
        )
        assert app.screen is confirm  # enter moved to the button
        await pilot.press("y")
        await until(pilot, lambda: any(n.startswith("Skipped") for n in notes(app)), "the toast")
        assert any(f"{key.waiting} waiting event" in n for n in notes(app))
        await until(
            pilot,
            lambda: key.ordering_key not in [k.ordering_key for k in table.blocked_keys],
            "the key to be released",
        )
        assert app.main.last_snapshot.blocked_keys == len(keys) - 1
    detail = await detail_of(ordered_url, key.head_id)
    assert detail.columns["status"] == DEAD_LETTER and detail.columns["skipped_at"] is not None
    [entry] = await audit(ordered_url)
    assert (entry["event_id"], entry["action"], entry["operator"], entry["reason"]) == (
        key.head_id,
        "skip",
        "tester",
        "refund by hand",
    )


async def test_k_cancelled_changes_nothing_and_is_off_for_a_failed_head(
    ordered_url, orders_registry
):
    keys = await blocked(ordered_url)
    key = waiting_key(keys)
    failed = next(k for k in keys if k.head_status == "failed")
    app = console(ordered_url, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        table = await open_blocked_keys(pilot, app, len(keys))
        await move_to(pilot, table, key)
        for cancel in (("enter", "n"), ("escape",)):
            await pilot.press("k")
            await dialog(pilot, "the confirmation")
            await pilot.press(*cancel)
            await until(pilot, lambda: app.screen is app.main, f"{cancel} to close the dialog")
        assert any("Skip cancelled" in n for n in notes(app))

        await move_to(pilot, table, failed)  # a retry will release it: nothing to skip
        assert app.main.check_action("skip_dead_letter", ()) is False  # not in the footer
        await pilot.press("k")
        await pilot.pause(0.2)
        assert app.screen is app.main
        await refreshed(pilot)
        assert ident(table.blocked_keys) == ident(keys)
    assert await audit(ordered_url) == []
    assert (await detail_of(ordered_url, key.head_id)).columns["skipped_at"] is None


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_help_and_palette_offer_the_new_keys(ordered_url, orders_registry):
    app = console(ordered_url, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        out = Console(width=100, record=True, file=io.StringIO())
        out.print(keys_table())
        keys = out.export_text()
        assert "blocked keys" in keys and "skip the highlighted dead letter" in keys
        assert "ordering key" in keys
        await pilot.press("escape", "ctrl+p")
        await until(pilot, lambda: app.screen is not app.main, "the palette")
        await palette_offers(pilot, "blocked", "Show blocked keys")
        await pilot.press("enter")
        await until(pilot, lambda: app.main.mode == "blocked_keys", "the palette command")
