"""Scenario j's two sides: one ``outbox-tui --dispatch`` draining a SQLite file, and its
SQL floor, the same claim and completion statements in a loop with nothing around them.

SQLite serialises writers, so one process is the whole drain; a second would only wait
for the write lock. The file lives in the harness's workdir, on a real disk: on tmpfs an
fsync costs nothing and each commit (two per batch, synchronous=FULL in WAL mode, the
engine's default) would be flattered.

Both sides are worker processes of a ``Fleet`` that start on its go file, and both are
timed alike: the clock runs from the go file to the first 50 ms poll that finds no
active row. Run as ``python -m benchmarks.sqlite_drain --url URL --batch-size N`` this
module is the floor's process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks import drains, support, usage
from benchmarks.bench_app import EFFECTS_TABLE, wait_for_go
from benchmarks.support import Context, Fleet, WorkerFailed
from engine import create_engine, create_schema
from engine.clock import utc_now, uuid7
from engine.dispatch import fenced_writes
from engine.dispatch.claimer import Claimer
from engine.storage.schema import ACTIVE_PREDICATE

FLOOR_ID = "floor"
LEASE = timedelta(seconds=30)
_TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"  # how UtcDateTime stores an instant on SQLite


def database_path(ctx: Context) -> Path:
    return ctx.workdir / "sqlite" / "outbox.db"


def url_of(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


async def load(path: Path, events: int) -> None:
    """A fresh file with ``events`` pending events, the payloads of the PostgreSQL preload.

    One executemany in one transaction through sqlite3, SQLite's counterpart of the COPY
    (no per-row bind processing of SQLAlchemy's types); then a WAL checkpoint, so every
    run starts from the same file state.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        stale.unlink(missing_ok=True)
    engine = create_engine(url_of(path))
    try:
        await create_schema(engine)
    finally:
        await engine.dispose()
    created = utc_now().strftime(_TIME_FORMAT)
    rows = (
        (uuid7(), "acme", support.EVENT_TYPE, 1, "bench", str(i), support.payload(i), created)
        for i in range(events)
    )
    with sqlite3.connect(path, isolation_level=None) as db:
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO outbox_events (id, tenant_id, event_type, event_version,"
            " aggregate_type, aggregate_id, payload, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


class Watcher:
    """The harness's read-only view of the file (WAL readers never block the writer)."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)

    async def empty(self) -> bool:
        found = self.db.execute(
            f"SELECT 1 FROM outbox_events WHERE {ACTIVE_PREDICATE} LIMIT 1"
        ).fetchone()
        return found is None

    async def remaining(self) -> int:
        found = self.db.execute(f"SELECT count(*) FROM outbox_events WHERE {ACTIVE_PREDICATE}")
        return int(found.fetchone()[0])

    def close(self) -> None:
        self.db.close()


async def _timed(
    ctx: Context, fleet: Fleet, path: Path, *, label: str, events: int, exits_itself: bool
) -> dict[str, Any]:
    watcher = Watcher(path)
    try:
        await fleet.wait_ready()
        async with usage.measuring(ctx, lambda: fleet.pids, postgres=False) as stats:
            started = fleet.go()
            ended, _ = await support.wait_until_empty(
                watcher.empty,
                watcher.remaining,
                total=events,
                fleet=fleet,
                progress=ctx.progress(label, events),
                limit=ctx.timeout,
            )
        # The floor exits by itself once it claims nothing; a SIGTERM then could land in
        # its interpreter's shutdown, after Python put back the default (fatal) action.
        codes = await (_exited(fleet) if exits_itself else fleet.stop())
    except BaseException:
        fleet.kill()
        raise
    finally:
        watcher.close()
    if any(codes):
        raise WorkerFailed(f"{label}: worker exit codes {codes}:\n{fleet.log_tail()}")
    seconds = ended - started
    run: dict[str, Any] = {
        "events": events,
        "seconds": round(seconds, 3),
        "rate": round(events / seconds, 1),
        "processes": 1,
        "usage": stats,
    }
    if not exits_itself:  # our CLI logs its handler calls; the floor has no handler
        run.update(support.check_calls(fleet.calls(), events))
    return run


async def _exited(fleet: Fleet, limit: float = 60.0) -> list[int]:
    """Wait for workers that stop on their own; SIGTERM (``Fleet.stop``) after ``limit`` s."""
    for proc in fleet.procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(proc.wait, limit)
    return await fleet.stop()


async def ours(ctx: Context, events: int, *, write: str = "") -> dict[str, Any]:
    """One ``outbox-tui --dispatch`` with the bench app, as scenario a runs it (``write``:
    the handler's business row, benchmarks/bench_app.py)."""
    path = database_path(ctx)
    await load(path, events)
    if write:
        with sqlite3.connect(path) as db:
            db.execute(EFFECTS_TABLE)
        db.close()
    fleet = drains.new_fleet(ctx)
    env = drains.ours_env(replace(ctx, url=url_of(path)), fleet, write=write)
    fleet.start(drains.ours_argv(ctx), env)
    label = f"ours: SQLite{', ' + write if write else ''}"
    run = await _timed(ctx, fleet, path, label=label, events=events, exits_itself=False)
    if write:
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT count(*) FROM bench_effects").fetchone()[0]
        db.close()
        if rows != events:
            raise WorkerFailed(f"{label}: {rows:,} business rows for {events:,} events")
        run["business_rows"] = rows
    return run


async def floor(ctx: Context, events: int) -> dict[str, Any]:
    """This module as a process: Claimer.claim and mark_published by hand until empty."""
    path = database_path(ctx)
    await load(path, events)
    fleet = drains.new_fleet(ctx)
    argv = [sys.executable, "-m", "benchmarks.sqlite_drain", "--url", url_of(path)]
    argv += ["--batch-size", str(ctx.batch_size)]
    fleet.start(argv, fleet.env())
    return await _timed(ctx, fleet, path, label="SQLite floor", events=events, exits_itself=True)


# -- the floor's process -------------------------------------------------------------------


async def drain_floor(url: str, batch_size: int, sync_dir: str | None) -> int:
    """The dispatcher's two transactions per batch (claim, then complete), nothing else.

    Unscoped (every type), as pgbench's floor of scenario d: the dispatcher's scope and
    pause reads are its own overhead. The key cursor and the ordered/unordered turn are
    carried from claim to claim as the dispatcher carries them.
    """
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:  # open the file before the clock starts
            await conn.exec_driver_sql("SELECT 1")
        if sync_dir:
            wait_for_go(sync_dir)
        total, claimer = 0, Claimer(FLOOR_ID, batch_size, LEASE)
        while True:
            async with engine.begin() as conn:
                batch = await claimer.claim(conn, utc_now())
            claimer.committed(batch)
            if not batch.rows:
                return total
            claims = [(row.event_id, row.claim_version) for row in batch.rows]
            async with engine.begin() as conn:
                done = await fenced_writes.mark_published(
                    conn, claims, fenced_writes.Fence(FLOOR_ID, utc_now())
                )
            total += len(done)
    finally:
        await engine.dispose()


def main(argv: list[str] | None = None) -> int:
    from outbox_tui.cli.event_loop import run_coroutine  # the loop the CLI's side runs on

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", required=True)
    parser.add_argument("--batch-size", type=int, default=500)
    args = parser.parse_args(argv)
    done = run_coroutine(
        drain_floor(args.url, args.batch_size, os.environ.get("OUTBOX_BENCH_SYNC_DIR"))
    )
    print(f"floor: {done} events published")
    return 0


if __name__ == "__main__":
    sys.exit(main())
