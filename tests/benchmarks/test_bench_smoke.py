"""`make bench --smoke` against the suite's PostgreSQL and RabbitMQ: the harness runs every
comparison end to end and writes a well-formed result. Nothing here is timed.

pgqueuer is not in the test extra (it brings uvloop, typer, croniter and more, and is only
the yardstick of `make bench`), so under `make test` the two pgqueuer comparisons must come
back cleanly as "peer not installed"; where it is installed they must run.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.bench import ALL

ROOT = Path(__file__).resolve().parents[2]
HAS_PGQUEUER = importlib.util.find_spec("pgqueuer") is not None

pytestmark = [pytest.mark.slow, pytest.mark.postgresql, pytest.mark.rabbitmq]


def _rates(side: dict) -> list[float]:
    return [run["rate"] for run in side["runs"]]


def test_smoke_run_reports_every_comparison(pg_url: str, amqp_url: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench", "--smoke", "--database-url", pg_url,
         "--amqp-url", amqp_url, "--json", str(out), "--no-markdown",
         "--workdir", str(tmp_path / "work")],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())

    assert result["machine"]["postgresql"].startswith("15")
    assert result["options"]["smoke"] is True
    # b must run the dispatcher with --max-concurrency: the harness reads it from its help.
    assert result["machine"]["max_concurrency"] == "has --max-concurrency"
    by_id = {rec["id"]: rec for rec in result["scenarios"]}
    assert sorted(by_id) == sorted(ALL)
    assert not [rec for rec in result["scenarios"] if rec["status"] == "error"]

    for sid in "ab":
        if HAS_PGQUEUER:
            assert by_id[sid]["status"] == "ok", by_id[sid]
        else:
            assert by_id[sid]["status"] == "skipped"
            assert by_id[sid]["reason"] == "peer not installed (pgqueuer)"
        assert all(rate > 0 for rate in _rates(by_id[sid]["ours"]))
    # b: every side ran at each batch size, the fastest chosen per repeat
    b_sides = ("ours", "peer") if HAS_PGQUEUER else ("ours",)
    for key in b_sides:
        for run in by_id["b"][key]["runs"]:
            assert sorted(t["batch_size"] for t in run["tried"]) == [50, 100], run
            assert run["rate"] == max(t["rate"] for t in run["tried"])
    assert (by_id["f"]["status"], by_id["f"]["reason"]) == ("skipped", "not run: pass --large")
    if by_id["c"]["status"] == "skipped":
        assert by_id["c"]["reason"] == "no ordering_key column"

    for rec in result["scenarios"]:
        if rec["status"] != "ok" or rec["id"] in "ik":
            continue
        assert rec["ratio"] > 0, rec
        for key in ("ours", "peer"):
            assert all(rate > 0 for rate in _rates(rec[key])), (rec["id"], key)
            assert rec[key]["runs"][0]["usage"]["wall_seconds"] > 0
    assert by_id["e"]["duplicates"] == 0
    # h: the row + SELECT 1 slots ran beside the two compared, as often
    statement = by_id["h"]["second_statement"]
    assert len(statement["runs"]) == len(by_id["h"]["ours"]["runs"]) and statement["ratio"] > 0
    assert by_id["g"]["ours"]["runs"][0]["queued"] >= by_id["g"]["ours"]["runs"][0]["events"]
    latency = by_id["i"]
    assert latency["status"] == "ok"
    assert 0 < latency["p50_ms"] <= latency["p99_ms"]

    for sid in "no":  # the inbox: consumed into the outbox; end to end through B's handler
        assert by_id[sid]["status"] == "ok", by_id[sid]
    assert by_id["o"]["ours"]["runs"][0]["duplicates"] == 0
    tracing = by_id["p"]  # the same drain traced (the SDK, spans dropped) and not
    assert tracing["status"] == "ok", tracing
    assert min(tracing["cpu_us_per_event"].values()) > 0
    assert "cost_us_per_event" in tracing

    sqlite = by_id["j"]  # a SQLite file in the workdir: no service to skip for
    assert sqlite["status"] == "ok", sqlite
    assert sqlite["ours"]["runs"][0]["duplicates"] == 0
    assert sqlite["peer"]["runs"][0]["usage"]["worker_processes"] == 1

    console = by_id["k"]  # smoke sizes stand in for --large's 100,000 and 1,000,000 rows
    assert console["status"] == "ok", console
    assert sorted(console["databases"]) == ["postgresql", "sqlite"]
    for side in console["databases"].values():
        assert side["refresh_ms"] > 0 and side["rss_ratio"] > 0 and side["recount_ms"] > 0
        for size in ("small", "large"):
            run = side[size]["runs"][0]
            assert run["first_screen_ms"] > 0 and run["peak_rss_mb"] > 0
            assert 0 <= run["stall_median_ms"] <= run["stall_max_ms"]
