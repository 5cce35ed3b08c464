"""Local delivery claims its next batch while the handlers of the last one run (``prefetch``).

On PostgreSQL a round that took a full batch claims the next one beside its handlers, so
no round starts by waiting for its claim. The rows held ahead keep every guarantee of a
claim: fenced, handed back unattempted (no attempt spent) unless every event of the round
they wait behind was published, one event per ordering key in flight, each key in order.
SQLite has one writer, so a dispatcher there never claims ahead of its own completions.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from engine import DispatchResult, OutboxDispatcher, create_engine, create_schema
from engine.errors import EventHandlerPermanentError
from engine.operating.pauses import pause

from .conftest import rows
from .test_relay_prefetch import (
    assert_a_stop_hands_back_what_was_claimed_ahead,
    assert_each_key_in_order,
    assert_handed_back_unattempted,
    assert_the_run_loop_hands_back_what_it_claimed_ahead,
    drain_all,
    held,
    publish,
)


class Handler:
    """Records each call; while handling, waits (bounded) until rows beyond its batch are held."""

    def __init__(self, db, batch=(), *, fail=frozenset(), wait_for_next=True, pause=0.0):
        self.db = db
        self.pause = pause  # every call awaits this long (I/O)
        self.batch = set(batch)  # the rows of the round the first call belongs to
        self.fail = set(fail)
        self.wait_for_next = wait_for_next
        self.calls: list[str] = []
        self.claimed_while_running: list[list[str]] = []

    async def __call__(self, envelope):
        self.calls.append(envelope.event_id)
        if self.wait_for_next and len(self.calls) == 1:
            # The claim ahead runs beside this handler (8 s: below the handler timeout).
            give_up = asyncio.get_running_loop().time() + 8
            while True:
                others = [i for i in held(await rows(self.db)) if i not in self.batch]
                if len(others) >= 2 or asyncio.get_running_loop().time() > give_up:
                    break
                await asyncio.sleep(0.01)
            self.claimed_while_running.append(others)
        if self.pause:
            await asyncio.sleep(self.pause)
        if envelope.event_id in self.fail:
            raise EventHandlerPermanentError("refused")


def dispatcher_for(db, registry, clock, handler, *, prefetch=True, batch_size=2):
    registry.register_handler("orders.placed", handler, key="prefetch-test")
    return OutboxDispatcher(
        db, registry, clock=clock, batch_size=batch_size, max_concurrency=2, prefetch=prefetch
    )


async def fresh(url):
    engine = create_engine(url)
    await create_schema(engine)
    return engine


@pytest.fixture
async def pg_db(pg_url):
    """Claiming ahead is PostgreSQL's: SQLite's rule is test_sqlite_claims_nothing_ahead."""
    engine = await fresh(pg_url)
    yield engine
    await engine.dispose()


@pytest.fixture
async def sqlite_db(sqlite_url):
    engine = await fresh(sqlite_url)
    yield engine
    await engine.dispose()


@pytest.mark.postgresql
async def test_the_next_batch_is_claimed_while_handlers_run_and_used_by_the_next_round(
    pg_db, registry, clock
):
    db = pg_db
    ids = await publish(db, registry, 5)
    handler = Handler(db, ids[:2])
    dispatcher = dispatcher_for(db, registry, clock, handler)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=2, published=2)
    assert handler.claimed_while_running == [ids[2:4]]  # claimed beside the first handler
    assert held(await rows(db)) == ids[2:4]  # and held for the next round

    assert await dispatcher.dispatch_once() == DispatchResult(claimed=2, published=2)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert handler.calls == ids
    stored = await rows(db)
    assert {r["status"] for r in stored} == {"published"}
    assert {r["attempt_count"] for r in stored} == {1}  # one claim each, none wasted


@pytest.mark.postgresql
async def test_after_a_failure_the_batch_claimed_ahead_goes_back_without_spending_an_attempt(
    pg_db, registry, clock
):
    db = pg_db
    ids = await publish(db, registry, 4)
    handler = Handler(db, ids[:2], fail={ids[1]})
    dispatcher = dispatcher_for(db, registry, clock, handler)
    assert await dispatcher.dispatch_once() == DispatchResult(
        claimed=2, published=1, dead_lettered=1
    )
    assert handler.claimed_while_running == [ids[2:4]]
    await assert_handed_back_unattempted(db, ids[2:4])  # a wait may follow: none stays held


@pytest.mark.postgresql
async def test_a_pause_made_after_the_claim_ahead_holds_its_rows_back(pg_db, registry, clock):
    db = pg_db
    ids = await publish(db, registry, 4)
    dispatcher = dispatcher_for(db, registry, clock, Handler(db, ids[:2]))
    assert (await dispatcher.dispatch_once()).published == 2
    assert held(await rows(db)) == ids[2:4]  # claimed ahead, before the pause
    await pause(db, "orders.placed", reason="vendor down", now=clock.now)
    assert await dispatcher.dispatch_once() == DispatchResult()  # its next round obeys it
    await assert_handed_back_unattempted(db, ids[2:])


@pytest.mark.postgresql
async def test_rows_claimed_ahead_whose_lease_ran_out_count_as_lost_leases(pg_db, registry, clock):
    db = pg_db
    ids = await publish(db, registry, 4)
    dispatcher = dispatcher_for(db, registry, clock, Handler(db, ids[:2]))
    assert (await dispatcher.dispatch_once()).published == 2
    clock.advance(dispatcher.lease.total_seconds() + 1)  # the held batch's lease ran out
    other = OutboxDispatcher(db, registry, clock=clock, batch_size=2, dispatcher_id="other")
    assert (await other.dispatch_once()).published == 1  # takes one abandoned row over
    # The stale batch is handed back: the fence refuses both rows (their lease is over,
    # one is someone else's now), so both count as lost, like late completions would.
    result = await dispatcher.dispatch_once()
    assert result.lost_leases == 2
    assert result.published == 1  # and claims (and delivers) the row still due
    assert {r["status"] for r in await rows(db)} == {"published"}


@pytest.mark.postgresql
async def test_a_stop_hands_the_batch_claimed_ahead_back(pg_db, registry, clock):
    db = pg_db
    ids = await publish(db, registry, 4)
    dispatcher = dispatcher_for(db, registry, clock, Handler(db, ids[:2]))
    await assert_a_stop_hands_back_what_was_claimed_ahead(db, dispatcher, ids)


@pytest.mark.postgresql
async def test_the_run_loop_hands_back_what_it_claimed_ahead_when_it_ends(pg_db, registry, clock):
    db = pg_db
    ids = await publish(db, registry, 4)
    dispatcher = dispatcher_for(db, registry, clock, Handler(db, ids[:2]))
    await assert_the_run_loop_hands_back_what_it_claimed_ahead(db, dispatcher, ids)


@pytest.mark.postgresql
async def test_handlers_that_never_wait_claim_nothing_ahead(pg_db, registry, clock):
    db = pg_db
    ids = await publish(db, registry, 6)
    handler = Handler(db, wait_for_next=False)  # quick: the round is CPU, nothing to hide
    dispatcher = dispatcher_for(db, registry, clock, handler)
    assert (await dispatcher.dispatch_once()).published == 2
    assert held(await rows(db)) == []
    handler.pause = 0.02  # the same handlers, now waiting on I/O: claimed beside them
    assert (await dispatcher.dispatch_once()).published == 2
    assert held(await rows(db)) == ids[4:]


async def test_sqlite_claims_nothing_ahead(sqlite_db, registry, clock):
    db = sqlite_db
    await publish(db, registry, 4)
    handler = Handler(db, wait_for_next=False, pause=0.02)  # waiting handlers, one writer
    dispatcher = dispatcher_for(db, registry, clock, handler)
    assert (await dispatcher.dispatch_once()).published == 2
    assert held(await rows(db)) == []


def key_for(i: int) -> str | None:
    """Keys k0..k2, with every fourth event unordered: batches that mix both claim ahead."""
    return None if i % 4 == 0 else f"k{i % 3}"


async def test_one_event_per_key_in_flight_and_each_key_in_order(db, registry, clock):
    ids = await publish(db, registry, 16, key=key_for)
    key_of = {event_id: key_for(i) for i, event_id in enumerate(ids)}

    class KeyedHandler(Handler):
        def __init__(self, db):
            super().__init__(db, wait_for_next=False)
            self.overlaps = 0
            self.in_flight_keys: list[str] = []
            self.held_beside: list[int] = []  # rows held beyond this round's, per call

        async def __call__(self, envelope):
            self.calls.append(envelope.event_id)
            key = key_of[envelope.event_id]
            if key is not None:
                self.overlaps += key in self.in_flight_keys
                self.in_flight_keys.append(key)
            try:
                if self.db.dialect.name == "postgresql" and max(self.held_beside, default=0) <= 3:
                    await self.stay_until_claimed_ahead()
                await asyncio.sleep(0.02)
                self.held_beside.append(len(held(await rows(self.db))))
            finally:
                if key is not None:
                    self.in_flight_keys.remove(key)

        async def stay_until_claimed_ahead(self) -> None:
            """Handlers stay in flight until a claim ahead has run beside them (a fixed 20 ms
            was too short on a loaded machine), until one has: a round of key heads only
            claims nothing ahead, so its handlers give up after a second."""
            deadline = asyncio.get_running_loop().time() + 1
            while len(held(await rows(self.db))) <= 3:
                if asyncio.get_running_loop().time() > deadline:
                    return  # the assertion below says what went wrong
                await asyncio.sleep(0.01)

    handler = KeyedHandler(db)
    registry.register_handler("orders.placed", handler, key="prefetch-test")
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, batch_size=3, max_concurrency=3, prefetch=True
    )
    await drain_all(db, dispatcher)
    assert Counter(handler.calls) == Counter(ids)  # each once
    assert handler.overlaps == 0  # never two of a key at once
    assert_each_key_in_order(handler.calls, ids, key_of)
    if db.dialect.name == "postgresql":  # rows were claimed ahead beside the handlers
        assert max(handler.held_beside) > 3


@pytest.mark.postgresql
async def test_a_batch_of_key_heads_only_claims_nothing_ahead(pg_db, registry, clock):
    db = pg_db
    ids = await publish(db, registry, 8, key=lambda i: f"k{i % 4}")
    handler = Handler(db, wait_for_next=False, pause=0.02)  # handlers that wait
    dispatcher = dispatcher_for(db, registry, clock, handler, batch_size=3)
    assert (await dispatcher.dispatch_once()).published == 3  # heads of k0, k1, k2
    # k3's head was due, but a claim beside three key heads is not worth its key walk
    assert held(await rows(db)) == []
    assert handler.calls == ids[:3]
