"""Who burned the CPU during a run, and how often PostgreSQL synced its WAL.

``measuring(ctx, pids)`` wraps a timed block: it samples /proc for the workers' CPU, this
database's backends' (pg_stat_activity), the broker's and the harness's own, the whole
machine's busy and iowait shares (/proc/stat), and PostgreSQL's WAL and commit counters.
With ``postgres=False`` (a SQLite run) there are no backends or WAL counters to read:
the iowait share is then what says how much the file's fsyncs cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.support import Context, connect

CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int, int]:
    """(busy, iowait, total) clock ticks of the whole machine since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, values[4], sum(values)


def cpu_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@dataclass
class Usage:
    """CPU of the workers and of this database's PostgreSQL backends, and WAL syncs.

    Processes seen at ``start`` count from there; later ones from zero (a backend born
    during the run did all its work in it). Remote servers give no backend CPU.
    """

    conn: asyncpg.Connection | None  # None: no PostgreSQL in this run (SQLite)
    worker_pids: Callable[[], Iterable[int]]
    skip_pids: set[int] = field(default_factory=set)
    other_pids: dict[int, str] = field(default_factory=dict)  # e.g. {broker pid: "broker"}
    first: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)
    wal0: dict[str, Any] = field(default_factory=dict)
    machine0: tuple[int, int, int] = (0, 0, 0)
    started: float = 0.0
    wall: float = 0.0

    async def _wal(self) -> dict[str, Any]:
        if self.conn is None:
            return {}
        row = await self.conn.fetchrow(
            "SELECT w.wal_records, w.wal_fpi, w.wal_bytes::bigint AS wal_bytes, w.wal_sync,"
            " w.wal_sync_time, d.xact_commit, current_setting('track_wal_io_timing') AS timing"
            " FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()"
        )
        return dict(row) if row else {}

    async def _pids(self) -> dict[int, str]:
        backends = []
        if self.conn is not None:
            backends = await self.conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
        found = {int(r["pid"]): "postgres" for r in backends if r["pid"] not in self.skip_pids}
        found.update(self.other_pids)
        found[os.getpid()] = "harness"
        found.update({pid: "workers" for pid in self.worker_pids()})
        return found

    async def sample(self, *, baseline: bool = False) -> None:
        for pid, kind in (await self._pids()).items():
            ticks = cpu_ticks(pid)
            if ticks is None:
                continue
            self.kinds[pid] = kind
            if pid not in self.first:
                self.first[pid] = ticks if baseline else 0
            self.last[pid] = ticks

    async def start(self) -> None:
        if self.conn is not None:
            await self.conn.execute("SELECT pg_stat_clear_snapshot()")
        self.wal0 = await self._wal()
        self.machine0 = machine_ticks()
        await self.sample(baseline=True)
        self.started = time.perf_counter()

    async def finish(self) -> dict[str, Any]:
        await self.sample()
        self.wall = time.perf_counter() - self.started
        if self.conn is not None:
            await self.conn.execute("SELECT pg_stat_clear_snapshot()")
        wal1 = await self._wal()
        busy, iowait, total = (b - a for a, b in zip(self.machine0, machine_ticks(), strict=True))
        cores = {"workers": 0.0, "postgres": 0.0, "harness": 0.0}
        for pid, kind in self.kinds.items():
            cores[kind] = cores.get(kind, 0.0) + (self.last[pid] - self.first[pid]) / CLK_TCK
        wall = max(self.wall, 1e-9)
        out: dict[str, Any] = {"wall_seconds": round(self.wall, 3)}
        out.update({f"{kind}_cores": round(cpu / wall, 2) for kind, cpu in cores.items()})
        out["machine_busy"] = round(busy / total, 2) if total else None
        out["machine_iowait"] = round(iowait / total, 2) if total else None
        out["worker_processes"] = sum(1 for kind in self.kinds.values() if kind == "workers")
        if self.wal0 and wal1:
            delta = {k: wal1[k] - self.wal0[k] for k in wal1 if k != "timing"}
            out["commits_per_second"] = round(delta["xact_commit"] / wall)
            out["wal_syncs_per_second"] = round(delta["wal_sync"] / wall)
            out["wal_mb_per_second"] = round(delta["wal_bytes"] / wall / 1e6, 1)
            if wal1["timing"] == "on":
                out["fsync_busy"] = round(delta["wal_sync_time"] / 1000 / wall, 2)
        return out


async def sampling(usage: Usage, until: asyncio.Event, every: float = 0.25) -> None:
    """Sample until ``until`` is set (catches short-lived backends' CPU)."""
    while not until.is_set():
        await usage.sample()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(until.wait(), every)


@contextlib.asynccontextmanager
async def measuring(
    ctx: Context, worker_pids: Callable[[], Iterable[int]], *, postgres: bool = True
) -> AsyncIterator[dict[str, Any]]:
    """Usage of the block's workers and backends; the dict is filled when the block ends.

    Samples on its own connection (asyncpg runs one query at a time and ``ctx.conn``
    polls), skipping ``ctx.conn``'s own backend; ``postgres=False``: no connection.
    """
    others = {ctx.broker_pid: "broker"} if ctx.broker_pid else {}
    conn = await connect(ctx.url) if postgres else None
    usage = Usage(conn, worker_pids, {ctx.conn.get_server_pid()}, others)
    stats: dict[str, Any] = {}
    try:
        await usage.start()
        stop = asyncio.Event()
        sampler = asyncio.create_task(sampling(usage, stop))
        try:
            yield stats
        finally:
            stop.set()
            await sampler
        stats.update(await usage.finish())
    finally:
        if conn is not None:
            await conn.close()
