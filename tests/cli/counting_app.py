"""An installed app for multi-process tests.

Its handler appends ``<event id> <pid>`` to the file named by ``COUNTING_APP_LOG``, so a
test can see which process handled which event and whether any was handled twice. Until
the file named by ``COUNTING_APP_GO`` exists, handlers wait: every dispatcher process
holds a claimed batch at once, so they really do run side by side.
"""

from __future__ import annotations

import asyncio
import os

from engine import EventEnvelope, EventRegistry

EVENT_TYPE = "counting.tick"


async def record(envelope: EventEnvelope) -> None:
    go = os.environ["COUNTING_APP_GO"]
    while not os.path.exists(go):  # noqa: ASYNC110, ASYNC240 - written by another process
        await asyncio.sleep(0.01)
    line = f"{envelope.event_id} {os.getpid()}\n".encode()
    fd = os.open(os.environ["COUNTING_APP_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)  # one small O_APPEND write: atomic between processes
    finally:
        os.close(fd)


def register(registry: EventRegistry) -> None:
    registry.register_event(EVENT_TYPE, 1)
    registry.register_handler(EVENT_TYPE, record, key="counting.record")
