"""``make bench``: our outbox side by side with pgqueuer, the SQL floor and raw aio-pika.

Usage: python -m benchmarks.bench --database-url URL [--amqp-url URL] [--only a,b,...]
       [--smoke] [--large] [--repeats R] [--events N] [--json PATH] [--markdown PATH]

The database must be a throwaway one: every outbox table, pgqueuer's and bench_orders
are truncated between runs (the harness refuses a database whose outbox holds events of
another type). ``scripts/bench.sh`` (``make bench``) starts a PostgreSQL 15 with default
durability and a RabbitMQ on free loopback ports and stops them afterwards.

Scenarios (see docs/BENCHMARKS.md for the last run and how each is measured):

  a  drain N events with a no-op handler: 2 × outbox-tui --dispatch / 2 pgqueuer workers
  b  the same with a handler awaiting 10 ms (--max-concurrency when the CLI has it)
  c  1,000 ordering keys / unordered, and one hot key (needs the ordering_key column)
  d  the drain of (a) / pgbench running the same claim and completion SQL
  e  4 processes / 1 process, no event handled twice
  f  1,000,000 preloaded / 100,000 (only with --large)
  g  relay to RabbitMQ / raw aio-pika confirmed publishes of the same size
  h  8 producers: business row + outbox event / business row alone (a cost)
  i  wake-up latency, producer commit → handler start, with NOTIFY after commit
  j  drain on SQLite (a file in the workdir): 1 × outbox-tui --dispatch / the same claim and
     completion statements run by hand in a loop
  k  the console at 1,000,000 rows on PostgreSQL and SQLite: a full refresh, the longest
     event-loop stall, memory at 1,000,000 / 100,000 (only with --large)
  l  exactly-once effects: a transactional handler inserting one row / a plain handler
     inserting the same row through its own session (PostgreSQL)
  m  the same on SQLite (reported)
  n  consume N CloudEvents into the inbox (outbox-tui consume) / raw aio-pika consuming the
     same queue with manual acks
  o  end to end, A's outbox → relay → RabbitMQ → B's inbox → B's handler / A's relay alone
  p  the drain of (a) traced with OpenTelemetry's SDK (spans dropped) / no tracer configured:
     what tracing costs per event (reported)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from benchmarks import peer_pgqueuer, report, scenarios, support
from benchmarks.scenarios import Sizes
from benchmarks.support import Context
from engine import create_engine, create_schema

ALL = "abcdefghijklmnop"
SMOKE = Sizes(
    repeats=1,
    drain=400,
    io=200,
    io_batches=(50, 100),
    ordered=400,
    hot_key=100,
    scale=400,
    large_base=400,
    relay=300,
    write_producers=2,
    write_seconds=1.0,
    write_pairs=1,
    latency_events=6,
    latency_gaps=(0.12, 0.2),
    sqlite_drain=400,
    console=(300, 3_000),
    console_watch_seconds=0.5,
    effects=300,
    inbox=300,
    end_to_end=200,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench",
        description=doc.split("\n\n")[0],
        epilog="\n\n".join(doc.split("\n\n")[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    env = os.environ.get
    parser.add_argument("--database-url", default=env("OUTBOX_BENCH_DATABASE_URL"))
    parser.add_argument("--amqp-url", default=env("OUTBOX_BENCH_AMQP_URL"))
    parser.add_argument("--broker-pid", type=int, default=None, help="count its CPU too")
    parser.add_argument("--only", default=ALL, help="scenario letters, e.g. a,d,e")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (~1 min)")
    parser.add_argument("--large", action="store_true", help="add f and k: 1,000,000 events (rows)")
    parser.add_argument("--no-peer", action="store_true", help="skip pgqueuer")
    parser.add_argument("--repeats", type=int, help="alternations per comparison (default 3)")
    parser.add_argument("--events", type=int, help="drain size of a and d (default 100,000)")
    parser.add_argument("--io-events", type=int, help="b (default 100,000)")
    parser.add_argument("--ordered-events", type=int, help="c (default 100,000)")
    parser.add_argument("--scale-events", type=int, help="e (default 100,000)")
    parser.add_argument("--relay-events", type=int, help="g (default 10,000, 5 repeats)")
    parser.add_argument("--large-events", type=int, default=1_000_000)
    # One pair of f spread from 0.77 to 1.07 on this machine within an hour: three
    # alternations give its ratio a median, as every other comparison has.
    parser.add_argument("--large-repeats", type=int, default=3, help="f's alternations (default 3)")
    parser.add_argument("--write-seconds", type=float, help="h, per slot (default 3)")
    parser.add_argument("--latency-events", type=int, help="i (default 150)")
    parser.add_argument("--sqlite-events", type=int, help="j (default 100,000, 5 repeats)")
    parser.add_argument("--inbox-events", type=int, help="n (default 100,000)")
    parser.add_argument("--end-to-end-events", type=int, help="o (default 10,000, 5 repeats)")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument(
        "--peer-loop", choices=("uvloop", "asyncio"), default="uvloop", help="pgqueuer's loop"
    )
    parser.add_argument("--json", type=Path, default=None, help="default: results/latest.json")
    parser.add_argument("--markdown", type=Path, default=Path("docs/BENCHMARKS.md"))
    parser.add_argument("--no-markdown", action="store_true")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.json is None:  # a smoke run must not overwrite the last real run's figures
        name = "smoke.json" if args.smoke else "latest.json"
        args.json = Path("benchmarks/results") / name
        args.no_markdown = args.no_markdown or args.smoke
    if not args.database_url:
        parser.error("--database-url (or OUTBOX_BENCH_DATABASE_URL) is required")
    args.only = "".join(c for c in args.only if c in ALL)
    return args


def sizes_from(args: argparse.Namespace) -> Sizes:
    sizes = SMOKE if args.smoke else Sizes()
    chosen = {
        "repeats": args.repeats,
        "drain": args.events,
        "io": args.io_events,
        "ordered": args.ordered_events,
        "scale": args.scale_events,
        "relay": args.relay_events,
        "write_seconds": args.write_seconds,
        "latency_events": args.latency_events,
        "sqlite_drain": args.sqlite_events,
        "inbox": args.inbox_events,
        "end_to_end": args.end_to_end_events,
        "peer_loop": args.peer_loop,
    }
    sizes = replace(sizes, **{k: v for k, v in chosen.items() if v is not None})
    if args.large:
        sizes = replace(sizes, large=args.large_events, console=(100_000, args.large_events))
    return sizes


async def guard_and_prepare(ctx: Context) -> None:
    """Create the schemas; refuse a database whose outbox holds someone's real events."""
    engine = create_engine(ctx.url)
    try:
        await create_schema(engine)
    finally:
        await engine.dispose()
    foreign = await ctx.conn.fetchval(
        "SELECT count(*) FROM (SELECT 1 FROM outbox_events WHERE event_type <> $1 LIMIT 1) t",
        support.EVENT_TYPE,
    )
    if foreign:
        raise SystemExit(
            "benchmarks: the outbox in this database holds events that are not the "
            "benchmark's; it truncates every table, so give it a throwaway database"
        )


