"""How a ``consume`` run reports: JSON lines, or a live status line and a summary table."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.live import Live
from rich.text import Text

from outbox_tui.output.run import RunClock, write_summary
from outbox_tui.output.values import age, rate, seconds
from outbox_tui.output.writer import Output


def consume_status_line(totals: Mapping[str, Any], elapsed: float, waiting: str | None) -> Text:
    line = Text("consuming ", style="bold")
    line.append(f"received {totals.get('received', 0)}  ")
    line.append(f"stored {totals.get('stored', 0)}  ", style="green")
    line.append(f"duplicates {totals.get('duplicates', 0)}  ")
    line.append(f"rejected {totals.get('rejected', 0)}  ", style="red")
    line.append(f"{rate(int(totals.get('acked', 0)), elapsed)}/s  ")
    if waiting:
        line.append(f"waiting for {waiting}  ", style="yellow")
    line.append(f"up {age(elapsed)}", style="dim")
    return line


class ConsumeReporter:
    """Reports a ``consume`` run: JSON lines on stdout, or a live line on stderr.

    JSON mode writes ``started`` first, ``batch`` for every committed batch, ``waiting``
    when what the consumer waits for changes (``waiting_for`` null once it is over),
    ``idle`` at most every ``idle_every`` seconds while nothing happens, and ``summary``
    last.
    """

    def __init__(self, out: Output, *, idle_every: float = 10.0) -> None:
        self.out = out
        self.idle_every = idle_every
        self.clock = RunClock()
        self._last_line = self.clock.started
        self._totals: dict[str, int] = {}
        self._waiting: str | None = None
        self._live: Live | None = None

    def started(self, details: Mapping[str, Any]) -> None:
        self.clock = RunClock()
        self._last_line = self.clock.started
        if self.out.json_mode:
            self.out.json({"event": "started", **details})
            return
        self.out.note(
            f"consuming {details.get('queue')} from {details.get('amqp_url')} into "
            f"{details.get('database_url')} as {details.get('instance_id')} "
            "(Ctrl-C or SIGTERM to stop after the batch in hand)"
        )
        if self.out.err_console.is_terminal:
            self._live = Live(
                consume_status_line({}, 0.0, None),
                console=self.out.err_console,
                refresh_per_second=4,
            )
            self._live.start()

    def batch(self, size: int, stored: int, duplicates: int, totals: Mapping[str, int]) -> None:
        self._totals = dict(totals)
        elapsed = self.clock.elapsed
        self._refresh()
        if not self.out.json_mode:
            return
        self.out.json(
            {
                "event": "batch",
                "size": size,
                "stored": stored,
                "duplicates": duplicates,
                "totals": dict(totals),
                "elapsed_seconds": seconds(elapsed),
                "rate_per_second": rate(int(totals.get("acked", 0)), elapsed),
            }
        )
        self._last_line = time.monotonic()

    def waiting(self, reason: str | None) -> None:
        self._waiting = reason
        self._refresh()
        if self.out.json_mode:
            self.out.json({"event": "waiting", "waiting_for": reason, "totals": self._totals})
            self._last_line = time.monotonic()

    def tick(self) -> None:
        """An ``idle`` line when nothing was said for ``idle_every`` seconds."""
        now = time.monotonic()
        if self.out.json_mode and now - self._last_line >= self.idle_every:
            self.out.json(
                {
                    "event": "idle",
                    "totals": self._totals,
                    "waiting_for": self._waiting,
                    "elapsed_seconds": seconds(self.clock.elapsed),
                }
            )
            self._last_line = now

    def finished(self, summary: Mapping[str, Any], instance_id: str) -> None:
        self.stop()
        write_summary(
            self.out, "consume run summary", summary, instance_id, self.clock.elapsed, "acked"
        )

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _refresh(self) -> None:
        if self._live is not None:
            line = consume_status_line(self._totals, self.clock.elapsed, self._waiting)
            self._live.update(line)
