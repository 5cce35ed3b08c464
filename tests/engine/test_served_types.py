"""A dispatcher claims only the event types it can deliver; the rest wait, untouched.

Rolling deploys (an old dispatcher next to the new version's new types) and services
sharing one outbox database (each with its own handlers) depend on it: nothing is
dead-lettered as unknown, nothing is marked published with no handler run.
"""

from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import text

from engine import EventRegistry, OutboxDispatcher
from engine.dispatch import ExternalPublishResult
from engine.dispatch.claimer import Claimer, ClaimScope
from engine.operating.insights import OutboxInsights
from engine.running.heartbeat import Heartbeat

from .conftest import row

INSERT = text(
    "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, aggregate_type, "
    "aggregate_id, payload, ordering_key) VALUES (:id, :tenant, :type, 1, 'order', 'o-1', "
    ":payload, :key)"
)


def payload(tenant: str = "acme") -> str:
    return json.dumps(
        {"order_id": "o-1", "amount": 5, "tenant_id": tenant, "actor_id": "u", "request_id": "r"}
    )


async def insert(db, *events: tuple[str, str], key: str | None = None, tenant: str = "acme"):
    """(id, event_type) rows in this order (so in seq order), optionally on one key."""
    async with db.begin() as conn:
        for event_id, event_type in events:
            await conn.execute(
                INSERT,
                {
                    "id": event_id,
                    "tenant": tenant,
                    "type": event_type,
                    "payload": payload(tenant),
                    "key": key,
                },
            )


def handling(registry: EventRegistry, event_type: str, seen: list[str]) -> EventRegistry:
    async def handle(envelope) -> None:
        seen.append(envelope.event_id)

    registry.register_handler(event_type, handle, key=f"test.{event_type}")
    return registry


async def test_types_without_a_handler_here_and_unknown_types_stay_pending(db, registry, clock):
    seen: list[str] = []
    handling(registry, "orders.placed", seen)  # orders.cancelled: registered, no handler
    await insert(
        db,
        ("p1", "orders.placed"),
        ("c1", "orders.cancelled"),
        ("b1", "billing.invoiced"),  # a type this process does not know at all
        ("p2", "orders.placed"),
    )
    dispatcher = OutboxDispatcher(db, registry, clock=clock)
    assert dispatcher.served_types == ["orders.placed"]
    result = await dispatcher.dispatch_once()
    assert (result.claimed, result.published, result.dead_lettered) == (2, 2, 0)
    assert sorted(seen) == ["p1", "p2"]
    for event_id in ("c1", "b1"):
        untouched = await row(db, event_id)
        assert (untouched["status"], untouched["attempt_count"]) == ("pending", 0)
        assert untouched["locked_by"] is None and untouched["claim_version"] == 0

    other = EventRegistry()  # the other service sharing this database
    other.register_event("orders.cancelled", 1)
    other.register_event("billing.invoiced", 1)
    handling(other, "orders.cancelled", seen)
    handling(other, "billing.invoiced", seen)
    result = await OutboxDispatcher(db, other, clock=clock).dispatch_once()
    assert (result.claimed, result.published) == (2, 2)
    assert sorted(seen) == ["b1", "c1", "p1", "p2"]


class _Sink:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def publish(self, envelopes):
        self.sent += [e.event_id for e in envelopes]
        return ExternalPublishResult(published={e.event_id for e in envelopes})


async def test_a_relay_serves_every_registered_type_and_no_unknown_one(db, registry, clock):
    await insert(db, ("p1", "orders.placed"), ("c1", "orders.cancelled"), ("b1", "billing.x"))
    sink = _Sink()
    dispatcher = OutboxDispatcher(db, registry, external_publisher=sink, clock=clock)
    assert dispatcher.served_types == ["orders.cancelled", "orders.placed"]
    await dispatcher.dispatch_once()
    assert sorted(sink.sent) == ["c1", "p1"]
    assert (await row(db, "b1"))["status"] == "pending"


async def test_a_key_whose_head_nobody_here_serves_waits_for_it(db, registry, clock):
    seen: list[str] = []
    handling(registry, "orders.placed", seen)
    await insert(db, ("h", "billing.invoiced"), ("next", "orders.placed"), key="order:o-1")
    dispatcher = OutboxDispatcher(db, registry, clock=clock)
    assert (await dispatcher.dispatch_once()).claimed == 0
    assert (await row(db, "next"))["status"] == "pending"

    other = EventRegistry()
    other.register_event("billing.invoiced", 1)
    handling(other, "billing.invoiced", seen)
    assert (await OutboxDispatcher(db, other, clock=clock).dispatch_once()).published == 1
    assert (await dispatcher.dispatch_once()).published == 1
    assert seen == ["h", "next"]


async def test_rows_of_unserved_types_ahead_do_not_starve_served_ones(db, registry, clock):
    """Hundreds of unserved rows first: the claim still fills from the served types."""
    seen: list[str] = []
    handling(registry, "orders.placed", seen)
    handling(registry, "orders.cancelled", seen)
    await insert(db, *[(f"u{i:03}", "billing.invoiced") for i in range(300)])
    await insert(db, *[(f"p{i}", "orders.placed") for i in range(4)])
    await insert(db, *[(f"c{i}", "orders.cancelled") for i in range(4)])
    dispatcher = OutboxDispatcher(db, registry, batch_size=5, clock=clock)
    first = await dispatcher.dispatch_once()
    assert first.published == 5
    assert seen == ["p0", "p1", "p2", "p3", "c0"]  # seq order across the served types
    assert (await dispatcher.dispatch_once()).published == 3
    assert (await dispatcher.dispatch_once()).claimed == 0


