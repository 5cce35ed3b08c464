"""Concurrent delivery: bounded overlap, per-handler timeouts, completions written as they
finish, and the lease rule for starting handlers. Every body runs on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from engine import DispatchResult, OutboxDispatcher, OutboxEventPublisher, unit_of_work
from engine.errors import ConfigurationError
from engine.operating.insights import OutboxInsights
from engine.writing.publisher import OutboxEvent

from .conftest import CTX, order_payload, row
from .test_dispatch import publish


async def _until_reached(bound: asyncio.Event) -> None:
    """The handlers' I/O: it lasts until as many run at once as allowed (or 5 s, when fewer
    ever do: the test's ``most`` says so). A fixed sleep let a stalled event loop end one
    call before the last worker started, on a loaded machine."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(bound.wait(), 5)


async def test_handlers_overlap_up_to_max_concurrency(db, registry, clock):
    running = 0
    most = 0
    reached = asyncio.Event()

    @registry.handler("orders.placed", key="orders.io")
    async def io_bound(envelope):
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running == 4:
            reached.set()
        await _until_reached(reached)
        running -= 1

    await publish(db, registry, count=12)
    worker = OutboxDispatcher(db, registry, batch_size=12, max_concurrency=4, clock=clock)
    assert await worker.dispatch_once() == DispatchResult(claimed=12, published=12)
    assert most == 4


async def test_handlers_that_wait_only_sometimes_still_reach_the_bound_and_never_pass_it(
    db, registry, clock
):
    running = 0
    most = 0
    calls = 0
    reached = asyncio.Event()

    @registry.handler("orders.placed", key="orders.mixed")
    async def sometimes_waits(envelope):
        nonlocal running, most, calls
        running += 1
        most = max(most, running)
        if running == 6:
            reached.set()
        calls += 1
        if calls % 2 == 0:
            await _until_reached(reached)  # every other call does I/O; the rest return at once
        running -= 1

    await publish(db, registry, count=40)
    worker = OutboxDispatcher(db, registry, batch_size=40, max_concurrency=6, clock=clock)
    assert await worker.dispatch_once() == DispatchResult(claimed=40, published=40)
    assert most == 6


async def test_a_hung_handler_times_out_as_a_transient_failure(db, registry, clock):
    @registry.handler("orders.placed", key="orders.hangs")
    async def hangs(envelope):
        if envelope.payload["order_id"] == "o-0":
            await asyncio.sleep(3600)

    ids = await publish(db, registry, count=3)
    worker = OutboxDispatcher(db, registry, batch_size=3, handler_timeout_seconds=0.2, clock=clock)
    result = await asyncio.wait_for(worker.dispatch_once(), 10)
    assert result == DispatchResult(claimed=3, published=2, failed=1)
    hung = await row(db, ids[0])
    assert hung["status"] == "failed"
    assert hung["last_error"] == "orders.hangs: timed out after 0.2 s"


async def test_finished_events_are_recorded_while_a_slow_one_still_runs(db, registry, clock):
    seen_published = []
    insights = OutboxInsights(db, clock=clock)

    @registry.handler("orders.placed", key="orders.mixed")
    async def mixed(envelope):
        if envelope.payload["order_id"] != "o-0":
            return
        # The slow one waits until the fast ones are on disk (or gives up after 8 s, below
        # the handler timeout).
        give_up = asyncio.get_running_loop().time() + 8
        while True:
            counts = (await insights.overview()).counts
            if counts["published"] == 4 or asyncio.get_running_loop().time() > give_up:
                break
            await asyncio.sleep(0.05)
        seen_published.append(counts["published"])

    await publish(db, registry, count=5)
    worker = OutboxDispatcher(db, registry, batch_size=5, clock=clock)
    assert await worker.dispatch_once() == DispatchResult(claimed=5, published=5)
    assert seen_published == [4]


async def test_no_handler_starts_once_the_start_budget_of_the_lease_is_spent(db, registry, clock):
    started = []

    @registry.handler("orders.placed", key="orders.slowclock")
    async def slow(envelope):
        started.append(envelope.event_id)
        clock.advance(11)  # each handler "takes" 11 s of a 30 s lease

    ids = await publish(db, registry, count=4)
    # timeout 10 s: a handler may start until min(0.8 x 30, 30 - 10) = 20 s after the claim.
    worker = OutboxDispatcher(
        db, registry, batch_size=4, max_concurrency=1, handler_timeout_seconds=10, clock=clock
    )
    assert worker.start_budget.total_seconds() == 20
    result = await worker.dispatch_once()
    assert started == ids[:2]
    assert (result.claimed, result.published) == (4, 2)
    for event_id in ids[2:]:  # handed back without spending an attempt
        stored = await row(db, event_id)
        assert (stored["status"], stored["attempt_count"]) == ("pending", 0)


