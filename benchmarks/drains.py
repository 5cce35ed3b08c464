"""One timed drain each: our dispatchers, pgqueuer, the pgbench SQL floor, the relay and raw
aio-pika, all with the same clock, stop rule and accounting.

The clock starts when the go file appears (every worker is up and waiting) and stops at
the first 50 ms poll that finds nothing left, or at ``cap`` seconds (then the rate is what
was done by then); then the workers get SIGTERM.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.engine import make_url

from benchmarks import peer_amqp, peer_pgqueuer, support, usage
from benchmarks.bench_app import EFFECTS_TABLE
from benchmarks.support import Context, Fleet, WorkerFailed
from engine.dispatch import claim_sql, fenced_writes

OURS_APP = "benchmarks.bench_app"


async def _timed(
    ctx: Context,
    fleet: Fleet,
    *,
    label: str,
    total: int,
    empty: Callable[[], Awaitable[bool]],
    remaining: Callable[[], Awaitable[int]],
    cap: float | None = None,
    handler_calls: bool = True,
) -> dict[str, Any]:
    try:
        await fleet.wait_ready()
        async with usage.measuring(ctx, lambda: fleet.pids) as stats:
            started = fleet.go()
            ended, emptied = await support.wait_until_empty(
                empty,
                remaining,
                total=total,
                fleet=fleet,
                progress=ctx.progress(label, total),
                limit=ctx.timeout,
                cap=cap,
                logged=fleet.calls_logged if handler_calls else None,
            )
            done = total if emptied else total - await remaining()
        codes = await fleet.stop()
    except BaseException:
        fleet.kill()
        raise
    if any(codes):
        raise WorkerFailed(f"{label}: worker exit codes {codes}:\n{fleet.log_tail()}")
    seconds = ended - started
    run: dict[str, Any] = {
        "events": done,
        "seconds": round(seconds, 3),
        "rate": round(done / seconds, 1),
        "capped": not emptied,
        "usage": stats,
    }
    if handler_calls:
        run.update(support.check_calls(fleet.calls(), done, exact=emptied))
    return run


def ours_argv(
    ctx: Context, *, concurrency: int | None = None, idle_sleep: float | None = 0.2
) -> list[str]:
    argv = [*support.outbox_cli(), "--dispatch", "--installed-app", OURS_APP]
    argv += ["--batch-size", str(ctx.batch_size)]
    if idle_sleep is not None:
        argv += ["--idle-sleep-seconds", str(idle_sleep)]
    if concurrency and ctx.max_concurrency_flag:
        argv += ["--max-concurrency", str(concurrency)]
    return argv


def ours_env(
    ctx: Context, fleet: Fleet, *, sleep_ms: float = 0.0, write: str = "", tracing: str = ""
) -> dict[str, str]:
    return fleet.env(
        {
            "OUTBOX_DATABASE_URL": ctx.url,
            "OUTBOX_BENCH_SLEEP_MS": str(sleep_ms),
            "OUTBOX_BENCH_WRITE": write,
            "OUTBOX_BENCH_TRACING": tracing,
            "OUTBOX_LOG_LEVEL": "WARNING",
        }
    )


async def load_outbox(
    ctx: Context, events: int, ordering_key: Callable[[int], str] | None = None
) -> None:
    await support.reset_outbox(ctx.conn)
    await support.preload_outbox(ctx.conn, events, ordering_key=ordering_key)
    await support.settle(ctx.conn, "outbox_events")


def new_fleet(ctx: Context) -> Fleet:
    fleet = Fleet(ctx.workdir / "run")
    fleet.prepare()
    return fleet


async def ours(
    ctx: Context,
    events: int,
    *,
    processes: int = 2,
    sleep_ms: float = 0.0,
    concurrency: int | None = None,
    ordering_key: Callable[[int], str] | None = None,
    cap: float | None = None,
    label: str = "ours",
    write: str = "",
    tracing: str = "",
) -> dict[str, Any]:
    """``processes`` × ``outbox-tui --dispatch`` draining ``events`` preloaded events;
    ``write``: the handler's business row, ``tracing``: ``sdk`` to trace with OpenTelemetry's
    SDK (benchmarks/bench_app.py)."""
    await load_outbox(ctx, events, ordering_key)
    if write:
        await ctx.conn.execute(EFFECTS_TABLE)
        await ctx.conn.execute("TRUNCATE bench_effects")
    fleet = new_fleet(ctx)
    env = ours_env(ctx, fleet, sleep_ms=sleep_ms, write=write, tracing=tracing)
    for _ in range(processes):
        fleet.start(ours_argv(ctx, concurrency=concurrency), env)
    run = await _timed(
        ctx,
        fleet,
        label=label,
        total=events,
        empty=lambda: support.outbox_empty(ctx.conn),
        remaining=lambda: support.count_active(ctx.conn),
        cap=cap,
    )
    run["processes"] = processes
    if concurrency and ctx.max_concurrency_flag:
        run["max_concurrency"] = concurrency
    if write:
        rows = await ctx.conn.fetchval("SELECT count(*) FROM bench_effects")
        if rows != events:
            raise WorkerFailed(f"{label}: {rows:,} business rows for {events:,} events")
        run["business_rows"] = rows
    return run


async def pgqueuer(
    ctx: Context,
    events: int,
    *,
    processes: int = 2,
    sleep_ms: float = 0.0,
    max_concurrent_tasks: int | None = None,
    loop: str = "uvloop",
    cap: float | None = None,
    label: str = "pgqueuer",
) -> dict[str, Any]:
    """``processes`` pgqueuer workers draining ``events`` jobs enqueued with its batch API."""
    await peer_pgqueuer.install(ctx.conn)
    await peer_pgqueuer.reset_and_preload(ctx.conn, events, support.payload(0).encode())
    await support.settle(ctx.conn, peer_pgqueuer.QUEUE_TABLE)
    fleet = new_fleet(ctx)
    env = fleet.env({"OUTBOX_BENCH_PEER_DSN": support.libpq_dsn(ctx.url)})
    argv = [sys.executable, "-m", "benchmarks.peer_pgqueuer", "--batch-size", str(ctx.batch_size)]
    argv += ["--sleep-ms", str(sleep_ms), "--loop", loop]
    if max_concurrent_tasks:
        argv += ["--max-concurrent-tasks", str(max_concurrent_tasks)]
    for _ in range(processes):
        fleet.start(argv, env)
    run = await _timed(
        ctx,
        fleet,
        label=label,
        total=events,
        empty=lambda: peer_pgqueuer.queue_empty(ctx.conn),
        remaining=lambda: peer_pgqueuer.count_queue(ctx.conn),
        cap=cap,
    )
    run.update(processes=processes, loop=loop, max_concurrent_tasks=max_concurrent_tasks)
    return run


# -- the SQL floor: pgbench running the claim and the completion ------------------------------


def pgbench_binary() -> str | None:
    pgbin = os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin")
    candidate = os.path.join(pgbin, "pgbench")
    return candidate if os.access(candidate, os.X_OK) else shutil.which("pgbench")


def floor_script(batch: int, *, order_by: str, unordered_only: bool) -> str:
    """engine.dispatch's claim and fenced completion, as pgbench runs them (one commit each).

    The claim is ``Claimer.claim`` for PostgreSQL (an abandoned row first, else up to
    ``batch`` due rows, ``FOR UPDATE SKIP LOCKED``, the update finding them by address,
    the columns it returns). pgbench keeps one row of a result, so the claimed rows come
    back aggregated: their ids and versions as the strings the completion takes, as
    ``mark_published`` does (word for word, with ``now()``, this client's holder and
    U+001F for its parameters), and every returned column as an array, as the dispatcher
    reads them (an empty claim gives empty strings and arrays: the nulls of an aggregate
    over no rows failed pgbench). With
    ``seq`` ordering, each client keeps the claim's keyset floor as a dispatcher does
    (``:seq_floor``, from ``-D seq_floor=0``): after a full batch, the next claim starts
    after its last row; otherwise at 0.
    """
    unordered = " AND ordering_key IS NULL" if unordered_only else ""
    keyset = order_by == "seq"
    floor = " AND seq >= :seq_floor" if keyset else ""
    holder = "('floor-' || :client_id::text)"
    next_floor = (
        f",\n  CASE WHEN count(*) >= {batch} THEN max(seq) + 1 ELSE 0 END AS seq_floor"
        if keyset
        else ""
    )
    complete = (
        fenced_writes._PUBLISH_PG.element.text.replace(":now", "now()")
        .replace(":dispatcher_id", holder)
        .replace(":ids", ":claimed_ids")
        .replace(":versions", ":claimed_versions")
        .replace(":separator", "chr(31)")
    )
    return f"""WITH abandoned AS (
  SELECT ctid AS ref FROM outbox_events WHERE locked_until IS NOT NULL AND locked_until < now()
  ORDER BY locked_until LIMIT 1 FOR UPDATE SKIP LOCKED
), waiting AS (
  SELECT ctid AS ref FROM outbox_events
  WHERE status IN ('pending', 'publishing', 'failed'){unordered}
    AND status IN ('pending', 'failed')
    AND (next_retry_at IS NULL OR next_retry_at <= now())
    AND (locked_until IS NULL OR locked_until < now()){floor}
    AND NOT EXISTS (SELECT id FROM abandoned)
  ORDER BY {order_by} LIMIT {batch} FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE outbox_events SET status = 'publishing', claim_version = claim_version + 1,
    attempt_count = attempt_count + 1, locked_by = {holder},
    locked_until = now() + interval '30 seconds'
  WHERE ctid = ANY(ARRAY(SELECT ref FROM abandoned UNION ALL SELECT ref FROM waiting))
  RETURNING {", ".join(claim_sql.CLAIM_RETURNS)}, payload
)
SELECT coalesce(chr(31) || string_agg(id, chr(31)), '') AS claimed_ids,
  coalesce(string_agg(claim_version::text, ','), '') AS claimed_versions,
  coalesce(array_agg(claimed), '{{}}') AS claimed_rows{next_floor}
