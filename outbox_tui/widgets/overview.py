"""The overview band: counts by status, blocked keys, ages against thresholds, throughput,
the trend and its verdict, the active pauses, and the types with the most undelivered events.

Narrow or short terminals get the trend and the top types as one line each; wide, tall
ones get them as boxes (``#overview-more``). The pauses show only while there are some.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from engine.operating.insights import OverviewSnapshot, TypeCounts
from engine.service.incidents import PausedBacklog
from outbox_tui.widgets.format import (
    RICH_STATUS_STYLES,
    compact,
    count,
    duration,
    fitted,
    latency,
)
from outbox_tui.widgets.pauses import PausesLine
from outbox_tui.widgets.top_types import TopTypesLine, TopTypesPanel
from outbox_tui.widgets.trend import TrendLine, TrendsPanel, TrendView

# (status, label, the label where that does not fit)
TILES = (
    ("pending", "pending", "pending"),
    ("publishing", "publishing", "publishing"),
    ("failed", "failed · retrying", "failed"),
    # Rows now, where the dispatchers' table counts what each ever dead-lettered.
    ("dead_letter", "dead letters now", "dead now"),
    ("published", "published", "published"),
)
BLOCKED_TILE = "blocked_keys"
OK, WARN, CRIT = "#87d787", "#ffaf5f", "#ff5f5f"
MUTED = "#8a8a8a"


@dataclass(frozen=True, slots=True)
class AgeThresholds:
    """The oldest pending event turns yellow at ``warn`` and red at ``critical`` seconds."""

    warn: float = 60.0
    critical: float = 300.0

    def colour(self, seconds: float | None) -> str:
        if seconds is None or seconds < self.warn:
            return OK
        return WARN if seconds < self.critical else CRIT


BLOCKS = " ▁▂▃▄▅▆▇█"
TILE_STYLES = {BLOCKED_TILE: f"bold {WARN}"}


def sparkline(values: Sequence[int], width: int, colour: str = OK) -> Text:
    """Two rows of block characters, newest on the right, scaled to the largest value.

    Zero is a flat baseline rather than nothing, so an idle outbox reads as idle.
    """
    values = list(values)[-width:]
    values = [0] * (width - len(values)) + values
    peak = max(values) or 1
    top, bottom = Text(), Text()
    for value in values:
        level = 0 if value <= 0 else max(1, round(16 * value / peak))
        low, high = min(level, 8), max(0, level - 8)
        bottom.append(BLOCKS[low] if level else "▁", style=colour if level else "#444444")
        top.append(BLOCKS[high], style=colour)
    return Text("\n").join([top, bottom])


class CountTile(Static):
    """One status: its count, never cut (abbreviated when the tile is narrow).

    Boxed (wide terminals) the label is the border title; unboxed (the stylesheet drops
    the border below 140 columns) it is the first line, shortened when it must be.
    """

    def __init__(self, status: str, label: str, short: str | None = None) -> None:
        super().__init__(id=f"tile-{status}", classes="tile")
        self.status = status
        self.label = label
        self.short = short or label
        self.value: int | None = None
        self.extra = ""
        self.note = ""
        self.border_title = label

    def show(self, value: int, extra: str = "", *, note: str = "") -> None:
        """``extra`` follows the count when it fits; ``note`` too, on the bottom border."""
        if (value, extra, note) == (self.value, self.extra, self.note):
            return  # the same figure: drawing it again would cost the loop a redraw
        self.value, self.extra, self.note = value, extra, note
        self._relabel()
        self.refresh()

    def on_resize(self) -> None:
        self._relabel()

    def _relabel(self) -> None:
        """Border title and note (boxed) for the current width; none unboxed."""
        room = self.content_size.width - 4
        boxed = self.boxed
        self.border_title = self._label(room) if boxed else None
        self.border_subtitle = self.note if boxed and len(self.note) <= room else None

    @property
    def boxed(self) -> bool:
        edge = self.styles.border_top[0]
        return bool(edge) and edge != "none"

    def render(self) -> Text:
        width = max(1, self.content_size.width)
        boxed = self.boxed
        number = Text(no_wrap=True, overflow="crop", justify="center")
        if self.value is None:
            number.append("—", style=MUTED)
        else:
            style = TILE_STYLES.get(self.status, RICH_STATUS_STYLES.get(self.status, "")) or ""
            shown = fitted(self.value, width)
            number.append(shown, style=style if self.value else MUTED)
            extra = f" · {self.extra}" if self.extra else ""
            if not boxed and self.note:
                extra = f" · {self.note}"
            if extra and len(shown) + len(extra) <= width:
                number.append(extra, style=MUTED)
        number.align("center", width)
        if boxed:
            return number
        label = Text(self._label(width), style=MUTED, no_wrap=True)
        label.align("center", width)
        return Text("\n").join([label, number])

    def _label(self, room: int) -> str:
        return self.label if len(self.label) <= room else self.short


class HealthLine(Static):
    """One line in its longest variant that fits the width (the last one, cut, otherwise)."""

    def __init__(self, text: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.variants: list[Text] = [Text(text, style=MUTED)]

    def show(self, *variants: Text) -> None:
        self.variants = list(variants)
        self.refresh()

    def render(self) -> Text:
        width = self.content_size.width
        for text in self.variants:
            if text.cell_len <= width:
                return text
        return self.variants[-1]


class OverviewPanel(Vertical):
    """Counts, health, throughput, trend, pauses and top types, fed once per refresh."""

    def __init__(self, thresholds: AgeThresholds, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.thresholds = thresholds
        self._throughput_drawn: tuple[tuple[int, ...], int] | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="overview-top"):
            with Vertical(id="counts"):
                with Horizontal(id="tiles"):
                    for status, label, short in TILES:
                        yield CountTile(status, label, short)
                    yield CountTile(BLOCKED_TILE, "blocked keys", "blocked")
                yield HealthLine("waiting for the first refresh…", id="health")
                yield TrendLine(id="trend")  # narrow or short: the verdict in one line
            with Vertical(id="throughput") as box:
                box.border_title = "published per refresh"
                yield Static(sparkline([], 34), id="sparkline")
                yield Static("", id="throughput-summary")
        yield PausesLine(id="pauses")
        yield TopTypesLine(id="top-types-line")
        with Horizontal(id="overview-more"):  # wide and tall: the trend and top types boxed
            yield TrendsPanel(id="trends")
            yield TopTypesPanel(id="top-types")

    def show(
        self,
        snap: OverviewSnapshot,
        throughput: Sequence[int],
        *,
        trend: TrendView | None = None,
        pauses: Sequence[PausedBacklog] = (),
        top_types: Sequence[TypeCounts] = (),
    ) -> None:
        if trend is not None:
            self.query_one(TrendLine).show(trend)
            self.query_one(TrendsPanel).show(trend)
        self.query_one(PausesLine).show(pauses, snap.taken_at)
        self.query_one(TopTypesLine).show(top_types)
        self.query_one(TopTypesPanel).show(top_types)
        self._show_counts(snap, throughput)

    def _show_counts(self, snap: OverviewSnapshot, throughput: Sequence[int]) -> None:
        for status, _label, _short in TILES:
            extra = ""
            if status == "published":
                window = duration(snap.recent_window_seconds)
                extra = f"{compact(snap.published_recent)}/{window}"  # e.g. "1,019/5m"
            self.query_one(f"#tile-{status}", CountTile).show(snap.counts.get(status, 0), extra)
        # Keys held back by a failed or dead-lettered head, and how old the oldest head is.
        head_age = snap.oldest_blocked_head_age_seconds
        self.query_one(f"#tile-{BLOCKED_TILE}", CountTile).show(
            snap.blocked_keys, note=f"oldest {duration(head_age)}" if head_age is not None else ""
        )
        oldest = snap.oldest_pending_age_seconds
        warn, critical = duration(self.thresholds.warn), duration(self.thresholds.critical)
        stuck = snap.stuck_publishing
        age = (
            duration(oldest) if oldest is not None else "none",
            f"bold {self.thresholds.colour(oldest)}",
        )
        stuck_count = (count(stuck), f"bold {CRIT if stuck else OK}")
        if snap.awaiting_purge is None:
            purge, purge_note = ("n/a", MUTED), " (retention off)"
        else:
            purge = (compact(snap.awaiting_purge), "bold")
            purge_note = f" (retention {duration(snap.retention_seconds)})"
        last = (compact(throughput[-1]) if throughput else "—", "bold")
        lag = snap.lag  # from the dispatchers that measure it (metrics on)
        lag_parts: list[tuple[str, str]] = []
        if lag is not None and lag.events:
            p50, p99 = latency(lag.p50_seconds), latency(lag.p99_seconds)
            lag_parts = [("  ·  lag p50 ", MUTED), (p50, "bold"), (" p99 ", MUTED), (p99, "bold")]
        full = Text.assemble(
            ("oldest pending ", MUTED),
            age,
            (f" (warn {warn}, crit {critical})", MUTED),
            *lag_parts,
            ("  ·  stuck publishing (lease expired) ", MUTED),
            stuck_count,
            ("  ·  awaiting purge ", MUTED),
            purge,
            (purge_note, MUTED),
            no_wrap=True,
            overflow="ellipsis",
        )
        # Narrow terminals: the same facts, fewer words; the throughput box is hidden
        # there, so the last refresh's published count comes along.
        short = Text.assemble(
            ("oldest pending ", MUTED),
            age,
            *lag_parts,
            ("  ·  stuck ", MUTED),
            stuck_count,
            ("  ·  purge ", MUTED),
            purge,
            ("  ·  published/refresh ", MUTED),
            last,
            no_wrap=True,
            overflow="ellipsis",
        )
        self.query_one("#health", HealthLine).show(full, short)
        chart = self.query_one("#sparkline", Static)
        drawn = (tuple(throughput), max(8, chart.size.width or 34))
        if drawn == self._throughput_drawn:  # the same figures: no redraw
            return
        self._throughput_drawn = drawn
        # The stylesheet fixes both boxes' sizes: new figures need no layout, which would
        # redraw the whole screen (the event table's rows included) on every refresh.
        chart.update(sparkline(throughput, drawn[1]), layout=False)
        summary = self.query_one("#throughput-summary", Static)
        if not throughput:
            summary.update(Text("from the next refresh on", style=MUTED), layout=False)
            return
        summary.update(
            Text.assemble(
                ("last ", MUTED),
                (count(throughput[-1]), "bold"),
                ("  peak ", MUTED),
                (count(max(throughput)), "bold"),
                (f"  over {len(throughput)} refreshes", MUTED),
                no_wrap=True,
                overflow="ellipsis",
            ),
            layout=False,
        )
