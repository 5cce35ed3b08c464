"""Transactional handlers: the handler's writes, its record, its follow-up events and the
fence commit together or not at all, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from sqlalchemy import Column, MetaData, String, Table, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import (
    ConfigurationError,
    EventRegistrationError,
    OutboxDispatcher,
    OutboxEventPublisher,
    OutboxInsights,
    unit_of_work,
)
from engine.storage.schema import handler_runs, outbox_events

from .conftest import CTX, order_payload, rows

# A business table without a unique constraint: a second run would add a second row.
business = MetaData()
invoices = Table(
    "test_invoices",
    business,
    Column("event_id", String(36)),
    Column("order_id", String(36)),
)


@pytest.fixture
async def bdb(db: AsyncEngine) -> AsyncEngine:
    async with db.begin() as conn:
        await conn.run_sync(business.create_all)
    return db


@pytest.fixture
def chain_registry(registry):
    registry.register_event("invoices.issued", 1)
    registry.register_event("invoices.sent", 1)
    return registry


async def publish(db, registry, count=1):
    ids = []
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        for n in range(count):
            ids.append(
                await OutboxEventPublisher(session).publish(
                    "orders.placed",
                    order_payload(f"o-{n}"),
                    aggregate_type="order",
                    aggregate_id=f"o-{n}",
                )
            )
    return ids


async def invoice_rows(db) -> list[tuple[str, str]]:
    async with db.connect() as conn:
        return [tuple(r) for r in await conn.execute(select(invoices))]


async def by_type(db, event_type: str) -> list[dict]:
    return [r for r in await rows(db) if r["event_type"] == event_type]


def issue_invoice(registry, *, fail: BaseException | None = None, before=None):
    """orders.placed -> one invoice row and an invoices.issued event, in the handler's
    transaction."""

    @registry.handler("orders.placed", key="billing.invoice", transactional=True)
    async def handler(envelope, session):
        order_id = envelope.payload["order_id"]
        await session.execute(
            insert(invoices).values(event_id=envelope.event_id, order_id=order_id)
        )
        await OutboxEventPublisher(session).publish(
            "invoices.issued",
            {"order_id": order_id},
            aggregate_type="invoice",
            aggregate_id=order_id,
        )
        if before is not None:
            await before(envelope)
        if fail is not None:
            raise fail

    return handler


async def test_a_sole_transactional_handler_commits_its_writes_its_event_and_the_completion(
    bdb, chain_registry, clock
):
    [event_id] = await publish(bdb, chain_registry)
    issue_invoice(chain_registry)
    result = await OutboxDispatcher(bdb, chain_registry, clock=clock).dispatch_once()
    assert (result.claimed, result.published, result.lost_leases) == (1, 1, 0)
    assert await invoice_rows(bdb) == [(event_id, "o-0")]
    [placed] = await by_type(bdb, "orders.placed")
    assert placed["status"] == "published"
    [issued] = await by_type(bdb, "invoices.issued")
    assert issued["status"] == "pending"
    assert (issued["causation_id"], issued["correlation_id"]) == (event_id, event_id)
    assert issued["payload"]["tenant_id"] == CTX.tenant_id  # the cause's task context
    async with bdb.connect() as conn:  # its only handler: the published row is the record
        assert (await conn.execute(select(func.count()).select_from(handler_runs))).scalar() == 0


async def test_a_handler_that_raises_leaves_nothing_behind_and_is_retried(
    bdb, chain_registry, clock
):
    await publish(bdb, chain_registry)
    issue_invoice(chain_registry, fail=ConnectionError("ledger away"))
    result = await OutboxDispatcher(bdb, chain_registry, clock=clock).dispatch_once()
    assert (result.published, result.failed) == (0, 1)
    assert await invoice_rows(bdb) == []
    assert await by_type(bdb, "invoices.issued") == []
    [placed] = await by_type(bdb, "orders.placed")
    assert placed["status"] == "failed" and "ledger away" in placed["last_error"]


async def test_a_claim_lost_while_the_handler_ran_rolls_everything_back(bdb, chain_registry, clock):
    """The lease runs out mid-handler and another dispatcher takes the event over: the
    first one's writes never commit, the second one's do, once."""
    [event_id] = await publish(bdb, chain_registry)
    first_in = asyncio.Event()
    taken_over = asyncio.Event()

    async def stall(envelope):
        if not first_in.is_set():
            first_in.set()
            await taken_over.wait()

    issue_invoice(chain_registry, before=stall)
    slow = OutboxDispatcher(
        bdb, chain_registry, clock=clock, dispatcher_id="slow", lease_seconds=10
    )
    running = asyncio.create_task(slow.dispatch_once())
    await first_in.wait()
    clock.advance(11)  # the slow one's lease has run out
    if bdb.dialect.name == "sqlite":
        # SQLite's one writer: the slow handler holds the write lock, so the takeover
        # can only claim once that transaction ends; let it end first.
        taken_over.set()
        lost = await running
        other = await OutboxDispatcher(
            bdb, chain_registry, clock=clock, dispatcher_id="other"
        ).dispatch_once()
    else:
        other = await OutboxDispatcher(
            bdb, chain_registry, clock=clock, dispatcher_id="other"
        ).dispatch_once()
        taken_over.set()
        lost = await running
    assert (lost.published, lost.lost_leases) == (0, 1)
    assert other.published == 1
    assert await invoice_rows(bdb) == [(event_id, "o-0")]
    assert len(await by_type(bdb, "invoices.issued")) == 1


async def test_with_other_handlers_its_record_commits_with_its_writes_and_a_retry_skips_it(
    bdb, chain_registry, clock
):
    [event_id] = await publish(bdb, chain_registry)
    issue_invoice(chain_registry)
    calls = Counter()

    @chain_registry.handler("orders.placed", key="mail.confirm")
    async def confirm(envelope):
        calls["confirm"] += 1
        if calls["confirm"] == 1:
            raise ConnectionError("smtp away")

    dispatcher = OutboxDispatcher(bdb, chain_registry, clock=clock)
    assert (await dispatcher.dispatch_once()).failed == 1
    async with bdb.connect() as conn:
        runs = {
            r.handler_key: r.status
            for r in await conn.execute(select(handler_runs.c.handler_key, handler_runs.c.status))
        }
    assert runs == {"billing.invoice": "succeeded", "mail.confirm": "failed"}
    clock.advance(60)
    assert (await dispatcher.dispatch_once()).published == 1
    assert await invoice_rows(bdb) == [(event_id, "o-0")]  # not run again
    assert len(await by_type(bdb, "invoices.issued")) == 1
    assert calls["confirm"] == 2


@pytest.mark.parametrize("ending", ["commit", "rollback", "close"])
async def test_a_handler_that_ends_the_transaction_itself_fails_and_writes_nothing(
    bdb, chain_registry, clock, ending
):
    await publish(bdb, chain_registry)

    @chain_registry.handler("orders.placed", key="billing.invoice", transactional=True)
    async def handler(envelope, session):
        await session.execute(insert(invoices).values(event_id=envelope.event_id, order_id="x"))
        await getattr(session, ending)()

    result = await OutboxDispatcher(bdb, chain_registry, clock=clock).dispatch_once()
    assert result.failed == 1
    assert await invoice_rows(bdb) == []
    [placed] = await by_type(bdb, "orders.placed")
    assert f"must not {ending.replace('rollback', 'roll back')} it" in placed["last_error"]


async def test_a_handler_past_its_timeout_is_cancelled_and_rolled_back(bdb, chain_registry, clock):
    await publish(bdb, chain_registry)

    async def slow(envelope):
        await asyncio.sleep(5)

    issue_invoice(chain_registry, before=slow)
    dispatcher = OutboxDispatcher(bdb, chain_registry, clock=clock, handler_timeout_seconds=0.2)
    result = await dispatcher.dispatch_once()
    assert result.failed == 1
    assert await invoice_rows(bdb) == []
    assert await by_type(bdb, "invoices.issued") == []
    [placed] = await by_type(bdb, "orders.placed")
    assert "timed out after 0.2 s" in placed["last_error"]


async def test_a_chain_carries_its_first_event_and_each_link_its_cause(bdb, chain_registry, clock):
    [first] = await publish(bdb, chain_registry)
    issue_invoice(chain_registry)

    @chain_registry.handler("invoices.issued", key="billing.send", transactional=True)
    async def send(envelope, session):
        await OutboxEventPublisher(session).publish(
            "invoices.sent", dict(envelope.payload), aggregate_type="invoice", aggregate_id="i"
        )

    @chain_registry.handler("invoices.sent", key="billing.archive", transactional=True)
    async def archive(envelope, session):
        assert envelope.chain_id == first

    dispatcher = OutboxDispatcher(bdb, chain_registry, clock=clock)
    for _ in range(3):
        await dispatcher.dispatch_once()
    [issued] = await by_type(bdb, "invoices.issued")
    [sent] = await by_type(bdb, "invoices.sent")
    assert (issued["causation_id"], issued["correlation_id"]) == (first, first)
    assert (sent["causation_id"], sent["correlation_id"]) == (issued["id"], first)
    assert {r["status"] for r in await rows(bdb)} == {"published"}
    detail = await OutboxInsights(bdb, clock=clock).event_detail(sent["id"])
    assert detail.chain_id == first
    assert [(e["id"], e["causation_id"]) for e in detail.chain] == [
        (first, None),
        (issued["id"], first),
        (sent["id"], issued["id"]),
    ]
    alone = await OutboxInsights(bdb, clock=clock).event_detail(first)
    assert [e["id"] for e in alone.chain] == [first, issued["id"], sent["id"]]


async def test_events_published_outside_a_handler_start_a_chain(db, registry):
    [event_id] = await publish(db, registry)
    [stored] = await rows(db)
    assert stored["id"] == event_id
    assert (stored["causation_id"], stored["correlation_id"]) == (None, None)


def test_a_transactional_handler_without_a_session_parameter_is_refused(registry):
    async def one(envelope):
        return None

    with pytest.raises(EventRegistrationError, match=r"must take \(envelope, session\)"):
        registry.register_handler("orders.placed", one, key="k", transactional=True)


def test_a_plain_handler_that_takes_a_session_is_told_to_be_transactional(registry):
    async def two(envelope, session):
        return None

    with pytest.raises(EventRegistrationError, match="transactional=True"):
        registry.register_handler("orders.placed", two, key="k")


async def test_a_dispatcher_on_another_database_than_its_app_expects_refuses_to_start(
    db, registry, tmp_path
):
    registry.expect_database(f"sqlite+aiosqlite:///{tmp_path}/business.db")
    issue_invoice(registry)
    with pytest.raises(ConfigurationError, match="must commit in the outbox's own database"):
        OutboxDispatcher(db, registry)
    registry.expect_database(db)
    OutboxDispatcher(db, registry)  # the same database: fine


async def test_concurrent_transactional_handlers_each_commit_once(bdb, chain_registry, clock):
    ids = await publish(bdb, chain_registry, count=12)

    async def pause(envelope):
        await asyncio.sleep(0.01)

    issue_invoice(chain_registry, before=pause)
    dispatcher = OutboxDispatcher(
        bdb, chain_registry, clock=clock, batch_size=12, max_concurrency=4
    )
    assert (await dispatcher.dispatch_once()).published == 12
    assert sorted(await invoice_rows(bdb)) == sorted((i, f"o-{n}") for n, i in enumerate(ids))
    issued = await by_type(bdb, "invoices.issued")
    assert sorted(r["causation_id"] for r in issued) == sorted(ids)
    async with bdb.connect() as conn:
        assert (
            await conn.execute(select(func.count()).where(outbox_events.c.status == "published"))
        ).scalar() == 12
