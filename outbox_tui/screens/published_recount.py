"""The published total off the refresh path: counted in full now and then, not per refresh.

The published total and the purge backlog grow with the table (decision 0032), so a
refresh asks ``live_overview``, which carries them from the last ``published_totals`` and
adds what was published since. The first refresh counts them in full (the first screen is
exact); after that a ``recount`` worker counts them again every
``published_recount_seconds``, beside the refreshes and never overlapping itself.

A part of ``MainScreen``, whose poll worker asks ``live_overview`` and then
``recount_when_due``.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING

from textual import work

from engine.errors import OutboxError
from engine.operating.insights import OverviewSnapshot, PublishedMark, PublishedTotals
from outbox_tui.screens.base import ScreenPart

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole


class PublishedRecount(ScreenPart):
    """Holds the last recount and the mark the next live overview continues from."""

    def __init__(self, console: OutboxConsole) -> None:
        super().__init__(console)
        self._totals: PublishedTotals | None = None
        self._mark: PublishedMark | None = None

    @property
    def totals(self) -> PublishedTotals | None:
        """The last full count (None before the first refresh)."""
        return self._totals

    async def live_overview(self) -> OverviewSnapshot:
        """The refresh's overview (the poll worker asks, inside its timeout)."""
        console = self.console
        if self._totals is None:  # the first screen: counted in full
            self._totals = await console.db(console.insights.published_totals())
        snapshot = await console.db(console.insights.live_overview(self._totals, since=self._mark))
        self._mark = snapshot.mark
        return snapshot

    def recount_when_due(self, now: datetime) -> None:
        every = self.console.config.published_recount_seconds
        totals = self._totals
        if totals is None or (now - totals.taken_at).total_seconds() < every:
            return
        if not any(w.group == "recount" and w.is_running for w in self.workers):
            self._recount()

    @work(exclusive=True, group="recount", exit_on_error=False)
    async def _recount(self) -> None:
        """Count the published rows in full again, beside the refreshes (never inside one)."""
        console = self.console
        try:
            async with asyncio.timeout(console.config.poll_timeout_seconds):
                self._totals = await console.db(console.insights.published_totals())
        except (TimeoutError, OutboxError):
            pass  # the refreshes say when the database is in trouble; the next one retries
