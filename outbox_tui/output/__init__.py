"""What the command line prints: stable JSON records and rich text for people.

One module per job, all re-exported here (commands write ``output.stats_record``):

- ``records``: every JSON record a command prints, so the keys documented in
  ``docs/cli.md`` live in one module, and the replay and skip reports;
- ``tables``: the same data as rich tables and lines for a terminal;
- ``writer``: ``Output``, stdout for results and stderr for errors (exactly one plain
  line, ``outbox-tui: error: ...``, that scripts can match), progress and status;
- ``run``: how a ``dispatch`` run reports (JSON lines, or a live status line);
- ``values``: timestamps, ages and rates as both print them.
"""

from __future__ import annotations

from outbox_tui.output.records import (
    CONSUMER_TOTALS,
    COUNTERS,
    HEARTBEAT_TOTALS,
    ReplayReport,
    SkipReport,
    dead_letter_record,
    dispatch_once_record,
    error_group_record,
    error_groups_record,
    event_detail_record,
    heartbeat_record,
    pause_record,
    stats_record,
    type_counts_record,
)
from outbox_tui.output.run import WORK_TOTALS, RunClock, RunReporter, status_line
from outbox_tui.output.tables import (
    counters_table,
    dead_letters_table,
    dedup_warning,
    error_groups_table,
    replay_text,
    skip_text,
    stats_tables,
)
from outbox_tui.output.values import age, iso, rate, seconds
from outbox_tui.output.writer import Output, PipeConsole

__all__ = [
    "CONSUMER_TOTALS",
    "COUNTERS",
    "HEARTBEAT_TOTALS",
    "WORK_TOTALS",
    "Output",
    "PipeConsole",
    "ReplayReport",
    "RunClock",
    "RunReporter",
    "SkipReport",
    "age",
    "counters_table",
    "dead_letter_record",
    "dead_letters_table",
    "dedup_warning",
    "dispatch_once_record",
    "error_group_record",
    "error_groups_record",
    "error_groups_table",
    "event_detail_record",
    "heartbeat_record",
    "iso",
    "pause_record",
    "rate",
    "replay_text",
    "seconds",
    "skip_text",
    "stats_record",
    "stats_tables",
    "status_line",
    "type_counts_record",
]
