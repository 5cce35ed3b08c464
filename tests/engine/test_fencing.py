"""Fencing under a race: a claim taken over while its completion runs is not completed."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import bindparam, text

from engine import create_engine, create_schema
from engine.dispatch import fenced_writes
from engine.storage.schema import UtcDateTime

pytestmark = pytest.mark.postgresql


async def _status_of(engine, event_id: str) -> tuple:
    async with engine.connect() as conn:
        found = await conn.execute(
            text("SELECT status, locked_by, claim_version FROM outbox_events WHERE id = :id"),
            {"id": event_id},
        )
        return tuple(found.one())


async def _until_someone_waits_for_a_lock(conn, limit: float = 10.0) -> None:
    """Until another session waits for a row lock (the completion, on the takeover's)."""
    waiting = text("SELECT count(*) FROM pg_locks WHERE NOT granted")
    for _ in range(int(limit / 0.05)):
        if (await conn.execute(waiting)).scalar_one():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the completion never waited for the takeover's row lock")


async def test_a_takeover_that_commits_while_the_completion_waits_is_not_completed(pg_url, clock):
    """Dispatcher ``d`` completes its claim (version 1) while another dispatcher, whose
    clock says the lease ran out, takes the row over (version 2) and has not committed
    yet. The completion waits for that row; once the takeover commits, the completion
    must leave the row to its new holder, not publish it on ``d``'s stale claim."""
    engine = create_engine(pg_url)
    await create_schema(engine)
    now = clock()
    until = bindparam("until", type_=UtcDateTime())
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, "
                    "aggregate_type, aggregate_id, payload, status, locked_by, locked_until, "
                    "claim_version, attempt_count) VALUES ('e1', 't', 'x', 1, 'o', 'a', '{}', "
                    "'publishing', 'd', :until, 1, 1)"
                ).bindparams(until),
                {"until": now + timedelta(seconds=30)},
            )
        async with engine.connect() as other:
            takeover = await other.begin()
            await other.execute(
                text(
                    "UPDATE outbox_events SET locked_by = 'other', locked_until = :until, "
                    "claim_version = claim_version + 1 WHERE id = 'e1'"
                ).bindparams(until),
                {"until": now + timedelta(seconds=60)},
            )

            async def complete() -> set[str]:
                async with engine.begin() as conn:
                    return await fenced_writes.mark_published(
                        conn, [("e1", 1)], fenced_writes.Fence("d", now)
                    )

            completion = asyncio.create_task(complete())
            await _until_someone_waits_for_a_lock(other)
            assert not completion.done(), "the completion should wait for the takeover's lock"
            await takeover.commit()
            assert await asyncio.wait_for(completion, 10) == set()
        assert await _status_of(engine, "e1") == ("publishing", "other", 2)
    finally:
        await engine.dispose()


async def _complete_held_rows(pg_url: str, ids: list[str], now) -> tuple[set[str], list[str]]:
    """Rows ``ids`` in flight with dispatcher ``d`` (written with plain SQL), completed as
    one batch: the ids the completion reports, and each row's status after it."""
    engine = create_engine(pg_url)
    await create_schema(engine)
    try:
        async with engine.begin() as conn:
            for event_id in ids:
                await conn.execute(
                    text(
                        "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, "
                        "aggregate_type, aggregate_id, payload, status, locked_by, "
                        "locked_until, claim_version, attempt_count) VALUES (:id, 't', 'x', "
                        "1, 'o', 'a', '{}', 'publishing', 'd', :until, 1, 1)"
                    ).bindparams(bindparam("until", type_=UtcDateTime())),
                    {"id": event_id, "until": now + timedelta(seconds=30)},
                )
        async with engine.begin() as conn:
            published = await fenced_writes.mark_published(
                conn, [(event_id, 1) for event_id in ids], fenced_writes.Fence("d", now)
            )
        return published, [(await _status_of(engine, i))[0] for i in ids]
    finally:
        await engine.dispose()


async def test_a_batch_whose_ids_hold_the_separator_is_completed_whole(pg_url, clock):
    """The completion joins a batch's ids into one string; an id written with plain SQL
    may hold the usual separator (U+001F), and then another one is chosen."""
    ids = ["plain", "unit\x1fseparated", "record\x1eseparated", "last"]
    published, statuses = await _complete_held_rows(pg_url, ids, clock())
    assert published == set(ids)
    assert statuses == ["published"] * len(ids)


@pytest.mark.parametrize("ids", [[""], ["", "after"], ["before", ""]])
async def test_an_empty_id_is_completed_alone_and_in_a_batch(pg_url, clock, ids):
    """An empty id (plain SQL may write one) is an id like any other: split from the
    joined string, an empty string would otherwise be no id at all."""
    published, statuses = await _complete_held_rows(pg_url, ids, clock())
    assert published == set(ids)
    assert statuses == ["published"] * len(ids)


def test_joined_ids_puts_a_separator_no_id_holds_before_each_id():
    assert fenced_writes.joined_ids(["a", "b"]) == ("\x1fa\x1fb", "\x1f")
    assert fenced_writes.joined_ids([""]) == ("\x1f", "\x1f")
    joined, separator = fenced_writes.joined_ids(["a\x1f", "b\x1e", "c"])
    assert separator not in "a\x1fb\x1ec"
    assert joined.split(separator) == ["", "a\x1f", "b\x1e", "c"]
    every_control = "".join(chr(c) for c in range(1, 0x20))
    joined, separator = fenced_writes.joined_ids([every_control, "x"])
    assert separator == "\ue000" and joined.split(separator) == ["", every_control, "x"]
