"""Error groups: one fingerprint per failure, groups over failed rows and dead letters,
and replaying a whole group."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from engine import EventHandlerPermanentError, OutboxDispatcher
from engine.errors import ConfigurationError
from engine.operating import replay
from engine.operating.error_groups import (
    NO_ERROR,
    GroupMembers,
    error_groups,
    fingerprint,
    group_members,
    normalise_error,
)
from engine.operating.replay import replay_dead_letter, replay_group
from engine.storage.schema import replay_log

from .conftest import row
from .seeding import event_row, insert_events
from .test_dispatch import publish


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("crm: HTTPError: 503 for order o-17", "crm: HTTPError: 404 for order o-92"),
        (
            "no customer 0190aaaa-0000-7000-8000-000000000001",
            "no customer 0190bbbb-1234-7000-8000-00000000abcd",
        ),
        ("KeyError: 'amount'", 'KeyError: "order_id"'),
        ("lease lost at 2026-01-01T12:00:00.123+00:00", "lease lost at 2026-03-09 08:15:00Z"),
        ("retry at 12:00:01", "retry at 23:59:59.5"),
        ("bad pointer 0xdeadBEEF", "bad pointer 0x1"),
        ("took 1.53 s", "took 20.1 s"),
        ("customer cus_9aB3xQ12 refused", "customer cus_Zz81pqR4 refused"),
        ("duplicate ids 4, 5, 6", "duplicate ids 7"),
        ("  spaced   out\n", "spaced out"),
    ],
)
def test_errors_that_differ_only_in_what_varies_per_event_share_a_fingerprint(one, other):
    assert normalise_error(one) == normalise_error(other)
    assert fingerprint(one) == fingerprint(other)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("crm: HTTPError: 503", "crm: ConnectionError: 503"),
        ("orders.crm: timed out after 10 s", "orders.email: timed out after 10 s"),
        ("utf8 codec failed", "utf16 codec failed and more"),
    ],
)
def test_different_failures_get_different_fingerprints(one, other):
    assert fingerprint(one) != fingerprint(other)


def test_a_fingerprint_is_twelve_hex_digits_and_stable_across_versions():
    # Operators keep fingerprints (in runbooks, in `replay --group`): they must not drift.
    assert fingerprint("crm: HTTPError: 503 for order o-17") == "3978ad63b895"
    assert normalise_error("crm: HTTPError: 503 for order o-17") == (
        "crm: HTTPError: <num> for order o-<num>"
    )
    assert normalise_error(None) == normalise_error("") == NO_ERROR


async def _fail(db, registry, clock, count, prefix, *, permanent):
    @registry.handler("orders.placed", key=f"orders.{prefix}")
    async def handler(envelope):
        if envelope.payload["order_id"].startswith(prefix):
            detail = f"vendor refused order {envelope.payload['order_id']} at 2026-01-01 12:00:00"
            raise EventHandlerPermanentError(detail) if permanent else ConnectionError(detail)

    return await publish(db, registry, count=count, prefix=prefix)


async def test_failed_rows_and_dead_letters_are_grouped_with_counts_types_tenants_and_times(
    db, registry, clock
):
    dead = await _fail(db, registry, clock, 3, "bad", permanent=True)
    failing = await _fail(db, registry, clock, 2, "flaky", permanent=False)
    await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    t0 = clock.now
    [other] = await insert_events(
        db,
        event_row(
            status="dead_letter",
            event_type="invoices.sent",
            tenant_id="globex",
            created_at=t0 + timedelta(hours=1),
            last_error=None,
            dead_letter_reason="corrupt payload: not valid JSON (line 1 column 7)",
        ),
    )

    found = await error_groups(db)
    assert found.complete and found.scanned == 6
    by_size = [(g.count, dict(g.statuses)) for g in found.groups]
    assert by_size == [(3, {"dead_letter": 3}), (2, {"failed": 2}), (1, {"dead_letter": 1})]
    permanent, transient, corrupt = found.groups
    assert permanent.message == ("permanent: orders.bad: vendor refused order bad-<num> at <time>")
    assert transient.message.startswith("orders.flaky: ConnectionError: vendor refused order")
    assert dict(permanent.event_types) == {"orders.placed": 3}
    assert dict(permanent.tenants) == {"acme": 3}
    stored = [await row(db, i) for i in dead]
    assert permanent.first_seen == min(r["created_at"] for r in stored)
    assert permanent.last_seen == max(r["created_at"] for r in stored)
    assert permanent.dead_letters == 3 and transient.dead_letters == 0
    assert corrupt.message == "corrupt payload: not valid JSON (line <num> column <num>)"
    assert dict(corrupt.tenants) == {"globex": 1} and corrupt.first_seen == t0 + timedelta(hours=1)

    members = await group_members(db, permanent.fingerprint)
    assert members.ids == tuple(sorted(dead)) == members.dead_letter_ids
    assert members.by_type == {"orders.placed": 3}
    failing_members = await group_members(db, transient.fingerprint)
    assert failing_members.ids == tuple(sorted(failing)) and failing_members.dead_letter_ids == ()
    assert (await group_members(db, corrupt.fingerprint)).ids == (other,)
    assert (await group_members(db, "000000000000")).ids == ()


async def test_the_group_scan_stops_at_its_limit_and_says_so(db, clock):
    await insert_events(
        db,
        *(
            event_row(status="failed", created_at=clock.now, last_error=f"timeout {i}")
            for i in range(5)
        ),
    )
    partial = await error_groups(db, scan_limit=3)
    assert not partial.complete and partial.scanned == 3
    assert [g.count for g in partial.groups] == [3]
    whole = await error_groups(db, scan_limit=5)
    assert whole.complete and [g.count for g in whole.groups] == [5]
    only_dead = await error_groups(db, statuses=("dead_letter",))
    assert only_dead.complete and only_dead.groups == []
    with pytest.raises(ConfigurationError, match="not 'pending'"):
        await error_groups(db, statuses=("pending",))
    with pytest.raises(ConfigurationError, match="scan_limit"):
        await error_groups(db, scan_limit=0)


async def test_replaying_a_group_replays_its_dead_letters_only_and_audits_each(db, registry, clock):
    dead = await _fail(db, registry, clock, 3, "bad", permanent=True)
    failing = await _fail(db, registry, clock, 1, "flaky", permanent=False)
    await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    [unrelated] = await insert_events(
        db, event_row(status="dead_letter", created_at=clock.now, last_error="other failure")
    )
    group = fingerprint((await row(db, dead[0]))["last_error"])
    # Someone replays one of the group first: the group replay refuses nothing and skips it.
    await replay_dead_letter(db, [dead[0]], operator="bob", now=clock.now)

    result = await replay_group(db, group, operator="alice", reason="vendor fixed", now=clock.now)
    assert sorted(result.replayed) == sorted(dead[1:]) and result.refused == {}
    assert [(await row(db, i))["status"] for i in dead] == ["pending"] * 3
    assert (await row(db, failing[0]))["status"] == "failed"
    assert (await row(db, unrelated))["status"] == "dead_letter"
    async with db.connect() as conn:
        audit = (await conn.execute(select(replay_log).order_by(replay_log.c.id))).mappings().all()
    assert [(a["event_id"], a["operator"]) for a in audit] == [(dead[0], "bob")] + [
        (i, "alice") for i in sorted(dead[1:])
    ]
    assert {a["reason"] for a in audit[1:]} == {"vendor fixed"}
    assert (await replay_group(db, group)).replayed == []


async def test_a_row_whose_error_left_the_group_before_the_lock_is_refused(db, clock, monkeypatch):
    now = clock.now
    ours, theirs = await insert_events(
        db,
        event_row(status="dead_letter", created_at=now, last_error="vendor refused order o-1"),
        event_row(status="dead_letter", created_at=now, last_error="disk full"),
    )
    group = fingerprint("vendor refused order o-1")
    stale = GroupMembers(group, (ours, theirs), (ours, theirs), {"orders.placed": 2})

    async def listed_before_the_change(engine, fp, *, statuses):
        return stale

    monkeypatch.setattr(replay, "group_members", listed_before_the_change)
    result = await replay.replay_group(db, group, operator="alice", now=now)
    assert result.replayed == [ours]
    assert result.refused == {theirs: f"its error is no longer in group {group}"}
    assert (await row(db, theirs))["status"] == "dead_letter"
