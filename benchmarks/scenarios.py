"""The comparisons of ``make bench``: each alternates its sides R times and reports a ratio.

Every scenario returns one record (see ``record``): the sides' rates (median and best
of the repeats, every run kept), the median of the per-repeat ratios, the target and
whether it was met. A side that cannot run (pgqueuer not installed, no pgbench, no
broker, no ``ordering_key`` column) makes the record ``skipped`` with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from benchmarks import (
    console_million_rows,
    drains,
    inbox,
    peer_amqp,
    peer_pgqueuer,
    producing,
    sqlite_drain,
    support,
    usage,
)
from benchmarks.support import Context

Run = Callable[[], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Sizes:
    repeats: int = 3
    drain: int = 100_000
    # Every drain on PostgreSQL is 100,000 events, as the issue measured. Shorter runs
    # (b at 20,000, c and e at 50,000) ended in 0.65-1.3 s on the faster side, where
    # the first claims' ramp and the 50 ms stop poll weigh most. On one PostgreSQL, b
    # read 1.33-1.56 at 20,000 and 1.61-1.84 at 100,000; e 1.56-1.62 at 50,000 and
    # 1.70-1.78 at 100,000. c went the other way, 0.73-0.77 at 50,000 and 0.58-0.70 at
    # 100,000: with 100 events per key instead of 50 an ordered row costs PostgreSQL
    # more (decision 0031, row c), an unordered one does not.
    io: int = 100_000
    io_sleep_ms: float = 10.0
    io_concurrency: int = 500
    io_batches: tuple[int, ...] = (500, 1000)
    ordered: int = 100_000
    hot_key: int = 2_000
    scale: int = 100_000
    large: int | None = None  # 1_000_000 with --large
    large_base: int = 100_000
    relay: int = 10_000
    relay_repeats: int = 5  # short runs, more pairs: the broker makes this one noisy
    write_producers: int = 8
    write_seconds: float = 3.0
    write_pairs: int = 6
    latency_events: int = 150
    # Longer than the notifier's 100 ms coalescing interval: every commit notifies at once,
    # so the figure is the wake-up path, not the coalescing delay.
    latency_gaps: tuple[float, float] = (0.12, 0.3)
    peer_loop: str = "uvloop"
    peer_io_max_tasks: int | None = None
    sqlite_drain: int = 100_000  # a SQLite drain is fast: shorter runs are mostly poll noise
    # Runs of about 4 s whose ratio spread widest of any row (0.65 to 0.81 within one run,
    # medians of 0.69 and 0.79 in two runs of one day): more pairs for its median.
    sqlite_repeats: int = 5
    console: tuple[int, int] | None = None  # (100_000, 1_000_000) with --large
    console_watch_seconds: float = 5.0
    effects: int = 20_000  # l and m: one business row per event, a commit per event
    inbox: int = 100_000
    end_to_end: int = 10_000


def record(sid: str, title: str, **fields: Any) -> dict[str, Any]:
    return {"id": sid, "title": title, "status": "ok", **fields}


def skipped(sid: str, title: str, reason: str, **fields: Any) -> dict[str, Any]:
    return {"id": sid, "title": title, "status": "skipped", "reason": reason, **fields}


async def alternate(repeats: int, sides: list[tuple[str, Run]]) -> dict[str, list[dict[str, Any]]]:
    """Run every side once per repeat, rotating who goes first, so drift hits all alike."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in sides}
    for r in range(repeats):
        turn = r % len(sides)
        for name, run in sides[turn:] + sides[:turn]:
            runs[name].append(await run())
    return runs


def noisy_row_repeats(sizes: Sizes, wanted: int) -> int:
    """More alternations for a row whose short runs spread widely; a one-repeat run
    (``--smoke``, ``--repeats 1``) stays at one."""
    return max(sizes.repeats, wanted) if sizes.repeats > 1 else 1


def side(label: str, runs: list[dict[str, Any]], key: str = "rate") -> dict[str, Any]:
    values = [r[key] for r in runs]
    return {
        "label": label,
        "median": round(statistics.median(values), 1),
        "best": round(max(values), 1),
        "runs": runs,
    }