async def test_an_events_later_handler_does_not_start_past_the_budget_and_keys_stay_apart(
    db, registry, clock
):
    """The start budget holds for each handler of an event, not only its first: otherwise
    a later one could still run when the lease ends and another dispatcher has taken the
    event, and the next event of its key, over. The event fails instead; its retry skips
    the handler that succeeded."""
    registry.set_ordering("orders.placed")  # one key: "order:same-aggregate"
    calls: list[str] = []

    @registry.handler("orders.placed", key="orders.first")
    async def first(envelope):
        calls.append(f"first {envelope.payload['order_id']}")
        if envelope.payload["order_id"] == "A" and envelope.attempt_count == 1:
            clock.advance(21)  # 21 s of the 30 s lease: past the 20 s start budget

    @registry.handler("orders.placed", key="orders.second")
    async def second(envelope):
        calls.append(f"second {envelope.payload['order_id']}")

    drafts = [
        OutboxEvent("orders.placed", order_payload(o), "order", "same-aggregate") for o in "AB"
    ]
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        a, _b = await OutboxEventPublisher(session).publish_many(drafts)
    worker = OutboxDispatcher(db, registry, lease_seconds=30, clock=clock)
    assert worker.start_budget.total_seconds() == 20
    assert await worker.dispatch_once() == DispatchResult(claimed=1, failed=1)
    assert calls == ["first A"]
    stored = await row(db, a)
    assert stored["status"] == "failed"
    assert stored["last_error"] == (
        "orders.second: not started: the handlers before it spent the start budget "
        "(20 s of the 30 s lease)"
    )
    clock.advance(3600)  # past the retry's backoff: A again (first skipped), then B
    for _ in range(3):
        await worker.dispatch_once()
    assert calls == ["first A", "second A", "first B", "second B"]


async def test_a_handler_raising_cancelled_error_fails_alone(db, registry, clock):
    """A CancelledError out of a handler whose worker no one cancelled (a future cancelled
    under it) is that handler's failure: the others in flight finish and are recorded."""

    @registry.handler("orders.placed", key="orders.inner")
    async def handler(envelope):
        if envelope.payload["order_id"] == "o-0":
            inner = asyncio.get_running_loop().create_future()
            inner.cancel()
            await inner
        await asyncio.sleep(0.05)

    ids = await publish(db, registry, count=3)
    worker = OutboxDispatcher(db, registry, clock=clock)
    assert await worker.dispatch_once() == DispatchResult(claimed=3, published=2, failed=1)
    stored = await row(db, ids[0])
    assert (stored["status"], stored["last_error"]) == (
        "failed",
        "orders.inner: CancelledByHandler: raised CancelledError without being cancelled",
    )


def test_the_default_handler_timeout_fits_a_short_lease(db, registry):
    assert OutboxDispatcher(db, registry).handler_timeout == 10
    assert OutboxDispatcher(db, registry, lease_seconds=6).handler_timeout == 3


def test_settings_that_cannot_work_are_refused(db, registry):
    with pytest.raises(ConfigurationError, match="max_concurrency"):
        OutboxDispatcher(db, registry, max_concurrency=0)
    with pytest.raises(ConfigurationError, match="below lease_seconds"):
        OutboxDispatcher(db, registry, lease_seconds=5, handler_timeout_seconds=5)


async def test_unless_set_two_batches_of_handlers_may_be_in_flight(db, registry, clock):
    """The default follows the batch size: a round and the round overlapping its last calls
    can each start every event at once; what a user sets wins."""
    from engine import DispatcherSettings, build_dispatcher

    gate = asyncio.Event()
    in_flight = 0
    peak = 0

    @registry.handler("orders.placed", key="orders.waits")
    async def waits(envelope):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight == 12:
            gate.set()
        await asyncio.wait_for(gate.wait(), 5)
        in_flight -= 1

    await publish(db, registry, count=12)
    dispatcher = build_dispatcher(db, registry, DispatcherSettings(batch_size=12), clock=clock)
    assert dispatcher.max_concurrency == 24
    assert (await dispatcher.dispatch_once()).published == 12
    assert peak == 12  # the whole batch at once
    assert OutboxDispatcher(db, registry, batch_size=7).max_concurrency == 14
    chosen = DispatcherSettings(batch_size=12, max_concurrency=3)
    assert build_dispatcher(db, registry, chosen).max_concurrency == 3
