"""Pauses per event type (and tenant): stored, audited, counted, and the claim's filter."""

from __future__ import annotations

from datetime import timedelta

import pytest

from engine.errors import ConfigurationError, PauseError
from engine.operating.pauses import (
    ClaimFilter,
    Pause,
    active_pauses,
    claim_filter,
    pause,
    pause_history,
    paused_backlog,
    resume,
)

from .seeding import event_row, insert_events


async def _active(db):
    async with db.connect() as conn:
        return await active_pauses(conn)


async def test_a_pause_is_stored_until_resumed_and_both_are_audited(db, clock):
    made = await pause(db, "orders.placed", reason="crm down", operator="alice", now=clock.now)
    assert made == Pause("orders.placed", None, "crm down", "alice", clock.now)
    clock.advance(60)
    await pause(
        db, "orders.placed", "acme", reason="acme's webhook 500s", operator="bob", now=clock.now
    )
    assert [(p.event_type, p.tenant_id, p.paused_by) for p in await _active(db)] == [
        ("orders.placed", None, "alice"),
        ("orders.placed", "acme", "bob"),
    ]
    with pytest.raises(
        PauseError,
        match=r"orders.placed \(every tenant\) is already paused, "
        r"since 2026-01-01 12:00 UTC by alice: crm down",
    ):
        await pause(db, "orders.placed", reason="again", operator="carol")

    clock.advance(60)
    ended = await resume(db, "orders.placed", reason="crm back", operator="carol", now=clock.now)
    assert ended == made  # the tenant pause stays: a resume ends exactly its own scope
    assert [(p.tenant_id, p.reason) for p in await _active(db)] == [("acme", "acme's webhook 500s")]
    with pytest.raises(PauseError, match=r"orders.placed \(every tenant\) is not paused"):
        await resume(db, "orders.placed")
    with pytest.raises(PauseError, match=r"invoices.sent \(tenant acme\) is not paused"):
        await resume(db, "invoices.sent", "acme")

    history = await pause_history(db)
    assert [(h.action, h.tenant_id, h.operator, h.reason, h.at) for h in history] == [
        ("resume", None, "carol", "crm back", clock.now),
        ("pause", "acme", "bob", "acme's webhook 500s", clock.now - timedelta(seconds=60)),
        ("pause", None, "alice", "crm down", clock.now - timedelta(seconds=120)),
    ]


@pytest.mark.parametrize(
    ("event_type", "tenant", "reason", "message"),
    [
        ("", None, "r", "event type must be 1 to 200 characters"),
        ("x" * 201, None, "r", "event type must be 1 to 200 characters"),
        ("orders.placed", "", "r", "tenant must be 1 to 128 characters"),
        ("orders.placed", "  ", "r", "leave it out to pause every tenant"),
        ("orders.placed", None, " ", "a pause needs a reason"),
    ],
)
async def test_bad_pause_input_is_refused_in_one_line(db, event_type, tenant, reason, message):
    with pytest.raises(ConfigurationError, match=message):
        await pause(db, event_type, tenant, reason=reason)
    assert await _active(db) == []
    assert await pause_history(db) == []


async def test_each_pause_counts_the_pending_and_failed_events_it_holds_back(db, clock):
    now = clock.now
    seeds = [
        ("pending", "orders.placed", "acme"),
        ("pending", "orders.placed", "globex"),
        ("failed", "orders.placed", "acme"),
        ("dead_letter", "orders.placed", "acme"),
        ("published", "orders.placed", "acme"),
        ("publishing", "orders.placed", "acme"),
        ("pending", "invoices.sent", "acme"),
    ]
    await insert_events(
        db, *(event_row(status=s, event_type=e, tenant_id=x, created_at=now) for s, e, x in seeds)
    )
    await pause(db, "orders.placed", reason="r", now=now)
    await pause(db, "invoices.sent", "globex", reason="r", now=now + timedelta(seconds=1))
    await pause(db, "orders.placed", "acme", reason="r", now=now + timedelta(seconds=2))
    backlog = await paused_backlog(db)
    assert [(b.pause.describe(), b.waiting) for b in backlog] == [
        ("orders.placed (every tenant)", 3),
        ("invoices.sent (tenant globex)", 0),
        ("orders.placed (tenant acme)", 2),
    ]


def test_the_claim_filter_excludes_whole_types_and_tenant_pairs():
    def held(event_type, tenant=None):
        return Pause(event_type, tenant, "r", "op", None)  # type: ignore[arg-type]

    assert not claim_filter([]) and claim_filter([]) == ClaimFilter()
    found = claim_filter(
        [held("orders.placed"), held("orders.placed", "acme"), held("invoices.sent", "acme")]
    )
    assert found.event_types == {"orders.placed"}
    assert found.pairs == {("invoices.sent", "acme")}
    assert found.is_paused("orders.placed", "globex")
    assert found.is_paused("invoices.sent", "acme")
    assert not found.is_paused("invoices.sent", "globex")
    assert not found.is_paused("orders.cancelled", "acme")
