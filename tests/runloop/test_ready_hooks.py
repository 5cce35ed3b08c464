"""``EventRegistry.on_ready``: awaited once a run loop is up, before its first claim."""

from __future__ import annotations

import pytest

from engine import EventRegistry
from engine.errors import EventRegistrationError, InstalledAppError
from engine.running.build import build_dispatcher
from engine.running.run_loop import run_dispatcher

from .conftest import fast, heartbeat_row, publish, statuses


async def test_hooks_run_once_in_order_after_the_heartbeat_and_before_the_first_claim(db, registry):
    seen: list[tuple[str, set[str], bool]] = []

    async def look(name: str) -> None:
        beating = await heartbeat_row(db, "ready-test") is not None
        seen.append((name, set((await statuses(db)).values()), beating))

    async def first() -> None:
        await look("first")

    @registry.on_ready
    async def second() -> None:
        await look("second")

    registry.on_ready(first)  # registered after ``second``: runs after it
    delivered = []

    @registry.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        delivered.append(envelope.event_id)

    ids = await publish(db, registry, count=3)
    settings = fast(batch_size=2)
    summary = await run_dispatcher(
        build_dispatcher(db, registry, settings),
        settings=settings,
        max_iterations=3,
        instance_id="ready-test",
    )
    assert [name for name, _, _ in seen] == ["second", "first"]  # once each, in order
    assert all(found == {"pending"} for _, found, _ in seen)  # nothing claimed yet
    assert all(beating for _, _, beating in seen)  # the heartbeat row was written
    assert summary.published == 3 and delivered == ids


async def test_a_failing_hook_stops_the_run_before_anything_is_claimed(db, registry):
    @registry.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        raise AssertionError("no handler may run")

    @registry.on_ready
    async def warm_up() -> None:
        raise ConnectionError("the payment API is down")

    await publish(db, registry, count=2)
    settings = fast()
    with pytest.raises(InstalledAppError) as raised:
        await run_dispatcher(build_dispatcher(db, registry, settings), settings=settings)
    assert str(raised.value) == (
        "the ready hook test_a_failing_hook_stops_the_run_before_anything_is_claimed."
        "<locals>.warm_up failed: ConnectionError: the payment API is down"
    )
    assert set((await statuses(db)).values()) == {"pending"}


def test_a_hook_must_be_callable():
    with pytest.raises(EventRegistrationError, match="on_ready takes a callable"):
        EventRegistry().on_ready("warm_up")  # type: ignore[arg-type]
