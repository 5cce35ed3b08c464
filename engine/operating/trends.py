"""Is the backlog shrinking, and when will it be gone? Trends over overview samples.

Pure logic, no I/O and no clock: a front end adds one ``Sample`` per overview it
takes (``Sample.from_overview``) to a bounded ``Trends`` ring, draws the series as
sparklines and shows ``verdict()``, one line such as "draining, empty in about 3m",
"growing by 2.0/s" or "stalled: nothing published in 2m".

The verdict is judged over a window (``window_seconds``, a minute by default, or the
last five samples when a slow refresh takes longer) and says "not enough data yet"
until it spans ``min_window_seconds``: a few seconds of a bursty outbox say nothing
about where it is going. The rates it quotes are
``Verdict.published_rate`` and ``Verdict.arriving_rate``, the averages over that
window, which a front end shows beside the series, so the line and the figures agree:
"growing by X" is exactly arriving minus published.

It does not flip on noise. Growing or draining needs the backlog's fitted change over
the window (least squares), and its drainable part's, to stand out of the scatter
around the fit (twice its standard deviation) and to be worth saying (3 events, and a
tenth of what was published meanwhile), the net rate to agree in sign, and all that
for three samples in a row; once said, it holds until the change falls under the
scatter itself, or half those floors (hysteresis).

Events held behind a dead-lettered head of their ordering key never drain by
themselves: the ETA leaves them out and the line says how many there are ("draining,
empty in about 3m (40 held by dead letters)"; "held: 40 wait behind dead letters ..."
once nothing else waits), as the console says what pauses hold.

Rates come from differences between samples. ``published_total`` is a counter that
should only grow; when it drops (the retention purge deleted published rows, or it
was reset) that interval is unknown (None) and left out of the averages.
"""

from __future__ import annotations

import math
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
DEFAULT_MIN_WINDOW_SECONDS = 30.0
DEFAULT_STALL_AFTER_SECONDS = 30.0
DEFAULT_IDLE_AFTER_SECONDS = 10.0
MIN_SAMPLES = 5  # fewer samples are not enough data, however long they span
MIN_CHANGE_EVENTS = 3.0  # a smaller change of the backlog is never a trend
FLOW_SHARE = 0.1  # nor one smaller than this share of what was published meanwhile
NOISE_TIMES = 2.0  # how far out of the scatter a change must stand to start a trend
CONFIRM_SAMPLES = 3  # and for how many samples in a row before it is said

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
    """One line for the overview, with the figures behind it (all over ``span_seconds``)."""

    kind: str  # idle | measuring | draining | growing | steady | stalled | held
    text: str
    net_rate: float | None = None  # backlog change per second (negative: shrinking)
    eta_seconds: float | None = None  # until empty, when draining
    published_rate: float | None = None  # events per second, averaged over the window
    arriving_rate: float | None = None  # published plus the backlog's growth, per second
    span_seconds: float = 0.0  # how much time the window covers


@dataclass(frozen=True, slots=True)
class _Window:
    """The samples a verdict is judged on, and their averages."""

    samples: Sequence[Sample]
    span: float
    published_rate: float | None
    net_rate: float | None

    @property
    def arriving_rate(self) -> float | None:
        if self.published_rate is None or self.net_rate is None:
            return None
        return max(0.0, self.published_rate + self.net_rate)


