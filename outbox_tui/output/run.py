"""How a ``dispatch`` (``--dispatch``) run reports: JSON lines, or a live status line."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.live import Live
from rich.text import Text

from outbox_tui.output.records import COUNTERS, HEARTBEAT_TOTALS
from outbox_tui.output.tables import counters_table
from outbox_tui.output.values import age, rate, seconds
from outbox_tui.output.writer import Output

# A run's totals that change only when an iteration did something.
WORK_TOTALS = HEARTBEAT_TOTALS


@dataclass(slots=True)
class RunClock:
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


def status_line(totals: Mapping[str, Any], elapsed: float) -> Text:
    line = Text("dispatching ", style="bold")
    line.append(f"iterations {totals.get('iterations', 0)}  ")
    line.append(f"claimed {totals.get('claimed', 0)}  ")
    line.append(f"published {totals.get('published', 0)}  ", style="green")
    line.append(f"failed {totals.get('failed', 0)}  ", style="yellow")
    line.append(f"dead-lettered {totals.get('dead_lettered', 0)}  ", style="red")
    line.append(f"{rate(int(totals.get('published', 0)), elapsed)}/s  ")
    line.append(f"up {age(elapsed)}", style="dim")
    return line


class RunReporter:
    """Reports a ``--dispatch`` run: JSON lines on stdout, or a live status line on stderr.

    JSON mode writes ``started`` first, ``iteration`` for every iteration whose
    totals changed (it did work, purged, or hit a storage error), ``idle`` at
    most every ``idle_every`` seconds while nothing happens, and ``summary`` last.
    """

    def __init__(self, out: Output, *, idle_every: float = 10.0) -> None:
        self.out = out
        self.idle_every = idle_every
        self.clock = RunClock()
        self._last_line = self.clock.started
        self._previous = _work_totals({})
        self._live: Live | None = None

    def started(self, details: Mapping[str, Any]) -> None:
        self.clock = RunClock()
        self._last_line = self.clock.started
        if self.out.json_mode:
            self.out.json({"event": "started", **details})
            return
        self.out.note(
            f"dispatching as {details.get('instance_id')} from {details.get('database_url')}"
            " (Ctrl-C or SIGTERM to stop after the current batch)"
        )
        if self.out.err_console.is_terminal:
            self._live = Live(
                status_line({}, 0.0), console=self.out.err_console, refresh_per_second=4
            )
            self._live.start()

    def iteration(self, totals: Mapping[str, Any], result: Mapping[str, int]) -> None:
        elapsed = self.clock.elapsed
        if self._live is not None:
            self._live.update(status_line(totals, elapsed))
        if not self.out.json_mode:
            return
        changed = _work_totals(totals) != self._previous
        now = time.monotonic()
        if changed:
            self._previous = _work_totals(totals)
            self.out.json(
                {
                    "event": "iteration",
                    "iteration": totals.get("iterations", 0),
                    **{name: int(result.get(name, 0)) for name in COUNTERS},
                    "totals": dict(totals),
                    "elapsed_seconds": seconds(elapsed),
                    "rate_per_second": rate(int(totals.get("published", 0)), elapsed),
                }
            )
            self._last_line = now
        elif now - self._last_line >= self.idle_every:
            self.out.json(
                {
                    "event": "idle",
                    "iteration": totals.get("iterations", 0),
                    "totals": dict(totals),
                    "elapsed_seconds": seconds(elapsed),
                }
            )
            self._last_line = now

    def finished(self, totals: Mapping[str, Any], instance_id: str) -> None:
        self.stop()
        write_summary(
            self.out, "dispatch run summary", totals, instance_id, self.clock.elapsed, "published"
        )

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def write_summary(
    out: Output,
    title: str,
    totals: Mapping[str, Any],
    instance_id: str,
    elapsed: float,
    rate_of: str,
) -> None:
    """A run's last word: its totals, id, time and the rate of ``rate_of`` per second, as
    the ``summary`` JSON line or a table titled ``title``."""
    record = {
        "event": "summary",
        **totals,
        "instance_id": instance_id,
        "elapsed_seconds": seconds(elapsed),
        "rate_per_second": rate(int(totals.get(rate_of, 0)), elapsed),
    }
    if out.json_mode:
        out.json(record)
    else:
        shown = {k: v for k, v in record.items() if k != "event"}
        out.console.print(counters_table(title, shown))


def _work_totals(totals: Mapping[str, Any]) -> dict[str, Any]:
    return {name: totals.get(name, 0) for name in WORK_TOTALS}