def ratio(
    ours: list[dict[str, Any]], other: list[dict[str, Any]], *, invert: bool = False
) -> dict[str, Any]:
    """Median of the per-repeat ratios ours / other (other / ours with ``invert``)."""
    pairs = [
        (b["rate"] / a["rate"]) if invert else (a["rate"] / b["rate"])
        for a, b in zip(ours, other, strict=True)
    ]
    return {"ratio": round(statistics.median(pairs), 3), "ratios": [round(p, 3) for p in pairs]}


def met(value: float, target: str) -> bool:
    op, bound = target.split()
    return value >= float(bound) if op == ">=" else value <= float(bound)


# -- a + d: the drain, against pgqueuer and against the SQL floor ---------------------------


async def drain(
    ctx: Context, sizes: Sizes, *, against_peer: bool, peer: bool, floor: bool
) -> list[dict[str, Any]]:
    """a (``against_peer``: ours / pgqueuer, skipped without ``peer``) and d (``floor``)."""
    n = sizes.drain
    label = f"outbox-tui --dispatch ×2, batch {ctx.batch_size}"
    sides: list[tuple[str, Run]] = [("ours", lambda: drains.ours(ctx, n))]
    peer_reason = None if peer_pgqueuer.available() else "peer not installed (pgqueuer)"
    floor_reason = None if drains.pgbench_binary() else "pgbench not found"
    if against_peer and peer and not peer_reason:
        sides.append(
            ("pgqueuer", lambda: drains.pgqueuer(ctx, n, loop=sizes.peer_loop, label="pgqueuer"))
        )
    if floor and not floor_reason:
        sides.append(("floor", lambda: drains.floor(ctx, n)))
    runs = await alternate(sizes.repeats, sides)
    out = []
    title_a = f"a. drain {n:,} events, no-op handler: ours / pgqueuer"
    why_not = "peer skipped (--no-peer)" if not peer else peer_reason
    if against_peer and why_not:
        out.append(skipped("a", title_a, why_not, ours=side(label, runs["ours"])))
    elif against_peer:
        peer_label = (
            f"pgqueuer {peer_pgqueuer.version()} ×2, batch {ctx.batch_size}, {sizes.peer_loop}"
        )
        result = ratio(runs["ours"], runs["pgqueuer"])
        out.append(
            record(
                "a",
                title_a,
                unit="events/s",
                ours=side(label, runs["ours"]),
                peer=side(peer_label, runs["pgqueuer"]),
                target=">= 1.5",
                met=met(result["ratio"], ">= 1.5"),
                **result,
            )
        )
    if floor:
        title_d = f"d. drain {n:,}: ours / SQL floor (pgbench, 2 clients, same claim + complete)"
        if floor_reason:
            out.append(skipped("d", title_d, floor_reason))
        else:
            result = ratio(runs["ours"], runs["floor"])
            out.append(
                record(
                    "d",
                    title_d,
                    unit="events/s",
                    ours=side(label, runs["ours"]),
                    peer=side("pgbench -c 2, claim + complete", runs["floor"]),
                    target=">= 0.8",
                    met=met(result["ratio"], ">= 0.8"),
                    **result,
                )
            )
    return out


# -- b: I/O-bound handlers --------------------------------------------------------------