class Trends:
    """The last ``capacity`` samples, oldest first, and the verdict on them."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        *,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        min_window_seconds: float = DEFAULT_MIN_WINDOW_SECONDS,
        stall_after_seconds: float = DEFAULT_STALL_AFTER_SECONDS,
        idle_after_seconds: float = DEFAULT_IDLE_AFTER_SECONDS,
    ) -> None:
        if capacity < 2:
            raise ConfigurationError(f"trend capacity must be at least 2, got {capacity}")
        if not 0 < min_window_seconds <= window_seconds:
            raise ConfigurationError(
                f"the trend's minimum window ({min_window_seconds:g}s) must be positive and "
                f"at most its window ({window_seconds:g}s)"
            )
        self._samples: deque[Sample] = deque(maxlen=capacity)
        self.window_seconds = window_seconds
        self.min_window_seconds = min_window_seconds
        self.stall_after_seconds = stall_after_seconds
        self.idle_after_seconds = idle_after_seconds
        self._verdict = Verdict(MEASURING, "not enough data yet")
        self._streak = (STEADY, 0)  # the last direction judged, and for how many samples

    def add(self, sample: Sample) -> None:
        """Keep ``sample`` and judge again; one not later than the newest is dropped."""
        if self._samples and sample.at <= self._samples[-1].at:
            return
        self._samples.append(sample)
        self._verdict = self._judge(self._verdict.kind)

    def verdict(self) -> Verdict:
        """The verdict as of the newest sample."""
        return self._verdict

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

    # -- the verdict ----------------------------------------------------------------------

    def _window(self) -> _Window:
        newest = self._samples[-1]
        samples = [
            s for s in self._samples if (newest.at - s.at).total_seconds() <= self.window_seconds
        ]
        if len(samples) < MIN_SAMPLES:  # a slow refresh: the window reaches back further
            samples = list(self._samples)[-MIN_SAMPLES:]
        published = grown = seconds = 0.0
        for a, b in pairwise(samples):
            if _drain(a, b) is None:
                continue  # the purge or a reset: this interval says nothing
            published += b.published_total - a.published_total
            grown += b.backlog - a.backlog
            seconds += _seconds(a, b)
        span = _seconds(samples[0], newest)
        if not seconds:
            return _Window(samples, span, None, None)
        return _Window(samples, span, published / seconds, grown / seconds)

    def _judge(self, previous: str) -> Verdict:
        if len(self._samples) < 2:
            return Verdict(MEASURING, "not enough data yet")
        window = self._window()
        newest = self._samples[-1]

        def verdict(kind: str, text: str, eta: float | None = None) -> Verdict:
            return Verdict(
                kind,
                text,
                window.net_rate,
                eta,
                window.published_rate,
                window.arriving_rate,
                window.span,
            )

        # Judged from the start, shown from the minimum window on: a trend that holds
        # from the start is confirmed by then.
        direction = self._confirmed(_direction(window, previous), previous)
        if window.span < self.min_window_seconds or len(window.samples) < MIN_SAMPLES:
            have = _duration(window.span) if window.span >= 1 else "0s"
            needed = _duration(self.min_window_seconds)
            return verdict(MEASURING, f"not enough data yet ({have} of {needed})")
        published = window.published_rate or 0.0
        quiet = self._quiet_seconds()
        if newest.backlog == 0:
            if quiet >= self.idle_after_seconds or not published:
                return verdict(IDLE, "idle: none waiting")
            return verdict(STEADY, f"keeping up: {rate_text(published)} published, none waiting")
        held = f" ({newest.held:,} held by dead letters)" if newest.held else ""
        if newest.drainable == 0:
            if quiet < self.idle_after_seconds and published:
                text = f"keeping up: {rate_text(published)} published{held}"
                return verdict(STEADY, text)
            text = f"held: {newest.held:,} wait behind dead letters (replay or skip their heads)"
            return verdict(HELD, text)
        if quiet >= self.stall_after_seconds:
            return verdict(STALLED, f"stalled: nothing published in {_duration(quiet)}{held}")
        net = window.net_rate or 0.0
        if direction == GROWING:
            return verdict(GROWING, f"growing by {rate_text(net)}{held}")
        if direction == DRAINING:
            eta = newest.drainable / -net
            return verdict(DRAINING, f"draining, empty in about {_duration(eta)}{held}", eta)
        shown = f"{rate_text(published)} published, " if published else ""
        return verdict(STEADY, f"steady: {shown}{newest.backlog:,} waiting{held}")

    def _confirmed(self, direction: str, previous: str) -> str:
        """``direction``, or STEADY while a new trend has not lasted ``CONFIRM_SAMPLES``."""
        if direction == self._streak[0]:
            self._streak = (direction, self._streak[1] + 1)
        else:
            self._streak = (direction, 1)
        if direction in (GROWING, DRAINING) and direction != previous:
            return direction if self._streak[1] >= CONFIRM_SAMPLES else STEADY
        return direction

    def _quiet_seconds(self) -> float:
        """Seconds since the end of the last interval that published anything.

        From the oldest sample when no interval in the ring published.
        """
        newest = self._samples[-1]
        for a, b in reversed(_pairs(self._samples)):
            if (_drain(a, b) or 0.0) > 0:
                return _seconds(b, newest)
        return _seconds(self._samples[0], newest)


def _direction(window: _Window, previous: str) -> str:
    """GROWING, DRAINING or STEADY: does the backlog's change stand out of its noise?

    The backlog on the screen and its drainable part must both have moved that way:
    events that join the ones held behind dead letters grow the backlog, but they are
    no sign that the dispatchers fall behind (the verdict names them on its own). The
    bar to start a trend is higher than the bar to keep the one ``previous`` says.
    """
    net = window.net_rate
    if net is None or net == 0:
        return STEADY
    wanted = GROWING if net > 0 else DRAINING
    flowed = (window.published_rate or 0.0) * window.span
    floor = max(MIN_CHANGE_EVENTS, FLOW_SHARE * flowed)
    for series in (
        [float(s.backlog) for s in window.samples],
        [float(s.drainable) for s in window.samples],
    ):
        change, scatter = _fit(window.samples, series)
        if change == 0 or (change > 0) != (net > 0):
            return STEADY  # the fit and the averages disagree: no trend to speak of
        keeping = previous == wanted
        bar = max(floor / 2, scatter) if keeping else max(floor, NOISE_TIMES * scatter)
        if abs(change) < bar:
            return STEADY
    return wanted


def _fit(samples: Sequence[Sample], values: Sequence[float]) -> tuple[float, float]:
    """The change of ``values`` over the samples by least squares, and the scatter:
    the standard deviation of the values about the fitted line."""
    t0 = samples[0].at
    xs = [(s.at - t0).total_seconds() for s in samples]
    ys = list(values)
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if not sxx:
        return 0.0, 0.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    residuals = [y - (mean_y + slope * (x - mean_x)) for x, y in zip(xs, ys, strict=True)]
    scatter = math.sqrt(sum(r * r for r in residuals) / max(1, n - 2))
    return slope * (xs[-1] - xs[0]), scatter


def _pairs(samples: Sequence[Sample] | deque[Sample]) -> list[tuple[Sample, Sample]]:
    return list(pairwise(samples))


def _seconds(a: Sample, b: Sample) -> float:
    return (b.at - a.at).total_seconds()


def _drain(a: Sample, b: Sample) -> float | None:
    delta = b.published_total - a.published_total
    return None if delta < 0 else delta / _seconds(a, b)


def rate_text(per_second: float) -> str:
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
