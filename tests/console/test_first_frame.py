"""The first frame agrees with itself: no "no dispatcher" beside "dispatch: running" (issue 12)."""

from __future__ import annotations

import asyncio

from textual.widgets import Static

from outbox_tui.widgets.dispatchers import NO_HEARTBEAT, DispatchersPanel, empty_note
from outbox_tui.widgets.status_bar import StatusBar

from .conftest import SIZE, console, started, until


def note(app) -> str:
    panel = app.main.query_one(DispatchersPanel)
    assert panel.has_class("-empty")
    return str(panel.query_one("#no-dispatchers", Static).render())


def test_the_note_follows_what_is_known():
    assert "first refresh" in empty_note(False, "stopped")
    assert "starting" in empty_note(False, "starting")
    assert "running" in empty_note(True, "running")
    assert empty_note(True, "stopped") == NO_HEARTBEAT


async def test_before_the_first_refresh_nothing_claims_there_is_no_dispatcher(
    sqlite_seeded, orders_registry
):
    app = console(sqlite_seeded, orders_registry, autostart_dispatch=True)
    gate = asyncio.Event()
    overview = app.insights.overview

    async def held_overview():
        await gate.wait()
        return await overview()

    app.insights.overview = held_overview  # the first refresh waits until told
    async with app.run_test(size=SIZE) as pilot:
        bar = app.main.query_one(StatusBar)
        await until(pilot, lambda: bar.dispatch == "running", "the dispatcher to start")
        assert "No dispatcher" not in note(app)
        assert "In-process dispatcher running" in note(app)
        gate.set()
        await started(pilot)


async def test_a_refresh_before_the_first_heartbeat_says_it_is_on_its_way(
    sqlite_seeded, orders_registry
):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        assert note(app) == NO_HEARTBEAT  # nothing runs: the advice stands
        app.main.dispatch_state = "running"  # as the header says once start returned
        assert "No dispatcher" not in note(app)
        # A refresh that finds no heartbeat yet (the dispatcher's first round is running).
        app.main.query_one(DispatchersPanel).show(())
        assert "In-process dispatcher running" in note(app)
        app.main.dispatch_state = "stopped"
        assert note(app) == NO_HEARTBEAT
