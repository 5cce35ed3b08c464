"""A deterministic outbox for snapshot tests and ``scripts/screenshots.py``.

The example orders app fills it (``generate_orders`` with a fixed seed) and a
dispatcher with a fixed clock works through part of it, so every state shows:
pending, failed with a retry time, dead letters (one replayed, with a reason),
published with handler runs and side effects, one row stuck in publishing
with an expired lease, three dispatchers (alive, stale, stopped), and blocked
ordering keys (the example orders each order's events: a refused or retrying
order holds back its cancellation).

Determinism: event ids (UUIDv7) and order ids (UUIDv4) come from seeded
generators while the data is written, creation times are set from the fixed
clock afterwards, and the console gets the same clock.
"""

from __future__ import annotations

import contextlib
import json
import random
import sqlite3
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine
from textual.command import CommandList, CommandPalette
from textual.pilot import Pilot
from textual.widgets import Input

from engine import (
    BackoffPolicy,
    OutboxDispatcher,
    OutboxEventPublisher,
    create_engine,
    create_schema,
    replay_dead_letter,
)
from engine.dispatch.claimer import Claimer
from engine.inbox import InboxWriter, ReceivedMessage, RowBuilder, decode_message
from engine.inbox.heartbeat import CONSUMER_KIND, ConsumerTotals, consumer_details
from engine.operating.insights import EventSummary
from engine.operating.pauses import pause
from engine.running.heartbeat import Heartbeat
from engine.running.lag import LAG_BUCKETS
from engine.service import load_registry
from engine.settings import DispatcherSettings
from engine.storage.schema import DEAD_LETTER, outbox_events
from engine.writing.registry import EventRegistry
from outbox_tui.app import ConsoleConfig, OutboxConsole, make_app
from outbox_tui.examples import billing, orders
from outbox_tui.examples.orders.traffic import generate_orders
from outbox_tui.screens.confirm import ConfirmModal
from outbox_tui.screens.filter import FilterModal
from outbox_tui.screens.help import HelpScreen
from outbox_tui.widgets.blocked_keys import BlockedKeysTable
from outbox_tui.widgets.event_detail import EventDetailPane
from outbox_tui.widgets.event_table import EventTable

NOW = datetime(2026, 3, 14, 9, 15, tzinfo=UTC)
T0 = NOW - timedelta(minutes=15)  # the first order
ORDERS = 60  # 72 events with the cancellations
SPACING_SECONDS = 12
SHOWCASE_URL = "sqlite+aiosqlite:///./showcase.db"  # relative: the header shows no tmp path
SIZE = (160, 45)