async def io_bound(ctx: Context, sizes: Sizes, *, peer: bool = True) -> dict[str, Any]:
    """b: each side runs at every batch size of ``sizes.io_batches``; per repeat, the best
    of ours against the best of pgqueuer's.

    The batch is the one knob both tools share, and the best one is not the same for
    both: ours ran faster at about twice ``--max-concurrency`` (docs/dispatcher.md,
    "Concurrency"), pgqueuer's rate barely moves. Each side gets the same choices,
    alternated in the same run; which batch won each repeat is in the record and in the
    notes.
    """
    n, ms = sizes.io, sizes.io_sleep_ms
    title = f"b. drain {n:,} events, handler awaits {ms:g} ms: ours / pgqueuer"
    concurrency = sizes.io_concurrency if ctx.max_concurrency_flag else None
    batches = " / ".join(str(b) for b in sizes.io_batches)
    label = "outbox-tui --dispatch ×2, " + (
        f"--max-concurrency {concurrency}"
        if concurrency
        else "one handler at a time (CLI has no --max-concurrency)"
    )
    label += f", best of batch {batches}"

    def ours(batch: int) -> Run:
        return lambda: drains.ours(
            replace(ctx, batch_size=batch), n, sleep_ms=ms, concurrency=concurrency
        )

    sides = [(f"ours {b}", ours(b)) for b in sizes.io_batches]
    if not peer or not peer_pgqueuer.available():
        runs = _best_per_repeat(await alternate(sizes.repeats, sides), sizes.io_batches, "ours")
        why = "peer not installed (pgqueuer)" if peer else "peer skipped (--no-peer)"
        return skipped("b", title, why, ours=side(label, runs["ours"]))
    tasks = sizes.peer_io_max_tasks

    def theirs(batch: int) -> Run:
        return lambda: drains.pgqueuer(
            replace(ctx, batch_size=batch),
            n,
            sleep_ms=ms,
            max_concurrent_tasks=tasks,
            loop=sizes.peer_loop,
        )

    sides += [(f"pgqueuer {b}", theirs(b)) for b in sizes.io_batches]
    runs = _best_per_repeat(
        await alternate(sizes.repeats, sides), sizes.io_batches, "ours", "pgqueuer"
    )
    peer_label = f"pgqueuer ×2, max_concurrent_tasks {tasks or 'unlimited'}"
    peer_label += f", best of batch {batches}"
    result = ratio(runs["ours"], runs["pgqueuer"])
    return record(
        "b",
        title,
        unit="events/s",
        ours=side(label, runs["ours"]),
        peer=side(peer_label, runs["pgqueuer"]),
        target=">= 1.5",
        met=met(result["ratio"], ">= 1.5"),
        **result,
    )


def _best_per_repeat(
    runs: dict[str, list[dict[str, Any]]], batches: tuple[int, ...], *names: str
) -> dict[str, list[dict[str, Any]]]:
    """Per repeat, each named side's fastest run over its ``"<name> <batch>"`` runs;
    every run is kept under ``tried`` (batch, rate) on the one chosen."""
    best: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        chosen = []
        for repeat in zip(*(runs[f"{name} {b}"] for b in batches), strict=True):
            by_batch = list(zip(batches, repeat, strict=True))
            batch, run = max(by_batch, key=lambda br: br[1]["rate"])
            tried = [{"batch_size": b, "rate": r["rate"]} for b, r in by_batch]
            chosen.append({**run, "batch_size": batch, "tried": tried})
        best[name] = chosen
    return best


# -- c: ordered delivery ----------------------------------------------------------------


