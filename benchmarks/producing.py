"""Timed runs with producers (benchmarks/producers.py): the write path and wake-up latency."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from typing import Any

from benchmarks import drains, support, usage
from benchmarks.support import Context, Fleet, WorkerFailed

BUSINESS_TABLE = """CREATE TABLE IF NOT EXISTS bench_orders (
    id varchar(36) PRIMARY KEY, n integer NOT NULL)"""


def _producer(what: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.producers", what, *args]


async def _wait_exit(fleet: Fleet, procs: list[int], progress: Any, seconds: float) -> None:
    """Until the workers at indexes ``procs`` exit; the bar shows elapsed of ``seconds``."""
    started = time.monotonic()
    while True:
        fleet.check_alive()
        if all(fleet.procs[i].poll() is not None for i in procs):
            progress(int(seconds * 10))
            return
        progress(min(int((time.monotonic() - started) * 10), int(seconds * 10)))
        await asyncio.sleep(support.POLL_SECONDS)


def _results(fleet: Fleet) -> dict[int, dict[str, Any]]:
    found = {}
    for path in fleet.calls_dir.glob("result.*.json"):
        found[int(path.name.split(".")[1])] = json.loads(path.read_text())
    return found


async def write_round(ctx: Context, mode: str, *, producers: int, seconds: float) -> dict[str, Any]:
    """``producers`` processes committing units of work for ``seconds`` (plain or outbox)."""
    await ctx.conn.execute(BUSINESS_TABLE)
    await ctx.conn.execute("TRUNCATE bench_orders")
    await support.reset_outbox(ctx.conn)
    await support.settle(ctx.conn)
    fleet = drains.new_fleet(ctx)
    env = fleet.env({"OUTBOX_DATABASE_URL": ctx.url})
    for _ in range(producers):
        fleet.start(_producer("write", "--mode", mode, "--seconds", str(seconds)), env)
    try:
        await fleet.wait_ready()
        progress = ctx.progress(f"{mode} × {producers}", int(seconds * 10))
        async with usage.measuring(ctx, lambda: fleet.pids) as stats:
            fleet.go()
            await _wait_exit(fleet, list(range(producers)), progress, seconds)
        codes = await fleet.stop()
    except BaseException:
        fleet.kill()
        raise
    if any(codes):
        raise WorkerFailed(f"write {mode}: exit codes {codes}:\n{fleet.log_tail()}")
    results = list(_results(fleet).values())
    commits = sum(r["commits"] for r in results)
    elapsed = statistics.mean(r["seconds"] for r in results)
    return {
        "commits": commits,
        "seconds": round(elapsed, 3),
        "rate": round(commits / elapsed, 1),
        "producers": producers,
        "usage": stats,
    }


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def wakeup_latency(
    ctx: Context, events: int, *, min_gap: float, max_gap: float
) -> dict[str, Any]:
    """One idle dispatcher (default 1 s idle sleep), one producer with the wake-up on."""
    await support.reset_outbox(ctx.conn)
    await support.settle(ctx.conn)
    fleet = drains.new_fleet(ctx)
    env = drains.ours_env(ctx, fleet)
    fleet.start(drains.ours_argv(ctx, idle_sleep=None), env)
    gaps = ["--min-gap", str(min_gap), "--max-gap", str(max_gap)]
    fleet.start(_producer("latency", "--events", str(events), *gaps), env)
    expected = events * (min_gap + max_gap) / 2
    try:
        await fleet.wait_ready()
        progress = ctx.progress("producer → handler", int(expected * 10))
        async with usage.measuring(ctx, lambda: fleet.pids) as stats:
            fleet.go()
            await _wait_exit(fleet, [1], progress, expected)
            await support.wait_until_empty(
                lambda: support.outbox_empty(ctx.conn),
                lambda: support.count_active(ctx.conn),
                total=events,
                fleet=fleet,
                progress=lambda _n: None,
                limit=30.0,
            )
        codes = await fleet.stop()
    except BaseException:
        fleet.kill()
        raise
    if any(codes):
        raise WorkerFailed(f"latency: exit codes {codes}:\n{fleet.log_tail()}")
    committed = dict(_results(fleet)[fleet.procs[1].pid]["committed"])
    started = dict(fleet.calls())
    missing = set(committed) - set(started)
    if missing:
        raise WorkerFailed(f"latency: {len(missing)} events never reached the handler")
    latencies = [(started[k] - committed[k]) * 1000 for k in committed]
    return {
        "events": events,
        "p50_ms": round(_percentile(latencies, 0.5), 1),
        "p90_ms": round(_percentile(latencies, 0.9), 1),
        "p99_ms": round(_percentile(latencies, 0.99), 1),
        "max_ms": round(max(latencies), 1),
        "gap_seconds": [min_gap, max_gap],
        "idle_sleep_seconds": 1.0,
        "usage": stats,
    }
