"""Whether the engine makes spans, and the tracer it makes them with.

The engine depends on ``opentelemetry-api`` only: a service that installs and configures
the SDK (``trace.set_tracer_provider``) gets spans; without one the engine makes none.
Even a no-op span costs microseconds (a context attach and detach), so the hot paths ask
``active_tracer()`` once (a round, a publish call) and skip tracing altogether when it
answers None. Asking OpenTelemetry for its provider reads the environment each time, so
an answer of "none configured" is kept for a second; a configured provider is kept for
good (OpenTelemetry lets a process set its global provider once). See decision 0040.
"""

from __future__ import annotations

import time
from importlib.metadata import PackageNotFoundError, version

from opentelemetry import trace
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, Tracer, TracerProvider

INSTRUMENTATION_NAME = "outbox-tui"
#: How long "no tracer provider configured" is believed before asking again.
RECHECK_SECONDS = 1.0

try:
    _VERSION: str | None = version("outbox-tui")
except PackageNotFoundError:  # pragma: no cover - run from a source tree without metadata
    _VERSION = None


class _Switch:
    """The engine's tracing state (one per process)."""

    tracer: Tracer | None = None
    override: TracerProvider | None = None
    recheck_at = 0.0


def _configured(provider: TracerProvider) -> bool:
    """Whether ``provider`` makes real spans: not the API's proxy or no-op stand-ins."""
    return not isinstance(provider, ProxyTracerProvider | NoOpTracerProvider)


def active_tracer() -> Tracer | None:
    """The engine's tracer, or None when no tracer provider is configured (trace nothing)."""
    tracer = _Switch.tracer
    if tracer is not None:
        return tracer
    now = time.monotonic()
    if now < _Switch.recheck_at:
        return None
    _Switch.recheck_at = now + RECHECK_SECONDS
    provider = _Switch.override or trace.get_tracer_provider()
    if not _configured(provider):
        return None
    _Switch.tracer = provider.get_tracer(INSTRUMENTATION_NAME, _VERSION)
    return _Switch.tracer


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Make the engine's spans with ``provider`` instead of OpenTelemetry's global one;
    None goes back to the global provider (the default).

    For a service that keeps several providers, and for tests: OpenTelemetry's global
    provider can be set only once per process. ``NoOpTracerProvider()`` turns the
    engine's tracing off whatever the global provider is.
    """
    _Switch.override = provider
    _Switch.tracer = None
    _Switch.recheck_at = 0.0