async def ordered(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    n = sizes.ordered
    title = f"c. drain {n:,} events over 1,000 ordering keys / unordered"
    if not await support.has_column(ctx.conn, "outbox_events", "ordering_key"):
        return skipped("c", title, "no ordering_key column")

    def spread(i: int) -> str:
        return f"k:{i % 1000}"

    runs = await alternate(
        sizes.repeats,
        [
            ("ordered", lambda: drains.ours(ctx, n, ordering_key=spread, label="ours: 1,000 keys")),
            ("unordered", lambda: drains.ours(ctx, n, label="ours: unordered")),
        ],
    )
    hot = await alternate(
        sizes.repeats,
        [("hot", lambda: drains.ours(ctx, sizes.hot_key, ordering_key=lambda _i: "k:hot"))],
    )
    result = ratio(runs["ordered"], runs["unordered"])
    return record(
        "c",
        title,
        unit="events/s",
        ours=side("ordered, 1,000 keys, ×2", runs["ordered"]),
        peer=side("unordered, ×2", runs["unordered"]),
        hot_key=side(f"one hot key, {sizes.hot_key:,} events, ×2", hot["hot"]),
        target=">= 0.8",
        met=met(result["ratio"], ">= 0.8"),
        **result,
    )


# -- e, f: scale-out and a large backlog -------------------------------------------------


async def scale_out(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    n = sizes.scale
    runs = await alternate(
        sizes.repeats,
        [
            ("four", lambda: drains.ours(ctx, n, processes=4, label="ours ×4")),
            ("one", lambda: drains.ours(ctx, n, processes=1, label="ours ×1")),
        ],
    )
    duplicates = sum(r["duplicates"] for r in runs["four"] + runs["one"])
    result = ratio(runs["four"], runs["one"])
    return record(
        "e",
        f"e. drain {n:,}: 4 processes / 1 process (no event handled twice)",
        unit="events/s",
        ours=side("outbox-tui --dispatch ×4", runs["four"]),
        peer=side("outbox-tui --dispatch ×1", runs["one"]),
        duplicates=duplicates,
        target=">= 1.5",
        met=met(result["ratio"], ">= 1.5") and duplicates == 0,
        **result,
    )


async def large_backlog(ctx: Context, sizes: Sizes, repeats: int) -> dict[str, Any]:
    base = sizes.large_base
    if sizes.large is None:
        return skipped("f", "f. drain rate at 1,000,000 / at 100,000", "not run: pass --large")
    big = sizes.large
    runs = await alternate(
        repeats,
        [
            ("big", lambda: drains.ours(ctx, big, label=f"ours: {big:,}")),
            ("base", lambda: drains.ours(ctx, base, label=f"ours: {base:,}")),
        ],
    )
    result = ratio(runs["big"], runs["base"])
    return record(
        "f",
        f"f. drain rate at {big:,} / at {base:,}",
        unit="events/s",
        ours=side(f"{big:,} preloaded, ×2", runs["big"]),
        peer=side(f"{base:,} preloaded, ×2", runs["base"]),
        target=">= 0.8",
        met=met(result["ratio"], ">= 0.8"),
        **result,
    )


# -- g, h, i: relay, write path, wake-up --------------------------------------------------


async def relay(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    n = sizes.relay
    title = f"g. relay {n:,} events to RabbitMQ: ours / raw aio-pika confirmed publishes"
    if ctx.amqp_url is None:
        return skipped("g", title, "no RabbitMQ (pass --amqp-url)")
    body = support.cloudevent_size()
    try:
        runs = await alternate(
            noisy_row_repeats(sizes, sizes.relay_repeats),
            [
                ("ours", lambda: drains.relay(ctx, n)),
                ("raw", lambda: drains.raw_publish(ctx, n, body_size=body)),
            ],
        )
    finally:
        # Bound to every routing key: left behind, it would swallow what others publish.
        await peer_amqp.delete_queue(ctx.amqp_url)
    result = ratio(runs["ours"], runs["raw"])
    return record(
        "g",
        title,
        unit="events/s",
        ours=side(f"outbox-tui --dispatch --amqp-url ×1, batch {ctx.batch_size}", runs["ours"]),
        peer=side(f"aio-pika, one channel, gather {ctx.batch_size}, {body} B", runs["raw"]),
        body_bytes=body,
        target=">= 0.7",
        met=met(result["ratio"], ">= 0.7"),
        **result,
    )


async def consume(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    n = sizes.inbox
    title = (
        f"n. consume {n:,} CloudEvents into the inbox: ours / raw aio-pika consuming the "
        "same queue with manual acks, doing nothing"
    )
    if ctx.amqp_url is None:
        return skipped("n", title, "no RabbitMQ (pass --amqp-url)")
    try:
        runs = await alternate(
            sizes.repeats,
            [
                ("ours", lambda: inbox.ours_consume(ctx, n)),
                ("raw", lambda: inbox.raw_consume(ctx, n)),
            ],
        )
    finally:
        await inbox.delete_queues(ctx.amqp_url)
    result = ratio(runs["ours"], runs["raw"])
    return record(
        "n",
        title,
        unit="messages/s",
        ours=side(f"outbox-tui consume ×1, prefetch {inbox.PREFETCH}", runs["ours"]),
        peer=side(f"aio-pika, prefetch {inbox.PREFETCH}, an ack each", runs["raw"]),
        target=">= 0.7",
        met=met(result["ratio"], ">= 0.7"),
        **result,
    )


async def end_to_end(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    n = sizes.end_to_end
    title = (
        f"o. {n:,} events end to end, A's outbox → relay → RabbitMQ → B's inbox → B's "
        "handler: / A's relay alone (reported)"
    )
    if ctx.amqp_url is None:
        return skipped("o", title, "no RabbitMQ (pass --amqp-url)")
    try:
        runs = await alternate(
            noisy_row_repeats(sizes, sizes.relay_repeats),
            [
                ("ours", lambda: inbox.end_to_end(ctx, n)),
                ("relay", lambda: drains.relay(ctx, n)),
            ],
        )
    finally:
        await peer_amqp.delete_queue(ctx.amqp_url)
        await inbox.delete_queues(ctx.amqp_url)
    result = ratio(runs["ours"], runs["relay"])
    return record(
        "o",
        title,
        unit="events/s",
        ours=side("A's relay + B's consume + B's dispatcher, one process each", runs["ours"]),
        peer=side(f"A's relay alone, batch {ctx.batch_size}", runs["relay"]),
        target=None,
        met=None,
        **result,
    )


async def write_path(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    """The modes alternate slot by slot in one set of producer processes (see producing).

    Beside the two compared, each round has a slot of the row plus a bare ``SELECT 1``
    (``statement``): its cost against the row alone is what any second statement costs
    on this machine, the floor under an event written by a statement of its own. The row
    alone and with its event are also written through psycopg 3 (``-psycopg``): the
    same cost per driver, and psycopg's write path against asyncpg's (decision 0035).
    """
    producers, seconds, pairs = sizes.write_producers, sizes.write_seconds, sizes.write_pairs
    modes = ["outbox", "plain", "statement", "outbox-psycopg", "plain-psycopg"]
    schedule = []
    for n in range(pairs):
        turn = n % len(modes)
        schedule += modes[turn:] + modes[:turn]
    runs = await producing.write_schedule(ctx, schedule, producers=producers, seconds=seconds)
    by_mode = {mode: [r for r in runs if r["mode"] == mode] for mode in modes}
    outbox, plain, statement = by_mode["outbox"], by_mode["plain"], by_mode["statement"]
    psy_outbox, psy_plain = by_mode["outbox-psycopg"], by_mode["plain-psycopg"]
    # A cost: how many times slower the write path gets with the event (lower is better).
    result = ratio(outbox, plain, invert=True)
    floor = side("business row + SELECT 1", statement)
    psycopg = {
        "outbox": side("business row + outbox event, psycopg", psy_outbox),
        "plain": side("business row alone, psycopg", psy_plain),
        "cost": ratio(psy_outbox, psy_plain, invert=True),
        "against_asyncpg": ratio(psy_outbox, outbox),
    }
    return record(
        "h",
        f"h. write path, {producers} producers, durable commits: row alone / row + event "
        f"(a cost; asyncpg; {pairs} alternations of {seconds:g} s)",
        unit="commits/s",
        ours=side("business row + outbox event", outbox),
        peer=side("business row alone", plain),
        second_statement={**floor, **ratio(statement, plain, invert=True)},
        psycopg=psycopg,
        target="<= 1.2",
        met=met(result["ratio"], "<= 1.2"),
        **result,
    )


async def latency(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    """One run: a latency distribution needs events, not alternation (there is no peer)."""
    low, high = sizes.latency_gaps
    run = await producing.wakeup_latency(ctx, sizes.latency_events, min_gap=low, max_gap=high)
    return record(
        "i",
        f"i. wake-up: producer commit → handler start, NOTIFY after commit, "
        f"{sizes.latency_events} commits {low * 1000:g}–{high * 1000:g} ms apart",
        unit="ms",
        ours=side("p50", [run], key="p50_ms"),
        p50_ms=run["p50_ms"],
        p99_ms=run["p99_ms"],
        target="p50 < 20 ms",
        met=run["p50_ms"] < 20,
    )


# -- j: the drain on SQLite against its own SQL floor ------------------------------------


async def sqlite_floor(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    """One dispatcher (SQLite has one writer at a time) / the claim + complete loop."""
    n = sizes.sqlite_drain
    runs = await alternate(
        noisy_row_repeats(sizes, sizes.sqlite_repeats),
        [
            ("ours", lambda: sqlite_drain.ours(ctx, n)),
            ("floor", lambda: sqlite_drain.floor(ctx, n)),
        ],
    )
    result = ratio(runs["ours"], runs["floor"])
    return record(
        "j",
        f"j. drain {n:,} on SQLite: ours / SQL floor (same claim + complete by hand, 1 process)",
        unit="events/s",
        ours=side(f"outbox-tui --dispatch ×1, batch {ctx.batch_size}", runs["ours"]),
        peer=side("Claimer.claim + mark_published loop, ×1", runs["floor"]),
        target=">= 0.8",
        met=met(result["ratio"], ">= 0.8"),
        **result,
    )


# -- k: the console at a million rows ------------------------------------------------------

CONSOLE_TARGET = "refresh < 100 ms, stall < 50 ms, RSS ratio <= 1.2"
DATABASES = (("postgresql", "PostgreSQL"), ("sqlite", "SQLite"))


async def _console_run(ctx: Context, url: str, watch_seconds: float) -> dict[str, Any]:
    """One ``console_million_rows --measure`` in a fresh process: its RSS is the console's."""
    path = os.pathsep.join(filter(None, [str(support.ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, OUTBOX_DATABASE_URL=url)
    argv = [sys.executable, "-m", "benchmarks.console_million_rows", "--measure"]
    before, wall0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    machine0 = usage.machine_ticks()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        "--watch-seconds",
        str(watch_seconds),
        env=env,
        cwd=support.ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), ctx.timeout)
    if proc.returncode != 0:
        tail = err.decode(errors="replace")[-2000:]
        raise support.WorkerFailed(f"console measure exited with {proc.returncode}:\n{tail}")
    run = dict(json.loads(out.decode().strip().splitlines()[-1]))
    # A stall is the console's or the machine's: other load on a shared machine shows here.
    after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - wall0
    busy, _iowait, total = (b - a for a, b in zip(machine0, usage.machine_ticks(), strict=True))
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    run["console_cores"] = round(cpu / wall, 2)
    run["machine_busy"] = round(busy / total, 2) if total else None
    return run


def _console_side(small: dict[str, Any], large: dict[str, Any]) -> dict[str, Any]:
    """Medians of the repeats at each size; the stall is the worst seen at either."""

    def med(runs: list[dict[str, Any]], key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 1)

    parts = ("overview", "paused_backlog", "top_types", "first_page")
    rss_small, rss_large = med(small["runs"], "peak_rss_mb"), med(large["runs"], "peak_rss_mb")
    return {
        "small": small,
        "large": large,
        "refresh_ms": med(large["runs"], "refresh_ms"),
        "refresh_small_ms": med(small["runs"], "refresh_ms"),
        "parts_ms": {name: med(large["runs"], f"{name}_ms") for name in parts},
        "stall_max_ms": max(r["stall_max_ms"] for r in small["runs"] + large["runs"]),
        "rss_mb": {"small": rss_small, "large": rss_large},
        "rss_ratio": round(rss_large / rss_small, 3),
        # The published recount the console runs beside its refreshes, not in them.
        "recount_ms": med(large["runs"], "recount_ms"),
    }


async def console_rows(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    """Grow each database's outbox to the small size, measure, grow to the large, measure."""
    title = (
        "k. console at 1,000,000 rows: full refresh, event-loop stall, RSS at 1,000,000 / 100,000"
    )
    if sizes.console is None:
        return skipped("k", title, "not run: pass --large")
    small_n, large_n = sizes.console
    title = (
        f"k. console at {large_n:,} rows (PostgreSQL, SQLite): full refresh, longest "
        f"event-loop stall, peak RSS at {large_n:,} / {small_n:,}"
    )
    sqlite_path = ctx.workdir / "console" / "outbox.db"
    sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    for stale in sqlite_path.parent.glob("outbox.db*"):
        stale.unlink()
    urls = {"postgresql": ctx.url, "sqlite": sqlite_drain.url_of(sqlite_path)}
    found: dict[str, dict[str, Any]] = {}
    await support.reset_outbox(ctx.conn)
    try:
        for db, name in DATABASES:
            at: dict[int, dict[str, Any]] = {}
            for n in (small_n, large_n):
                grown = await console_million_rows.grow(
                    urls[db], n, progress=ctx.progress(f"{name}: {n:,} rows", n)
                )
                runs = []
                for _ in range(sizes.repeats):
                    runs.append(await _console_run(ctx, urls[db], sizes.console_watch_seconds))
                at[n] = {"rows": n, "fill_seconds": grown["seconds"], "runs": runs}
            found[db] = _console_side(at[small_n], at[large_n])
    finally:  # the console's rows are not the benchmark's: later runs would refuse them
        await support.reset_outbox(ctx.conn)
    refresh = max(side["refresh_ms"] for side in found.values())
    stall = max(side["stall_max_ms"] for side in found.values())
    rss = max(side["rss_ratio"] for side in found.values())
    return record(
        "k",
        title,
        unit="console",
        rows=[small_n, large_n],
        databases=found,
        refresh_ms=refresh,
        stall_max_ms=stall,
        rss_ratio=rss,
        target=CONSOLE_TARGET,
        met=refresh < 100 and stall < 50 and rss <= 1.2,
    )


# -- l + m: exactly-once effects ------------------------------------------------------------

EFFECTS_TARGET = ">= 0.9"


async def effects(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    """l: what exactly-once costs on PostgreSQL: the handler's row written in the
    dispatcher's transaction (with the event's completion in the same commit) against the
    same row committed by the handler itself (then the batch's completion)."""
    n = sizes.effects
    runs = await alternate(
        sizes.repeats,
        [
            ("ours", lambda: drains.ours(ctx, n, write="transactional", label="transactional")),
            ("other", lambda: drains.ours(ctx, n, write="plain", label="plain")),
        ],
    )
    result = ratio(runs["ours"], runs["other"])
    return record(
        "l",
        f"l. drain {n:,}, each event writes one row: transactional handler / plain handler "
        "committing its own session",
        unit="events/s",
        ours=side(
            f"outbox-tui --dispatch ×2, transactional=True, batch {ctx.batch_size}", runs["ours"]
        ),
        peer=side("the same, the handler commits its own session", runs["other"]),
        target=EFFECTS_TARGET,
        met=met(result["ratio"], EFFECTS_TARGET),
        **result,
    )


async def sqlite_effects(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    """m: l on SQLite, one dispatcher (reported: its handlers take the write lock in turn
    either way)."""
    n = sizes.effects
    runs = await alternate(
        sizes.repeats,
        [
            ("ours", lambda: sqlite_drain.ours(ctx, n, write="transactional")),
            ("other", lambda: sqlite_drain.ours(ctx, n, write="plain")),
        ],
    )
    result = ratio(runs["ours"], runs["other"])
    return record(
        "m",
        f"m. the same on SQLite ({n:,} events, 1 process): transactional / plain",
        unit="events/s",
        ours=side(
            f"outbox-tui --dispatch ×1, transactional=True, batch {ctx.batch_size}", runs["ours"]
        ),
        peer=side("the same, the handler commits its own session", runs["other"]),
        **result,
    )


# -- n: what tracing costs ------------------------------------------------------------------


def cpu_per_event_us(run: dict[str, Any]) -> float:
    """The dispatchers' CPU per event of one drain, in microseconds."""
    usage = run["usage"]
    return usage["workers_cores"] * usage["wall_seconds"] / run["events"] * 1e6


async def tracing_cost(ctx: Context, sizes: Sizes) -> dict[str, Any]:
    """n: the no-op drain of a with every event traced (the SDK configured, a batch span
    processor, an exporter that drops the spans) against the same drain with no tracer
    configured, which is what a service without the SDK runs. The cost per event is the
    dispatchers' CPU per event, traced less untraced (medians)."""
    n = sizes.drain
    runs = await alternate(
        sizes.repeats,
        [
            ("traced", lambda: drains.ours(ctx, n, tracing="sdk", label="traced")),
            ("plain", lambda: drains.ours(ctx, n, label="not traced")),
        ],
    )
    result = ratio(runs["traced"], runs["plain"])
    traced = statistics.median(cpu_per_event_us(r) for r in runs["traced"])
    plain = statistics.median(cpu_per_event_us(r) for r in runs["plain"])
    return record(
        "p",
        f"p. drain {n:,}, no-op handler: traced (OpenTelemetry SDK, spans dropped) / no tracer",
        unit="events/s",
        ours=side("outbox-tui --dispatch ×2, a process span per event", runs["traced"]),
        peer=side("outbox-tui --dispatch ×2, no tracer configured", runs["plain"]),
        cpu_us_per_event={"traced": round(traced, 1), "plain": round(plain, 1)},
        cost_us_per_event=round(traced - plain, 1),
        **result,
    )
