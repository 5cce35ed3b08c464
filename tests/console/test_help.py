"""The help dialog: every key press scrolls, and what it says the console changes comes
from the action table (issue 43, defects 5 and 6)."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widgets import Static

from outbox_tui.actions import ACTIONS, changing_actions
from outbox_tui.screens.help import HelpScreen

from .conftest import burst, console, started, until

SMALL = (80, 24)


async def test_a_burst_of_down_keys_scrolls_one_line_per_key(sqlite_seeded, orders_registry):
    """Nine downs sent at once scrolled one line; spaced 50 ms apart, nine."""
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SMALL) as pilot:
        await started(pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        box = app.screen.query_one("#help-dialog", VerticalScroll)
        await until(pilot, lambda: box.max_scroll_y > 12, "the help to be laid out")
        await burst(pilot, *["down"] * 9)
        await until(pilot, lambda: box.scroll_y == 9, f"nine lines down (at {box.scroll_y})", 5)
        await pilot.press("up", "up")
        await until(pilot, lambda: box.scroll_y == 7, "two lines up", 5)
        await burst(pilot, *["up"] * 20)
        await until(pilot, lambda: box.scroll_y == 0, "the top, and no further", 5)


def test_what_the_console_changes_is_said_from_the_action_table():
    """It forgot pause and resume: the sentence listed replays, skips and the dispatcher."""
    changing = changing_actions()
    assert {a.action for a in changing} >= {
        "replay_one",
        "replay_matching",
        "skip_dead_letter",
        "pause_type",
        "start_dispatch",
    }
    assert all(a.changes for a in changing)
    assert not any(a.changes for a in ACTIONS if a.action in ("show_events", "filter"))


async def test_the_help_says_every_change_the_console_makes(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=(160, 48)) as pilot:
        await started(pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        footnote = str(app.screen.query_one("#help-footnote", Static).render())
        for change in {a.changes for a in changing_actions()}:
            assert change in footnote, (change, footnote)
        assert "pauses and resumes" in footnote
