"""The published total off the refresh path: counted in full now and then, not per refresh.

The published total and the purge backlog grow with the table (decision 0032), so a
refresh asks ``live_overview``, which carries them from the last ``published_totals`` and
adds what was published since. The first refresh counts them in full (the first screen is
exact); after that a ``recount`` worker counts them again every
``published_recount_seconds``, beside the refreshes and never overlapping itself.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from textual import work

from engine.errors import OutboxError
from engine.operating.insights import OverviewSnapshot, PublishedMark, PublishedTotals
from outbox_tui.screens.base import ConsoleScreen


class PublishedRecount(ConsoleScreen):
    """Holds the last recount and the mark the next live overview continues from."""

    _totals: PublishedTotals | None = None
    _mark: PublishedMark | None = None

    async def live_overview(self) -> OverviewSnapshot:
        """The refresh's overview (the poll worker asks, inside its timeout)."""
        console = self.console_app
        if self._totals is None:  # the first screen: counted in full
            self._totals = await console.db(console.insights.published_totals())
        snapshot = await console.db(console.insights.live_overview(self._totals, since=self._mark))
        self._mark = snapshot.mark
        return snapshot

    def recount_when_due(self, now: datetime) -> None:
        every = self.console_app.config.published_recount_seconds
        totals = self._totals
        if totals is None or (now - totals.taken_at).total_seconds() < every:
            return
        if not any(w.group == "recount" and w.is_running for w in self.workers):
            self._recount()

    @work(exclusive=True, group="recount", exit_on_error=False)
    async def _recount(self) -> None:
        """Count the published rows in full again, beside the refreshes (never inside one)."""
        console = self.console_app
        try:
            async with asyncio.timeout(console.config.poll_timeout_seconds):
                self._totals = await console.db(console.insights.published_totals())
        except (TimeoutError, OutboxError):
            pass  # the refreshes say when the database is in trouble; the next one retries
