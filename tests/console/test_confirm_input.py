"""One input model for every confirmation (issue 43, defect 1), typed with no pause.

The reason field has the focus from the start and takes every printable key, ``y``
and ``n`` too; ``enter`` there moves to the buttons, where ``y`` confirms and ``n``
cancels; escape cancels anywhere. Each test sends its keys in one call, as a fast
typist or ``tmux send-keys`` does, and checks what the audit log recorded.

``pilot.press`` waits a little after each key; ``burst`` queues every key before the
app handles the first (a terminal read). Both are run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from sqlalchemy import select
from textual.pilot import Pilot
from textual.widgets import Button, Input, Label

from engine import create_engine
from engine.storage.schema import pause_log, replay_log
from outbox_tui.screens.confirm import ConfirmModal
from outbox_tui.widgets.blocked_keys import BlockedKeysTable

from .conftest import SIZE, burst, console, dialog, open_dead_letters, started, until

Send = Callable[..., Awaitable[None]]


@pytest.fixture(params=["press", "burst"])
def send(request: pytest.FixtureRequest) -> Callable[[Pilot[object]], Send]:
    """``send(pilot)(*keys)``: the keys in one call, through ``pilot.press`` or a burst."""
    if request.param == "press":
        return lambda pilot: pilot.press
    return lambda pilot: lambda *keys: burst(pilot, *keys)


async def _logged(url: str, table) -> list[str | None]:  # type: ignore[no-untyped-def]
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(select(table.c.reason).order_by(table.c.id))
            return [r.reason for r in rows]
    finally:
        await engine.dispose()


async def _closed(pilot: Pilot[object]) -> None:
    app = pilot.app
    await until(pilot, lambda: not isinstance(app.screen, ConfirmModal), "the dialog to close")
    await app.workers.wait_for_complete()


async def test_a_skip_reason_starting_with_n_keeps_its_n(sqlite_seeded, orders_registry, send):
    """The issue's ``b``, ``k``, then ``no dup, ok`` enter ``y`` recorded ``o dup, ok``."""
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("b")
        keys = app.main.query_one(BlockedKeysTable)
        await until(pilot, lambda: keys.row_count > 0, "the blocked keys")
        await pilot.press("k")
        await dialog(pilot, "the skip dialog")
        await send(pilot)(*"no dup, ok", "enter", "y")
        await _closed(pilot)
    assert await _logged(sqlite_seeded, replay_log) == ["no dup, ok"]


async def test_a_replay_reason_starting_with_y_is_text(sqlite_seeded, orders_registry, send):
    """``r`` then ``yu``: the field reads ``yu``, and nothing is replayed yet."""
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await open_dead_letters(pilot, app)
        await pilot.press("r")
        confirm = await dialog(pilot)
        await send(pilot)(*"yu")
        reason = confirm.query_one("#reason", Input)
        await until(pilot, lambda: reason.value == "yu", "the reason to read 'yu'")
        assert app.screen is confirm
        await send(pilot)("enter", "y")
        await _closed(pilot)
    assert await _logged(sqlite_seeded, replay_log) == ["yu"]


async def test_reason_enter_y_in_one_burst_pauses_with_the_exact_reason(
    sqlite_seeded, orders_registry
):
    """The issue's ``CRM down, pausing now`` enter ``y``: the y went into the reason.

    A burst only: ``pilot.press`` lets the app go idle after the enter, which hid this.
    """
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("p")
        await dialog(pilot, "the pause dialog")
        await burst(pilot, *"CRM down, pausing now", "enter", "y")
        await _closed(pilot)
    assert await _logged(sqlite_seeded, pause_log) == ["CRM down, pausing now"]


async def test_y_with_no_reason_keeps_the_pause_dialog_open_at_the_reason(
    sqlite_seeded, orders_registry, send
):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("p")
        confirm = await dialog(pilot, "the pause dialog")
        await send(pilot)("enter", "y")  # to the buttons, then yes with nothing typed
        reason = confirm.query_one("#reason", Input)
        await until(pilot, lambda: confirm.focused is reason, "the focus back on the reason")
        assert app.screen is confirm
        label = str(confirm.query_one("#reason-label", Label).render())
        assert "a pause needs a reason" in label.lower()
        await send(pilot)(*"vendor down", "enter", "y")
        await _closed(pilot)
    assert await _logged(sqlite_seeded, pause_log) == ["vendor down"]


async def test_n_cancels_only_from_the_buttons(sqlite_seeded, orders_registry, send):
    """In the field ``n`` is a letter; from the buttons it cancels; escape cancels anywhere."""
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await open_dead_letters(pilot, app)
        await pilot.press("r")
        confirm = await dialog(pilot)
        await send(pilot)("n", "enter", "n")
        await until(pilot, lambda: app.screen is app.main, "n on the buttons to cancel")
        await pilot.press("r")
        confirm = await dialog(pilot)
        await send(pilot)(*"nope")
        reason = confirm.query_one("#reason", Input)
        await until(pilot, lambda: reason.value == "nope", "the reason to read 'nope'")
        await send(pilot)("escape")
        await until(pilot, lambda: app.screen is app.main, "escape to cancel")
    assert await _logged(sqlite_seeded, replay_log) == []


async def test_the_focus_starts_in_the_reason_and_enter_walks_to_confirm(
    sqlite_seeded, orders_registry, send
):
    """The reason has the focus at once; enter there lands on confirm, enter again confirms."""
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await open_dead_letters(pilot, app)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the dialog")
        confirm = app.screen
        await until(pilot, lambda: confirm.focused is not None, "the dialog's focus")
        assert confirm.focused is confirm.query_one("#reason", Input)
        await send(pilot)(*"ok", "enter")
        await until(
            pilot,
            lambda: confirm.focused is confirm.query_one("#confirm", Button),
            "the focus on the confirm button",
        )
        await send(pilot)("enter")
        await _closed(pilot)
    assert await _logged(sqlite_seeded, replay_log) == ["ok"]
