"""Every key typed into a text field reaches it: bursts, pastes and tabs (issue 12, part 7)."""

from __future__ import annotations

from textual import events
from textual.widgets import Input

from engine.operating.insights import EventFilter
from outbox_tui.screens.filter import FilterModal

from .conftest import SIZE, burst, console, dialog, open_dead_letters, started, until
from .test_replay import detail_of, notes

PHRASE = "vendor fixed yesterday"  # y and n are the buttons' keys, text in the field


async def _replay_with_reason(app, pilot, url: str, type_reason) -> str:
    """Open the replay dialog, type the reason with ``type_reason``, confirm; the stored one."""
    table = await open_dead_letters(pilot, app)
    target = table.highlighted.id
    await pilot.press("r")
    confirm = await dialog(pilot)
    reason = confirm.query_one("#reason", Input)
    await type_reason(pilot)
    await until(
        pilot,
        lambda: app.screen is not confirm or reason.value == PHRASE,
        f"the reason to read {PHRASE!r} (or the dialog to end)",
    )
    assert app.screen is confirm, "a y or n of the reason ended the dialog"
    assert reason.value == PHRASE
    await pilot.press("enter", "y")  # enter leaves the field for the button; y confirms
    await until(pilot, lambda: any("back to pending" in n for n in notes(app)), "the toast")
    return (await detail_of(url, target)).replays[0]["reason"]


async def test_a_reason_pressed_key_by_key_keeps_its_y_and_n(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)

        async def by_key(pilot) -> None:
            await pilot.press(*PHRASE)

        assert await _replay_with_reason(app, pilot, sqlite_seeded, by_key) == PHRASE


async def test_a_reason_typed_in_a_burst_keeps_its_y_and_n(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)

        async def in_a_burst(pilot) -> None:
            await burst(pilot, *PHRASE)

        assert await _replay_with_reason(app, pilot, sqlite_seeded, in_a_burst) == PHRASE


async def test_a_paste_goes_to_the_reason(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)

        async def pasted(pilot) -> None:
            assert app.focused is not None and app.focused.id == "reason"
            app.focused.post_message(events.Paste(PHRASE))
            await pilot.pause()

        assert await _replay_with_reason(app, pilot, sqlite_seeded, pasted) == PHRASE


async def test_the_filter_keeps_a_fast_tab(sqlite_seeded, orders_registry):
    """Typed quickly, the first tab still moves to the type field."""
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("slash")
        await burst(pilot, *"failed", "tab", *"orders.placed", "enter")
        wanted = EventFilter(("failed",), "orders.placed")
        await until(pilot, lambda: app.main.view.filter == wanted, "the filter")
        assert not isinstance(app.screen, FilterModal)


async def test_the_filter_keeps_every_tab_of_a_burst(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("slash")
        await burst(pilot, *"failed", "tab", *"orders.placed", "tab", *"acme", "enter")
        wanted = EventFilter(("failed",), "orders.placed", "acme")
        await until(pilot, lambda: app.main.view.filter == wanted, "the filter")
