"""pydantic models as event schemas: checked at publish and before the handler, parsed for it."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import String, insert
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    AggregateRoot,
    EventEnvelope,
    EventRegistrationError,
    EventRegistry,
    EventSchemaSpec,
    EventValidationError,
    OutboxDispatcher,
    OutboxEventPublisher,
    unit_of_work,
)
from engine.storage.schema import outbox_events

from .conftest import CTX, row, rows


class OrderPlaced(BaseModel):
    order_id: str
    amount: int = Field(gt=0)
    note: str | None = None


class StrictOrderPlaced(BaseModel):
    """Forbids extra fields: the context fields the payload carries are not shown to it."""

    model_config = ConfigDict(extra="forbid")
    order_id: str


@pytest.fixture
def models() -> EventRegistry:
    reg = EventRegistry()
    reg.register_event("orders.placed", 1, schema=OrderPlaced)
    reg.register_event("orders.placed", 2, schema=EventSchemaSpec(required={"order_id": str}))
    reg.register_event("orders.strict", 1, schema=StrictOrderPlaced)
    return reg


async def publish(db, registry, payload, event_type="orders.placed", version=1) -> str:
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        return await OutboxEventPublisher(session).publish(
            event_type, payload, aggregate_type="order", aggregate_id="o-1", event_version=version
        )


async def test_a_payload_that_breaks_the_model_is_refused_at_publish(db, models):
    with pytest.raises(EventValidationError) as caught:
        await publish(db, models, {"order_id": "o-1", "amount": 0})
    assert "orders.placed v1: field 'amount': Input should be greater than 0" in str(caught.value)
    with pytest.raises(EventValidationError, match="missing required field 'order_id'"):
        await publish(db, models, {"amount": 3})
    assert await rows(db) == []


async def test_a_model_instance_is_published_as_its_json(db, models):
    event_id = await publish(db, models, OrderPlaced(order_id="o-1", amount=5))
    stored = (await row(db, event_id))["payload"]
    assert stored == {
        "order_id": "o-1",
        "amount": 5,
        "note": None,
        "tenant_id": "acme",
        "actor_id": "user-1",
        "request_id": "req-1",
        "trace_id": "trace-abc",
    }


async def test_a_model_that_forbids_extra_fields_still_takes_the_context_fields(db, models):
    await publish(db, models, {"order_id": "o-1"}, event_type="orders.strict")
    with pytest.raises(EventValidationError, match="Extra inputs are not permitted"):
        await publish(db, models, {"order_id": "o-1", "colour": "red"}, event_type="orders.strict")


async def test_handlers_receive_the_parsed_model_and_the_envelope(db, models):
    got: list[tuple[str, object]] = []

    @models.handler("orders.placed", key="billing.charge")
    async def charge(envelope: EventEnvelope, order: OrderPlaced) -> None:
        got.append((envelope.event_id, order))

    @models.handler("orders.placed", key="audit.log")
    async def log(envelope: EventEnvelope) -> None:
        got.append((envelope.event_id, dict(envelope.payload)["order_id"]))

    event_id = await publish(db, models, {"order_id": "o-1", "amount": 7, "note": "gift"})
    result = await OutboxDispatcher(db, models).dispatch_once()
    assert result.published == 1
    assert got == [
        (event_id, OrderPlaced(order_id="o-1", amount=7, note="gift")),
        (event_id, "o-1"),
    ]


async def test_a_version_without_a_model_is_dead_lettered_for_a_model_handler(db, models):
    @models.handler("orders.placed", key="billing.charge")
    async def charge(envelope: EventEnvelope, order: OrderPlaced) -> None:
        raise AssertionError("not called")

    event_id = await publish(db, models, {"order_id": "o-1"}, version=2)
    result = await OutboxDispatcher(db, models).dispatch_once()
    assert result.dead_lettered == 1
    assert "has no pydantic model to give handler 'billing.charge'" in str(
        (await row(db, event_id))["last_error"]
    )


async def test_a_row_written_by_plain_sql_is_checked_against_the_model_before_the_handler(
    db, models
):
    called = []

    @models.handler("orders.placed", key="billing.charge")
    async def charge(envelope: EventEnvelope, order: OrderPlaced) -> None:
        called.append(order)

    payload = {"order_id": "o-9", "amount": -1, **CTX.envelope_fields()}
    async with db.begin() as conn:
        await conn.execute(
            insert(outbox_events).values(
                id="plain-1",
                tenant_id="acme",
                event_type="orders.placed",
                event_version=1,
                aggregate_type="order",
                aggregate_id="o-9",
                payload=payload,
            )
        )
    result = await OutboxDispatcher(db, models).dispatch_once()
    assert (result.dead_lettered, called) == (1, [])
    stored = await row(db, "plain-1")
    assert stored["status"] == "dead_letter"
    assert "schema: orders.placed v1: field 'amount'" in str(stored["dead_letter_reason"])


def test_registration_errors_are_clear():
    reg = EventRegistry()
    with pytest.raises(EventRegistrationError, match="EventSchemaSpec or a pydantic model"):
        reg.register_event("orders.placed", 1, schema=dict)
    reg.register_event("orders.placed", 1)

    async def wants_model(envelope: EventEnvelope, order: OrderPlaced) -> None:
        return None

    with pytest.raises(EventRegistrationError, match=r"no version of 'orders\.placed'"):
        reg.register_handler("orders.placed", wants_model, key="k")


def test_the_model_and_its_json_schema_are_reachable_from_the_registry(models):
    schema = models.model_for("orders.placed", 1)
    assert schema is not None and schema.model is OrderPlaced
    assert schema.json_schema()["required"] == ["order_id", "amount"]
    assert models.model_for("orders.placed", 2) is None
    assert models.versions_of("orders.placed") == [1, 2]
    json.dumps(schema.json_schema())  # JSON all the way down


class Base(DeclarativeBase):
    pass


class Cart(Base, AggregateRoot):
    __tablename__ = "test_pydantic_carts"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)


async def test_a_pydantic_domain_event_becomes_its_json(db):
    async with db.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    reg = EventRegistry()
    reg.register_event("orders.placed", 1, schema=OrderPlaced)
    reg.map_domain_event(
        OrderPlaced, event_type="orders.placed", aggregate_type="cart", subject=lambda e: e.order_id
    )
    async with unit_of_work(db, registry=reg, context=CTX) as session:
        cart = Cart(id="c-1")
        session.add(cart)
        cart.record_event(OrderPlaced(order_id="o-3", amount=2))
    [stored] = await rows(db)
    assert stored["aggregate_id"] == "o-3"
    assert stored["payload"]["amount"] == 2


async def test_a_transactional_handler_gets_the_model_between_envelope_and_session(db, models):
    """(envelope, model, session): the model is parsed, and the session's writes (here an
    event it publishes) commit with the handler's record."""
    models.register_event("invoices.issued", 1)

    @models.handler("orders.placed", key="billing.invoice", transactional=True)
    async def invoice(envelope: EventEnvelope, order: OrderPlaced, session) -> None:
        await OutboxEventPublisher(session).publish(
            "invoices.issued",
            {"order_id": order.order_id, **envelope.task_context().envelope_fields()},
            aggregate_type="invoice",
            aggregate_id=f"i-{order.order_id}",
        )

    await publish(db, models, {"order_id": "o-5", "amount": 3})
    assert (await OutboxDispatcher(db, models).dispatch_once()).published == 1
    issued = [r for r in await rows(db) if r["event_type"] == "invoices.issued"]
    assert [r["aggregate_id"] for r in issued] == ["i-o-5"]
