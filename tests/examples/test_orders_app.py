"""The example app end to end: domain events out, every outbox state reached."""

from __future__ import annotations

from sqlalchemy import select

from engine import EventRegistry, OutboxDispatcher, create_engine, create_schema
from engine.operating.insights import OutboxInsights
from engine.storage.schema import outbox_events, side_effects
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
        assert result.claimed == 30  # each cancellation waits behind its order's placed event
        insights = OutboxInsights(engine)
        overview = await insights.overview()
        counts = overview.counts
        assert counts["published"] > 0 and counts["dead_letter"] > 0 and counts["failed"] > 0
        assert overview.blocked_keys > 0  # failed and dead-lettered orders hold their keys
        await dispatcher.dispatch_once()  # the cancellations of published orders follow
        async with engine.connect() as conn:
            rows = (await conn.execute(select(outbox_events))).mappings().all()
        by_order: dict[str, dict[str, object]] = {}
        for row in rows:
            by_order.setdefault(row["aggregate_id"], {})[row["event_type"]] = row
        for events in by_order.values():
            cancelled, first = events.get("orders.cancelled"), events["orders.placed"]
            assert first["ordering_key"] == f"order:{first['aggregate_id']}"
            if cancelled is not None and cancelled["status"] == "published":
                assert first["status"] == "published"  # never cancelled before placed
                assert first["published_at"] <= cancelled["published_at"]
            elif cancelled is not None and first["status"] != "published":
                assert cancelled["status"] == "pending"  # held back by its order
        async with engine.connect() as conn:
            effects = (await conn.execute(select(side_effects.c.effect_key))).scalars().all()
        assert set(effects) == {"warehouse.reserve"}
        assert len(placed) == 30
    finally:
        await engine.dispose()
