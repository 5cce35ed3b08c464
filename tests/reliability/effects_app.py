"""An installed app whose handler makes two guarded external calls (the crash scenario's load).

Each event's handler waits ``sleep_ms`` (simulated I/O), then calls two external systems
through ``run_event_side_effect`` ("charge", then "notify"). It appends one line per step
to the file named by ``EFFECTS_APP_LOG``: ``effect <event id>/<effect key> <pid> <ns>``
when a call itself runs, and ``recorded ...`` once the helper returns from that call, its
record committed (CLOCK_MONOTONIC nanoseconds, system-wide on Linux). The gap between the
two is the window in which a kill makes the call happen again; a key with two ``effect``
lines was called twice.
"""

from __future__ import annotations

import asyncio
import os
import time

from engine import EventEnvelope, EventRegistry, run_event_side_effect

EVENT_TYPE = "effects.charged"
HANDLER_KEY = "effects.charge_and_notify"
EFFECT_KEYS = ("charge", "notify")


def log_line(kind: str, call: str) -> None:
    """One O_APPEND write: atomic between processes, and whole or absent after a SIGKILL."""
    line = f"{kind} {call} {os.getpid()} {time.monotonic_ns()}\n".encode()
    fd = os.open(os.environ["EFFECTS_APP_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


async def handle(envelope: EventEnvelope) -> None:
    await asyncio.sleep(envelope.payload["sleep_ms"] / 1000)
    for effect_key in EFFECT_KEYS:
        call = f"{envelope.event_id}/{effect_key}"
        called: list[str] = []

        def call_external_system(call: str = call, called: list[str] = called) -> str:
            log_line("effect", call)
            called.append(call)
            return call  # what the external system would answer

        await run_event_side_effect(effect_key, call_external_system)
        if called:  # not an answer from an earlier call's record
            log_line("recorded", call)


def register(registry: EventRegistry) -> None:
    registry.register_event(EVENT_TYPE, 1)
    registry.register_handler(EVENT_TYPE, handle, key=HANDLER_KEY)
