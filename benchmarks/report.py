"""The JSON result and docs/BENCHMARKS.md, both from one run's records.

"What bounds it" is read off the usage the harness sampled during each side's median
run: CPU seconds per wall second of the workers (Python), of this database's PostgreSQL
backends and of the broker, the whole machine's busy share (/proc/stat: other load on a
shared machine shows here), and the share of wall time PostgreSQL spent in WAL fsync
(``track_wal_io_timing``).
"""

from __future__ import annotations

import json
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
    the machine was saturated but a fifth or more of it went to other load. fsync: WAL
    syncs took a quarter or more of wall time. Otherwise round trips and waits.
    """
    if not usage:
        return "n/a"
    cpu = {(short, name): usage.get(f"{kind}_cores", 0.0) for kind, short, name in KINDS}
    ours = sum(cpu.values())
    harness = usage.get("harness_cores", 0.0)
    others = max(0.0, (usage.get("machine_busy") or 0.0) * cores - ours - harness)
    fsync = usage.get("fsync_busy")
    (_, top), top_cores = max(cpu.items(), key=lambda item: item[1])
    heavy = f"{top}-heavy" if ours and top_cores / ours >= 0.6 else "mixed"
    if ours >= 0.75 * cores:
        verdict = f"CPU ({top})"
    elif others >= 0.2 * cores and ours + others + harness >= 0.9 * cores:
        verdict = f"shared CPU ({heavy})"
    elif fsync is not None and fsync >= 0.25:
        verdict = "fsync per commit"
    else:
        verdict = f"round trips ({heavy})"
    used = [f"{short} {value:.1f}" for (short, _), value in cpu.items() if value >= 0.05]
    detail = " + ".join(used) or "—"
    detail += f" cores; other load {others:.1f}"
    if fsync is not None:
        detail += f"; fsync {fsync:.0%} of wall"
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


def table_row(rec: dict[str, Any], cores: int) -> str:
    unit = rec.get("unit", "events/s")
    target = rec.get("target") or "—"
    if rec["status"] != "ok":
        figure = f"{rec['status']}: {rec.get('reason', '')}"
        return _cells(rec["title"], figure, _side_cell(rec.get("ours"), unit), "—", target, "—")
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
        if rec.get("hot_key"):
            hot = rec["hot_key"]
            lines.append(f"- c: one hot key drains at {hot['median']:,.0f} ev/s ({hot['label']}).")
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
    "  no active row (no queued job). Handlers log each call, so every run also checks that",
    "  each event was handled exactly once.",
    "- pgqueuer runs as its own `pgq run` would: `PgQueuer.run` under uvloop, no-op (or",
    "  sleeping) entrypoint, 2 processes × batch 500, durable (logged) tables.",
    "- The SQL floor is pgbench with 2 clients running `engine.store`'s claim statement",
    "  (same CTEs, `FOR UPDATE SKIP LOCKED`, all columns returned) and the completion's",
    "  fence, one commit each, on the same preloaded table: the drain with no Python.",
    "- The relay compares one dispatcher relaying to a bound durable queue against aio-pika",
    "  publishing the same number of persistent, mandatory messages of the same size,",
    "  gathered 500 at a time on one confirming channel.",
    "- The write path runs N producer processes, each committing one unit of work after",
    "  another for a fixed time, with and without one outbox event in it.",
    "- What bounds it: CPU seconds per wall second of the workers (py), of this database's",
    "  PostgreSQL backends (pg) and of the broker (mq), sampled from /proc during the",
    "  median run; the machine's busy share (other load on a shared machine shows as the",
    "  gap); and PostgreSQL's WAL fsync time as a share of wall time.",
    "",
    "Re-run: `make bench` (about 15 minutes; `--smoke` for a one-minute check, `--large`",
    "adds the 1,000,000-event backlog). Raw data: `benchmarks/results/latest.json`.",
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
        else:
            ours = rec["ours"]["median"]
            other = rec["peer"]["median"]
            out.append(
                f"{rec['id']}: ratio {rec['ratio']:.2f}  ({ours:,.0f} vs {other:,.0f} "
                f"{rec['unit']}; target {rec.get('target') or '—'})"
            )
    return out
