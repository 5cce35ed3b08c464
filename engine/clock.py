"""Time and identifiers: timezone-aware UTC everywhere, time-ordered UUIDv7 ids."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The current time as an aware UTC datetime (the engine's default clock)."""
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """Return ``value`` as aware UTC; naive values are taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


_uuid7_lock = threading.Lock()
_uuid7_last = (0, 0)  # (milliseconds, 12-bit counter)


def uuid7() -> str:
    """A UUIDv7 (RFC 9562) as text: sorts by creation time, monotonic within a process.

    Within one millisecond a 12-bit counter (``rand_a``) keeps ids increasing, so
    keyset paging by id equals paging by creation order.
    """
    global _uuid7_last
    with _uuid7_lock:
        millis = time.time_ns() // 1_000_000
        last_millis, counter = _uuid7_last
        if millis <= last_millis:
            millis = last_millis
            counter += 1
            if counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                millis += 1
                counter = 0
        else:
            counter = int.from_bytes(os.urandom(2), "big") & 0x7FF  # leave headroom
        _uuid7_last = (millis, counter)
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (millis & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76 | counter << 64 | 0b10 << 62 | rand_b
    # str(uuid.UUID(int=value)) spelled out: it runs on every publish (see decision 0025).
    hex_ = f"{value:032x}"
    return f"{hex_[:8]}-{hex_[8:12]}-{hex_[12:16]}-{hex_[16:20]}-{hex_[20:]}"