def cpu_model() -> str | None:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


async def machine(ctx: Context) -> dict[str, Any]:
    settings = {}
    for name in ("server_version", "fsync", "synchronous_commit", "full_page_writes"):
        settings[name] = await ctx.conn.fetchval(f"SHOW {name}")
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "postgresql": settings["server_version"].split()[0],
        "fsync": settings["fsync"],
        "synchronous_commit": settings["synchronous_commit"],
        "full_page_writes": settings["full_page_writes"],
        "rabbitmq": await rabbitmq_version(ctx.amqp_url),
        "pgqueuer": peer_pgqueuer.version() if peer_pgqueuer.available() else None,
        "max_concurrency": (
            "has --max-concurrency"
            if ctx.max_concurrency_flag
            else "no --max-concurrency flag (handlers run one at a time per process)"
        ),
    }


async def rabbitmq_version(url: str | None) -> str | None:
    if not url:
        return None
    import aio_pika

    try:
        connection = await aio_pika.connect(url)
    except Exception:
        return None
    async with connection:
        props = connection.transport.connection.server_properties if connection.transport else {}
        version = props.get("version") if props else None
        return version.decode() if isinstance(version, bytes) else version


def git_commit() -> str | None:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
        cwd=support.ROOT,
    )
    return done.stdout.strip() or None


Step = tuple[str, Callable[[], Any]]


