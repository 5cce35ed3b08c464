"""The JSON result and docs/BENCHMARKS.md, both from one run's records.

"What bounds it" is read off the usage the harness sampled during each side's median
run: CPU seconds per wall second of the workers (Python), of this database's PostgreSQL
backends and of the broker, the whole machine's busy share (/proc/stat: other load on a
shared machine shows here), and the share of wall time PostgreSQL spent in WAL fsync
(``track_wal_io_timing``). A SQLite run has no server to ask: the machine's iowait share
stands in for what its fsyncs cost. The console row (k) has no rates: its figures are
times and memory, and its bound is the slowest query of a refresh.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

KINDS = (
    ("workers", "py", "Python"),
    ("postgres", "pg", "PostgreSQL"),
    ("broker", "mq", "RabbitMQ"),
)


def median_run(runs: list[dict[str, Any]], key: str = "rate") -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: r[key])
    return ordered[(len(ordered) - 1) // 2]


def bound(usage: dict[str, Any], cores: int) -> str:
    """One short line: the verdict, then cores used by whom (and by other load), fsync share.

    CPU (X): the run used three quarters of the machine itself, X the most. Shared CPU:
    the machine was saturated but a fifth or more of it went to other load. One core: the
    workers ran their single thread flat out (a process cannot use more). fsync: WAL
    syncs took a quarter or more of wall time (SQLite: iowait a quarter of a core or
    more). Otherwise round trips and waits.
    """
    if not usage:
        return "n/a"
    cpu = {(short, name): usage.get(f"{kind}_cores", 0.0) for kind, short, name in KINDS}
    ours = sum(cpu.values())
    harness = usage.get("harness_cores", 0.0)
    others = max(0.0, (usage.get("machine_busy") or 0.0) * cores - ours - harness)
    fsync = usage.get("fsync_busy")
    iowait = usage.get("machine_iowait")
    processes = usage.get("worker_processes") or 0
    per_process = cpu[("py", "Python")] / processes if processes else 0.0
    (_, top), top_cores = max(cpu.items(), key=lambda item: item[1])
    heavy = f"{top}-heavy" if ours and top_cores / ours >= 0.6 else "mixed"
    if ours >= 0.75 * cores:
        verdict = f"CPU ({top})"
    elif others >= 0.2 * cores and ours + others + harness >= 0.9 * cores:
        verdict = f"shared CPU ({heavy})"
    elif per_process >= 0.85:
        verdict = "one core per process (Python)"
    elif fsync is not None and fsync >= 0.25:
        verdict = "fsync per commit"
    elif fsync is None and iowait is not None and iowait * cores >= 0.25:
        verdict = "fsync per commit (iowait)"
    else:
        verdict = f"round trips ({heavy})"
    used = [f"{short} {value:.1f}" for (short, _), value in cpu.items() if value >= 0.05]
    detail = " + ".join(used) or "—"
    detail += f" cores; other load {others:.1f}"
    if fsync is not None:
        detail += f"; fsync {fsync:.0%} of wall"
    elif iowait is not None:
        detail += f"; iowait {iowait * cores:.2f} cores"
    return f"{verdict}: {detail}"


def _rate(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    short = {"events/s": "ev/s", "commits/s": "commits/s", "ms": "ms"}.get(unit, unit)
    return f"{value:,.0f} {short}"


def _side_cell(side: dict[str, Any] | None, unit: str) -> str:
    if not side:
        return "—"
    return f"{_rate(side['median'], unit)} ({side['label']})"


def _bounds(rec: dict[str, Any], cores: int) -> str:
    out = []
    for key, name in (("ours", "ours"), ("peer", "other")):
        side = rec.get(key)
        if side and side.get("runs"):
            usage = median_run(side["runs"], "p50_ms" if rec.get("unit") == "ms" else "rate")
            out.append(f"{name}: {bound(usage.get('usage', {}), cores)}")
    return "<br>".join(out) or "—"


def _cells(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


DATABASE_NAMES = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}


def console_cells(rec: dict[str, Any], cores: int) -> tuple[str, str, str, str]:
    """Scenario k: (figure, at the large size, at the small size, what bounds it)."""
    small_n, large_n = rec["rows"]
    dbs = rec["databases"]
    names = {db: DATABASE_NAMES.get(db, db) for db in dbs}
    figure = "refresh " + ", ".join(
        f"{names[db]} **{side['refresh_ms']:.0f} ms**" for db, side in dbs.items()
    )
    figure += f"; max stall **{rec['stall_max_ms']:.0f} ms**; RSS ratio " + ", ".join(
        f"{names[db]} **{side['rss_ratio']:.2f}**" for db, side in dbs.items()
    )

    def at(size: str, n: int) -> str:
        key = "refresh_ms" if size == "large" else "refresh_small_ms"
        return "<br>".join(
            f"{names[db]} at {n:,}: refresh {side[key]:.0f} ms, "
            f"peak RSS {side['rss_mb'][size]:.0f} MB"
            + (
                f", published recount (beside the refreshes) {side['recount_ms']:.0f} ms"
                if size == "large" and "recount_ms" in side
                else ""
            )
            for db, side in dbs.items()
        )

    bounds = []
    for db, side in dbs.items():
        part, ms = max(side["parts_ms"].items(), key=lambda item: item[1])
        runs = side["small"]["runs"] + side["large"]["runs"]
        others = [
            max(0.0, (r.get("machine_busy") or 0.0) * cores - r.get("console_cores", 0.0))
            for r in runs
        ]
        bounds.append(
            f"{names[db]}: {part} {ms:.0f} of {side['refresh_ms']:.0f} ms; console "
            f"{max(r.get('console_cores', 0.0) for r in runs):.1f} cores, other load "
            f"{max(others):.1f}"
        )
    return figure, at("large", large_n), at("small", small_n), "<br>".join(bounds)


def table_row(rec: dict[str, Any], cores: int) -> str:
    unit = rec.get("unit", "events/s")
    target = rec.get("target") or "—"
    if rec["status"] != "ok":
        figure = f"{rec['status']}: {rec.get('reason', '')}"
        return _cells(rec["title"], figure, _side_cell(rec.get("ours"), unit), "—", target, "—")
    if unit == "console":
        figure, ours, other, bounds = console_cells(rec, cores)
        target += " ✓" if rec["met"] else " ✗"
        return _cells(rec["title"], figure, ours, other, target, bounds)
    if unit == "ms":
        figure = f"p50 {rec['p50_ms']:.0f} ms, p99 {rec['p99_ms']:.0f} ms"
        ours, other = "producer commit → handler start", "—"
    else:
        figure = f"**{rec['ratio']:.2f}**"
        if len(rec["ratios"]) > 1:
            figure += " (" + ", ".join(f"{r:.2f}" for r in rec["ratios"]) + ")"
        ours = _side_cell(rec.get("ours"), unit)
        other = _side_cell(rec.get("peer"), unit)
    if rec.get("met") is not None:
        target += " ✓" if rec["met"] else " ✗"
    return _cells(rec["title"], figure, ours, other, target, _bounds(rec, cores))


def notes(records: list[dict[str, Any]]) -> list[str]:
    lines = []
    for rec in records:
        if rec["status"] == "error":
            lines.append(f"- {rec['id']}: **error**: {rec.get('reason', '')}")
        if rec.get("unit") == "console" and rec["status"] == "ok":
            for db, side in rec["databases"].items():
                runs = side["large"]["runs"] + side["small"]["runs"]
                lines.append(
                    f"- k: {DATABASE_NAMES.get(db, db)}: first screen "
                    f"{max(r['first_screen_ms'] for r in runs):.0f} ms at most, an older page "
                    f"{max(r['older_page_ms'] for r in runs):.0f} ms, event-loop stall p99 "
                    f"{max(r['stall_p99_ms'] for r in runs):.0f} ms, longest stall while "
                    f"paging {max(r.get('stall_paging_max_ms', 0.0) for r in runs):.0f} ms, "
                    f"while refreshing {max(r.get('stall_refresh_max_ms', 0.0) for r in runs):.0f}"
                    " ms; rows filled in "
                    f"{side['small']['fill_seconds'] + side['large']['fill_seconds']:.0f} s."
                )
        if rec["status"] == "ok" and any("tried" in r for r in rec.get("ours", {}).get("runs", [])):
            lines.append(f"- b: {_batch_choices(rec)}")
        if rec.get("hot_key"):
            hot = rec["hot_key"]
            lines.append(f"- c: one hot key drains at {hot['median']:,.0f} ev/s ({hot['label']}).")
        if rec.get("second_statement"):
            extra = rec["second_statement"]
            lines.append(
                f"- h: the business row plus a bare `SELECT 1` on the same connection costs "
                f"{extra['ratio']:.2f}× the row alone ({extra['median']:,.0f} commits/s; "
                + ", ".join(f"{r:.2f}" for r in extra["ratios"])
                + "): what any second statement costs here, the floor under an event "
                "written by a statement of its own."
            )
        if rec.get("psycopg"):
            psy = rec["psycopg"]
            lines.append(
                f"- h, psycopg 3 (`postgresql+psycopg`): row alone / row + event "
                f"**{psy['cost']['ratio']:.2f}** ("
                + ", ".join(f"{r:.2f}" for r in psy["cost"]["ratios"])
                + f"; {psy['outbox']['median']:,.0f} against {psy['plain']['median']:,.0f} "
                f"commits/s); its row + event against asyncpg's "
                f"{psy['against_asyncpg']['ratio']:.2f} ("
                + ", ".join(f"{r:.2f}" for r in psy["against_asyncpg"]["ratios"])
                + ")."
            )
        if rec.get("cost_us_per_event") is not None and rec["status"] == "ok":
            cpu = rec["cpu_us_per_event"]
            lines.append(
                f"- p: tracing costs {rec['cost_us_per_event']:.1f} µs of dispatcher CPU per "
                f"event ({cpu['traced']:.1f} µs traced, {cpu['plain']:.1f} µs without a "
                "tracer): a process span per event, its context attached while the handler "
                "runs, a batch span processor; the exporter drops the spans."
            )
        if rec.get("duplicates") is not None:
            lines.append(f"- e: events handled twice across all runs: {rec['duplicates']}.")
        if rec.get("unit") == "ms" and rec["status"] == "ok":
            runs = rec["ours"]["runs"]
            worst = max(r["max_ms"] for r in runs)
            lines.append(
                f"- i: {sum(r['events'] for r in runs)} events, max {worst:.0f} ms; the idle "
                "sleep is 1 s, so anything under it came from the notification."
            )
    return lines


def _batch_choices(rec: dict[str, Any]) -> str:
    """Which batch size won each repeat, and each batch's median rate, per side."""
    parts = []
    for key in ("ours", "peer"):
        runs = rec[key]["runs"]
        won = ", ".join(str(r["batch_size"]) for r in runs)
        rates: dict[int, list[float]] = {}
        for r in runs:
            for t in r["tried"]:
                rates.setdefault(t["batch_size"], []).append(t["rate"])
        medians = ", ".join(
            f"batch {b}: {statistics.median(v):,.0f}" for b, v in sorted(rates.items())
        )
        name = "ours" if key == "ours" else "pgqueuer"
        parts.append(f"{name} ran fastest at batch {won} ({medians} ev/s, medians)")
    return "; ".join(parts) + "."


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    cores = int(m["cores"])
    head = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`benchmarks/bench.py`); do not edit by hand. Every figure",
        "is a ratio of two rates measured in the same run on the same database, the two sides",
        "alternating (who goes first rotates), repeated; the ratio is the median of the",
        "per-repeat ratios (each repeat's in brackets), the rates are the medians. Rates on a",
        "small shared machine are noise; the ratios are the result.",
        "",
        f"- Run: {result['started_at']}, commit `{result.get('commit') or '?'}`,"
        f" {result['options']['repeats']} repeat(s){' (smoke sizes)' if result['options']['smoke'] else ''},"  # noqa: E501
        f" {result['seconds']:.0f} s in all.",
        f"- Machine: {cores} cores ({m.get('cpu') or '?'}), Python {m['python']},"
        f" PostgreSQL {m['postgresql']} (fsync {m['fsync']}, synchronous_commit"
        f" {m['synchronous_commit']}, full_page_writes {m['full_page_writes']}),"
        f" RabbitMQ {m.get('rabbitmq') or '—'}, pgqueuer {m.get('pgqueuer') or 'not installed'}.",
        f"- Our CLI: {m['max_concurrency']}.",
        "",
        "| comparison | ratio | ours | other side | target | what bounds it |",
        "|---|---|---|---|---|---|",
    ]
    rows = [table_row(rec, cores) for rec in result["scenarios"]]
    tail = ["", *notes(result["scenarios"]), "", *HOW_TO_READ]
    return "\n".join(head + rows + tail) + "\n"


