"""Plain values the records and the tables share: UTC timestamps, ages, rates."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with a ``Z`` suffix (``2026-01-01T12:00:00.000000Z``)."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def age(value: float | None) -> str:
    """A short human age: ``4.2s``, ``3m 5s``, ``2h 10m``, ``3d 4h``."""
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m {secs}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def rate(count: int, elapsed: float) -> float:
    return round(count / elapsed, 2) if elapsed > 0 else 0.0
