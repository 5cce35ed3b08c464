"""Side-effect records are group-committed: many records, one transaction, each caller told.

How much narrower this makes the window between a call and its record, under load and
SIGKILLs, is measured by the fault suite (tests/reliability/test_crash.py, the scenario
under load); these tests pin what the writer must do.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import create_engine, create_schema
from engine.clock import utc_now
from engine.handlers import record_writer
from engine.handlers.idempotency import (
    FAILED,
    SIDE_EFFECT_COLUMNS,
    SUCCEEDED,
    IdempotencyStore,
    SideEffectKey,
    side_effect_upsert,
)
from engine.handlers.record_writer import RecordWriter
from engine.storage.schema import side_effects
from engine.storage.sqlite_batches import SqliteBatchWriter

pytestmark = pytest.mark.all_drivers  # asyncpg has a path of its own, psycopg SQLAlchemy's


def _key(n: int, effect: str = "charge") -> SideEffectKey:
    return SideEffectKey("acme", "user-1", f"event-{n}", "orders.charge", effect)


@dataclass
class Commits:
    """The number of records of each transaction the writer sent; while ``release`` is
    clear, a write waits before it is sent."""

    sizes: list[int] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    taken: threading.Event = field(default_factory=threading.Event)

    def count(self, rows: list[Any]) -> None:
        self.sizes.append(len(rows))
        self.taken.set()

    async def first_taken(self) -> None:
        assert await asyncio.to_thread(self.taken.wait, 10)


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> Commits:
    """Counts the writer's transactions: its task's on PostgreSQL (asyncpg's path or
    SQLAlchemy's), its thread's on SQLite."""
    seen = Commits()
    seen.release.set()
    write = record_writer._write
    execute = record_writer._execute
    write_on_thread = SqliteBatchWriter._write

    async def counted(driver: Any, dialect: Any, sql: str, rows: list[Any]) -> None:
        seen.count(rows)
        await asyncio.to_thread(seen.release.wait, 10)
        await write(driver, dialect, sql, rows)

    async def counted_execute(conn: Any, stmt: Any, records: list[Any]) -> None:
        seen.count(records)
        await asyncio.to_thread(seen.release.wait, 10)
        await execute(conn, stmt, records)

    def counted_on_thread(self: SqliteBatchWriter, connection: Any, rows: list[Any]) -> None:
        seen.count(rows)
        seen.release.wait(10)
        write_on_thread(self, connection, rows)

    monkeypatch.setattr(record_writer, "_write", counted)
    monkeypatch.setattr(record_writer, "_execute", counted_execute)
    monkeypatch.setattr(SqliteBatchWriter, "_write", counted_on_thread)
    return seen


async def _effects(engine: AsyncEngine) -> dict[str, dict[str, Any]]:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(side_effects))).mappings().all()
    return {row["event_id"]: dict(row) for row in rows}


async def test_records_submitted_together_commit_together(
    db: AsyncEngine, commits: Commits
) -> None:
    store = IdempotencyStore(db, clock=utc_now)
    await asyncio.gather(
        *[store.submit_side_effect(_key(n), succeeded=True, response={"n": n}) for n in range(50)]
    )
    # One transaction; two on SQLite if its thread took the first record before the rest
    # arrived (the old path: 50).
    assert sum(commits.sizes) == 50 and len(commits.sizes) <= 2
    effects = await _effects(db)
    assert len(effects) == 50
    assert effects["event-7"]["status"] == SUCCEEDED
    assert effects["event-7"]["response"] == {"n": 7}


async def test_records_arriving_during_a_commit_join_the_next_one(
    db: AsyncEngine, commits: Commits
) -> None:
    store = IdempotencyStore(db, clock=utc_now)
    commits.release.clear()
    first = store.submit_side_effect(_key(0), succeeded=True)
    await commits.first_taken()  # the writer has taken the first record and is committing it
    later = [store.submit_side_effect(_key(n), succeeded=True) for n in range(1, 20)]
    commits.release.set()
    await asyncio.gather(first, *later)
    assert commits.sizes == [1, 19]
    assert len(await _effects(db)) == 20


async def test_a_record_that_is_not_json_fails_only_its_own_call(db: AsyncEngine) -> None:
    store = IdempotencyStore(db, clock=utc_now)
    good = [store.submit_side_effect(_key(n), succeeded=True, response=n) for n in range(5)]
    bad = store.submit_side_effect(_key(99), succeeded=True, response=object())
    with pytest.raises(TypeError, match="JSON serializable"):
        await bad
    await asyncio.gather(*good)
    assert sorted(await _effects(db)) == [f"event-{n}" for n in range(5)]


async def test_a_record_the_database_refuses_fails_only_its_own_call(
    db: AsyncEngine, commits: Commits
) -> None:
    writer = RecordWriter(db, side_effect_upsert, SIDE_EFFECT_COLUMNS)
    now = utc_now()

    def record(n: int, status: str) -> dict[str, Any]:
        values: dict[str, Any] = dict.fromkeys(SIDE_EFFECT_COLUMNS)
        key = _key(n)
        values |= {
            "tenant_id": key.tenant_id,
            "actor_id": key.actor_id,
            "event_id": key.event_id,
            "handler_key": key.handler_key,
            "effect_key": key.effect_key,
            "status": status,
            "attempt_count": 1,
            "created_at": now,
            "updated_at": now,
        }
        return values

    commits.release.clear()
    good = [writer.submit(record(0, SUCCEEDED))]
    await commits.first_taken()
    good += [writer.submit(record(n, SUCCEEDED)) for n in (1, 2)]
    bad = writer.submit(record(99, "bogus"))  # refused by the status CHECK
    commits.release.set()
    with pytest.raises(IntegrityError):
        await bad
    await asyncio.gather(*good)
    assert sorted(await _effects(db)) == [f"event-{n}" for n in range(3)]
    assert commits.sizes == [1, 3, 1, 1, 1]  # refused as a batch, then written one by one


async def test_one_key_twice_in_a_batch_ends_as_written_one_after_the_other(
    db: AsyncEngine,
) -> None:
    store = IdempotencyStore(db, clock=utc_now)
    failed = store.submit_side_effect(_key(1), succeeded=False, error="timeout")
    succeeded = store.submit_side_effect(_key(1), succeeded=True, response="ok")
    failed_again = store.submit_side_effect(_key(1), succeeded=False, error="late")
    await asyncio.gather(failed, succeeded, failed_again)
    [effect] = (await _effects(db)).values()
    assert effect["status"] == SUCCEEDED and effect["response"] == "ok"  # never downgraded
    assert effect["attempt_count"] == 2  # the failure, then the success over it


async def test_a_caller_that_stops_waiting_still_has_its_record_written(db: AsyncEngine) -> None:
    store = IdempotencyStore(db, clock=utc_now)
    waiting = asyncio.ensure_future(store.record_side_effect(_key(1), succeeded=False, error="x"))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(store.record_side_effect(_key(2), succeeded=True))  # after it
    effects = await _effects(db)
    assert effects["event-1"]["status"] == FAILED and effects["event-2"]["status"] == SUCCEEDED


@pytest.fixture
async def sqlite_db(sqlite_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(sqlite_url)
    await create_schema(engine)
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_sqlite_commits_as_soon_as_a_held_write_lock_is_released(
    sqlite_db: AsyncEngine, sqlite_url: str
) -> None:
    """Another process's writer holds the lock: the record waits, without failing, and is
    committed once the lock is free."""
    holder = create_engine(sqlite_url)
    store = IdempotencyStore(sqlite_db, clock=utc_now)
    try:
        async with holder.begin() as conn:
            await conn.execute(text("DELETE FROM outbox_side_effects"))  # takes the lock
            waiting = store.submit_side_effect(_key(1), succeeded=True)
            await asyncio.sleep(0.3)
            assert not waiting.done()
        await asyncio.wait_for(waiting, 5)
    finally:
        await holder.dispose()
    assert list(await _effects(sqlite_db)) == ["event-1"]


async def test_sqlite_writer_gives_up_after_its_lock_wait_and_writes_again_later(
    sqlite_db: AsyncEngine, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(record_writer, "LOCK_WAIT_SECONDS", 0.2)
    holder = create_engine(sqlite_url)
    store = IdempotencyStore(sqlite_db, clock=utc_now)
    try:
        async with holder.begin() as conn:
            await conn.execute(text("DELETE FROM outbox_side_effects"))
            with pytest.raises(OperationalError, match="locked"):
                await store.record_side_effect(_key(1), succeeded=True)
    finally:
        await holder.dispose()
    assert await _effects(sqlite_db) == {}
    await store.record_side_effect(_key(2), succeeded=True)  # the lock is free again
    assert list(await _effects(sqlite_db)) == ["event-2"]
