"""A service that turns tracing on, for tests/tracing/test_across_processes.py.

As an installed app (``--installed-app tests.tracing.traced_app``) it registers
``orders.placed`` with a handler that logs a line and makes a span of its own; run as a
module (``python -m tests.tracing.traced_app DATABASE_URL``) it is the producer: it
publishes one event inside a request span. Either way, with ``OUTBOX_TEST_SPANS_FILE``
set, it configures OpenTelemetry's SDK as a service would (the global tracer provider)
and exports every span as one JSON line to that file.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from engine import EventRegistry, TaskContext

SPANS_FILE = "OUTBOX_TEST_SPANS_FILE"
log = logging.getLogger("traced_app")


def _one_line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


def configure_tracing(service: str) -> None:
    path = os.environ.get(SPANS_FILE)
    if not path:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = ConsoleSpanExporter(out=open(path, "a"), formatter=_one_line)  # noqa: SIM115
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def register(registry: EventRegistry) -> None:
    configure_tracing("dispatcher")
    registry.register_event("orders.placed", 1)
    tracer = trace.get_tracer("traced_app")

    @registry.handler("orders.placed", key="billing.charge")
    async def charge(envelope):
        with tracer.start_as_current_span("charge card"):
            log.warning("charging order %s", envelope.payload["order_id"])


async def produce(url: str) -> None:
    from engine import OutboxEventPublisher, create_engine, create_schema, unit_of_work

    configure_tracing("producer")
    registry = EventRegistry()
    register_types(registry)
    engine = create_engine(url)
    await create_schema(engine)
    context = TaskContext(tenant_id="acme", actor_id="u-1", request_id="r-1")
    with trace.get_tracer("traced_app").start_as_current_span("POST /orders"):
        async with unit_of_work(engine, registry=registry, context=context) as session:
            await OutboxEventPublisher(session).publish(
                "orders.placed", {"order_id": "o-1"}, aggregate_type="order", aggregate_id="o-1"
            )
    await engine.dispose()


def register_types(registry: EventRegistry) -> None:
    registry.register_event("orders.placed", 1)


if __name__ == "__main__":
    asyncio.run(produce(sys.argv[1]))
