"""The outbox lag of the last minute: how long events waited before processing began.

A dispatcher with metrics keeps a ``LagWindow``: each delivery's lag (``created_at`` to
the start of processing) counted into fixed buckets, the Prometheus histogram's, over the
last ``window`` seconds in slots that age out. Its heartbeat carries the counts
(``details["lag"]``), so ``stats`` and the console can give percentiles for every live
dispatcher together: bucket counts add up across processes, percentiles would not.
``lag_quantiles`` estimates them as Prometheus's ``histogram_quantile`` does (linear
within a bucket), so they agree with a dashboard's.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Upper bounds (seconds) of the lag buckets, as in ``outbox_event_lag_seconds``.
LAG_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0,
)  # fmt: skip
WINDOW_SECONDS = 60.0
SLOTS = 6


class LagWindow:
    """Lag observations of the last ``window`` seconds, by bucket (the last one: above
    every bound)."""

    def __init__(
        self,
        window: float = WINDOW_SECONDS,
        *,
        slots: int = SLOTS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self._slot_seconds = window / slots
        self._monotonic = monotonic
        self._slots: list[tuple[int, list[int]]] = []  # (slot number, counts), oldest first

    def observe(self, lag_seconds: float) -> None:
        slot = int(self._monotonic() // self._slot_seconds)
        if not self._slots or self._slots[-1][0] != slot:
            self._slots.append((slot, [0] * (len(LAG_BUCKETS) + 1)))
            self._drop_old(slot)
        self._slots[-1][1][bisect.bisect_left(LAG_BUCKETS, lag_seconds)] += 1

    def counts(self) -> list[int]:
        """The counts per bucket over the window."""
        self._drop_old(int(self._monotonic() // self._slot_seconds))
        total = [0] * (len(LAG_BUCKETS) + 1)
        for _slot, counts in self._slots:
            for n, count in enumerate(counts):
                total[n] += count
        return total

    def as_details(self) -> dict[str, Any]:
        """What a heartbeat carries."""
        return {"window_seconds": self.window, "le": list(LAG_BUCKETS), "counts": self.counts()}

    def _drop_old(self, slot: int) -> None:
        oldest = slot - round(self.window / self._slot_seconds) + 1
        while self._slots and self._slots[0][0] < oldest:
            self._slots.pop(0)


@dataclass(frozen=True, slots=True)
class LagSummary:
    """The lag of the events live dispatchers began processing in the last window."""

    window_seconds: float
    events: int
    dispatchers: int
    p50_seconds: float | None
    p90_seconds: float | None
    p99_seconds: float | None


def lag_quantiles(counts: Sequence[int], quantiles: Iterable[float]) -> list[float | None]:
    """Each quantile of the bucketed ``counts`` (None without observations): linear within
    its bucket from the bound below it (0 for the first); in the last, open bucket, the
    highest bound, as ``histogram_quantile`` answers."""
    total = sum(counts)
    found: list[float | None] = []
    for q in quantiles:
        if total == 0:
            found.append(None)
            continue
        rank, seen = q * total, 0
        for n, count in enumerate(counts):
            if count and seen + count >= rank:
                if n == len(LAG_BUCKETS):
                    found.append(LAG_BUCKETS[-1])
                    break
                low = 0.0 if n == 0 else LAG_BUCKETS[n - 1]
                found.append(low + (LAG_BUCKETS[n] - low) * (rank - seen) / count)
                break
            seen += count
    return found


def merged_lag(details: Iterable[Mapping[str, Any]]) -> LagSummary | None:
    """The lag over the heartbeats' ``details`` that carry one (same buckets); None when
    none does."""
    total = [0] * (len(LAG_BUCKETS) + 1)
    dispatchers, window = 0, WINDOW_SECONDS
    for found in details:
        lag = found.get("lag")
        if not isinstance(lag, Mapping) or list(lag.get("le") or ()) != list(LAG_BUCKETS):
            continue
        counts = lag.get("counts")
        if not isinstance(counts, list) or len(counts) != len(total):
            continue
        if not all(type(c) is int and c >= 0 for c in counts):
            continue
        dispatchers += 1
        window = float(lag.get("window_seconds") or window)
        total = [a + b for a, b in zip(total, counts, strict=True)]
    if not dispatchers:
        return None
    p50, p90, p99 = lag_quantiles(total, (0.5, 0.9, 0.99))
    return LagSummary(window, sum(total), dispatchers, p50, p90, p99)
