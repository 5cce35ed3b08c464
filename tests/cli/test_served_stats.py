"""`stats` says which types each dispatcher serves, and which waiting types none serves,
with count and age (issue 9, defect 6)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

from rich.console import Console

from engine import create_engine
from engine.operating.insights import HeartbeatView, OverviewSnapshot, UnservedType
from engine.running.heartbeat import Heartbeat
from outbox_tui import output
from tests.cli.conftest import Cli, seed_orders, sqlite_only

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
MANY = [f"service.type-{i:02}" for i in range(12)]


def beat(instance_id: str, serves: list[str] | None) -> HeartbeatView:
    details = {"iterations": 7} if serves is None else {"iterations": 7, "serves": serves}
    return HeartbeatView(
        instance_id, "dispatcher", "vm", 42, "alive", NOW - timedelta(hours=1), NOW, 2.0, details
    )


def snapshot(*heartbeats: HeartbeatView) -> OverviewSnapshot:
    return OverviewSnapshot(
        taken_at=NOW,
        counts={"pending": 3},
        published_recent=0,
        recent_window_seconds=300,
        oldest_pending_at=NOW - timedelta(minutes=5),
        stuck_publishing=0,
        awaiting_purge=None,
        retention_seconds=None,
        heartbeats=heartbeats,
        unserved=[UnservedType("billing.invoiced", 3, NOW - timedelta(seconds=252), 252.0)],
    )


def rendered(snap: OverviewSnapshot, width: int | None) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width or 200, highlight=False, color_system=None)
    for table in output.stats_tables(snap, "sqlite+aiosqlite:///x.db", width=width):
        console.print(table)
    return out.getvalue()


def test_the_heartbeats_table_has_a_serves_column_cut_to_the_room():
    snap = snapshot(beat("vm:42", ["orders.placed", "orders.cancelled"]), beat("vm:43", MANY))
    text = rendered(snap, None)
    header = next(line for line in text.splitlines() if "instance" in line and "pid" in line)
    assert "serves" in header
    assert "orders.placed, orders.cancelled" in text
    assert "service.type-00, … (12 types)" in text  # 40 cells at most
    # The waiting types no live dispatcher serves: type, count and the oldest's age.
    assert "no dispatcher serves these (they wait)" in text
    row = next(line for line in text.splitlines() if "billing.invoiced" in line)
    assert "3" in row and "4m 12s" in row


def test_narrow_terminals_shorten_or_leave_out_the_serves_column():
    snap = snapshot(beat("vm:42", ["orders.placed", "orders.cancelled"]), beat("vm:43", MANY))
    at_104 = rendered(snap, 104)
    assert "2 types" in at_104 and "12 types" in at_104
    assert max(len(line) for line in at_104.splitlines()) <= 104
    at_80 = rendered(snap, 80)
    header = next(line for line in at_80.splitlines() if "instance" in line)
    assert "serves" not in header


def test_no_serves_column_for_dispatchers_that_do_not_say():
    text = rendered(snapshot(beat("vm:42", None)), None)
    header = next(line for line in text.splitlines() if "instance" in line and "pid" in line)
    assert "serves" not in header


@sqlite_only
async def test_stats_shows_what_each_dispatcher_serves(cli: Cli, database_url: str) -> None:
    await seed_orders(database_url)  # 20 orders, 4 of them cancelled: all pending
    engine = create_engine(database_url)
    try:
        hb = Heartbeat(engine, "billing-1:7", host="billing-1", pid=7)
        await hb.beat({"iterations": 1, "serves": ["orders.placed"]}, force=True)
    finally:
        await engine.dispose()
    result = cli("stats", env={"OUTBOX_DATABASE_URL": database_url})
    assert result.returncode == 0, result
    lines = result.stdout.splitlines()
    beats = next(line for line in lines if "billing-1:7" in line)
    assert beats.rstrip(" │").endswith("orders.placed"), beats
    waiting = next(line for line in lines if "orders.cancelled" in line)
    assert " 4 " in waiting, waiting  # the cancellations wait: nobody alive serves them
    assert waiting.rstrip(" │").endswith("s"), waiting  # and the oldest one's age
    record = cli("stats", "--json", env={"OUTBOX_DATABASE_URL": database_url}).json()
    assert record["heartbeats"][0]["serves"] == ["orders.placed"]
    assert [(u["event_type"], u["count"]) for u in record["unserved"]] == [("orders.cancelled", 4)]
