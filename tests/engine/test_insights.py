"""The read side: counts, ages, keyset pages, details, heartbeat states."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import insert

from engine import EventHandlerPermanentError, OutboxDispatcher, replay_dead_letter
from engine.dispatch.claimer import Claimer
from engine.errors import ConfigurationError, EventNotFoundError
from engine.operating.insights import EventFilter, OutboxInsights
from engine.storage.schema import outbox_events, process_heartbeats

from .seeding import event_row, insert_events
from .test_dispatch import publish


async def test_overview_counts_ages_and_heartbeat_states(db, registry, clock):
    @registry.handler("orders.placed", key="orders.maybe")
    async def maybe(envelope):
        if envelope.payload["order_id"].startswith("bad"):
            raise EventHandlerPermanentError("nope")

    await publish(db, registry, count=3, prefix="ok")
    await publish(db, registry, count=2, prefix="bad")
    await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    clock.advance(60)
    await publish(db, registry, count=4, prefix="later")
    async with db.begin() as conn:
        for name, state, age in (("a", "running", 5), ("b", "running", 120), ("c", "stopped", 1)):
            await conn.execute(
                insert(process_heartbeats).values(
                    instance_id=name,
                    kind="dispatcher",
                    host="h",
                    pid=1,
                    state=state,
                    started_at=clock.now - timedelta(seconds=500),
                    last_seen_at=clock.now - timedelta(seconds=age),
                    details={"iterations": 3, "totals": {"published": 9}},
                )
            )
    clock.advance(10)
    insights = OutboxInsights(db, clock=clock, retention_seconds=30, stale_after_seconds=30)
    snap = await insights.overview()
    assert dict(snap.counts) == {
        "pending": 4,
        "publishing": 0,
        "published": 3,
        "failed": 0,
        "dead_letter": 2,
    }
    assert snap.published_recent == 3 and snap.awaiting_purge == 3
    assert snap.stuck_publishing == 0
    assert snap.oldest_pending_age_seconds is not None
    states = {hb.instance_id: hb.state for hb in snap.heartbeats}
    assert states == {"a": "alive", "b": "stale", "c": "stopped"}
    assert snap.heartbeats[0].total("published") == 9


async def test_event_pages_are_keyset_newest_first_and_filterable(db, registry, clock):
    ids = await publish(db, registry, count=7)
    insights = OutboxInsights(db, clock=clock)
    first = await insights.events_page(limit=3)
    assert [e.id for e in first.events] == ids[::-1][:3] and first.has_more
    second = await insights.events_page(limit=3, before=first.next_cursor)
    assert [e.id for e in second.events] == ids[::-1][3:6]
    third = await insights.events_page(limit=3, before=second.next_cursor)
    assert [e.id for e in third.events] == ids[:1] and not third.has_more
    only = await insights.events_page(EventFilter(aggregate_id="o-4"))
    assert [e.aggregate_id for e in only.events] == ["o-4"]
    assert (await insights.events_page(EventFilter(tenant_id="globex"))).events == []
    summary = await insights.match_summary(EventFilter(statuses=("pending",)))
    assert summary.total == 7 and dict(summary.by_type) == {"orders.placed": 7}
    with pytest.raises(ConfigurationError, match="unknown status 'done'"):
        await insights.events_page(EventFilter(statuses=("done",)))


async def test_status_and_aggregate_filters_find_rows_in_flight_and_published_alike(
    db, registry, clock
):
    """On PostgreSQL the status and aggregate indexes leave out what a drain writes
    (engine.storage.schema); the filters still find every row, whatever its state."""

    @registry.handler("orders.placed", key="orders.fail")
    async def fail(envelope):
        if envelope.payload["order_id"] == "o-1":
            raise EventHandlerPermanentError("nope")

    ids = await publish(db, registry, count=3)  # aggregates o-0, o-1, o-2
    await OutboxDispatcher(db, registry, clock=clock, batch_size=2).dispatch_once()
    async with db.begin() as conn:  # o-2 in flight
        claimed = await Claimer("d1", 5, timedelta(seconds=30)).claim(conn, clock.now)
    assert [r.event_id for r in claimed.rows] == ids[2:]
    insights = OutboxInsights(db, clock=clock)
    expected = {"published": ids[0], "dead_letter": ids[1], "publishing": ids[2]}
    for status, event_id in expected.items():
        page = await insights.events_page(EventFilter(statuses=(status,)))
        assert [e.id for e in page.events] == [event_id], status
        assert (await insights.match_summary(EventFilter(statuses=(status,)))).total == 1
    both = await insights.events_page(EventFilter(statuses=("publishing", "published")))
    assert [e.id for e in both.events] == [ids[2], ids[0]]
    for n, event_id in enumerate(ids):
        page = await insights.events_page(EventFilter(aggregate_id=f"o-{n}"))
        assert [e.id for e in page.events] == [event_id]
    snap = await insights.overview()
    assert [snap.counts[s] for s in ("pending", "publishing", "dead_letter")] == [0, 1, 1]


async def test_event_detail_has_history_runs_and_payload(db, registry, clock):
    @registry.handler("orders.placed", key="orders.reject")
    async def reject(envelope):
        raise EventHandlerPermanentError("bad address")

    [event_id] = await publish(db, registry)
    await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    await replay_dead_letter(db, [event_id], operator="alice", reason="fixed")
    detail = await OutboxInsights(db, clock=clock).event_detail(event_id)
    assert detail.columns["status"] == "pending"
    assert detail.payload["order_id"] == "o-0" and detail.trace_id == "trace-abc"
    assert [r["operator"] for r in detail.replays] == ["alice"]
    assert [(r["handler_key"], r["status"]) for r in detail.handler_runs] == [
        ("orders.reject", "failed")
    ]
    with pytest.raises(EventNotFoundError):
        await OutboxInsights(db).event_detail("missing")


async def test_oldest_pending_counts_from_the_replay_not_the_creation(db, clock):
    now = clock.now
    # A 40-day-old dead letter replayed 2 minutes ago, with a lower id than the others.
    await insert_events(
        db,
        event_row(created_at=now - timedelta(days=40), last_replayed_at=now - timedelta(minutes=2)),
        event_row(status="published", created_at=now - timedelta(days=1)),
    )
    insights = OutboxInsights(db, clock=clock)
    assert (await insights.overview()).oldest_pending_age_seconds == 120
    await insert_events(db, event_row(created_at=now - timedelta(minutes=5)))
    assert (await insights.overview()).oldest_pending_age_seconds == 300
    await insert_events(
        db,
        event_row(created_at=now - timedelta(days=3), last_replayed_at=now - timedelta(minutes=9)),
    )
    assert (await insights.overview()).oldest_pending_age_seconds == 540


async def test_top_types_rank_event_types_by_undelivered_events(db, clock):
    seeds = {
        ("orders.placed", "pending"): 3,
        ("orders.placed", "published"): 50,
        ("orders.placed", "dead_letter"): 1,
        ("invoices.sent", "failed"): 4,
        ("invoices.sent", "dead_letter"): 2,
        ("invoices.sent", "publishing"): 1,
        ("users.signed_up", "published"): 100,
        ("mail.sent", "pending"): 1,
    }
    await insert_events(
        db,
        *(
            event_row(status=status, event_type=event_type, created_at=clock.now)
            for (event_type, status), n in seeds.items()
            for _ in range(n)
        ),
    )
    async with db.begin() as conn:  # a publishing row holds a lease (engine.storage.schema)
        await conn.execute(
            outbox_events.update()
            .where(outbox_events.c.status == "publishing")
            .values(locked_by="d1", locked_until=clock.now)
        )
    insights = OutboxInsights(db, clock=clock)
    top = await insights.top_types()
    assert [(t.event_type, t.undelivered, dict(t.counts)) for t in top] == [
        ("invoices.sent", 7, {"pending": 0, "publishing": 1, "failed": 4, "dead_letter": 2}),
        ("orders.placed", 4, {"pending": 3, "publishing": 0, "failed": 0, "dead_letter": 1}),
        ("mail.sent", 1, {"pending": 1, "publishing": 0, "failed": 0, "dead_letter": 0}),
    ]
    assert [t.event_type for t in await insights.top_types(limit=1)] == ["invoices.sent"]
    with pytest.raises(ConfigurationError, match="limit must be at least 1"):
        await insights.top_types(limit=0)


def _published(at, count: int) -> list[dict]:
    rows = []
    for _ in range(count):
        row = event_row(status="published", created_at=at - timedelta(seconds=2))
        rows.append({**row, "published_at": at})
    return rows


async def test_a_live_overview_carries_the_recount_and_adds_what_was_published_since(db, clock):
    """The console's refresh: exact totals without counting every published row."""
    insights = OutboxInsights(db, clock=clock, retention_seconds=3600)
    await insert_events(
        db,
        *_published(clock.now - timedelta(hours=2), 3),  # past the retention
        *_published(clock.now - timedelta(minutes=1), 2),
    )
    await insert_events(db, event_row(status="pending", created_at=clock.now))
    totals = await insights.published_totals()
    assert (totals.published, totals.awaiting_purge) == (5, 3)
    clock.advance(1)
    first = await insights.live_overview(totals)
    assert first.published_since is None and first.published_counted_at == totals.taken_at
    assert dict(first.counts) == dict((await insights.overview()).counts)
    # Published after the recount, and one a little before its clock (a late commit).
    await insert_events(db, *_published(clock.now, 4), *_published(totals.taken_at, 1))
    clock.advance(1)
    second = await insights.live_overview(totals, since=first.mark)
    assert second.published_since == 5
    exact = await insights.overview()
    assert dict(second.counts) == dict(exact.counts) and second.counts["published"] == 10
    assert second.awaiting_purge == exact.awaiting_purge == 3
    assert second.published_recent == exact.published_recent == 7
    clock.advance(1)
    third = await insights.live_overview(totals, since=second.mark)
    assert third.published_since == 0 and third.counts["published"] == 10
    # A new recount: the mark moves, and nothing is counted twice or lost across it.
    recount = await insights.published_totals()
    await insert_events(db, *_published(clock.now, 2))
    clock.advance(1)
    fourth = await insights.live_overview(recount, since=third.mark)
    assert fourth.published_since == 2 and fourth.counts["published"] == 12
    assert fourth.published_counted_at == recount.taken_at


