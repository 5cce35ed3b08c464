"""What tracing costs a dispatcher, in one process on SQLite: A/B against another checkout.

Drains N preloaded no-op events with ``OutboxDispatcher.dispatch_once`` (batch 500, uvloop)
and prints one JSON line: the rate and the process CPU per event. Which engine it runs is
whichever ``engine`` the interpreter imports, so alternating runs with ``PYTHONPATH`` set
to two checkouts compares their code paths in one venv (decision 0040):

    PYTHONPATH=/tmp/previous python benchmarks/tracing_ab.py 50000
    PYTHONPATH=.              python benchmarks/tracing_ab.py 50000
    PYTHONPATH=.              python benchmarks/tracing_ab.py 50000 --sdk   # spans dropped

``--runs R --against DIR`` alternates this checkout, DIR and this one with ``--sdk`` itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ROW = (
    "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, aggregate_type,"
    " aggregate_id, payload) VALUES (?, 'acme', 'bench.happened', 1, 'bench', ?, ?)"
)
PAYLOAD = '{"tenant_id": "acme", "actor_id": "bench", "request_id": "r", "n": 1}'


async def drain(events: int, directory: str) -> dict[str, object]:
    import sqlite3
    import uuid

    from engine import EventRegistry, OutboxDispatcher, create_engine, create_schema

    path = Path(directory) / "ab.db"
    url = f"sqlite+aiosqlite:///{path}"
    engine = create_engine(url)
    await create_schema(engine)
    with sqlite3.connect(path) as db:
        db.executemany(ROW, ((str(uuid.uuid4()), str(n), PAYLOAD) for n in range(events)))
    registry = EventRegistry()
    registry.register_event("bench.happened", 1)

    @registry.handler("bench.happened", key="bench.noop")
    async def noop(envelope: object) -> None:
        return None

    dispatcher = OutboxDispatcher(engine, registry, batch_size=500)
    wall, cpu, done = time.perf_counter(), time.process_time(), 0
    while True:
        result = await dispatcher.dispatch_once()
        done += result.published
        if not result.claimed:
            break
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await engine.dispose()
    assert done == events, (done, events)
    import engine as imported

    return {
        "rate": round(events / wall, 1),
        "cpu_us_per_event": round(cpu / events * 1e6, 2),
        "engine": str(Path(imported.__file__).parent.parent),
    }


def one(events: int, sdk: bool) -> None:
    if sdk:  # only this checkout's side traces: the previous one has no such function
        from benchmarks.bench_app import trace_with_the_sdk

        trace_with_the_sdk()
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    with tempfile.TemporaryDirectory() as directory:
        print(json.dumps(run(drain(events, directory))))


def alternate(events: int, runs: int, against: Path) -> None:
    sides = {"this": (ROOT, False), "previous": (against, False), "this+sdk": (ROOT, True)}
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(runs):
        for name in names[r % 3 :] + names[: r % 3]:
            path, sdk = sides[name]
            argv = [sys.executable, str(Path(__file__).resolve()), str(events)]
            env = dict(os.environ, PYTHONPATH=str(path))
            done = subprocess.run(
                [*argv, *(["--sdk"] if sdk else [])],
                env=env, cwd=path, capture_output=True, text=True, check=True,
            )  # fmt: skip
            found[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for name, got in found.items():
        print(name, json.dumps(got))
    for name in ("previous", "this+sdk"):
        ratios = [a["rate"] / b["rate"] for a, b in zip(found["this"], found[name], strict=True)]
        print(f"rate this / {name}: median {statistics.median(ratios):.3f}", ratios)
    cpu = [
        a["cpu_us_per_event"] / b["cpu_us_per_event"]
        for a, b in zip(found["this"], found["previous"], strict=True)
    ]
    print(f"CPU per event this / previous: median {statistics.median(cpu):.3f}", cpu)
    cost = [
        b["cpu_us_per_event"] - a["cpu_us_per_event"]
        for a, b in zip(found["this"], found["this+sdk"], strict=True)
    ]
    print(f"tracing CPU per event: median {statistics.median(cost):.2f} µs", cost)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("events", type=int)
    parser.add_argument("--sdk", action="store_true", help="trace with the SDK, spans dropped")
    parser.add_argument("--runs", type=int, default=0, help="alternate the sides R times")
    parser.add_argument("--against", type=Path, help="the previous checkout (with --runs)")
    args = parser.parse_args()
    if args.runs:
        alternate(args.events, args.runs, args.against)
    else:
        one(args.events, args.sdk)


if __name__ == "__main__":
    main()
