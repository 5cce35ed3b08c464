"""The peer: pgqueuer, driven the way its own drain benchmark drives it.

The harness imports this module for the schema, the preload (pgqueuer's own batch
``enqueue``) and the queue count, and runs it as a worker process:

    python -m benchmarks.peer_pgqueuer [DSN] --batch-size 500 [--sleep-ms 10]
        [--max-concurrent-tasks N] [--loop uvloop|asyncio]

A worker connects, registers entrypoint ``bench`` (a no-op, or an ``asyncio.sleep``),
reports ready and waits for the go file like our dispatchers (benchmarks/bench_app.py),
then runs ``PgQueuer.run`` until SIGTERM. ``uvloop`` is pgqueuer's own default runner
(``pgq run``) and a dependency of the package, so it is the default here too. DSN defaults
to ``$OUTBOX_BENCH_PEER_DSN`` (kept off the command line, where ``ps`` would show it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import TextIO

import asyncpg

ENTRYPOINT = "bench"
QUEUE_TABLE = "pgqueuer"
ENQUEUE_CHUNK = 50_000


def available() -> bool:
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        return False
    return True


def version() -> str:
    import pgqueuer

    return str(pgqueuer.__version__)


async def install(conn: asyncpg.Connection) -> None:
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    queries = Queries(AsyncpgDriver(conn))
    if not await queries.schema_is_installed():
        await queries.install()


async def reset_and_preload(conn: asyncpg.Connection, count: int, body: bytes) -> None:
    """Empty pgqueuer's tables, then enqueue ``count`` jobs with its batch API."""
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    queries = Queries(AsyncpgDriver(conn))
    await queries.clear_queue()
    await queries.clear_queue_log()
    await queries.clear_statistics_log()
    for start in range(0, count, ENQUEUE_CHUNK):
        n = min(ENQUEUE_CHUNK, count - start)
        await queries.enqueue([ENTRYPOINT] * n, [body] * n, [0] * n)


async def count_queue(conn: asyncpg.Connection) -> int:
    """Jobs not yet completed: pgqueuer deletes a job when its completion is logged."""
    return int(await conn.fetchval(f"SELECT count(*) FROM {QUEUE_TABLE}"))


async def queue_empty(conn: asyncpg.Connection) -> bool:
    return await conn.fetchval(f"SELECT 1 FROM {QUEUE_TABLE} LIMIT 1") is None


# -- the worker process ---------------------------------------------------------------------


async def _wait_for_go(sync_dir: Path) -> None:
    (sync_dir / f"ready.{os.getpid()}").touch()
    while True:
        if (sync_dir / "go").exists():
            return
        await asyncio.sleep(0.002)


def _call_log(directory: Path) -> TextIO:
    return (directory / f"calls.{os.getpid()}.tsv").open("a", buffering=1 << 20)


async def work(args: argparse.Namespace) -> None:
    import time

    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job

    sleep_seconds = args.sleep_ms / 1000
    log_dir = os.environ.get("OUTBOX_BENCH_LOG_DIR")
    calls = _call_log(Path(log_dir)) if log_dir else None
    conn = await asyncpg.connect(args.dsn)
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint(ENTRYPOINT)
    async def bench(job: Job) -> None:
        if calls is not None:
            calls.write(f"{job.id}\t{time.time_ns()}\n")  # as bench_app's CallLog
        if sleep_seconds:
            await asyncio.sleep(sleep_seconds)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, pgq.shutdown.set)
    sync_dir = os.environ.get("OUTBOX_BENCH_SYNC_DIR")
    if sync_dir:
        await _wait_for_go(Path(sync_dir))
    try:
        await pgq.run(batch_size=args.batch_size, max_concurrent_tasks=args.max_concurrent_tasks)
    finally:
        if calls is not None:
            calls.close()
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a pgqueuer worker for benchmarks/bench.py")
    parser.add_argument("dsn", nargs="?", default=os.environ.get("OUTBOX_BENCH_PEER_DSN"))
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--sleep-ms", type=float, default=0.0)
    parser.add_argument("--max-concurrent-tasks", type=int, default=None)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args(argv)
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(work(args))
    else:
        asyncio.run(work(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
