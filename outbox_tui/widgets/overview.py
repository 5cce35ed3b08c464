"""The overview band: counts by status, blocked keys, ages against thresholds, and throughput."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from engine.insights import OverviewSnapshot
from outbox_tui.widgets.format import RICH_STATUS_STYLES, count, duration

TILES = (
    ("pending", "pending"),
    ("publishing", "publishing"),
    ("failed", "failed · retrying"),
    ("dead_letter", "dead letter"),
    ("published", "published"),
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
    """One status: its label in the border, its count in the middle."""

    def __init__(self, status: str, label: str) -> None:
        super().__init__("—", id=f"tile-{status}", classes="tile")
        self.status = status
        self.border_title = label

    def show(self, value: int, extra: str = "", *, note: str = "") -> None:
        """``extra`` follows the count; ``note`` goes on the bottom border (short)."""
        self.border_subtitle = note
        style = TILE_STYLES.get(self.status, RICH_STATUS_STYLES.get(self.status, "")) or ""
        style = style if value else MUTED
        text = Text(count(value), style=style)
        if extra:
            text.append(f" · {extra}", style=MUTED)
        self.update(text)


class OverviewPanel(Horizontal):
    """Counts, health line and the throughput sparkline, fed one snapshot at a time."""

    def __init__(self, thresholds: AgeThresholds, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.thresholds = thresholds

    def compose(self) -> ComposeResult:
        with Vertical(id="counts"):
            with Horizontal(id="tiles"):
                for status, label in TILES:
                    yield CountTile(status, label)
                yield CountTile(BLOCKED_TILE, "blocked keys")
            yield Static("waiting for the first refresh…", id="health")
        with Vertical(id="throughput") as box:
            box.border_title = "published per refresh"
            yield Static(sparkline([], 34), id="sparkline")
            yield Static("", id="throughput-summary")

    def show(self, snap: OverviewSnapshot, throughput: Sequence[int]) -> None:
        for status, _label in TILES:
            extra = ""
            if status == "published":
                window = duration(snap.recent_window_seconds)
                extra = f"{count(snap.published_recent)}/{window}"  # e.g. "1,019/5m": fits a tile
            self.query_one(f"#tile-{status}", CountTile).show(snap.counts.get(status, 0), extra)
        # Keys held back by a failed or dead-lettered head, and how old the oldest head is.
        head_age = snap.oldest_blocked_head_age_seconds
        self.query_one(f"#tile-{BLOCKED_TILE}", CountTile).show(
            snap.blocked_keys, note=f"oldest {duration(head_age)}" if head_age is not None else ""
        )
        oldest = snap.oldest_pending_age_seconds
        warn, critical = duration(self.thresholds.warn), duration(self.thresholds.critical)
        stuck = snap.stuck_publishing
        health = Text.assemble(
            ("oldest pending ", MUTED),
            (
                duration(oldest) if oldest is not None else "none",
                f"bold {self.thresholds.colour(oldest)}",
            ),
            (f" (warn {warn}, crit {critical})", MUTED),
            ("  ·  stuck publishing (lease expired) ", MUTED),
            (count(stuck), f"bold {CRIT if stuck else OK}"),
            ("  ·  awaiting purge ", MUTED),
            no_wrap=True,
            overflow="ellipsis",
        )
        if snap.awaiting_purge is None:
            health.append("n/a (retention off)", style=MUTED)
        else:
            health.append(count(snap.awaiting_purge), style="bold")
            health.append(f" (retention {duration(snap.retention_seconds)})", style=MUTED)
        self.query_one("#health", Static).update(health)
        chart = self.query_one("#sparkline", Static)
        chart.update(sparkline(throughput, max(8, chart.size.width or 34)))
        summary = self.query_one("#throughput-summary", Static)
        if not throughput:
            summary.update(Text("from the next refresh on", style=MUTED))
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
            )
        )
