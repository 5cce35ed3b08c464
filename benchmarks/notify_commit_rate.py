"""Producers' commit rate with and without wake-up notifications, as ratios in one run.

Usage: python benchmarks/notify_commit_rate.py [SERVER_URL] [--producers 8] [--seconds 4]
       [--rounds 3] [--interval-ms 100] [--clients engine,asyncpg,pgbench]

SERVER_URL (default: $OUTBOX_TEST_PG_URL) is a PostgreSQL server the role may create
databases on; the benchmark works in a throwaway database that it drops afterwards. During
every run one connection LISTENs on the channel, as an idle dispatcher would.

Modes (how producers wake dispatchers):

  none          no notification at all: the baseline ("a")
  trigger       an AFTER INSERT ... FOR EACH STATEMENT trigger calling pg_notify ("b")
  in_tx         pg_notify called inside the business transaction ("b" without a trigger)
  after_commit  engine.running.wakeup.CommitNotifier: one pg_notify on its own connection after the
                commit, at most one per --interval-ms per producer process ("c", chosen)

Clients (who commits; each producer commits single-row transactions as fast as it can):

  engine   the real write path: one OS process per producer, each with its own engine,
           ``unit_of_work`` + ``OutboxEventPublisher.publish``; after_commit installs the
           notifier with ``enable_commit_notifications``. All start together at a barrier.
  asyncpg  plain INSERT transactions on asyncpg connections in one process: less client
           work per commit, so more of the database's own cost shows; after_commit pokes
           the same CommitNotifier after each commit.
  pgbench  (if installed) the same INSERT from a C client, the closest to the server's own
           ceiling; after_commit runs a second pgbench sending pg_notify at the worst-case
           rate of the coalesced design (producers x 1000 / interval_ms per second).

Rounds interleave the modes so machine noise hits all alike. Reported per client and mode:
the median commit rate, the median of the per-round ratios to "none" of the same client and
round ("vs none"), and those ratios sorted (their spread shows the noise).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.engine import URL, make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import (
    EventRegistry,
    OutboxEventPublisher,
    TaskContext,
    create_engine,
    create_schema,
    unit_of_work,
)
from engine.clock import uuid7
from engine.running.wakeup import (
    DEFAULT_CHANNEL,
    DEFAULT_INTERVAL_MS,
    CommitNotifier,
    enable_commit_notifications,
)

MODES = ("none", "trigger", "in_tx", "after_commit")
CLIENTS = ("engine", "asyncpg", "pgbench")
CTX = TaskContext("acme", "bench", "req")
NOTIFY_SQL = f"SELECT pg_notify('{DEFAULT_CHANNEL}', '')"
TRIGGER_SQL = [
    f"""CREATE OR REPLACE FUNCTION bench_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN PERFORM pg_notify('{DEFAULT_CHANNEL}', ''); RETURN NULL; END $$""",
    """CREATE TRIGGER bench_outbox_notify AFTER INSERT ON outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION bench_outbox_notify()""",
]
DROP_TRIGGER_SQL = "DROP TRIGGER IF EXISTS bench_outbox_notify ON outbox_events"
PAYLOAD = '{"n": 1, "tenant_id": "acme", "actor_id": "bench", "request_id": "req"}'
INSERT_SQL = (
    "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, aggregate_type,"
    " aggregate_id, payload) VALUES ($1, 'acme', 'bench.happened', 1, 'bench', '1', $2::jsonb)"
)


def _asyncpg_args(url: str | URL) -> dict[str, Any]:
    return make_url(url).translate_connect_args(username="user")


# -- the engine client: one process per producer ---------------------------------------
async def _engine_producer(
    url: str, mode: str, seconds: float, interval_ms: float, barrier: Any
) -> int:
    engine = create_engine(url, pool_size=2)
    registry = EventRegistry()
    registry.register_event("bench.happened", 1)
    notifier = (
        enable_commit_notifications(engine, interval_ms=interval_ms)
        if mode == "after_commit"
        else None
    )
    commits = 0
    try:
        async with engine.connect() as conn:  # connect before the clock starts
            await conn.execute(text("SELECT 1"))
        await asyncio.to_thread(barrier.wait)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            async with unit_of_work(engine, registry=registry, context=CTX) as session:
                await OutboxEventPublisher(session).publish(
                    "bench.happened", {"n": commits}, aggregate_type="bench", aggregate_id="1"
                )
                if mode == "in_tx":
                    await session.execute(text(NOTIFY_SQL))
            commits += 1
    finally:
        if notifier is not None:
            await notifier.aclose()
        await engine.dispose()
    return commits


def _engine_process(
    url: str, mode: str, seconds: float, interval_ms: float, barrier: Any, out: Any
):
    out.put(asyncio.run(_engine_producer(url, mode, seconds, interval_ms, barrier)))


async def engine_client(url: str, mode: str, producers: int, seconds: float, interval_ms: float):
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(producers), ctx.Queue()
    procs = [
        ctx.Process(target=_engine_process, args=(url, mode, seconds, interval_ms, barrier, out))
        for _ in range(producers)
    ]
    for proc in procs:
        proc.start()
    counts = [await asyncio.to_thread(out.get) for _ in procs]
    for proc in procs:
        await asyncio.to_thread(proc.join)
    return sum(counts) / seconds


# -- the asyncpg client: plain inserts, one process ---------------------------------------
async def asyncpg_client(url: str, mode: str, producers: int, seconds: float, interval_ms: float):
    conns = [await asyncpg.connect(**_asyncpg_args(url)) for _ in range(producers)]
    notifier = None
    if mode == "after_commit":
        engine = create_engine(url)
        notifier = CommitNotifier(engine, interval_ms=interval_ms)
    deadline = time.monotonic() + seconds

    async def produce(conn: Any) -> int:
        commits = 0
        while time.monotonic() < deadline:
            async with conn.transaction():
                await conn.execute(INSERT_SQL, uuid7(), PAYLOAD)
                if mode == "in_tx":
                    await conn.execute(NOTIFY_SQL)
            if notifier is not None:
                notifier.poke()
            commits += 1
        return commits

    try:
        counts = await asyncio.gather(*(produce(c) for c in conns))
    finally:
        for conn in conns:
            await conn.close()
        if notifier is not None:
            await notifier.flush()
            await notifier.aclose()
            await notifier.engine.dispose()
    return sum(counts) / seconds


# -- the pgbench client ----------------------------------------------------------------------
async def pgbench_client(url: str, mode: str, producers: int, seconds: float, interval_ms: float):
    parsed = make_url(url)
    env = {**os.environ, "PGPASSWORD": parsed.password or ""}
    common = ["-h", parsed.host or "localhost", "-p", str(parsed.port or 5432)]
    common += ["-U", parsed.username or "postgres", "-n", "-T", f"{seconds:g}"]
    with tempfile.TemporaryDirectory() as tmp:
        jobs = _pgbench_jobs(Path(tmp), common, mode, producers, interval_ms)
        procs = [
            await asyncio.create_subprocess_exec(
                *job,
                parsed.database or "",
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            for job in jobs
        ]
        outputs = [(await proc.communicate())[0].decode() for proc in procs]
    found = re.search(r"tps = ([\d.]+) \(without initial connection time\)", outputs[0])
    if found is None:
        raise RuntimeError(f"pgbench failed:\n{outputs[0]}")
    return float(found.group(1))


def _pgbench_jobs(
    tmp: Path, common: list[str], mode: str, producers: int, interval_ms: float
) -> list[list[str]]:
    script = tmp / "producer.sql"
    notify = NOTIFY_SQL + ";\n" if mode == "in_tx" else ""
    insert = INSERT_SQL.replace("$1", "gen_random_uuid()::text").replace("$2", f"'{PAYLOAD}'")
    script.write_text(f"BEGIN;\n{insert};\n{notify}COMMIT;\n")
    jobs = [["pgbench", *common, "-c", str(producers), "-j", "2", "-f", str(script)]]
    if mode == "after_commit":  # the coalesced notifier's worst case, on its own connection
        side = tmp / "notifier.sql"
        side.write_text(NOTIFY_SQL + ";\n")
        rate = producers * 1000.0 / max(interval_ms, 1.0)
        jobs.append(["pgbench", *common, "-c", "1", "-R", f"{rate:g}", "-f", str(side)])
    return jobs


Client = Callable[[str, str, int, float, float], Awaitable[float]]
CLIENT_FUNCTIONS: dict[str, Client] = {
    "engine": engine_client,
    "asyncpg": asyncpg_client,
    "pgbench": pgbench_client,
}


# -- one run -------------------------------------------------------------------------------
async def _prepare(url: str, mode: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("TRUNCATE outbox_events"))
            await conn.execute(text(DROP_TRIGGER_SQL))
            if mode == "trigger":
                for statement in TRIGGER_SQL:
                    await conn.execute(text(statement))
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text("VACUUM ANALYZE outbox_events"))
    finally:
        await engine.dispose()


async def run_once(client: str, url: str, mode: str, args: argparse.Namespace):
    await _prepare(url, mode)
    received = 0

    def on_notify(*_args: object) -> None:
        nonlocal received
        received += 1

    listener = await asyncpg.connect(**_asyncpg_args(url))
    await listener.add_listener(DEFAULT_CHANNEL, on_notify)
    try:
        rate = await CLIENT_FUNCTIONS[client](
            url, mode, args.producers, args.seconds, args.interval_ms
        )
        await asyncio.sleep(0.2)  # trailing notifications
    finally:
        await listener.close()
    return rate, received / args.seconds


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", default=os.environ.get("OUTBOX_TEST_PG_URL"))
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval-ms", type=float, default=DEFAULT_INTERVAL_MS)
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    if not args.url:
        parser.error("give a PostgreSQL URL or set OUTBOX_TEST_PG_URL")
    clients = [c for c in args.clients.split(",") if c]
    if "pgbench" in clients and shutil.which("pgbench") is None:
        print("pgbench not installed: skipping that client")
        clients.remove("pgbench")
    modes = [m for m in args.modes.split(",") if m]
    server = make_url(args.url)
    admin = await asyncpg.connect(**_asyncpg_args(server))
    name = f"bench_notify_{uuid.uuid4().hex[:8]}"
    await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    url = server.set(database=name).render_as_string(hide_password=False)
    try:
        show = {
            s: await admin.fetchval(f"SHOW {s}")
            for s in ("server_version", "fsync", "synchronous_commit")
        }
        print(
            f"PostgreSQL {show['server_version'].split()[0]} (fsync={show['fsync']}, "
            f"synchronous_commit={show['synchronous_commit']}), {os.cpu_count()} CPUs shared "
            f"with the clients; {args.producers} producers, {args.seconds:g} s x "
            f"{args.rounds} rounds, after_commit interval {args.interval_ms:g} ms",
            flush=True,
        )
        await create_schema(url)
        rates = {(c, m): [] for c in clients for m in modes}
        notes = {(c, m): [] for c in clients for m in modes}
        for round_no in range(1, args.rounds + 1):
            for client in clients:
                for mode in modes:
                    rate, notified = await run_once(client, url, mode, args)
                    rates[client, mode].append(rate)
                    notes[client, mode].append(notified)
                    print(
                        f"  round {round_no} {client:<8}{mode:<13}{rate:8.0f} commits/s"
                        f"{notified:8.0f} notifications/s",
                        flush=True,
                    )
        print(
            f"\n{'client':<9}{'mode':<13}{'commits/s':>10}{'vs none':>9}{'notifies/s':>12}"
            "  ratio in each round, sorted"
        )
        for client in clients:
            base = rates[client, "none"] if "none" in modes else None
            for mode in modes:
                median = statistics.median(rates[client, mode])
                ratio = spread = "-"
                if base:
                    per_round = sorted(
                        r / b for r, b in zip(rates[client, mode], base, strict=True)
                    )
                    ratio = f"{statistics.median(per_round):.2f}x"
                    spread = " ".join(f"{r:.2f}" for r in per_round)
                notified = statistics.median(notes[client, mode])
                print(f"{client:<9}{mode:<13}{median:>10.0f}{ratio:>9}{notified:>12.0f}  {spread}")
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
