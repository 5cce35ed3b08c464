"""Console fixtures: a database filled by the example app, the app factory, and waiting helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from textual.command import CommandList, CommandPalette
from textual.pilot import Pilot

from engine import OutboxDispatcher, create_engine, create_schema
from engine.clock import Clock
from engine.operating.insights import OutboxInsights
from engine.service import load_registry
from engine.settings import DispatcherSettings
from engine.writing.registry import EventRegistry
from outbox_tui.app import ConsoleConfig, OutboxConsole, make_app
from outbox_tui.examples.orders import create_tables
from outbox_tui.examples.orders.traffic import generate_orders
from outbox_tui.screens.confirm import ConfirmModal
from outbox_tui.widgets.event_table import EventTable

SIZE = (160, 45)
# A dispatcher that reacts in tens of milliseconds and keeps every published row.
FAST_DISPATCH = DispatcherSettings(
    idle_sleep_seconds=0.05,
    heartbeat_seconds=0.2,
    heartbeat_min_interval_seconds=0,
    backoff_base_seconds=0,
    retention_seconds=None,
    housekeeping_seconds=60,
)


@pytest.fixture
def orders_registry() -> EventRegistry:
    return load_registry(["outbox_tui.examples.orders"])


async def seed(url: str, registry: EventRegistry, *, orders: int = 30, rounds: int = 1) -> None:
    """Schema, example tables, ``orders`` orders, then ``rounds`` dispatch rounds."""
    engine = create_engine(url)
    try:
        await create_schema(engine)
        await create_tables(engine)
        await generate_orders(engine, registry, orders, seed=7)
        # One batch takes every order's head (which heads a smaller batch took would depend
        # on the random order ids, so the tenants of the dead letters would vary); the
        # cancellations wait behind their orders, so some events stay pending.
        dispatcher = OutboxDispatcher(engine, registry, batch_size=100)
        for _ in range(rounds):
            await dispatcher.dispatch_once()
    finally:
        await engine.dispose()


@pytest.fixture
async def seeded_url(database_url: str, orders_registry: EventRegistry) -> str:
    """Any backend, holding pending, failed, published and dead-letter events."""
    await seed(database_url, orders_registry)
    return database_url


@pytest.fixture
async def sqlite_seeded(sqlite_url: str, orders_registry: EventRegistry) -> str:
    """SQLite only: for console behaviour that does not depend on the backend."""
    await seed(sqlite_url, orders_registry)
    return sqlite_url


def console(
    url: str,
    registry: EventRegistry,
    *,
    refresh_seconds: float = 30.0,
    clock: Clock | None = None,
    **config: object,
) -> OutboxConsole:
    """The real app from the real factory; polls only when asked unless ``refresh_seconds``."""
    return make_app(
        ConsoleConfig(url, refresh_seconds=refresh_seconds, **config),  # type: ignore[arg-type]
        registry=registry,
        clock=clock,
        dispatch_settings=FAST_DISPATCH,
        instance_id="console:test",
        operator="tester",
    )


async def until(
    pilot: Pilot[object], predicate: Callable[[], object], what: str, seconds: float = 15.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {seconds}s waiting for {what}")
        await pilot.pause(0.02)


async def screenshot_when(
    pilot: Pilot[object], predicate: Callable[[str], object], what: str
) -> str:
    """The first screenshot ``predicate`` accepts (a pause can end before the screen is drawn)."""
    shot = [""]

    def taken() -> object:
        shot[0] = pilot.app.export_screenshot()
        return predicate(shot[0])

    await until(pilot, taken, what)
    return shot[0]


async def started(pilot: Pilot[object]) -> OutboxConsole:
    app: OutboxConsole = pilot.app  # type: ignore[assignment]
    await until(pilot, lambda: app.main.refreshes > 0, "the first refresh")
    return app


async def refreshed(pilot: Pilot[object]) -> None:
    """Poll now and wait until the answer is on screen."""
    app: OutboxConsole = pilot.app  # type: ignore[assignment]
    before = app.main.refreshes
    app.main.poll_now()
    await until(pilot, lambda: app.main.refreshes > before, "a refresh")


async def open_dead_letters(pilot: Pilot[object], app: OutboxConsole) -> EventTable:
    """Press d and wait until the table lists dead letters (a worker loads the page: until
    then the mode has changed but the rows, and so the highlighted event, have not)."""
    await pilot.press("d")
    table = app.main.query_one(EventTable)
    await until(pilot, lambda: table.mode == "dead_letters" and table.row_count, "dead letters")
    return table


async def dialog(pilot: Pilot[object], what: str = "the dialog") -> ConfirmModal:
    """Wait until a confirmation dialog is up and takes keys: mounted, the focus on the
    reason field (on Cancel in a dialog that asks for none).

    Some dialogs are pushed by a worker after a query, and every one sets its focus in
    ``on_mount``: a key sent before then reaches the screen below, or no widget.
    """
    app = pilot.app

    def ready() -> bool:
        screen = app.screen
        if not isinstance(screen, ConfirmModal) or screen.focused is None:
            return False
        return screen.focused.id == ("reason" if screen.ask_reason else "cancel")

    await until(pilot, ready, f"{what} to be up with the focus where typing starts")
    assert isinstance(app.screen, ConfirmModal)
    return app.screen


async def palette_offers(pilot: Pilot[object], query: str, title: str) -> None:
    """Type ``query`` into the open command palette and wait until its first hit is ``title``.

    The palette searches in a worker and keeps showing the previous search's hits (at
    first every command) until the new search ends: an ``enter`` before then runs
    whatever came first in the list shown.
    """
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, CommandPalette), "the palette")
    await pilot.press(*query)

    def first_hit() -> str | None:
        palette = app.screen
        if not isinstance(palette, CommandPalette):
            return None
        hits = palette.query_one(CommandList)
        if hits.option_count == 0 or hits.highlighted is None:
            return None
        return str(hits.get_option_at_index(hits.highlighted).hit.text)  # type: ignore[attr-defined]

    await until(
        pilot, lambda: first_hit() == title, f"the palette to offer {title!r} for {query!r}"
    )


async def counts(url: str) -> dict[str, int]:
    """The outbox counts as the engine sees them (for assertions after an action)."""
    engine = create_engine(url)
    try:
        return dict((await OutboxInsights(engine).overview()).counts)
    finally:
        await engine.dispose()


async def paste(pilot: Pilot[object], text: str) -> None:
    """Type ``text`` into the focused field the way a terminal pastes it (one event, fast)."""
    from textual import events

    focused = pilot.app.focused
    assert focused is not None, "nothing has the focus"
    focused.post_message(events.Paste(text))
    await pilot.pause()


async def burst(pilot: Pilot[object], *keys: str) -> None:
    """Keys as a fast typist or ``tmux send-keys`` delivers them: all queued at once.

    ``pilot.press`` lets the app go idle after every key, which hides anything that
    is deferred (a focus change, a screen's mount); a terminal read does not wait.
    ``keys`` are Textual key names or single characters.
    """
    from textual import events
    from textual.keys import _character_to_key

    driver = pilot.app._driver
    assert driver is not None
    for key in keys:
        character = key if len(key) == 1 else ("\t" if key == "tab" else None)
        name = _character_to_key(key) if len(key) == 1 and not key.isalnum() else key
        driver.send_message(events.Key(name, character))
    await pilot.pause()


async def press_to_exit(pilot: Pilot[object], *keys: str) -> None:
    """Press keys that end the app, and wait for it to decide to exit.

    Pilot's own waits never return once the app is gone, so the presses run in a
    task of their own and the wait here uses plain sleeps.
    """
    task = asyncio.create_task(pilot.press(*keys))
    try:
        async with asyncio.timeout(30):
            while pilot.app.return_code is None:  # noqa: ASYNC110 - no event to wait on
                await asyncio.sleep(0.02)
    finally:
        task.cancel()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A driver thread answering a closed loop is a bug here, not noise."""
    for item in items:
        if "tests/console/" in str(item.path).replace("\\", "/"):
            item.add_marker(
                pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
            )
