"""Stored text reaches the screen as characters: an escape sequence in an error message, a
tenant or an id (an outside system's text, a plain-SQL producer's) is spelled out, never
sent to the operator's terminal, where it could retitle the window or redraw the screen."""

from __future__ import annotations

from outbox_tui.screens.error_groups import ErrorGroupsScreen
from outbox_tui.widgets.event_detail import EventDetailPane
from outbox_tui.widgets.event_table import EventTable
from tests.cli.conftest import rewrite_dead_letters
from tests.console.conftest import SIZE, console, screenshot_when, started, until

HOSTILE = "\x1b]0;PWNED\x07\x1b[2J"


async def test_escape_sequences_in_rows_are_shown_not_sent(sqlite_seeded, orders_registry):
    await rewrite_dead_letters(
        sqlite_seeded,
        last_error=f"vendor said {HOSTILE}no",
        dead_letter_reason=f"permanent: {HOSTILE}",
        aggregate_id=f"agg{HOSTILE}",
    )
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("d")
        table = app.main.query_one(EventTable)
        await until(pilot, lambda: table.mode == "dead_letters", "the dead letters")
        await pilot.press("enter")
        pane = app.main.query_one(EventDetailPane)
        target = table.highlighted.id
        await until(pilot, lambda: pane.event_id == target and pane.detail, "the detail")
        screen = await screenshot_when(
            pilot,
            lambda shot: target in shot and "\\x1b]0;PWNED" in shot,  # the detail's title: its id
            "the detail and the spelled-out sequence on screen",
        )
        await pilot.press("g")  # the error groups, keyed by that message
        await until(
            pilot,
            lambda: isinstance(app.screen, ErrorGroupsScreen) and app.screen.loads > 0,
            "the error groups",
        )
        groups = await screenshot_when(
            pilot, lambda shot: "\\x1b]" in shot, "the groups' spelled-out message on screen"
        )
    for shown in (screen, groups):
        assert "\x1b" not in shown and "\x07" not in shown
    assert "\\x1b]0;PWNED" in screen