def plan(ctx: Context, sizes: Sizes, args: argparse.Namespace) -> list[Step]:
    only, peer = args.only, not args.no_peer
    steps: list[Step] = []
    if "a" in only or "d" in only:
        steps.append(
            (
                "a+d drain",
                lambda: scenarios.drain(
                    ctx, sizes, against_peer="a" in only, peer=peer, floor="d" in only
                ),
            )
        )
    one = {
        "b": ("b I/O-bound", lambda: scenarios.io_bound(ctx, sizes, peer=peer)),
        "c": ("c ordered", lambda: scenarios.ordered(ctx, sizes)),
        "e": ("e scale-out", lambda: scenarios.scale_out(ctx, sizes)),
        "f": ("f large backlog", lambda: scenarios.large_backlog(ctx, sizes, args.large_repeats)),
        "g": ("g relay", lambda: scenarios.relay(ctx, sizes)),
        "h": ("h write path", lambda: scenarios.write_path(ctx, sizes)),
        "i": ("i wake-up latency", lambda: scenarios.latency(ctx, sizes)),
        "j": ("j SQLite drain", lambda: scenarios.sqlite_floor(ctx, sizes)),
        "k": ("k console rows", lambda: scenarios.console_rows(ctx, sizes)),
        "l": ("l exactly-once effects", lambda: scenarios.effects(ctx, sizes)),
        "m": ("m exactly-once effects, SQLite", lambda: scenarios.sqlite_effects(ctx, sizes)),
        "n": ("n inbox consume", lambda: scenarios.consume(ctx, sizes)),
        "o": ("o end to end", lambda: scenarios.end_to_end(ctx, sizes)),
        "p": ("p tracing cost", lambda: scenarios.tracing_cost(ctx, sizes)),
    }
    steps += [one[c] for c in only if c in one]
    return steps


def _as_list(found: Any) -> list[dict[str, Any]]:
    return found if isinstance(found, list) else [found]


async def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    sizes = sizes_from(args)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="outbox-bench-"))
    conn = await support.connect(args.database_url)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.perf_counter()
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    current: list[Any] = []

    def run_bar(label: str, total: int) -> Callable[[int], None]:
        for task in current:
            progress.remove_task(task)
        current.clear()
        task = progress.add_task(f"  {label}", total=total)
        current.append(task)
        return lambda done: progress.update(task, completed=done)

    ctx = Context(
        url=args.database_url,
        amqp_url=args.amqp_url,
        workdir=workdir,
        conn=conn,
        progress=run_bar,
        batch_size=args.batch_size,
        cli_help=support.cli_help(),
        broker_pid=args.broker_pid,
    )
    records: list[dict[str, Any]] = []
    try:
        await guard_and_prepare(ctx)
        info = await machine(ctx)
        steps = plan(ctx, sizes, args)
        with progress:
            overall = progress.add_task("[bold]benchmarks", total=len(steps))
            for name, step in steps:
                progress.update(overall, description=f"[bold]{name}")
                try:
                    records += _as_list(await step())
                except Exception as exc:  # one failed comparison must not lose the others
                    records.append(
                        {
                            "id": name[0],
                            "title": name,
                            "status": "error",
                            "reason": f"{type(exc).__name__}: {exc}"[:2000],
                            "traceback": traceback.format_exc(),
                        }
                    )
                progress.advance(overall)
    finally:
        await conn.close()
    if args.workdir is None and not any(r["status"] == "error" for r in records):
        shutil.rmtree(workdir, ignore_errors=True)  # kept after an error: the workers' logs
    elif any(r["status"] == "error" for r in records):
        console.print(f"workers' logs: {workdir}")
    records.sort(key=lambda r: r["id"])
    return {
        "started_at": started_at,
        "seconds": round(time.perf_counter() - started, 1),
        "commit": git_commit(),
        "options": {
            "smoke": args.smoke,
            "large": args.large,
            "repeats": sizes.repeats,
            "batch_size": args.batch_size,
            "sizes": sizes.__dict__,
        },
        "machine": info,
        "scenarios": records,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(stderr=True)
    result = asyncio.run(run(args, console))
    report.write_json(result, args.json)
    if not args.no_markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(report.markdown(result))
    for line in report.summary_lines(result):
        console.print(line)
    console.print(f"wrote {args.json}" + ("" if args.no_markdown else f" and {args.markdown}"))
    return 1 if any(r["status"] == "error" for r in result["scenarios"]) else 0


if __name__ == "__main__":
    sys.exit(main())
