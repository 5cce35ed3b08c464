"""``s``: the console's own dispatcher: heartbeats, published rows, graceful stop."""

from __future__ import annotations

import pytest

from engine import EventRegistry, create_engine
from engine.operating.insights import OutboxInsights

from .conftest import SIZE, console, counts, dialog, press_to_exit, started, until


async def heartbeat(url: str, instance_id: str = "console:test"):
    engine = create_engine(url)
    try:
        beats = await OutboxInsights(engine).heartbeats()
    finally:
        await engine.dispose()
    return next((hb for hb in beats if hb.instance_id == instance_id), None)


def s_key(app) -> str:
    """What the footer offers for ``s`` right now."""
    return app.main.active_bindings["s"].binding.description


@pytest.mark.all_drivers  # the console on psycopg 3 too
async def test_s_starts_dispatch_and_s_y_stops_it_gracefully(seeded_url, orders_registry):
    before = await counts(seeded_url)
    assert before["pending"] > 0
    app = console(seeded_url, orders_registry, refresh_seconds=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        assert s_key(app) == "Start dispatch"
        await pilot.press("s")
        await until(pilot, lambda: app.main.dispatch_state == "running", "the dispatcher")
        assert s_key(app) == "Stop dispatch"
        snap = lambda: app.main.last_snapshot  # noqa: E731
        await until(
            pilot,
            lambda: (
                snap().counts["failed"] == 0
                # what is left pending waits behind a dead-lettered order (its key is blocked)
                and snap().counts["pending"] <= snap().blocked_keys
                and snap().counts["published"] > before["published"]
                and any(
                    hb.instance_id == "console:test" and hb.iterations > 0
                    for hb in snap().heartbeats
                )
            ),
            "the console's dispatcher to drain the outbox",
            seconds=30,
        )
        [mine] = [hb for hb in snap().heartbeats if hb.instance_id == "console:test"]
        assert mine.state == "alive" and mine.iterations > 0

        await pilot.press("s")
        await dialog(pilot, "the stop dialog")
        await pilot.press("y")
        await until(pilot, lambda: app.main.dispatch_state == "stopped", "a graceful stop")
        assert s_key(app) == "Start dispatch"
        assert not app.dispatch.running
    beat = await heartbeat(seeded_url)
    assert beat is not None and beat.state == "stopped" and beat.total("published") > 0
    after = await counts(seeded_url)
    assert after["published"] > before["published"] and after["publishing"] == 0


async def test_stop_can_be_cancelled_and_quit_stops_the_dispatcher(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("s")
        await until(pilot, lambda: app.main.dispatch_state == "running", "the dispatcher")
        await pilot.press("s", "n")
        assert app.main.dispatch_state == "running" and app.dispatch.running
        await press_to_exit(pilot, "q")
    beat = await heartbeat(sqlite_seeded)
    assert beat is not None and beat.state == "stopped"


async def test_s_without_handlers_or_relay_explains_why_it_cannot_start(sqlite_seeded):
    app = console(sqlite_seeded, EventRegistry())
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("s")
        await pilot.pause()
        assert app.main.dispatch_state == "stopped" and not app.dispatch.running
        [note] = [n for n in app._notifications if n.title == "Cannot start dispatch"]
        assert "--installed-app" in note.message and "--amqp-url" in note.message
    assert await heartbeat(sqlite_seeded) is None


async def test_s_with_a_relay_but_no_event_types_refuses_instead_of_dead_lettering(
    sqlite_seeded,
):
    """The same delivery rule as the CLI: relaying unknown types would dead-letter them all."""
    app = console(sqlite_seeded, EventRegistry(), amqp_url="amqp://guest:guest@127.0.0.1:1/")
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("s")
        await pilot.pause()
        assert not app.dispatch.running
        [note] = [n for n in app._notifications if n.title == "Cannot start dispatch"]
        assert "no event types are registered" in note.message
    assert await heartbeat(sqlite_seeded) is None


async def test_a_bug_while_starting_is_shown_and_start_is_offered_again(
    sqlite_seeded, orders_registry, monkeypatch
):
    """An unexpected error in the switch's worker (a bug, not an engine error) is a toast on
    the main screen, and the switch goes back to stopped instead of staying "starting"."""
    app = console(sqlite_seeded, orders_registry)

    async def broken_start() -> None:
        raise RuntimeError("a bug in start")

    monkeypatch.setattr(app.dispatch, "start", broken_start)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("s")
        shown = lambda: [n for n in app._notifications if n.title.startswith("Unexpected")]  # noqa: E731
        await until(pilot, shown, "the unexpected error's toast")
        [note] = shown()
        assert (note.title, note.message) == (
            "Unexpected error in dispatch",
            "RuntimeError: a bug in start",
        )
        await until(pilot, lambda: app.main.dispatch_state == "stopped", "the switch to reset")
        assert s_key(app) == "Start dispatch"
