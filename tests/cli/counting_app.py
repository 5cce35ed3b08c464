"""An installed app for multi-process tests.

Its handler appends ``<event id> <pid>`` to the file named by ``COUNTING_APP_LOG``, so a
test can see which process handled which event and whether any was handled twice. Until
the file named by ``COUNTING_APP_GO`` exists, handlers wait: every dispatcher process
holds a claimed batch at once, so they really do run side by side.

An event with ``stall_seconds`` in its payload stalls its first attempt: a synchronous
wait (blocking I/O, a CPU-bound step) that blocks the whole process, so no handler
timeout can end it, for that long or until the file named by ``COUNTING_APP_RELEASE``
exists. That handler outlives its lease: another dispatcher reclaims the event, and
the stalled one's completion comes late (the fault suite's races and lease expiry).
"""

from __future__ import annotations

import asyncio
import os
import time

from engine import EventEnvelope, EventRegistry

EVENT_TYPE = "counting.tick"


async def record(envelope: EventEnvelope) -> None:
    go = os.environ["COUNTING_APP_GO"]
    while not os.path.exists(go):  # noqa: ASYNC110, ASYNC240 - written by another process
        await asyncio.sleep(0.01)
    stall = float(envelope.payload.get("stall_seconds", 0))
    if stall and envelope.attempt_count == 1:
        _stall(stall, os.environ.get("COUNTING_APP_RELEASE"))
    line = f"{envelope.event_id} {os.getpid()}\n".encode()
    fd = os.open(os.environ["COUNTING_APP_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)  # one small O_APPEND write: atomic between processes
    finally:
        os.close(fd)


def _stall(seconds: float, release: str | None) -> None:
    """Block this process (not just this task) for ``seconds`` or until ``release`` exists."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (release and os.path.exists(release)):
        time.sleep(0.01)


def register(registry: EventRegistry) -> None:
    registry.register_event(EVENT_TYPE, 1)
    registry.register_handler(EVENT_TYPE, record, key="counting.record")
