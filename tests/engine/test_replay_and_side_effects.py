"""Dead-letter replay (with its audit trail) and the side-effect helper."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from sqlalchemy import event, select

from engine import (
    BackoffPolicy,
    DispatchResult,
    EventHandlerPermanentError,
    OutboxDispatcher,
    ReplayError,
    replay_dead_letter,
    run_event_side_effect,
)
from engine.errors import OutboxError
from engine.handlers.idempotency import IdempotencyStore
from engine.storage.schema import replay_log, side_effects

from .conftest import row
from .test_dispatch import publish


async def _dead_letter_one(db, registry, clock, fail_times=1):
    calls = Counter()

    @registry.handler("orders.placed", key="orders.picky")
    async def picky(envelope):
        calls["picky"] += 1
        if calls["picky"] <= fail_times:
            raise EventHandlerPermanentError("bad address")

    [event_id] = await publish(db, registry)
    dispatcher = OutboxDispatcher(db, registry, clock=clock)
    assert (await dispatcher.dispatch_once()).dead_lettered == 1
    return event_id, dispatcher, calls


async def test_replay_sends_a_dead_letter_back_to_pending_and_audits_it(db, registry, clock):
    event_id, dispatcher, calls = await _dead_letter_one(db, registry, clock)
    result = await replay_dead_letter(
        db, [event_id], operator="alice", reason="address fixed", now=clock.now
    )
    assert result.replayed == [event_id] and result.refused == {}
    stored = await row(db, event_id)
    assert stored["status"] == "pending"
    assert stored["attempt_count"] == 0
    assert stored["dead_letter_reason"] is None and stored["last_error"] is None
    assert stored["next_retry_at"] is None and stored["locked_by"] is None
    assert stored["replay_count"] == 1 and stored["last_replayed_at"] == clock.now
    async with db.connect() as conn:
        [audit] = (await conn.execute(select(replay_log))).mappings().all()
    assert audit["event_id"] == event_id
    assert audit["operator"] == "alice" and audit["reason"] == "address fixed"
    assert audit["cleared_dead_letter_reason"].startswith("permanent: orders.picky")
    assert audit["previous_attempt_count"] == 1
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert calls["picky"] == 2


async def test_replay_refuses_anything_but_dead_letters(db, registry, clock):
    dead, _dispatcher, _calls = await _dead_letter_one(db, registry, clock)
    [pending] = await publish(db, registry, prefix="p")
    with pytest.raises(ReplayError, match="status is pending, not dead_letter") as err:
        await replay_dead_letter(db, [pending, "no-such-id", dead], operator="bob")
    assert "no-such-id: no such event" in str(err.value)
    assert (await row(db, pending))["status"] == "pending"
    assert (await row(db, dead))["status"] == "pending"  # the valid one still went through
    result = await replay_dead_letter(db, [pending], strict=False)
    assert result.replayed == [] and pending in result.refused
    async with db.connect() as conn:
        audits = (await conn.execute(select(replay_log.c.event_id))).scalars().all()
    assert audits == [dead]


async def test_handler_that_succeeded_is_not_rerun_on_replay(db, registry, clock):
    calls = Counter()

    @registry.handler("orders.placed", key="orders.email")
    async def email(envelope):
        calls["email"] += 1

    @registry.handler("orders.placed", key="orders.crm")
    async def crm(envelope):
        calls["crm"] += 1
        if calls["crm"] == 1:
            raise EventHandlerPermanentError("crm rejected")

    [event_id] = await publish(db, registry)
    dispatcher = OutboxDispatcher(db, registry, clock=clock)
    assert (await dispatcher.dispatch_once()).dead_lettered == 1
    await replay_dead_letter(db, [event_id])
    assert (await dispatcher.dispatch_once()).published == 1
    assert calls == {"email": 1, "crm": 2}


async def test_succeeded_side_effect_is_not_rerun_when_the_handler_retries(db, registry, clock):
    vendor_calls = []
    attempts = Counter()

    @registry.handler("orders.placed", key="orders.fulfil")
    async def fulfil(envelope):
        attempts["fulfil"] += 1

        async def call_vendor():
            vendor_calls.append(envelope.event_id)
            return {"shipment": "S-1"}

        response = await run_event_side_effect(
            "vendor.ship", call_vendor, request_payload={"order": envelope.payload["order_id"]}
        )
        assert response == {"shipment": "S-1"}
        if attempts["fulfil"] == 1:
            raise ConnectionError("ledger down after shipping")

    [event_id] = await publish(db, registry)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, backoff=BackoffPolicy(base_seconds=1, jitter=0)
    )
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, failed=1)
    clock.advance(1)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert vendor_calls == [event_id]
    async with db.connect() as conn:
        [effect] = (await conn.execute(select(side_effects))).mappings().all()
    assert (effect["tenant_id"], effect["actor_id"], effect["event_id"]) == (
        "acme",
        "user-1",
        event_id,
    )
    assert (effect["handler_key"], effect["effect_key"]) == ("orders.fulfil", "vendor.ship")
    assert effect["status"] == "succeeded"
    assert effect["request"] == {"order": "o-0"} and effect["response"] == {"shipment": "S-1"}


async def test_raising_side_effect_is_recorded_failed_and_retried(db, registry, clock):
    vendor_calls = Counter()

    @registry.handler("orders.placed", key="orders.notify")
    async def notify(envelope):
        def send():  # a plain function works too
            vendor_calls["send"] += 1
            if vendor_calls["send"] == 1:
                raise TimeoutError("vendor timeout")
            return "ok"

        await run_event_side_effect("vendor.notify", send)

    [event_id] = await publish(db, registry)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, backoff=BackoffPolicy(base_seconds=1, jitter=0)
    )
    assert (await dispatcher.dispatch_once()).failed == 1
    async with db.connect() as conn:
        [effect] = (await conn.execute(select(side_effects))).mappings().all()
    assert effect["status"] == "failed" and "vendor timeout" in effect["last_error"]
    assert "TimeoutError" in (await row(db, event_id))["last_error"]
    clock.advance(1)
    assert (await dispatcher.dispatch_once()).published == 1
    async with db.connect() as conn:
        [effect] = (await conn.execute(select(side_effects))).mappings().all()
    assert effect["status"] == "succeeded" and effect["response"] == "ok"
    assert effect["attempt_count"] == 2
    assert vendor_calls["send"] == 2


class _SlowRecords(IdempotencyStore):
    """Side-effect records that wait, as on SQLite behind another process's write lock."""

    def submit_side_effect(self, *args, **kwargs):
        async def slowly():
            await asyncio.sleep(1.5)  # past the handler timeout below
            await IdempotencyStore.submit_side_effect(self, *args, **kwargs)

        return asyncio.ensure_future(slowly())