async def test_a_pause_for_one_tenant_leaves_that_tenants_rows_alone(db, clock):
    await insert(db, ("a1", "orders.placed"), ("a2", "orders.placed"), tenant="acme")
    await insert(db, ("g1", "orders.placed"), tenant="globex")
    await insert(db, ("g2", "orders.cancelled"), tenant="globex")
    scope = ClaimScope(
        frozenset({"orders.placed", "orders.cancelled"}),
        paused_pairs=frozenset({("orders.placed", "globex")}),
    )
    assert not scope.admits("orders.placed", "globex") and scope.admits("orders.placed", "acme")
    async with db.begin() as conn:
        batch = await Claimer("d", 10, timedelta(seconds=30)).claim(conn, clock(), scope)
    assert sorted(r.event_id for r in batch.rows) == ["a1", "a2", "g2"]
    assert (await row(db, "g1"))["status"] == "pending"
    async with db.begin() as conn:
        nothing = await Claimer("d", 10, timedelta(seconds=30)).claim(
            conn, clock(), ClaimScope(frozenset())
        )
    assert nothing.rows == []


async def test_stats_names_the_types_no_live_dispatcher_serves(db, registry, clock):
    await insert(
        db, ("p1", "orders.placed"), ("b1", "billing.invoiced"), ("b2", "billing.invoiced")
    )
    insights = OutboxInsights(db, clock=clock)
    assert not (await insights.overview()).unserved  # no dispatcher alive: nothing judged
    beat = Heartbeat(db, "host:1", clock=clock)
    await beat.beat({"serves": ["orders.placed"]})
    overview = await insights.overview()
    assert [(u.event_type, u.count) for u in overview.unserved] == [("billing.invoiced", 2)]
    assert overview.heartbeats[0].serves == ["orders.placed"]
    oldest = overview.unserved[0]
    assert oldest.oldest_age_seconds == max(
        0.0, (overview.taken_at - oldest.oldest_created_at).total_seconds()
    )


async def test_paused_types_and_tenants_wait_unattempted_until_resumed(db, registry, clock):
    from engine.operating.pauses import pause, resume

    seen: list[str] = []
    handling(registry, "orders.placed", seen)
    handling(registry, "orders.cancelled", seen)
    await insert(db, ("p-acme", "orders.placed"), ("c-acme", "orders.cancelled"), tenant="acme")
    await insert(db, ("p-globex", "orders.placed"), tenant="globex")
    await insert(db, ("k1", "orders.cancelled"), ("k2", "orders.placed"), key="order:o-9")
    await pause(db, "orders.cancelled", reason="vendor down", operator="ops")
    await pause(db, "orders.placed", "globex", reason="globex webhook 500s", operator="ops")

    dispatcher = OutboxDispatcher(db, registry, clock=clock)
    result = await dispatcher.dispatch_once()
    assert seen == ["p-acme"]  # k2 waits behind its paused head k1
    for event_id in ("c-acme", "p-globex", "k1", "k2"):
        waiting = await row(db, event_id)
        assert (waiting["status"], waiting["attempt_count"]) == ("pending", 0), event_id
    assert (result.claimed, result.failed, result.dead_lettered) == (1, 0, 0)

    await resume(db, "orders.cancelled", operator="ops")
    await dispatcher.dispatch_once()
    await dispatcher.dispatch_once()
    assert sorted(seen) == ["c-acme", "k1", "k2", "p-acme"]
    await resume(db, "orders.placed", "globex", operator="ops")
    await dispatcher.dispatch_once()
    assert "p-globex" in seen


async def test_an_unknown_version_of_a_served_type_is_dead_lettered(db, registry, clock):
    """Scope is by type, not version: an old dispatcher claims v2 of a type it serves and
    dead-letters it as not registered (docs/dispatcher.md: deploy consumers first)."""
    seen: list[str] = []
    handling(registry, "orders.placed", seen)
    await insert(db, ("v1", "orders.placed"))
    async with db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, "
                "aggregate_type, aggregate_id, payload) VALUES ('v2', 'acme', 'orders.placed', "
                "2, 'order', 'o-1', :payload)"
            ),
            {"payload": payload()},
        )
    result = await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    assert (result.claimed, result.published, result.dead_lettered) == (2, 1, 1)
    assert seen == ["v1"]
    dead = await row(db, "v2")
    assert dead["status"] == "dead_letter"
    assert dead["dead_letter_reason"] == (
        "permanent: schema: event type 'orders.placed' version 2 is not registered "
        "(registered versions: [1])"
    )


async def test_two_services_handling_one_type_do_not_fan_out(db, registry, clock):
    """Whichever dispatcher claims an event runs its own handlers only and marks it
    published: the other service's handlers for the same type never see it."""
    billing: list[str] = []
    shipping: list[str] = []
    handling(registry, "orders.placed", billing)
    other = EventRegistry()
    other.register_event("orders.placed", 1)
    handling(other, "orders.placed", shipping)
    await insert(db, ("p1", "orders.placed"))
    first = OutboxDispatcher(db, registry, clock=clock)
    second = OutboxDispatcher(db, other, clock=clock)
    assert (await first.dispatch_once()).published == 1
    assert (await second.dispatch_once()).claimed == 0
    assert (billing, shipping) == (["p1"], [])
    assert (await row(db, "p1"))["status"] == "published"