async def test_the_recount_takes_back_what_the_purge_deleted(db, clock):
    insights = OutboxInsights(db, clock=clock, retention_seconds=None)
    old = await insert_events(db, *_published(clock.now - timedelta(days=9), 3))
    totals = await insights.published_totals()
    assert (totals.published, totals.awaiting_purge) == (3, None)
    async with db.begin() as conn:
        await conn.execute(outbox_events.delete().where(outbox_events.c.id.in_(old[:2])))
    clock.advance(1)
    carried = await insights.live_overview(totals)
    assert carried.counts["published"] == 3  # carried from the recount until the next one
    recount = await insights.published_totals()
    assert (await insights.live_overview(recount)).counts["published"] == 1


async def test_a_claim_whose_lease_ran_out_is_stuck_and_a_live_one_is_not(db, registry, clock):
    await publish(db, registry, count=3)
    insights = OutboxInsights(db, clock=clock)
    lease = timedelta(seconds=30)
    async with db.begin() as conn:
        claimed = await Claimer("d1", 2, lease).claim(conn, clock.now)
    assert len(claimed.rows) == 2
    assert (await insights.overview()).stuck_publishing == 0
    clock.advance(60)  # d1 crashed: both its leases ran out
    snap = await insights.overview()
    assert snap.counts["publishing"] == 2 and snap.stuck_publishing == 2
    async with db.begin() as conn:  # d2 reclaims one abandoned row (alone), with a new lease
        again = await Claimer("d2", 5, lease).claim(conn, clock.now)
    assert len(again.rows) == 1 and again.rows[0].event_id in {r.event_id for r in claimed.rows}
    snap = await insights.overview()
    assert snap.counts["publishing"] == 2 and snap.stuck_publishing == 1