FROM claimed
\\gset
{complete};
"""


async def floor(ctx: Context, events: int, *, clients: int = 2) -> dict[str, Any]:
    """pgbench, ``clients`` connections, claiming and completing until the table is drained."""
    binary = pgbench_binary()
    if binary is None:
        raise WorkerFailed("pgbench not found (set PGBIN)")
    await load_outbox(ctx, events)
    has_seq = await support.has_column(ctx.conn, "outbox_events", "seq")
    keyed = await support.has_column(ctx.conn, "outbox_events", "ordering_key")
    workdir = ctx.workdir / "floor"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    script = workdir / "claim_complete.sql"
    script.write_text(
        floor_script(ctx.batch_size, order_by="seq" if has_seq else "id", unordered_only=keyed)
    )
    url = make_url(ctx.url)
    # Enough rounds to drain; the last ones find nothing and cost a millisecond.
    # (+4: a client whose floor ran past the last rows has an empty round before it
    # starts over.)
    rounds = math.ceil(events / ctx.batch_size / clients) + 4
    argv = [binary, "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients)]
    argv += ["-D", "seq_floor=0"]
    argv += ["-t", str(rounds), "-f", str(script), "-h", url.host or "127.0.0.1"]
    argv += ["-p", str(url.port or 5432), "-U", url.username or "", url.database or ""]
    env = dict(os.environ, PGPASSWORD=url.password or "")
    progress = ctx.progress("pgbench floor", events)
    pids: list[int] = []
    async with usage.measuring(ctx, lambda: pids) as stats:
        started = time.perf_counter()
        with (workdir / "pgbench.log").open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env
            )
            pids.append(proc.pid)
            code = await proc.wait()
        ended = time.perf_counter()
    progress(events)
    if code != 0:
        log_text = (workdir / "pgbench.log").read_text(errors="replace")[-2000:]
        raise WorkerFailed(f"pgbench exited with {code}:\n{log_text}")
    left = await support.count_active(ctx.conn)
    if left:
        raise WorkerFailed(f"pgbench left {left} of {events} events undrained")
    seconds = ended - started
    return {
        "events": events,
        "seconds": round(seconds, 3),
        "rate": round(events / seconds, 1),
        "clients": clients,
        "usage": stats,
    }


# -- the relay -----------------------------------------------------------------------------


async def relay(ctx: Context, events: int, *, cap: float | None = None) -> dict[str, Any]:
    """One ``outbox-tui --dispatch --amqp-url`` process relaying ``events`` to RabbitMQ."""
    assert ctx.amqp_url is not None
    await peer_amqp.prepare_queue(ctx.amqp_url)
    await load_outbox(ctx, events)
    fleet = new_fleet(ctx)
    env = ours_env(ctx, fleet)
    env["OUTBOX_AMQP_URL"] = ctx.amqp_url
    fleet.start(ours_argv(ctx), env)
    run = await _timed(
        ctx,
        fleet,
        label="ours: relay",
        total=events,
        empty=lambda: support.outbox_empty(ctx.conn),
        remaining=lambda: support.count_active(ctx.conn),
        cap=cap,
        handler_calls=False,
    )
    run["queued"] = await peer_amqp.queue_depth(ctx.amqp_url)
    if run["queued"] < run["events"]:
        raise WorkerFailed(f"relay: {run['queued']} messages queued for {run['events']} events")
    return run


async def raw_publish(ctx: Context, events: int, *, body_size: int) -> dict[str, Any]:
    """aio-pika alone: the same number of confirmed publishes of the same size."""
    assert ctx.amqp_url is not None
    await peer_amqp.prepare_queue(ctx.amqp_url)
    fleet = new_fleet(ctx)
    env = fleet.env({"OUTBOX_BENCH_AMQP_URL": ctx.amqp_url})
    argv = [sys.executable, "-m", "benchmarks.peer_amqp", "--count", str(events)]
    argv += ["--body-size", str(body_size), "--batch", str(ctx.batch_size)]
    fleet.start(argv, env)

    async def exited() -> bool:
        return all(p.poll() is not None for p in fleet.procs)

    async def unknown() -> int:
        return events

    run = await _timed(
        ctx,
        fleet,
        label="aio-pika",
        total=events,
        empty=exited,
        remaining=unknown,
        handler_calls=False,
    )
    run["queued"] = await peer_amqp.queue_depth(ctx.amqp_url)
    if run["queued"] < events:
        raise WorkerFailed(f"aio-pika: {run['queued']} messages queued of {events}")
    return run
