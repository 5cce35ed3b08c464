"""Is the backlog shrinking? The trend verdict and its sparklines (``engine.operating.trends``).

``MainScreen`` keeps the ``Trends`` ring (one sample per refresh) and hands a frozen
``TrendView`` to the overview. Two shapes show it:

- ``TrendLine``: one line, the verdict then as many sparklines as fit (backlog, oldest
  pending age, published against arriving), for narrow or short terminals;
- ``TrendsPanel``: a box with the verdict and one labelled row per series and its
  latest value, for wide and tall terminals.

Beside the published and arriving sparklines stand the verdict's own rates (averages
over its window, which the panel's title names), not the last interval's: the rate
the verdict quotes is the one on the screen. Numbers are never cut: a series that
does not fit is left out, whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from engine.operating.trends import (
    DRAINING,
    GROWING,
    HELD,
    MEASURING,
    STALLED,
    Trends,
    Verdict,
    rate_text,
)
from outbox_tui.widgets.format import compact, duration

BLOCKS = "▁▂▃▄▅▆▇█"
MUTED = "#8a8a8a"
OK, WARN, CRIT = "#87d787", "#ffaf5f", "#ff5f5f"
BACKLOG_COLOUR, AGE_COLOUR, OUT_COLOUR, IN_COLOUR = "#5fafff", "#d7afff", OK, WARN
VERDICT_STYLES = {
    DRAINING: f"bold {OK}",
    GROWING: f"bold {WARN}",
    STALLED: f"bold {CRIT}",
    HELD: f"bold {CRIT}",  # only an operator can move it on
    MEASURING: MUTED,
}
MIN_SPARK, MAX_SPARK = 4, 30


def one_row_sparkline(
    values: Sequence[float | None],
    width: int,
    *,
    peak: float | None = None,
    colour: str = BACKLOG_COLOUR,
) -> Text:
    """One row of blocks, newest on the right, scaled to ``peak`` (default: the largest).

    An unknown value (None: the published counter went backwards) is a gap.
    """
    shown = list(values)[-width:] if width > 0 else []
    top = peak if peak is not None else max((v for v in shown if v is not None), default=0)
    top = top or 1
    line = Text(style=colour)
    for value in shown:
        if value is None:
            line.append(" ")
        else:
            line.append(BLOCKS[min(7, max(0, round(7 * value / top)))])
    return line


def rate(per_second: float | None) -> str:
    """As the verdict writes a rate (``120/s``, ``2.5/s``, ``30/min``); a dash when unknown."""
    return "—" if per_second is None else rate_text(per_second)


@dataclass(frozen=True, slots=True)
class TrendView:
    """What the overview draws of the trend, taken from the ring after a refresh."""

    verdict: Verdict
    backlog: Sequence[float] = ()
    oldest_age: Sequence[float] = ()
    drain: Sequence[float | None] = ()
    inflow: Sequence[float | None] = ()
    held_by_pauses: int = 0  # events the active pauses hold back (said beside a stall)

    @classmethod
    def of(cls, trends: Trends, *, held_by_pauses: int = 0) -> TrendView:
        return cls(
            trends.verdict(),
            trends.backlog_series(),
            trends.oldest_age_series(),
            trends.drain_series(),
            trends.inflow_series(),
            held_by_pauses,
        )

    def verdict_text(self) -> Text:
        kind = self.verdict.kind
        text = Text(self.verdict.text, style=VERDICT_STYLES.get(kind, "bold"))
        if self.held_by_pauses and kind not in (DRAINING, MEASURING):
            text.append(f" ({compact(self.held_by_pauses)} held by pauses)", style=WARN)
        return text

    def latest(self, series: Sequence[float | None]) -> float | None:
        return series[-1] if series else None

    @property
    def published(self) -> str:
        """The published rate the verdict judged on (its window's average)."""
        return rate(self.verdict.published_rate)

    @property
    def arriving(self) -> str:
        return rate(self.verdict.arriving_rate)

    def title(self) -> str:
        """The panel's title: what one block is, and what the rates average over."""
        span = self.verdict.span_seconds
        over = f" · rates over the last {duration(round(span))}" if span >= 1 else ""
        return f"trend · one sample per refresh{over}"


def _peak(*series: Sequence[float | None]) -> float:
    return max((v for s in series for v in s if v is not None), default=0.0)


def trend_line(view: TrendView, width: int) -> Text:
    """The verdict, then the series that fit: backlog, oldest age, published vs arriving.

    Each series brings its latest value, so a reader never has to guess a number from
    a block; the sparklines share what room is left (``MIN_SPARK`` to ``MAX_SPARK``).
    """
    verdict = view.verdict_text()
    last_backlog = view.latest(view.backlog)
    last_age = view.latest(view.oldest_age)
    segments: list[tuple[str, list[tuple[Sequence[float | None], str]], str]] = [
        ("backlog ", [(view.backlog, BACKLOG_COLOUR)], f" {compact(_int(last_backlog))}"),
        ("oldest ", [(view.oldest_age, AGE_COLOUR)], f" {duration(last_age)}"),
        (
            "out/in ",
            [(view.drain, OUT_COLOUR), (view.inflow, IN_COLOUR)],
            f" {view.published} / {view.arriving}",
        ),
    ]
    gap = "  ·  "
    for keep in range(len(segments), -1, -1):
        chosen = segments[:keep]
        fixed = verdict.cell_len + sum(
            len(gap) + len(label) + len(value) + (len(lines) - 1) for label, lines, value in chosen
        )
        sparks = sum(len(lines) for _label, lines, _value in chosen)
        room = (width - fixed) // sparks if sparks else 0
        if keep and room < MIN_SPARK:
            continue
        line = verdict.copy()
        room = min(MAX_SPARK, room)
        for label, lines, value in chosen:
            peak = _peak(*(series for series, _colour in lines))
            line.append(gap, style=MUTED)
            line.append(label, style=MUTED)
            for index, (series, colour) in enumerate(lines):
                if index:
                    line.append(" ")
                line.append_text(one_row_sparkline(series, room, peak=peak, colour=colour))
            line.append(value, style="bold")
        return line
    return verdict


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


class TrendLine(Static):
    """``draining, empty in about 3m  ·  backlog ▁▂▃▅▇ 1,234  ·  …``, fitted to its width."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.view: TrendView | None = None

    def show(self, view: TrendView) -> None:
        self.view = view
        self.refresh()

    def render(self) -> Text:
        if self.view is None:
            return Text("trend: from the second refresh on", style=MUTED)
        return trend_line(self.view, self.content_size.width)


ROWS = (  # the label and colour of each series row, in order
    ("backlog", BACKLOG_COLOUR),
    ("oldest pending", AGE_COLOUR),
    ("published", OUT_COLOUR),  # the value carries its unit (/s or /min)
    ("arriving", IN_COLOUR),
)
LABEL_WIDTH, VALUE_WIDTH = 15, 9


def trend_rows(view: TrendView, width: int) -> Text:
    """The verdict, then one labelled sparkline per series with its latest value."""
    room = max(MIN_SPARK, width - LABEL_WIDTH - VALUE_WIDTH - 1)
    flow_peak = _peak(view.drain, view.inflow)  # published and arriving on one scale
    series: tuple[tuple[Sequence[float | None], float | None, str], ...] = (
        (view.backlog, None, compact(_int(view.latest(view.backlog)))),
        (view.oldest_age, None, duration(view.latest(view.oldest_age))),
        (view.drain, flow_peak, view.published),
        (view.inflow, flow_peak, view.arriving),
    )
    lines = [view.verdict_text()]
    for (label, colour), (values, peak, latest) in zip(ROWS, series, strict=True):
        row = Text(f"{label:<{LABEL_WIDTH}}", style=MUTED, no_wrap=True)
        row.append(" " * (room - min(room, len(values))))  # newest at the right edge
        row.append_text(one_row_sparkline(values, room, peak=peak, colour=colour))
        row.append(f" {latest:>{VALUE_WIDTH}}", style="bold")
        lines.append(row)
    return Text("\n", no_wrap=True).join(lines)


class TrendsPanel(Static):
    """The boxed trend for wide, tall terminals: verdict and four labelled series."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.view: TrendView | None = None
        self.border_title = "trend · one sample per refresh"

    def show(self, view: TrendView) -> None:
        self.view = view
        self.border_title = view.title()
        self.refresh()

    def render(self) -> Text:
        if self.view is None:
            return Text("from the second refresh on", style=MUTED)
        return trend_rows(self.view, self.content_size.width)
