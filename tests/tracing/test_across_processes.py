"""One trace across processes: a producer process writes the event inside a request span,
an ``outbox-tui --dispatch`` process delivers it. Each configures the SDK itself (as a
service does, tests/tracing/traced_app.py) and exports its spans to a file."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from tests.tracing.traced_app import SPANS_FILE

ROOT = Path(__file__).resolve().parents[2]


async def run(argv: list[str], env: dict[str, str]) -> tuple[str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return out.decode(), err.decode()


def spans_in(path: Path) -> dict[str, dict]:
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    by_name = {span["name"]: span for span in spans}
    assert len(by_name) == len(spans), [s["name"] for s in spans]
    return by_name


async def test_the_dispatchers_span_continues_the_producers_trace(database_url, tmp_path):
    producer_spans, dispatcher_spans = tmp_path / "producer.jsonl", tmp_path / "dispatcher.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OUTBOX_DATABASE_URL": database_url}
    await run(
        [sys.executable, "-m", "tests.tracing.traced_app", database_url],
        {**env, SPANS_FILE: str(producer_spans)},
    )
    _, stderr = await run(
        [sys.executable, "-m", "outbox_tui", "--dispatch", "--installed-app",
         "tests.tracing.traced_app", "--max-iterations", "1", "--json"],
        {**env, SPANS_FILE: str(dispatcher_spans)},
    )  # fmt: skip

    produced, delivered = spans_in(producer_spans), spans_in(dispatcher_spans)
    request, write = produced["POST /orders"], produced["publish orders.placed"]
    process, charge = delivered["process orders.placed"], delivered["charge card"]
    trace_id = request["context"]["trace_id"]
    assert {s["context"]["trace_id"] for s in (write, process, charge)} == {trace_id}
    assert write["parent_id"] == request["context"]["span_id"]
    assert process["parent_id"] == write["context"]["span_id"]  # across the process boundary
    assert charge["parent_id"] == process["context"]["span_id"]
    assert process["kind"] == "SpanKind.CONSUMER"
    assert process["resource"]["attributes"]["service.name"] == "dispatcher"
    assert process["attributes"]["outbox.outcome"] == "published"

    # The handler's log line, a JSON line on stderr, names its trace and span.
    logged = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    [line] = [entry for entry in logged if entry["logger"] == "traced_app"]
    assert line["message"] == "charging order o-1"
    assert f"0x{line['trace_id']}" == trace_id
    assert f"0x{line['span_id']}" == charge["context"]["span_id"]
