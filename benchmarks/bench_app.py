"""The installed app the benchmark's dispatchers load: ``--installed-app benchmarks.bench_app``.

Registers ``bench.happened`` v1 with one handler, configured by environment variables
that the harness sets per run:

``OUTBOX_BENCH_SLEEP_MS``  the handler awaits ``asyncio.sleep`` this long (default 0: no-op)
``OUTBOX_BENCH_LOG_DIR``   append ``<event id>\\t<unix time in ns at handler start>`` per call to
                           ``calls.<pid>.tsv`` there (duplicates, counts, wake-up latency)
``OUTBOX_BENCH_WRITE``     ``transactional``: the handler inserts one ``bench_effects`` row
                           through the dispatcher's transaction (``transactional=True``);
                           ``plain``: it inserts the same row through a session of its
                           own and commits it; unset: it writes nothing
``OUTBOX_BENCH_TRACING``  ``sdk``: configure OpenTelemetry's SDK as a service would (the global
                           tracer provider, a batch span processor) with an exporter that
                           drops every span: what tracing costs the dispatcher itself
``OUTBOX_BENCH_SYNC_DIR``  once the dispatcher is up (``EventRegistry.on_ready``: its
                           database open and checked, before its first claim): create
                           ``ready.<pid>`` there, then wait until a file ``go`` appears, so
                           every process starts draining at once and the clock does not
                           include its start-up (imports, connecting, the schema check)
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from pathlib import Path
from typing import TextIO

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from engine import EventRegistry, create_engine
from engine.writing.envelope import EventEnvelope

EVENT_TYPE = "bench.happened"
# The business row of OUTBOX_BENCH_WRITE (the harness creates the table).
EFFECTS_TABLE = "CREATE TABLE IF NOT EXISTS bench_effects (event_id varchar(36) NOT NULL)"
EFFECT = text("INSERT INTO bench_effects (event_id) VALUES (:event_id)")
HANDLER_KEY = "bench.handler"
GO_TIMEOUT_SECONDS = 300.0


class CallLog:
    """Handler starts, written through a large buffer and flushed at exit."""

    def __init__(self, directory: str) -> None:
        path = Path(directory) / f"calls.{os.getpid()}.tsv"
        self._file: TextIO = path.open("a", buffering=1 << 20)
        atexit.register(self._file.close)

    def record(self, event_id: str) -> None:
        # Nanoseconds as an integer: formatting a float (``time.time():.6f``) took twice
        # as long, 0.5 µs a call, inside the drain the harness times.
        self._file.write(f"{event_id}\t{time.time_ns()}\n")


def _report_ready(directory: str) -> Path:
    """Create ``ready.<pid>`` in the sync directory; returns the go file to wait for."""
    sync = Path(directory)
    (sync / f"ready.{os.getpid()}").touch()
    return sync / "go"


def wait_for_go(directory: str, timeout: float = GO_TIMEOUT_SECONDS) -> None:
    go = _report_ready(directory)
    deadline = time.monotonic() + timeout
    while not go.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no go signal in {directory} after {timeout:g} s")
        time.sleep(0.002)


async def await_go(directory: str) -> None:
    """``wait_for_go`` on a running event loop: a SIGTERM meanwhile still stops the run."""
    go = _report_ready(directory)
    try:
        async with asyncio.timeout(GO_TIMEOUT_SECONDS):
            while True:  # a file, not an event: polled, as producers.py polls it
                if go.exists():
                    return
                await asyncio.sleep(0.002)
    except TimeoutError:
        raise RuntimeError(f"no go signal in {directory} after {GO_TIMEOUT_SECONDS:g} s") from None


def trace_with_the_sdk() -> None:
    """Spans made, processed and handed to an exporter that drops them (row p)."""
    from collections.abc import Sequence

    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


def register(registry: EventRegistry) -> None:
    if os.environ.get("OUTBOX_BENCH_TRACING") == "sdk":
        trace_with_the_sdk()
    sleep_seconds = float(os.environ.get("OUTBOX_BENCH_SLEEP_MS", "0")) / 1000
    log_dir = os.environ.get("OUTBOX_BENCH_LOG_DIR")
    calls = CallLog(log_dir) if log_dir else None
    registry.register_event(EVENT_TYPE, 1)

    async def handle(envelope: EventEnvelope) -> None:
        if calls is not None:
            calls.record(envelope.event_id)
        if sleep_seconds:
            await asyncio.sleep(sleep_seconds)

    write = os.environ.get("OUTBOX_BENCH_WRITE", "")
    if write == "transactional":

        async def write_in_transaction(envelope: EventEnvelope, session: AsyncSession) -> None:
            await handle(envelope)
            await session.execute(EFFECT, {"event_id": envelope.event_id})

        registry.register_handler(
            EVENT_TYPE, write_in_transaction, key=HANDLER_KEY, transactional=True
        )
    elif write == "plain":
        engine = create_engine(os.environ["OUTBOX_DATABASE_URL"])

        async def write_on_its_own(envelope: EventEnvelope) -> None:
            await handle(envelope)
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(EFFECT, {"event_id": envelope.event_id})

        registry.register_handler(EVENT_TYPE, write_on_its_own, key=HANDLER_KEY)
    else:
        registry.register_handler(EVENT_TYPE, handle, key=HANDLER_KEY)
    sync_dir = os.environ.get("OUTBOX_BENCH_SYNC_DIR")
    if sync_dir:
        registry.on_ready(lambda: await_go(sync_dir))
