"""An installed app for the bad-input scenario (tests/reliability/test_bad_input.py).

``bad.order`` v1 has a schema (``order_id`` text, ``amount`` an integer); ``ODD_TYPE`` is
a type whose name is full of unicode and control characters. The handler appends one JSON
line per delivery (the envelope as received) to the file named by ``BAD_INPUT_LOG``, so the
test can compare what a handler got with what was written.
"""

from __future__ import annotations

import json
import os

from engine import EventEnvelope, EventRegistry, EventSchemaSpec

ORDER = "bad.order"
ODD_TYPE = "odd.тип✓\t\x01\x7f😀\u200b\u202ee\u0301"
ORDER_SCHEMA = EventSchemaSpec(required={"order_id": str, "amount": int})


async def record(envelope: EventEnvelope) -> None:
    line = json.dumps(
        {
            "id": envelope.event_id,
            "tenant_id": envelope.tenant_id,
            "event_type": envelope.event_type,
            "event_version": envelope.event_version,
            "aggregate_type": envelope.aggregate_type,
            "aggregate_id": envelope.aggregate_id,
            "payload": envelope.payload,
        }
    )
    with open(os.environ["BAD_INPUT_LOG"], "a", encoding="utf-8") as log:  # noqa: ASYNC230
        log.write(line + "\n")


def register(registry: EventRegistry) -> None:
    registry.register_event(ORDER, 1, ORDER_SCHEMA)
    registry.register_handler(ORDER, record, key="bad.record")
    registry.register_event(ODD_TYPE, 1)
    registry.register_handler(ODD_TYPE, record, key="odd.record")
