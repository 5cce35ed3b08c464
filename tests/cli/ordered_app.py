"""An installed app for the randomized ordering test (tests/cli/test_ordered_processes.py).

Each event's payload says its fate: ``fail`` transient failures before it succeeds,
``permanent`` (dead-letter at once) and ``sleep_ms`` of simulated I/O. The handler appends
``start`` and ``end`` lines with the event id, the process id and CLOCK_MONOTONIC
nanoseconds (system-wide on Linux, so lines of different processes compare) to the file
named by ``ORDERED_APP_LOG``.

With ``effect`` in the payload, the handler first makes one external call guarded by
``run_event_side_effect`` and logs an ``effect`` line when the call itself runs (the fault
suite compares those lines with the side-effect records to count repeated calls), then a
``recorded`` line once the helper returns, its record committed (the gap between the two is
the window in which a kill makes the call happen again).

With ``ORDERED_APP_MEET=N``, each process holds its first handler call until N processes
have one in hand (a ``meet.<pid>`` file beside the log each, at most ``MEET_SECONDS``), so
the work is shared however the claims fall: one SQLite writer can otherwise take every
batch while the other sleeps in SQLite's busy handler.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from engine import (
    EventEnvelope,
    EventHandlerPermanentError,
    EventRegistry,
    run_event_side_effect,
)

BLOCKING = "ordered.blocking"  # ordered by aggregate; a dead letter blocks its key
SKIPPING = "ordered.skipping"  # ordered by aggregate; a dead letter releases its key
UNORDERED = "ordered.free"
MEET_SECONDS = 5.0  # well within the handler timeout (10 s by default)
_met = False


def _log(kind: str, envelope: EventEnvelope) -> None:
    line = f"{kind} {envelope.event_id} {os.getpid()} {time.monotonic_ns()}\n".encode()
    fd = os.open(os.environ["ORDERED_APP_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)  # one small O_APPEND write: atomic between processes
    finally:
        os.close(fd)


async def _meet() -> None:
    """Hold this process's first handler call until ``ORDERED_APP_MEET`` processes have one."""
    global _met
    if _met or "ORDERED_APP_MEET" not in os.environ:
        return
    _met = True
    here = Path(os.environ["ORDERED_APP_LOG"]).parent
    (here / f"meet.{os.getpid()}").touch()
    deadline = time.monotonic() + MEET_SECONDS
    while len(list(here.glob("meet.*"))) < int(os.environ["ORDERED_APP_MEET"]):
        if time.monotonic() > deadline:
            return  # the test's own check says which process never got an event
        await asyncio.sleep(0.01)


async def handle(envelope: EventEnvelope) -> None:
    _log("start", envelope)
    try:
        await _meet()
        await asyncio.sleep(envelope.payload["sleep_ms"] / 1000)
        if envelope.payload.get("effect"):

            def call_external_system() -> str:
                _log("effect", envelope)
                return envelope.event_id  # what the external system would answer

            await run_event_side_effect("charge", call_external_system)
            _log("recorded", envelope)  # the record is committed: the window has closed
        if envelope.payload["permanent"]:
            raise EventHandlerPermanentError("fated to fail")
        if envelope.attempt_count <= envelope.payload["fail"]:
            raise RuntimeError(f"transient failure {envelope.attempt_count}")
    finally:
        _log("end", envelope)


def register(registry: EventRegistry) -> None:
    for event_type in (BLOCKING, SKIPPING, UNORDERED):
        registry.register_event(event_type, 1)
        registry.register_handler(event_type, handle, key="ordered.handle")
    registry.set_ordering(BLOCKING)
    registry.set_ordering(SKIPPING, on_dead_letter="skip")
