"""Tracing fixtures: the engine's spans go to the OpenTelemetry SDK's in-memory exporter.

The SDK is a test dependency only. ``spans`` gives the engine a provider of its own
(``engine.tracing.set_tracer_provider``), never OpenTelemetry's global one, which a
process can set only once: every other test keeps running untraced.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from engine.tracing import set_tracer_provider
from tests.engine.conftest import registry  # noqa: F401 - the engine tests' fixture
from tests.inbox.conftest import Inbound


class Spans:
    """The spans finished so far, and a tracer for the test's own (request, handler) spans."""

    def __init__(self, exporter: InMemorySpanExporter, provider: TracerProvider) -> None:
        self.exporter = exporter
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("tests")

    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.finished() if s.name == name]

    def tree(self, root: ReadableSpan) -> list[tuple[int, str, str]]:
        """(depth, name, kind) of ``root`` and its descendants, depth first."""
        spans = self.finished()
        found: list[tuple[int, str, str]] = []

        def walk(span: ReadableSpan, depth: int) -> None:
            found.append((depth, span.name, span.kind.name))
            for child in sorted(spans, key=lambda s: s.start_time or 0):
                if child.parent is not None and child.parent.span_id == span_id(span):
                    walk(child, depth + 1)

        walk(root, 0)
        return found

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, [s.name for s in self.finished()]
        return found[0]


@pytest.fixture
async def inbound(amqp_url: str) -> AsyncIterator[Inbound]:
    """An exchange and a queue of this test's own on the real broker."""
    found = Inbound(amqp_url)
    yield found
    await found.delete()


@pytest.fixture
def spans() -> Iterator[Spans]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    set_tracer_provider(provider)
    try:
        yield Spans(exporter, provider)
    finally:
        set_tracer_provider(None)
        provider.shutdown()


def traceparent_of(span: ReadableSpan) -> str:
    """The W3C traceparent naming ``span``."""
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def trace_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.trace_id
