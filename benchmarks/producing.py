"""Timed runs with producers (benchmarks/producers.py): the write path and wake-up latency."""

from __future__ import annotations

import asyncio
import json
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


async def write_schedule(
    ctx: Context, schedule: list[str], *, producers: int, seconds: float, gap: float = 0.5
) -> list[dict[str, Any]]:
    """``producers`` processes running the modes of ``schedule`` in slots of ``seconds``.

    One run per slot: every producer switches mode at the same instant (start time +
    n × (seconds + gap)), so the modes alternate every few seconds without restarting
    processes and the machine's other load hits both alike. Usage is sampled per slot.
    """
    await ctx.conn.execute(BUSINESS_TABLE)
    await ctx.conn.execute("TRUNCATE bench_orders")
    await support.reset_outbox(ctx.conn)
    await support.settle(ctx.conn)
    fleet = drains.new_fleet(ctx)
    env = fleet.env({"OUTBOX_DATABASE_URL": ctx.url})
    argv = _producer("write", "--schedule", ",".join(schedule), "--seconds", str(seconds))
    for _ in range(producers):
        fleet.start([*argv, "--gap", str(gap)], env)
    slots: list[dict[str, Any]] = []
    try:
        await fleet.wait_ready()
        progress = ctx.progress(f"{producers} producers, {len(schedule)} slots", len(schedule))
        start = time.time() + 0.5
        fleet.go(at=start)
        for n in range(len(schedule)):
            slot_start = start + n * (seconds + gap)
            await asyncio.sleep(max(0.0, slot_start - time.time()))
            async with usage.measuring(ctx, lambda: fleet.pids) as stats:
                await asyncio.sleep(max(0.0, slot_start + seconds - time.time()))
            slots.append(stats)
            fleet.check_alive()
            progress(n + 1)
        await _wait_exit(fleet, list(range(producers)), lambda _n: None, 0)
        codes = await fleet.stop()
    except BaseException:
        fleet.kill()
        raise
    if any(codes):
        raise WorkerFailed(f"write: exit codes {codes}:\n{fleet.log_tail()}")
    results = list(_results(fleet).values())
    runs = []
    for n, mode in enumerate(schedule):
        commits = sum(r["slots"][n]["commits"] for r in results)
        runs.append(
            {
                "mode": mode,
                "commits": commits,
                "seconds": seconds,
                "rate": round(commits / seconds, 1),
                "producers": producers,
                "usage": slots[n],
            }
        )
    return runs


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