class FixedClock:
    """A clock that moves only when told to."""

    def __init__(self, now: datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _uuid7(millis: int, rng: random.Random) -> str:
    value = (millis << 80) | (0x7 << 76) | (rng.getrandbits(12) << 64)
    value |= (0b10 << 62) | rng.getrandbits(62)
    return str(uuid.UUID(int=value))


@contextlib.contextmanager
def seeded_ids(seed: int = 20260314) -> Iterator[None]:
    """Event ids and order ids from a seeded generator, in the shape of the real ones."""
    rng = random.Random(seed)
    millis = int(T0.timestamp() * 1000)

    def event_id() -> str:
        nonlocal millis
        millis += 37
        return _uuid7(millis, rng)

    def order_id() -> uuid.UUID:
        return uuid.UUID(int=rng.getrandbits(128), version=4)

    with (
        mock.patch("engine.writing.publisher.uuid7", event_id),
        mock.patch("outbox_tui.examples.orders.app.uuid", SimpleNamespace(uuid4=order_id)),
    ):
        yield


@contextlib.contextmanager
def follow_ups_on(clock: FixedClock, seed: int) -> Iterator[None]:
    """The invoices billing's handler publishes while the showcase dispatches: ids from a
    seeded generator and creation times from the fixed clock."""
    rng = random.Random(seed)
    millis = 0

    def event_id() -> str:
        nonlocal millis
        millis = max(millis + 1, int(clock().timestamp() * 1000))
        return _uuid7(millis, rng)

    defaults = OutboxEventPublisher.__init__.__kwdefaults__
    with (
        mock.patch("engine.writing.publisher.uuid7", event_id),
        mock.patch.dict(defaults, {"clock": clock}),
    ):
        yield


def registry() -> EventRegistry:
    return load_registry(["outbox_tui.examples.orders", "outbox_tui.examples.billing"])


async def build_showcase(database_url: str, clock: FixedClock | None = None) -> None:
    """Create and fill the showcase database (it must not exist yet)."""
    clock = clock or FixedClock()
    reg = registry()
    engine = create_engine(database_url)
    try:
        await create_schema(engine)
        await orders.create_tables(engine)
        await billing.create_tables(engine)
        with seeded_ids():
            await generate_orders(engine, reg, ORDERS, seed=7, cancel_every=5)
        await _date_events(engine)
        clock.now = NOW - timedelta(minutes=4)
        worker = OutboxDispatcher(
            engine,
            reg,
            dispatcher_id="orders-worker-1",
            batch_size=12,
            backoff=BackoffPolicy(base_seconds=120, max_seconds=900, jitter=0),
            clock=clock,
        )
        with follow_ups_on(clock, seed=4):
            await worker.dispatch_once()
            clock.advance(40)
            await worker.dispatch_once()
            clock.advance(40)
            await worker.dispatch_once()
        clock.advance(30)
        await _replay_one(engine, clock)
        clock.now = NOW - timedelta(seconds=8)
        async with engine.begin() as conn:  # a dispatcher that died holding one row
            await Claimer("orders-worker-2", 1, timedelta(seconds=30)).claim(conn, clock())
        clock.now = NOW
        await _heartbeats(engine, clock)
    finally:
        await engine.dispose()


async def _date_events(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        ids = (await conn.execute(select(outbox_events.c.id).order_by(outbox_events.c.id))).all()
        for index, (event_id,) in enumerate(ids):
            await conn.execute(
                update(outbox_events)
                .where(outbox_events.c.id == event_id)
                .values(created_at=T0 + timedelta(seconds=SPACING_SECONDS * index))
            )


async def _replay_one(engine: AsyncEngine, clock: FixedClock) -> None:
    async with engine.connect() as conn:
        first = (
            await conn.execute(
                select(outbox_events.c.id)
                .where(outbox_events.c.status == DEAD_LETTER)
                .order_by(outbox_events.c.id)
                .limit(1)
            )
        ).scalar_one()
    await replay_dead_letter(
        engine, [first], operator="alice", reason="credit limit raised (INC-4211)", now=clock()
    )
    worker = OutboxDispatcher(
        engine, registry(), dispatcher_id="orders-worker-1", batch_size=1, clock=clock
    )
    # Rounds of one event until the replayed one comes up (a claim walks the keys in key
    # order): still over the limit, it is dead-lettered again.
    for _ in range(100):
        await worker.dispatch_once()
        async with engine.connect() as conn:
            status = (
                await conn.execute(
                    select(outbox_events.c.status).where(outbox_events.c.id == first)
                )
            ).scalar_one()
        if status == DEAD_LETTER:
            break


async def _heartbeats(engine: AsyncEngine, clock: FixedClock) -> None:
    rows = (
        ("orders-worker-1", "orders-1", 4242, -2, 1.0, (41, 31, 7, 3)),
        ("orders-worker-2", "orders-2", 5150, -185, 1.0, (13, 12, 0, 0)),
        ("orders-worker-0", "orders-1", 3121, -3600, 0.0, (495, 480, 9, 6)),
    )
    for instance_id, host, pid, seen, running, totals in rows:
        beat_clock = FixedClock(clock() + timedelta(seconds=seen))
        heartbeat = Heartbeat(engine, instance_id, clock=beat_clock, host=host, pid=pid)
        heartbeat.started_at = clock() - timedelta(hours=2)
        claimed, published, failed, dead = totals
        details = {
            "iterations": 1200 + pid % 97,
            "totals": {
                "claimed": claimed,
                "published": published,
                "failed": failed,
                "dead_lettered": dead,
            },
        }
        if running:
            await heartbeat.beat(details, force=True)
        else:
            await heartbeat.stop(details)


def showcase_app(clock: FixedClock | None = None, **config: object) -> OutboxConsole:
    """The console on the showcase database, polling only when asked."""
    return make_app(
        ConsoleConfig(
            SHOWCASE_URL,
            refresh_seconds=3600,
            queue=INBOX_QUEUE,  # what the catalog (c) says the inbox receives
            bindings=INBOX_BINDINGS,
            **config,  # type: ignore[arg-type]
        ),
        registry=registry(),
        clock=clock or FixedClock(),
        dispatch_settings=DispatcherSettings(retention_seconds=180),
        instance_id="console:showcase",
        operator="alice",
    )


def copy_database(source: Path, target: Path) -> None:
    """A copy of the SQLite database at ``source``, its WAL included: an idle writer's
    thread may still hold the last commits there (engine.storage.sqlite_batches), which a
    copy of the main file alone would miss."""
    with (
        contextlib.closing(sqlite3.connect(source)) as src,
        contextlib.closing(sqlite3.connect(target)) as dst,
    ):
        src.backup(dst)


# -- scenes: the same key presses for snapshot tests and for scripts/screenshots.py --------


async def _wait(pilot: Pilot[object], predicate: Callable[[], object], what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"showcase: timed out waiting for {what}")


async def _refreshed(pilot: Pilot[object]) -> None:
    app: OutboxConsole = pilot.app  # type: ignore[assignment]
    before = app.main.refreshes
    app.main.poll_now()
    await _wait(pilot, lambda: app.main.refreshes > before, "a refresh")


async def _first_refresh(pilot: Pilot[object]) -> OutboxConsole:
    app: OutboxConsole = pilot.app  # type: ignore[assignment]
    await _wait(pilot, lambda: app.main.refreshes > 0, "the first refresh")
    return app


async def warm_up(pilot: Pilot[object], clock: FixedClock, refreshes: int = 20) -> None:
    """Refresh while a fixed-clock dispatcher works, 1.5 s apart: a real sparkline, and
    (from 20 refreshes) a trend window long enough for a verdict.

    A last refresh five seconds later finds the row ``orders-worker-2`` holds with an
    expired lease (claimed eight seconds before NOW for thirty).
    """
    await _first_refresh(pilot)
    engine = create_engine(SHOWCASE_URL)
    worker = OutboxDispatcher(
        engine,
        registry(),
        dispatcher_id="orders-worker-1",
        batch_size=1,
        backoff=BackoffPolicy(base_seconds=120, max_seconds=900, jitter=0),
        clock=clock,
    )
    pattern = (1, 0, 2, 1, 0, 1, 3, 1, 0, 2, 1, 1, 0, 2, 1, 0, 1, 2, 1, 1)
    try:
        with follow_ups_on(clock, seed=refreshes):
            for index in range(refreshes):
                clock.advance(1.5)
                for _ in range(pattern[index % len(pattern)]):
                    await worker.dispatch_once()
                await _refreshed(pilot)
    finally:
        await engine.dispose()
    clock.advance(5)
    await _refreshed(pilot)


async def _detail_of(pilot: Pilot[object], pick: Callable[[EventSummary], bool]) -> None:
    app: OutboxConsole = pilot.app  # type: ignore[assignment]
    table = app.main.query_one(EventTable)
    row = next(i for i, event in enumerate(table.events) if pick(event))
    await pilot.press(*["down"] * row, "enter")
    pane = app.main.query_one(EventDetailPane)
    wanted = table.events[row].id
    await _wait(pilot, lambda: pane.event_id == wanted, "the detail")


async def _dialog(pilot: Pilot[object]) -> None:
    """Wait until a confirmation is up with its focus set (in the reason field, drawn with
    its cursor): the screen is pushed a frame before its ``on_mount`` sets the focus."""
    app = pilot.app
    await _wait(
        pilot,
        lambda: isinstance(app.screen, ConfirmModal) and app.screen.focused is not None,
        "the dialog",
    )
    for field in app.screen.query(Input):  # a steady cursor: the image must not blink
        field.cursor_blink = False
    await pilot.pause()


async def scene_overview(pilot: Pilot[object], clock: FixedClock) -> None:
    await warm_up(pilot, clock)


async def scene_overview_paused(pilot: Pilot[object], clock: FixedClock) -> None:
    """A vendor outage: orders.placed paused for every tenant two minutes ago, the
    cancellations of one tenant just now; a few quiet refreshes later the trend says
    what the pauses hold back."""
    await warm_up(pilot, clock, refreshes=12)
    engine = create_engine(SHOWCASE_URL)
    try:
        await pause(
            engine,
            "orders.placed",
            reason="warehouse API down (INC-4230)",
            operator="alice",
            now=clock() - timedelta(minutes=2),
        )
        await pause(
            engine,
            "orders.cancelled",
            "acme",
            reason="acme migrating their ledger",
            operator="bob",
            now=clock() - timedelta(seconds=40),
        )
    finally:
        await engine.dispose()
    for _ in range(3):
        clock.advance(2)
        await _refreshed(pilot)


async def scene_event_detail(pilot: Pilot[object], clock: FixedClock) -> None:
    await warm_up(pilot, clock, refreshes=6)
    await _detail_of(pilot, lambda e: e.status == "failed")


async def scene_event_chain(pilot: Pilot[object], clock: FixedClock) -> None:
    """An invoice's detail: the order it was issued for, and the chain from that order."""
    await warm_up(pilot, clock, refreshes=6)
    await _detail_of(pilot, lambda e: e.event_type == "invoices.issued")


async def scene_dead_letters(pilot: Pilot[object], clock: FixedClock) -> None:
    app = await _first_refresh(pilot)
    await pilot.press("d")
    await _wait(pilot, lambda: app.main.query_one(EventTable).mode == "dead_letters", "d")
    await _detail_of(pilot, lambda e: e.replay_count > 0)


async def scene_confirm_replay(pilot: Pilot[object], clock: FixedClock) -> None:
    app = await _first_refresh(pilot)
    await pilot.press("d")
    await _wait(pilot, lambda: app.main.query_one(EventTable).mode == "dead_letters", "d")
    await pilot.pause()  # the new columns measured before the dialog covers the table
    await pilot.press("R")
    await _dialog(pilot)


async def _blocked_key_with_waiting(pilot: Pilot[object]) -> OutboxConsole:
    """The blocked-keys view, the cursor on the oldest dead-lettered head with events behind."""
    app = await _first_refresh(pilot)
    await pilot.press("b")
    table = app.main.query_one(BlockedKeysTable)
    await _wait(pilot, lambda: table.display and table.row_count > 0, "the blocked keys")
    keys = table.blocked_keys
    row = next(i for i, k in enumerate(keys) if k.head_status == DEAD_LETTER and k.waiting)
    await pilot.press(*["down"] * row)
    return app


async def scene_blocked_keys(pilot: Pilot[object], clock: FixedClock) -> None:
    await _blocked_key_with_waiting(pilot)


async def scene_blocked_head_detail(pilot: Pilot[object], clock: FixedClock) -> None:
    app = await _blocked_key_with_waiting(pilot)
    await pilot.press("enter")
    pane = app.main.query_one(EventDetailPane)
    head = app.main.query_one(BlockedKeysTable).highlighted
    assert head is not None
    await _wait(pilot, lambda: pane.event_id == head.head_id and pane.waiting, "the detail")


async def scene_confirm_skip(pilot: Pilot[object], clock: FixedClock) -> None:
    await _blocked_key_with_waiting(pilot)
    await pilot.press("k")
    await _dialog(pilot)


async def scene_help(pilot: Pilot[object], clock: FixedClock) -> None:
    app = await _first_refresh(pilot)
    await pilot.press("question_mark")
    await _wait(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
    await pilot.pause()


async def scene_filter(pilot: Pilot[object], clock: FixedClock) -> None:
    app = await _first_refresh(pilot)
    await pilot.press("slash", *"failed", "tab", *"orders.placed")
    await _wait(pilot, lambda: isinstance(app.screen, FilterModal), "the filter")


async def scene_palette(pilot: Pilot[object], clock: FixedClock) -> None:
    app = await _first_refresh(pilot)
    await pilot.press("ctrl+p", *"replay")

    def searched() -> bool:
        """The search for "replay" has ended: its one hit shown, no busy indicator (the
        palette searches in a worker; a starved machine would shoot it mid-search)."""
        palette = app.screen
        if not isinstance(palette, CommandPalette) or palette._show_busy:
            return False
        hits = palette.query_one(CommandList)
        first = hits.get_option_at_index(0) if hits.option_count == 1 else None
        return first is not None and str(first.prompt).startswith("Replay all")

    await _wait(pilot, searched, "the palette's one hit for 'replay'")


async def scene_error_groups(pilot: Pilot[object], clock: FixedClock) -> None:
    from outbox_tui.screens.error_groups import ErrorGroupsScreen

    app = await _first_refresh(pilot)
    await pilot.press("g")
    screen = app.screen
    assert isinstance(screen, ErrorGroupsScreen)
    await _wait(pilot, lambda: screen.loads > 0, "the groups")


async def scene_confirm_pause(pilot: Pilot[object], clock: FixedClock) -> None:
    await _first_refresh(pilot)
    await pilot.press("p")
    await _dialog(pilot)


async def _age_oldest_dead_letters(count: int, days: int) -> None:
    """Make the ``count`` oldest dead letters ``days`` old: outside the 7-day dedup window."""
    engine = create_engine(SHOWCASE_URL)
    try:
        async with engine.begin() as conn:
            t = outbox_events
            oldest = select(t.c.id).where(t.c.status == DEAD_LETTER).order_by(t.c.id).limit(count)
            ids = list((await conn.execute(oldest)).scalars())
            when = NOW - timedelta(days=days)
            await conn.execute(update(t).where(t.c.id.in_(ids)).values(created_at=when))
    finally:
        await engine.dispose()


async def scene_confirm_replay_dedup(pilot: Pilot[object], clock: FixedClock) -> None:
    """The bulk replay dialog when 3 of the dead letters are older than the dedup window."""
    await _age_oldest_dead_letters(3, days=9)
    app = await _first_refresh(pilot)
    await _refreshed(pilot)
    await pilot.press("d")
    await _wait(pilot, lambda: app.main.query_one(EventTable).mode == "dead_letters", "d")
    await pilot.pause()  # the new columns measured before the dialog covers the table
    await pilot.press("R")
    await _dialog(pilot)


async def scene_catalog(pilot: Pilot[object], clock: FixedClock) -> None:
    """The event catalog (c), with the second type's schemas under the table."""
    from outbox_tui.screens.catalog import CatalogScreen

    app = await _first_refresh(pilot)
    await pilot.press("c")
    await _wait(pilot, lambda: isinstance(app.screen, CatalogScreen), "the catalog")
    await pilot.press("down")


INBOX_QUEUE = "orders.from-storefront"
INBOX_BINDINGS = ("storefront.events:orders.#",)


def _inbound_messages() -> list[ReceivedMessage]:
    """What the storefront sent: orders (structured mode, keyed), a cancellation in binary
    mode, an event type this service does not know, and a message nobody can read."""
    messages = []
    for n, (customer, amount) in enumerate((("ada", 42), ("grace", 17), ("alan", 99))):
        order = f"sf-{1040 + n}"
        body = {
            "specversion": "1.0",
            "id": f"0195b0c4-77aa-7d10-9a5e-00000000{104 + n:04d}",
            "source": "/storefront/order",
            "type": "orders.placed",
            "subject": f"order/{order}",
            "time": (T0 + timedelta(minutes=3 * n)).isoformat().replace("+00:00", "Z"),
            "datacontenttype": "application/json",
            "tenantid": "acme",
            "eventversion": 1,
            "aggregatetype": "order",
            "aggregateid": order,
            "partitionkey": f"order:{order}",
            "traceparent": f"00-4bf92f3577b34da6a3ce929d0e0e47{36 + n:02d}-00f067aa0ba902b7-01",
            "data": {"order_id": order, "customer": customer, "amount": amount},
        }
        messages.append(ReceivedMessage(json.dumps(body).encode(), "application/cloudevents+json"))
    binary = {
        "ce-specversion": "1.0",
        "ce-id": "0195b0c4-77aa-7d10-9a5e-000000000107",
        "ce-source": "/storefront/order",
        "ce-type": "orders.cancelled",
        "ce-tenantid": "acme",
        "ce-subject": "order/sf-1041",
        "ce-partitionkey": "order:sf-1041",
    }
    cancelled = {"order_id": "sf-1041", "reason": "customer changed their mind"}
    messages.append(ReceivedMessage(json.dumps(cancelled).encode(), "application/json", binary))
    unknown = {
        "specversion": "1.0",
        "id": "0195b0c4-77aa-7d10-9a5e-000000000108",
        "source": "/storefront/cart",
        "type": "storefront.cart_abandoned",
        "data": {"cart_id": "c-77", "tenant_id": "acme"},
    }
    messages.append(ReceivedMessage(json.dumps(unknown).encode(), "application/cloudevents+json"))
    messages.append(ReceivedMessage(b"<order id='sf-1045'/>", "text/xml", message_id="legacy-1045"))
    return messages


async def seed_inbox(clock: FixedClock, url: str = SHOWCASE_URL) -> None:
    """Inbound events written by the inbox into the showcase database (or ``url``), and
    two consumers' heartbeats (one waits for its broker)."""
    rng = random.Random(45)
    millis = int((NOW - timedelta(minutes=2)).timestamp() * 1000)

    def event_id() -> str:
        nonlocal millis
        millis += 211
        value = (millis << 80) | (0x7 << 76) | (rng.getrandbits(12) << 64)
        return str(uuid.UUID(int=value | (0b10 << 62) | rng.getrandbits(62)))

    engine = create_engine(url)
    try:
        received = FixedClock(NOW - timedelta(seconds=95))
        builder = RowBuilder(registry(), queue=INBOX_QUEUE, default_tenant="acme", clock=received)
        rows = []
        with mock.patch("engine.inbox.rows.uuid7", event_id):
            for message in _inbound_messages():
                received.advance(7)
                rows.append(builder.row(message, decode_message(message, max_bytes=1 << 20)))
        await InboxWriter(engine).write(rows)
        beats = (
            ("orders-inbox-1", "billing-1", 7311, -1, None, (412, 398, 13, 1)),
            (
                "orders-inbox-2",
                "billing-2",
                7420,
                -3,
                "broker unavailable: connection refused",
                (57, 57, 0, 0),
            ),
        )
        for instance_id, host, pid, seen, waiting, (got, stored, dups, bad) in beats:
            beat_clock = FixedClock(clock() + timedelta(seconds=seen))
            heartbeat = Heartbeat(
                engine, instance_id, kind=CONSUMER_KIND, clock=beat_clock, host=host, pid=pid
            )
            heartbeat.started_at = clock() - timedelta(hours=1)
            totals = ConsumerTotals(received=got, stored=stored, duplicates=dups, rejected=bad)
            details = consumer_details(
                queue=INBOX_QUEUE,
                bindings=["outbox.events:orders.#"],
                prefetch=1000,
                max_batch=500,
                totals=totals,
                waiting_for=waiting,
                last_error=waiting,
                heartbeat_seconds=5.0,
            )
            await heartbeat.beat(details, force=True)
    finally:
        await engine.dispose()


async def scene_inbox(pilot: Pilot[object], clock: FixedClock) -> None:
    """The inbox: its consumers under the dispatchers, the event list filtered to inbound
    events, and the detail of one with its origin (``seed_inbox`` ran before it opened)."""
    app = await _first_refresh(pilot)
    await _refreshed(pilot)
    await pilot.press("slash", *["tab"] * 5, *"inbound", "enter")
    table = app.main.query_one(EventTable)
    await _wait(pilot, lambda: app.main.view.filter.origin == "inbound", "the inbound filter")
    await _wait(pilot, lambda: len(table.events) == 6, "the six inbound events")
    await _detail_of(pilot, lambda e: e.event_type == "orders.cancelled")


async def scene_inbound_dead_letter(pilot: Pilot[object], clock: FixedClock) -> None:
    """A message the inbox could not decode: dead-lettered with its raw body and reason
    (``seed_inbox`` ran before the console opened)."""
    await _first_refresh(pilot)
    await _refreshed(pilot)
    await pilot.press("slash", *["tab"] * 5, *"inbound", "enter")
    app: OutboxConsole = pilot.app  # type: ignore[assignment]
    await _wait(pilot, lambda: app.main.view.filter.origin == "inbound", "the inbound filter")
    await _detail_of(pilot, lambda e: e.event_type == "inbox.undecodable")


TRACE_URL = "https://tempo.example.com/trace/{trace_id}"


async def stamp_traces() -> None:
    """What a traced service's outbox holds: each event's W3C context (its trace id the
    payload's, a span id from its own id), and a live dispatcher's last-minute lag."""
    lag = [0] * (len(LAG_BUCKETS) + 1)
    for bound, count in ((0.01, 310), (0.025, 120), (0.1, 40), (0.5, 9), (2.5, 2)):
        lag[LAG_BUCKETS.index(bound)] = count
    window = json.dumps({"window_seconds": 60.0, "le": list(LAG_BUCKETS), "counts": lag})
    engine = create_engine(SHOWCASE_URL)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE outbox_events SET traceparent = '00-' ||"
                    " json_extract(payload, '$.trace_id') || '-' ||"
                    " substr(replace(id, '-', ''), 17, 16) || '-01'"
                )
            )
            await conn.execute(
                text(
                    "UPDATE process_heartbeats SET details = json_set(details, '$.lag',"
                    " json(:window)) WHERE instance_id = 'orders-worker-1'"
                ),
                {"window": window},
            )
    finally:
        await engine.dispose()


async def scene_trace_detail(pilot: Pilot[object], clock: FixedClock) -> None:
    """A traced service's failed event: its trace id, parent span and the link
    ``--trace-url-template`` makes; the health line with the lag the dispatcher reports
    (``stamp_traces`` ran before the console opened)."""
    app = await _first_refresh(pilot)
    app.main.query_one(EventDetailPane).trace_url_template = TRACE_URL
    await _refreshed(pilot)  # no warm-up: the detail is the point, and it costs seconds
    await _detail_of(pilot, lambda e: e.status == "failed")


async def _stamp_traces(clock: FixedClock) -> None:
    await stamp_traces()


# What a scene adds to its copy of the database before the console opens on it. Written
# while the console ran, the writes raced its first refresh (the trend's backlog read 55
# or 60 from run to run).
PREPARE: dict[str, Callable[[FixedClock], Awaitable[None]]] = {
    "inbox": seed_inbox,
    "inbound-dead-letter": seed_inbox,
    "trace-detail": _stamp_traces,
}


async def prepare(scene: str, clock: FixedClock) -> None:
    """Run the scene's ``PREPARE`` step, if it has one, on ``./showcase.db``."""
    step = PREPARE.get(scene)
    if step is not None:
        await step(clock)


SCENES: dict[str, Callable[[Pilot[object], FixedClock], Awaitable[None]]] = {
    "overview": scene_overview,
    "overview-paused": scene_overview_paused,
    "events-detail": scene_event_detail,
    "event-chain": scene_event_chain,
    "dead-letters": scene_dead_letters,
    "confirm-replay": scene_confirm_replay,
    "blocked-keys": scene_blocked_keys,
    "blocked-head-detail": scene_blocked_head_detail,
    "confirm-skip": scene_confirm_skip,
    "help": scene_help,
    "filter": scene_filter,
    "palette": scene_palette,
    "error-groups": scene_error_groups,
    "confirm-pause": scene_confirm_pause,
    "confirm-replay-dedup": scene_confirm_replay_dedup,
    "catalog": scene_catalog,
    "inbox": scene_inbox,
    "inbound-dead-letter": scene_inbound_dead_letter,
    "trace-detail": scene_trace_detail,
}
# The sizes operators have (80x24), the one the screenshots use, and a big terminal.
SIZES = {"80x24": (80, 24), "160x45": SIZE, "160x48": (160, 48)}
