"""The example app end to end: domain events out, every outbox state reached."""

from __future__ import annotations

from sqlalchemy import select

from engine import EventRegistry, OutboxDispatcher, create_engine, create_schema
from engine.insights import OutboxInsights
from engine.schema import outbox_events, side_effects
from outbox_tui.examples.orders import create_tables, register
from outbox_tui.examples.orders.traffic import generate_orders


async def test_orders_app_emits_events_and_its_handlers_exercise_every_state(database_url):
    engine = create_engine(database_url)
    try:
        await create_schema(engine)
        await create_tables(engine)
        registry = EventRegistry()
        register(registry)
        placed = await generate_orders(engine, registry, 30, seed=3)
        async with engine.connect() as conn:
            types = (await conn.execute(select(outbox_events.c.event_type))).scalars().all()
        assert types.count("orders.placed") == 30 and types.count("orders.cancelled") == 6
        dispatcher = OutboxDispatcher(engine, registry, batch_size=50)
        result = await dispatcher.dispatch_once()
        assert result.claimed == 36
        counts = (await OutboxInsights(engine).overview()).counts
        assert counts["published"] > 0 and counts["dead_letter"] > 0 and counts["failed"] > 0
        async with engine.connect() as conn:
            effects = (await conn.execute(select(side_effects.c.effect_key))).scalars().all()
        assert set(effects) == {"warehouse.reserve"}
        assert len(placed) == 30
    finally:
        await engine.dispose()
