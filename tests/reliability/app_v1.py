"""Installed app "v1" of the fault suite: registers and handles ``reliability.a`` only.

The old version in the rolling-deploy scenario; the database-outage scenario uses it too.
Each handler run appends ``<event id> <event type> <pid>`` to the file named by
``RELIABILITY_APP_LOG`` (one small O_APPEND write: atomic between processes), so a test
sees which process handled which event and how often. ``RELIABILITY_APP_SLEEP`` (seconds,
default 0) paces the handler, so a backlog takes long enough to drain that a fault can
land mid-run.
"""

from __future__ import annotations

import asyncio
import os

from engine import EventEnvelope, EventRegistry

TYPE_A = "reliability.a"
LOG_ENV = "RELIABILITY_APP_LOG"
SLEEP_ENV = "RELIABILITY_APP_SLEEP"


async def record(envelope: EventEnvelope) -> None:
    pause = float(os.environ.get(SLEEP_ENV, "0") or 0)
    if pause:
        await asyncio.sleep(pause)
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    line = f"{envelope.event_id} {envelope.event_type} {os.getpid()}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def register(registry: EventRegistry) -> None:
    registry.register_event(TYPE_A, 1)
    registry.register_handler(TYPE_A, record, key="reliability.a.record")
