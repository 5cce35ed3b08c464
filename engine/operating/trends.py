"""Is the backlog shrinking, and when will it be gone? Trends over overview samples.

Pure logic, no I/O and no clock: a front end adds one ``Sample`` per overview it
takes (``Sample.from_overview``) to a bounded ``Trends`` ring, draws the series as
sparklines and shows ``verdict()``, one line such as "draining, empty in about 3m",
"growing by 120/s" or "stalled: nothing published in 2m". Events held behind a
dead-lettered head of their ordering key never drain by themselves: the verdict leaves
them out of its rates and its ETA and says how many there are ("draining, empty in about
3m (40 held by dead letters)"; "held: 40 wait behind dead letters ..." once nothing else
waits), as the console says what pauses hold.

Rates come from differences between samples. ``published_total`` is a counter that
should only grow; when it drops (the retention purge deleted published rows, or it
was reset) that interval's drain is unknown (None), never negative.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import TYPE_CHECKING

from engine.errors import ConfigurationError

if TYPE_CHECKING:
    from engine.operating.insights import OverviewSnapshot

DEFAULT_CAPACITY = 120  # two minutes at one sample a second
DEFAULT_WINDOW_SECONDS = 60.0
DEFAULT_STALL_AFTER_SECONDS = 30.0

IDLE, MEASURING, DRAINING, GROWING, STEADY, STALLED, HELD = (
    "idle",
    "measuring",
    "draining",
    "growing",
    "steady",
    "stalled",
    "held",
)


@dataclass(frozen=True, slots=True)
class Sample:
    """The outbox at one instant: what waits, for how long, and how much was delivered."""

    at: datetime
    backlog: int  # pending + failed
    oldest_pending_age: float | None  # seconds; None when nothing is pending
    published_total: int
    # Of the backlog, the events behind a dead-lettered head of their ordering key: they
    # cannot drain until an operator replays or skips that head.
    held: int = 0

    @property
    def drainable(self) -> int:
        """The backlog that can drain without an operator."""
        return max(0, self.backlog - self.held)

    @classmethod
    def from_overview(cls, snapshot: OverviewSnapshot) -> Sample:
        counts = snapshot.counts
        return cls(
            at=snapshot.taken_at,
            backlog=int(counts.get("pending", 0)) + int(counts.get("failed", 0)),
            oldest_pending_age=snapshot.oldest_pending_age_seconds,
            published_total=int(counts.get("published", 0)),
            held=snapshot.held_by_dead_letters,
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """One line for the overview, with the figures behind it."""

    kind: str  # idle | measuring | draining | growing | steady | stalled
    text: str
    net_rate: float | None = None  # backlog change per second (negative: shrinking)
    eta_seconds: float | None = None  # until empty, when draining


class Trends:
    """The last ``capacity`` samples, oldest first."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 2:
            raise ConfigurationError(f"trend capacity must be at least 2, got {capacity}")
        self._samples: deque[Sample] = deque(maxlen=capacity)

    def add(self, sample: Sample) -> None:
        """Keep ``sample``; one not later than the newest replaces nothing and is dropped."""
        if self._samples and sample.at <= self._samples[-1].at:
            return
        self._samples.append(sample)

    @property
    def samples(self) -> Sequence[Sample]:
        return tuple(self._samples)

    def backlog_series(self) -> list[float]:
        return [float(s.backlog) for s in self._samples]

    def oldest_age_series(self) -> list[float]:
        """Seconds; 0 where nothing was pending."""
        return [s.oldest_pending_age or 0.0 for s in self._samples]

    def drain_series(self) -> list[float | None]:
        """Events published per second, one value per interval between samples."""
        return [_drain(a, b) for a, b in _pairs(self._samples)]

    def inflow_series(self) -> list[float | None]:
        """Events arriving per second: what was published plus what the backlog grew by."""
        found: list[float | None] = []
        for a, b in _pairs(self._samples):
            drain = _drain(a, b)
            if drain is None:
                found.append(None)
            else:
                found.append(max(0.0, drain + (b.backlog - a.backlog) / _seconds(a, b)))
        return found

    def verdict(
        self,
        *,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        stall_after_seconds: float = DEFAULT_STALL_AFTER_SECONDS,
    ) -> Verdict:
        """What the last ``window_seconds`` of samples say, in one line."""
        if len(self._samples) < 2:
            return Verdict(MEASURING, "measuring…")
        newest = self._samples[-1]
        window = [s for s in self._samples if (newest.at - s.at).total_seconds() <= window_seconds]
        if len(window) < 2:
            window = list(self._samples)[-2:]
        first = window[0]
        span = _seconds(first, newest)
        # What drains on its own: events held behind dead letters wait for an operator,
        # however fast the rest goes, so they count in neither the rate nor the ETA.
        net = (newest.drainable - first.drainable) / span
        drains = [d for d in (_drain(a, b) for a, b in _pairs(window)) if d is not None]
        drain = sum(drains) / len(drains) if drains else None
        quiet = self._quiet_seconds()
        if newest.backlog == 0:
            if drain:
                return Verdict(STEADY, f"keeping up: {_rate(drain)} published, none waiting", net)
            return Verdict(IDLE, "idle", net)
        held = f" ({newest.held:,} held by dead letters)" if newest.held else ""
        if newest.drainable == 0:
            text = f"held: {newest.held:,} wait behind dead letters (replay or skip their heads)"
            return Verdict(HELD, text, net)
        if quiet >= stall_after_seconds:
            return Verdict(STALLED, f"stalled: nothing published in {_duration(quiet)}{held}", net)
        if net < 0:
            eta = newest.drainable / -net
            return Verdict(DRAINING, f"draining, empty in about {_duration(eta)}{held}", net, eta)
        if net > 0:
            return Verdict(GROWING, f"growing by {_rate(net)}{held}", net)
        shown = f"{_rate(drain)} published, " if drain else ""
        return Verdict(STEADY, f"steady: {shown}{newest.backlog:,} waiting{held}", net)

    def _quiet_seconds(self) -> float:
        """Seconds since the end of the last interval that published anything.

        From the oldest sample when no interval in the ring published.
        """
        newest = self._samples[-1]
        for a, b in reversed(_pairs(self._samples)):
            if (_drain(a, b) or 0.0) > 0:
                return _seconds(b, newest)
        return _seconds(self._samples[0], newest)


def _pairs(samples: Sequence[Sample] | deque[Sample]) -> list[tuple[Sample, Sample]]:
    return list(pairwise(samples))


def _seconds(a: Sample, b: Sample) -> float:
    return (b.at - a.at).total_seconds()


def _drain(a: Sample, b: Sample) -> float | None:
    delta = b.published_total - a.published_total
    return None if delta < 0 else delta / _seconds(a, b)


def _rate(per_second: float) -> str:
    """120/s, 2.5/s, or 30/min below one a second."""
    size = abs(per_second)
    if size >= 10:
        return f"{size:,.0f}/s"
    if size >= 1:
        return f"{size:.1f}/s"
    return f"{size * 60:.0f}/min"


def _duration(seconds: float) -> str:
    """45s, 3m, 2h, 3d: one unit, rounded, at least 1s."""
    seconds = max(1.0, seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{round(seconds / size)}{unit}"
    return f"{round(seconds)}s"