async def test_a_handler_timed_out_after_the_call_still_records_it(db, registry, clock):
    """The timeout lands while the record waits: the record is written anyway, so the
    retry answers from it and the external system is called once (fault suite: crash)."""
    vendor_calls = Counter()

    @registry.handler("orders.placed", key="orders.charge")
    async def charge(envelope):
        def call_vendor():
            vendor_calls[envelope.event_id] += 1
            return "charged"

        await run_event_side_effect("vendor.charge", call_vendor)

    [event_id] = await publish(db, registry)
    dispatcher = OutboxDispatcher(
        db,
        registry,
        clock=clock,
        handler_timeout_seconds=0.5,  # the lookup and the call fit; the record does not
        idempotency_store=_SlowRecords(db, clock=clock),
        backoff=BackoffPolicy(base_seconds=1, jitter=0),
    )
    result = await dispatcher.dispatch_once()
    assert result == DispatchResult(claimed=1, failed=1)
    assert "timed out" in (await row(db, event_id))["last_error"]
    async with db.connect() as conn:
        [effect] = (await conn.execute(select(side_effects))).mappings().all()
    assert effect["status"] == "succeeded" and effect["response"] == "charged"
    clock.advance(1)
    # The retry, by a dispatcher with the default timeout: 0.5 s was for the slow record,
    # and a loaded machine can spend it on the lookup alone.
    retrying = OutboxDispatcher(
        db, registry, clock=clock, idempotency_store=_SlowRecords(db, clock=clock)
    )
    assert await retrying.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert vendor_calls == {event_id: 1}


async def test_side_effect_helper_outside_a_handler_is_an_error():
    with pytest.raises(OutboxError, match="inside an event handler"):
        await run_event_side_effect("x", lambda: None)


async def test_a_key_repeated_within_one_handler_call_is_called_once(db, registry, clock):
    vendor_calls = Counter()

    @registry.handler("orders.placed", key="orders.ship")
    async def ship(envelope):
        def call_vendor():
            vendor_calls["ship"] += 1
            return {"shipment": vendor_calls["ship"]}

        first = await run_event_side_effect("vendor.ship", call_vendor)
        again = await run_event_side_effect("vendor.ship", call_vendor)
        assert first == again == {"shipment": 1}

    await publish(db, registry)
    dispatcher = OutboxDispatcher(db, registry, clock=clock)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert vendor_calls == {"ship": 1}


async def test_a_first_delivery_looks_up_no_side_effect_record(db, registry, clock):
    """No record can exist before an event's first delivery: its calls cost no lookup."""
    lookups = []
    event.listen(
        db.sync_engine,
        "before_cursor_execute",
        lambda _c, _cur, statement, *_: (
            lookups.append(statement)
            if statement.lstrip().upper().startswith("SELECT")
            and "outbox_side_effects" in statement
            else None
        ),
    )
    failures = Counter()

    @registry.handler("orders.placed", key="orders.notify")
    async def notify(envelope):
        await run_event_side_effect("vendor.notify", lambda: "sent")
        failures["notify"] += 1
        if failures["notify"] == 1:
            raise ConnectionError("after the call")

    await publish(db, registry)
    dispatcher = OutboxDispatcher(db, registry, clock=clock, backoff=BackoffPolicy(base_seconds=1))
    assert (await dispatcher.dispatch_once()).failed == 1
    assert lookups == []
    clock.advance(1)
    assert (await dispatcher.dispatch_once()).published == 1
    assert len(lookups) == 1  # the retry asks, and is answered from the record
