"""The unordered claim's keyset floor (``ClaimCursor.seq_floor``).

A dispatcher that claimed a full batch goes on after its last unordered row, so it does
not walk again over the index entries of rows published since the last vacuum. The floor
must never strand a row: one below it that becomes due again (a retry, a hand-back) is
claimed at once when nothing is due above the floor, and within ``SEQ_FLOOR_RESET`` while
a backlog above it keeps every batch full.
"""

from __future__ import annotations

from datetime import timedelta

from engine import OutboxDispatcher
from engine.dispatch import fenced_writes
from engine.dispatch.backoff import BackoffPolicy
from engine.dispatch.claimer import SEQ_FLOOR_RESET, ClaimCursor, ClaimedBatch, Claimer, ClaimScope
from engine.storage.schema import outbox_events

from .conftest import rows
from .test_relay_prefetch import publish

LEASE = timedelta(seconds=30)


async def claim(db, clock, *, floor: int, batch: int = 2) -> ClaimedBatch:
    async with db.begin() as conn:
        return await Claimer("d", batch, LEASE, cursor=ClaimCursor(seq_floor=floor)).claim(
            conn, clock.now
        )


async def test_a_full_batch_moves_the_floor_past_its_last_row_and_the_next_claim_starts_there(
    db, registry, clock
):
    ids = await publish(db, registry, 5)
    first = await claim(db, clock, floor=0)
    assert [r.event_id for r in first.rows] == ids[:2]
    assert first.cursor.seq_floor == first.rows[-1].seq + 1
    second = await claim(db, clock, floor=first.cursor.seq_floor)
    assert [r.event_id for r in second.rows] == ids[2:4]
    last = await claim(db, clock, floor=second.cursor.seq_floor)  # not full: start over next time
    assert [r.event_id for r in last.rows] == ids[4:]
    assert last.cursor.seq_floor == 0


async def test_nothing_due_above_the_floor_goes_round_from_the_first_row_at_once(
    db, registry, clock
):
    ids = await publish(db, registry, 3)
    seqs = {r.event_id: r.seq for r in (await claim(db, clock, floor=0, batch=3)).rows}
    async with db.begin() as conn:  # handed back, as a stopping dispatcher does
        released = await fenced_writes.release_unattempted(
            conn, [(ids[0], 1)], fenced_writes.Fence("d", clock.now)
        )
    assert released == {ids[0]}
    # A floor above every row: the claim finds nothing there and takes the released row.
    again = await claim(db, clock, floor=seqs[ids[2]] + 1)
    assert [r.event_id for r in again.rows] == [ids[0]]


async def test_a_retry_below_the_floor_is_claimed_within_the_reset_while_a_backlog_waits(
    db, registry, clock
):
    ids = await publish(db, registry, 20)
    failures = {ids[0]}
    handled: list[str] = []

    async def handler(envelope):
        handled.append(envelope.event_id)
        if envelope.event_id in failures:
            failures.discard(envelope.event_id)
            raise RuntimeError("vendor hiccup")

    registry.register_handler("orders.placed", handler, key="floor-test")
    retry = BackoffPolicy(kind="fixed", base_seconds=0.5, max_seconds=0.5, jitter=0)
    dispatcher = OutboxDispatcher(db, registry, clock=clock, batch_size=2, backoff=retry)
    assert (await dispatcher.dispatch_once()).failed == 1  # ids[0] waits for its retry
    clock.advance(0.6)  # due again, below the floor, with 18 rows waiting above it
    rounds = 0
    while handled.count(ids[0]) < 2:
        await dispatcher.dispatch_once()
        rounds += 1
        assert rounds < 9, "the retry waited for the backlog above the floor to drain"
        clock.advance(0.25)
    # Claimed by the first round at least SEQ_FLOOR_RESET after the floor was last 0, not
    # after the 9 rounds the backlog above the floor takes.
    assert timedelta(seconds=0.25 * (rounds - 1)) <= SEQ_FLOOR_RESET
    by_id = {r["id"]: r for r in await rows(db)}
    assert by_id[ids[0]]["status"] == "published"


async def test_a_claim_from_the_floor_keeps_the_ranges_plan_and_each_range_still_honours_a_pause(
    db, registry, clock
):
    """The plan (ranges per served type, while another type waits) is made by a claim from
    the first row and reused from the floor; a pause made in between still holds."""
    ids = await publish(db, registry, 6)
    async with db.begin() as conn:  # two rows of a type this dispatcher does not serve
        await conn.execute(
            outbox_events.update()
            .where(outbox_events.c.id.in_(ids[:2]))
            .values(event_type="billing.charged")
        )
    tenant = (await rows(db))[0]["tenant_id"]
    served = ClaimScope(frozenset({"orders.placed"}))
    paused = ClaimScope(frozenset({"orders.placed"}), frozenset({("orders.placed", tenant)}))

    async def claim_in(scope, *, floor, ranges):
        async with db.begin() as conn:
            return await Claimer(
                "d", 2, LEASE, cursor=ClaimCursor(seq_floor=floor, ranges=ranges)
            ).claim(conn, clock.now, scope)

    first = await claim_in(served, floor=0, ranges=None)
    assert [r.event_id for r in first.rows] == ids[2:4]
    assert first.cursor.ranges == ("orders.placed",)
    held = await claim_in(paused, floor=first.cursor.seq_floor, ranges=first.cursor.ranges)
    assert held.rows == []
    going_on = await claim_in(served, floor=first.cursor.seq_floor, ranges=first.cursor.ranges)
    assert [r.event_id for r in going_on.rows] == ids[4:6]
    statuses = {r["id"]: r["status"] for r in await rows(db)}
    assert [statuses[i] for i in ids[:2]] == ["pending", "pending"]
