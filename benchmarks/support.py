"""What every scenario of benchmarks/bench.py needs: connections, data, worker processes.

Nothing here knows a scenario. ``Fleet`` runs worker processes (our CLI or a peer) that
report ready and start together on a go file; ``wait_until_empty`` watches a table empty
out; ``check_calls`` checks that every event was handled exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from engine.clock import uuid7
from engine.storage.schema import ACTIVE_PREDICATE

ROOT = Path(__file__).resolve().parent.parent
EVENT_TYPE = "bench.happened"
COPY_CHUNK = 50_000
POLL_SECONDS = 0.05


# -- connections -----------------------------------------------------------------------


def asyncpg_args(url: str) -> dict[str, Any]:
    return make_url(url).translate_connect_args(username="user")


def libpq_dsn(url: str) -> str:
    """``postgresql://`` for clients that are not SQLAlchemy (pgqueuer, pgbench's env)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def connect(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(**asyncpg_args(url))


def payload(i: int) -> str:
    """A payload the registry accepts (the context fields) and of a realistic size."""
    return json.dumps(
        {"tenant_id": "acme", "actor_id": "bench", "request_id": f"req-{i}", "order_no": i}
    )


def cloudevent_size() -> int:
    """Bytes of the CloudEvent the relay sends for one preloaded event."""
    from engine.relay.cloudevents import encode_cloudevent, to_cloudevent
    from engine.writing.envelope import EventEnvelope

    envelope = EventEnvelope.from_row(
        {
            "id": uuid7(),
            "tenant_id": "acme",
            "event_type": EVENT_TYPE,
            "event_version": 1,
            "aggregate_type": "bench",
            "aggregate_id": "12345",
            "payload": json.loads(payload(12345)),
            "created_at": datetime.now(UTC),
            "attempt_count": 1,
            "max_attempts": 10,
            "claim_version": 1,
        }
    )
    return len(encode_cloudevent(to_cloudevent(envelope)))


# -- what every scenario gets ---------------------------------------------------------------

Progress = Callable[[str, int], Callable[[int], None]]


@dataclass
class Context:
    """Where to connect, where to write, how to report progress."""

    url: str
    amqp_url: str | None
    workdir: Path
    conn: asyncpg.Connection
    progress: Progress
    batch_size: int = 500
    timeout: float = 1800.0
    cli_help: str = ""
    broker_pid: int | None = None

    @property
    def max_concurrency_flag(self) -> bool:
        return "--max-concurrency" in self.cli_help


# -- outbox data -------------------------------------------------------------------------


async def has_column(conn: asyncpg.Connection, table: str, column: str) -> bool:
    found = await conn.fetchval(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND table_name = $1 AND column_name = $2",
        table,
        column,
    )
    return found is not None


async def reset_outbox(conn: asyncpg.Connection) -> None:
    await conn.execute("TRUNCATE outbox_events, outbox_handler_runs, process_heartbeats")


async def preload_outbox(
    conn: asyncpg.Connection, count: int, *, ordering_key: Callable[[int], str] | None = None
) -> None:
    """``count`` pending events by COPY, oldest first, optionally with an ordering key."""
    columns = ["id", "tenant_id", "event_type", "event_version", "aggregate_type"]
    columns += ["aggregate_id", "payload"] + (["ordering_key"] if ordering_key else [])
    for start in range(0, count, COPY_CHUNK):
        rows = []
        for i in range(start, min(count, start + COPY_CHUNK)):
            row = (uuid7(), "acme", EVENT_TYPE, 1, "bench", str(i), payload(i))
            rows.append((*row, ordering_key(i)) if ordering_key else row)
        await conn.copy_records_to_table("outbox_events", records=rows, columns=columns)


async def count_active(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval(f"SELECT count(*) FROM outbox_events WHERE {ACTIVE_PREDICATE}"))


async def outbox_empty(conn: asyncpg.Connection) -> bool:
    found = await conn.fetchval(f"SELECT 1 FROM outbox_events WHERE {ACTIVE_PREDICATE} LIMIT 1")
    return found is None


async def settle(conn: asyncpg.Connection, *tables: str) -> None:
    """ANALYZE the freshly loaded tables and CHECKPOINT, so every run starts alike.

    CHECKPOINT needs superuser or pg_checkpoint (bench.sh grants it); without it the
    runs just start wherever the last checkpoint left them.
    """
    for table in tables:
        await conn.execute(f"ANALYZE {table}")
    with contextlib.suppress(asyncpg.exceptions.InsufficientPrivilegeError):
        await conn.execute("CHECKPOINT")


# -- worker processes ---------------------------------------------------------------------


def outbox_cli() -> list[str]:
    """``outbox-tui`` of this interpreter's environment."""
    script = Path(sys.executable).with_name("outbox-tui")
    return [str(script)] if script.exists() else [sys.executable, "-m", "outbox_tui"]


def cli_help() -> str:
    """The dispatcher's own help (its flags, such as --max-concurrency, are listed there)."""
    done = subprocess.run(
        [*outbox_cli(), "dispatch", "--help"], capture_output=True, text=True, check=False
    )
    return done.stdout


class WorkerFailed(RuntimeError):
    pass


