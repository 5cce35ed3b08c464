"""What is paused: each active pause's type, tenant (or every tenant), age and waiting events.

Hidden while nothing is paused. Narrow or short terminals get one line (the oldest
pause, and how many more); wide, tall ones a line per pause, with who paused it and
why. The counts are never cut: when a line is too long the event type is shortened.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rich.text import Text
from textual.widgets import Static

from engine.service.incidents import PausedBacklog
from outbox_tui.widgets.format import compact, count, duration, one_line

WARN, MUTED = "#ffaf5f", "#8a8a8a"
MAX_ROWS = 3  # a line per pause up to this many, then "+N more"


def _scope(held: PausedBacklog) -> str:
    tenant = held.pause.tenant_id
    return "every tenant" if tenant is None else f"tenant {tenant}"


def _since(held: PausedBacklog, now: datetime) -> str:
    return duration((now - held.pause.paused_at).total_seconds())


def pause_text(
    held: PausedBacklog, now: datetime, width: int, *, who: bool = True, more: int = 0
) -> Text:
    """``⏸ orders.placed · every tenant · paused 3m ago · 12 waiting · by alice: …``.

    The longest variant that fits ``width``: with who and why, without them, then a
    shorter form (``⏸ orders.placed · all tenants · 3m · 12 waiting · +1 more``) with
    the count abbreviated if need be, and last that form with the event type shortened;
    the numbers stay whole.
    """
    pause = held.pause
    since = _since(held, now)
    why = f" · by {pause.paused_by}: {one_line(pause.reason)}" if who else ""
    tail, short_tail = (f"  ·  +{more} more paused", f" · +{more} more") if more else ("", "")
    long_rest = [
        (" · ", MUTED),
        (_scope(held), ""),
        (" · paused ", MUTED),
        (f"{since} ago", "bold"),
        (" · ", MUTED),
        (f"{count(held.waiting)} waiting", f"bold {WARN}"),
    ]
    candidates = [Text.assemble(*long_rest, (extra, MUTED), (tail, MUTED)) for extra in (why, "")]
    tenant = "all tenants" if pause.tenant_id is None else pause.tenant_id
    for waiting in (count(held.waiting), compact(held.waiting)):
        candidates.append(
            Text.assemble(
                (" · ", MUTED),
                (tenant, ""),
                (" · ", MUTED),
                (since, "bold"),
                (" · ", MUTED),
                (f"{waiting} waiting", f"bold {WARN}"),
                (short_tail, MUTED),
            )
        )
    for rest in candidates:
        line = Text.assemble(("⏸ ", f"bold {WARN}"), (pause.event_type, "bold"), rest, no_wrap=True)
        if line.cell_len <= width:
            return line
    rest = candidates[-1]
    room = max(1, width - 2 - rest.cell_len)
    return Text.assemble(
        ("⏸ ", f"bold {WARN}"), (one_line(pause.event_type, room), "bold"), rest, no_wrap=True
    )


def pause_lines(
    pauses: Sequence[PausedBacklog], now: datetime, width: int, *, rows: int = 1
) -> Text:
    """One line per pause up to ``rows`` (the last says how many more); empty when none."""
    if not pauses:
        return Text()
    if len(pauses) <= rows:
        shown = [pause_text(held, now, width) for held in pauses]
    else:
        head = [pause_text(held, now, width) for held in pauses[: rows - 1]]
        last = pause_text(pauses[rows - 1], now, width, who=False, more=len(pauses) - rows)
        shown = [*head, last]
    return Text("\n", no_wrap=True).join(shown)


class PausesLine(Static):
    """The active pauses, oldest first; not displayed while there are none."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.pauses: Sequence[PausedBacklog] = ()
        self.now: datetime | None = None

    def show(self, pauses: Sequence[PausedBacklog], now: datetime) -> None:
        lines_before = self._line_count()
        self.pauses, self.now = tuple(pauses), now
        self.set_class(bool(self.pauses), "-paused")
        # The height follows the line count, and only a new height needs a layout: a
        # layout redraws the whole screen, the event table's rows included, each refresh.
        self.refresh(layout=self._line_count() != lines_before)

    def _line_count(self) -> int:
        return min(len(self.pauses), self.rows)

    @property
    def rows(self) -> int:
        """A line per pause on wide, tall terminals; one line otherwise."""
        screen = self.screen
        roomy = screen.has_class("-wide") and screen.has_class("-tall")
        return MAX_ROWS if roomy else 1

    def render(self) -> Text:
        if not self.pauses or self.now is None:
            return Text()
        return pause_lines(self.pauses, self.now, self.content_size.width, rows=self.rows)