HOW_TO_READ = [
    "## How it is measured",
    "",
    "- Drains: N events are preloaded with COPY (pgqueuer's jobs with its own batch",
    "  `enqueue`), the table is ANALYZEd and CHECKPOINTed, the worker processes start and",
    "  wait; the clock starts when all are ready and stops at the first 50 ms poll that finds",
    "  no active row (no queued job). Ready: pgqueuer's workers once connected, ours once up",
    "  (database open and checked, heartbeat written: `EventRegistry.on_ready`), before the",
    "  first claim of either; until 2026-12-05 ours waited before connecting, and their",
    "  start-up (90 ms for one, 170-190 ms each for four starting at once) was on the clock.",
    "  Handlers log each call, so every run also checks that each event was handled exactly",
    "  once.",
    "- pgqueuer runs as its own `pgq run` would: `PgQueuer.run` under uvloop, no-op (or",
    "  sleeping) entrypoint, 2 processes × batch 500, durable (logged) tables.",
    "- The I/O-bound drain (b) runs each side at batch 500 and at 1,000, alternated, and",
    "  compares the fastest of each per repeat: the best batch is not the same for both",
    "  (ours: about twice `--max-concurrency`; pgqueuer's rate barely moves).",
    "- The SQL floor is pgbench with 2 clients running the claim statement of",
    "  `engine.dispatch.claim_sql`",
    "  (same CTEs, `FOR UPDATE SKIP LOCKED`, the columns it returns, aggregated: pgbench",
    "  keeps one row) and `mark_published`'s statement on the ids the claim returned, one",
    "  commit each, on the same preloaded table: the drain with no Python.",
    "- The relay compares one dispatcher relaying to a bound durable queue against aio-pika",
    "  publishing the same number of persistent, mandatory messages of the same size,",
    "  gathered 500 at a time on one confirming channel.",
    "- The write path runs N producer processes, each committing one unit of work after",
    "  another for a fixed time, with and without one outbox event in it, and with a bare",
    "  `SELECT 1` in its place (a note gives its cost: a second statement's round trip);",
    "  the row and the row + event also go through psycopg 3 (`postgresql+psycopg`) in",
    "  slots of their own (a note gives that driver's cost, and its rate against asyncpg's).",
    "- The SQLite drain preloads the same events (one executemany in one transaction) into",
    "  a fresh file in the harness's workdir on a real disk (WAL, synchronous=FULL: every",
    "  commit pays its fsync) before each run. One dispatcher, as SQLite has one writer at a",
    "  time; its floor is one process calling `engine.dispatch.claimer.Claimer.claim` and",
    "  `mark_published` in a loop, claim and completion in two transactions as the",
    "  dispatcher commits them, with no dispatcher and no handler. Same go file and stop",
    "  rule as the PostgreSQL drains.",
    "- The console row grows each database's outbox to 100,000 then 1,000,000 rows of a",
    "  realistic mix (mostly published; pending, failed, dead-letter, publishing; three",
    "  tenants), vacuums and analyzes it (as autovacuum would; right after the bulk load",
    "  PostgreSQL's counts visit the heap for every entry), and at each size starts the",
    "  real console headless in a fresh process: it",
    "  waits for the first screen, pages once, watches 0.5 s refreshes for 5 s while a",
    "  10 ms ticker records how late the event loop wakes it (the stall), and reads the",
    "  process's peak RSS; then times one refresh's queries (overview, paused backlog, top",
    "  types, first page of 100), median of 5. RSS ratio: peak at the large size / at the",
    "  small one (flat is 1). What bounds it: the slowest of those queries, the console's",
    "  CPU (cores, most of any run) and other load on the machine during it (a stall on a",
    "  saturated machine may be the scheduler's, not the console's).",
    "- What bounds it: CPU seconds per wall second of the workers (py), of this database's",
    "  PostgreSQL backends (pg) and of the broker (mq), sampled from /proc during the",
    "  median run; the machine's busy share (other load on a shared machine shows as the",
    "  gap); and PostgreSQL's WAL fsync time as a share of wall time (SQLite runs: the",
    "  machine's iowait, in cores). One core per process: a single-threaded worker at",
    "  0.85 cores or more.",
    "",
    "Re-run: `make bench` (about 6 minutes; `--smoke` for a one-minute check, `--large`",
    "adds the 1,000,000-event backlog, three alternations, and the console at 1,000,000",
    "rows: about 12 minutes in all). Raw data:",
    "`benchmarks/results/latest.json`.",
]


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A few lines for the terminal."""
    out = []
    for rec in result["scenarios"]:
        if rec["status"] != "ok":
            out.append(f"{rec['id']}: {rec['status']}: {rec.get('reason', '')}")
        elif rec.get("unit") == "ms":
            out.append(f"{rec['id']}: p50 {rec['p50_ms']:.1f} ms, p99 {rec['p99_ms']:.1f} ms")
        elif rec.get("unit") == "console":
            out.append(
                f"{rec['id']}: slowest refresh {rec['refresh_ms']:.0f} ms, max stall "
                f"{rec['stall_max_ms']:.0f} ms, RSS ratio {rec['rss_ratio']:.2f} "
                f"(target {rec['target']})"
            )
        else:
            ours = rec["ours"]["median"]
            other = rec["peer"]["median"]
            out.append(
                f"{rec['id']}: ratio {rec['ratio']:.2f}  ({ours:,.0f} vs {other:,.0f} "
                f"{rec['unit']}; target {rec.get('target') or '—'})"
            )
    return out