@dataclass
class Fleet:
    """Worker processes that wait for a go file in ``workdir/sync`` after they are ready."""

    workdir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    # calls_logged's place in each call log: how far it has read, how many lines it found
    _read_to: dict[Path, int] = field(default_factory=dict)
    _lines: int = 0

    @property
    def sync_dir(self) -> Path:
        return self.workdir / "sync"

    @property
    def calls_dir(self) -> Path:
        return self.workdir / "calls"

    def prepare(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.sync_dir.mkdir(parents=True)
        self.calls_dir.mkdir()

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env["OUTBOX_BENCH_SYNC_DIR"] = str(self.sync_dir)
        env["OUTBOX_BENCH_LOG_DIR"] = str(self.calls_dir)
        env.update(extra or {})
        return env

    def start(self, argv: Sequence[str], env: dict[str, str]) -> None:
        log = self.workdir / f"worker{len(self.procs)}.log"
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            )
        self.logs.append(log)

    def calls_logged(self) -> int:
        """Handler calls logged so far (what is flushed), for the progress bar.

        Reads only what the logs gained since the last call: a count of active rows
        instead visits the whole backlog, and at 1,000,000 rows it took about 0.4 s of a
        PostgreSQL backend once a second, beside the drain it was watching.
        """
        for path in self.calls_dir.glob("calls.*.tsv"):
            start = self._read_to.get(path, 0)
            with path.open("rb") as log:
                log.seek(start)
                chunk = log.read()
            self._read_to[path] = start + len(chunk)
            self._lines += chunk.count(b"\n")
        return self._lines

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def check_alive(self) -> None:
        """Raise when a worker failed (a clean exit is a finished producer, not a failure)."""
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll():
                tail = log.read_text(errors="replace")[-2000:]
                raise WorkerFailed(f"worker {proc.args!r} exited with {proc.returncode}:\n{tail}")

    async def wait_ready(self, limit: float = 120.0) -> None:
        deadline = time.monotonic() + limit
        while len(list(self.sync_dir.glob("ready.*"))) < len(self.procs):
            self.check_alive()
            if time.monotonic() > deadline:
                raise WorkerFailed(f"workers not ready after {limit:g} s (see {self.workdir})")
            await asyncio.sleep(0.02)

    def go(self, at: float | None = None) -> float:
        """Start the workers (those that read it start at the unix time ``at``)."""
        staged = self.sync_dir / "go.staged"
        staged.write_text("" if at is None else repr(at))
        staged.replace(self.sync_dir / "go")  # atomic: a reader never sees it half-written
        return time.perf_counter()

    async def stop(self, limit: float = 60.0) -> list[int]:
        """SIGTERM (our CLI finishes its batch and exits 0), SIGKILL after ``limit`` s."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + limit
        for proc in self.procs:
            while True:
                if proc.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    break
                await asyncio.sleep(0.02)
        return [p.returncode for p in self.procs]

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def calls(self) -> list[tuple[str, float]]:
        """(event or job id, handler start in unix seconds) of every handler call the
        workers logged (in nanoseconds)."""
        found = []
        for path in self.calls_dir.glob("calls.*.tsv"):
            for line in path.read_text().splitlines():
                key, _, when = line.partition("\t")
                found.append((key, int(when) / 1e9))
        return found

    def log_tail(self, chars: int = 1500) -> str:
        return "\n".join(p.read_text(errors="replace")[-chars:] for p in self.logs)


async def wait_until_empty(
    empty: Callable[[], Awaitable[bool]],
    remaining: Callable[[], Awaitable[int]],
    *,
    total: int,
    fleet: Fleet | None,
    progress: Callable[[int], None],
    limit: float,
    cap: float | None = None,
    logged: Callable[[], int] | None = None,
) -> tuple[float, bool]:
    """Poll ``empty`` every 50 ms; returns (perf_counter() then, whether it emptied).

    Stops early, not emptied, after ``cap`` seconds. The progress bar, about once a
    second, shows ``logged`` (the handler calls logged, Fleet.calls_logged) or else
    ``total`` less ``remaining`` (a count, dearer than the existence check).
    """
    started = time.monotonic()
    next_count = 0.0
    while True:
        if await empty():
            progress(total)
            return time.perf_counter(), True
        now = time.monotonic()
        if cap is not None and now - started >= cap:
            return time.perf_counter(), False
        if now >= next_count:
            progress(min(total, logged()) if logged is not None else total - await remaining())
            next_count = now + 1.0
        if fleet is not None:
            fleet.check_alive()
        if now - started > limit:
            raise WorkerFailed(f"{await remaining()} of {total} left after {limit:g} s")
        await asyncio.sleep(POLL_SECONDS)


def check_calls(
    calls: list[tuple[str, float]], expected: int, *, exact: bool = True
) -> dict[str, int]:
    """Handler calls against the events done: each exactly once (at least, when capped)."""
    seen: dict[str, int] = {}
    for key, _ in calls:
        seen[key] = seen.get(key, 0) + 1
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    if len(seen) < expected or (exact and len(seen) != expected):
        raise WorkerFailed(f"handled {len(seen)} distinct events, expected {expected}")
    return {"handler_calls": len(calls), "duplicates": duplicates}
