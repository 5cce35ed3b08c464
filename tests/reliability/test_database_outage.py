"""Database outage (issue 9): PostgreSQL restarts while an ``outbox-tui --dispatch`` drains a
backlog.

The dispatcher reports the outage (each report one line on stderr, no traceback), stays
alive and carries on once the server is back; its heartbeat shows the gap (``last_seen_at``
jumps by about the outage while it otherwise moves every 0.2 s or so); every event is published,
nothing stays claimed, nothing is dead-lettered.

The restart is real (``pg_ctl stop -m fast`` and start again) on a throwaway cluster of the
test's own, started with scripts/services.sh (``pg_up`` / ``pg_down``) on a free port under
a short /tmp path: the shared server of ``make test`` is never touched, so the test need
not be ``serial``. The console's side (its banner appears while PostgreSQL refuses
connections and goes once it accepts them again) is covered by
tests/console/test_resilience.py::test_postgresql_refusing_connections_then_accepting_again.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest

from engine import create_engine
from engine.operating.insights import OutboxInsights
from tests.cli.conftest import Cli, cli, status_counts  # noqa: F401 - shared fixture
from tests.inbox.own_services import services
from tests.reliability.fleet import DispatchProcess, eventually, handled, outbox_rows, seed
from tests.reliability.results import ScenarioResult, record

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

COMMAND = 'make test PYTEST_ARGS="tests/reliability/test_database_outage.py"'
PGBIN = Path(os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin"))


class OwnPostgres:
    """A throwaway PostgreSQL cluster this test may stop and start (scripts/services.sh)."""

    def __init__(self, base: Path) -> None:
        self.dir = base / "pg"
        self.port = 0
        self.password = secrets.token_hex(12)
        self.url = ""

    async def _services(self, *args: str) -> str:
        return await services(*args, seconds=90)

    async def up(self) -> None:
        if not self.port:
            self.port = int(await self._services("free_port", "15000", "5000"))
        url = await self._services(
            "pg_up", str(self.dir), str(self.port), "outbox_outage", "outbox", self.password
        )
        self.url = url

    async def down(self) -> None:
        await self._services("pg_down", str(self.dir))


@pytest.fixture
async def own_postgres() -> AsyncIterator[OwnPostgres]:
    """A cluster of this test's own; fails (never skips) without the PostgreSQL binaries."""
    if not (PGBIN / "initdb").exists():
        pytest.fail(
            f"no PostgreSQL binaries in {PGBIN}: the database-outage scenario restarts a "
            "cluster of its own (install postgresql-15, or set PGBIN)"
        )
    base = Path(tempfile.mkdtemp(prefix="obxr.", dir="/tmp"))  # short: the socket path
    os.chmod(base, 0o711)  # as root, the server runs as `postgres` and must reach base/pg
    cluster = OwnPostgres(base)
    try:
        await cluster.up()
        yield cluster
    finally:
        try:
            await cluster.down()
        finally:
            shutil.rmtree(base, ignore_errors=True)


async def _last_seen(url: str, instance_id: str) -> datetime | None:
    engine = create_engine(url)
    try:
        beats = await OutboxInsights(engine).heartbeats()
    finally:
        await engine.dispose()
    return next((b.last_seen_at for b in beats if b.instance_id == instance_id), None)


async def test_a_postgresql_restart_is_reported_survived_and_drained(
    own_postgres: OwnPostgres,
    cli: Cli,  # noqa: F811
    tmp_path: Path,
    soak: bool,
) -> None:
    backlog, after = (3000, 1000) if soak else (400, 100)
    down_seconds = 5.0 if soak else 1.5
    url = own_postgres.url
    log = tmp_path / "handled.log"
    await seed(url, 0, create=True)
    dispatcher = DispatchProcess(
        cli,
        "--installed-app",
        "tests.reliability.app_v1",
        "--batch-size",
        "10",
        env={
            "OUTBOX_DATABASE_URL": url,
            "RELIABILITY_APP_LOG": str(log),
            "RELIABILITY_APP_SLEEP": "0.02",  # about 300 events/s: the backlog outlasts a second
            "OUTBOX_DISPATCHER__LEASE_SECONDS": "2",
            "OUTBOX_DISPATCHER__IDLE_SLEEP_SECONDS": "0.05",
            "OUTBOX_DISPATCHER__HEARTBEAT_SECONDS": "0.2",
            "OUTBOX_DISPATCHER__HEARTBEAT_MIN_INTERVAL_SECONDS": "0.2",
            "OUTBOX_DISPATCHER__STORAGE_RETRY_INITIAL_SECONDS": "0.1",
            "OUTBOX_DISPATCHER__STORAGE_RETRY_MAX_SECONDS": "0.4",
        },
        instance_id="dispatcher-db-outage",
    )
    seen: list[datetime] = []  # every last_seen_at the test could read, in order
    sampling = asyncio.Event()
    sampling.set()

    async def sample() -> None:
        while sampling.is_set():
            try:
                last = await _last_seen(url, dispatcher.instance_id)
            except Exception:  # the server is away: that gap is what is measured
                last = None
            if last is not None and (not seen or last != seen[-1]):
                seen.append(last)
            await asyncio.sleep(0.05)

    sampler: asyncio.Task[None] | None = None
    try:
        ids = await seed(url, backlog, prefix="before")
        await dispatcher.started()
        sampler = asyncio.create_task(sample())

        async def dispatching() -> bool:
            return dispatcher.totals().get("published", 0) >= 50

        await eventually(dispatching, "the dispatcher to publish its first rounds")
        await own_postgres.down()  # pg_ctl stop -m fast: every session is cut
        stopped_at = time.monotonic()
        await asyncio.sleep(down_seconds)
        assert dispatcher.running, dispatcher.output()
        await own_postgres.up()
        down_for = time.monotonic() - stopped_at
        ids += await seed(url, after, prefix="after")  # written once it is back

        async def drained() -> bool:
            return (await status_counts(url)).get("published", 0) == len(ids)

        await eventually(
            drained, "everything to drain", seconds=60, explain=lambda: status_counts(url)
        )
        assert dispatcher.running
        await asyncio.sleep(0.5)  # a few more heartbeats after the drain
        sampling.clear()
        await sampler
        summary = await dispatcher.stop()
    finally:
        sampling.clear()
        if sampler is not None and not sampler.done():
            sampler.cancel()
        dispatcher.kill()

    # Reported: every storage error is one line (masked, no traceback) and counted.
    reports = [line for line in dispatcher.errors if "storage error" in line]
    assert reports, dispatcher.output()
    assert summary["storage_errors"] >= 1 and summary["storage_errors"] == len(reports)
    assert summary["last_error"], summary
    assert own_postgres.password not in "\n".join(dispatcher.errors)
    assert summary["shutdown_requested"] is True  # it ran until told to stop

    # Drained: every event published once, nothing left claimed, nothing dead.
    stored = await outbox_rows(url)
    assert Counter(r["status"] for r in stored) == Counter({"published": len(ids)})
    assert summary["published"] == len(ids) and summary["dead_lettered"] == 0
    runs = Counter(event_id for event_id, _type, _pid in handled(log.read_text().splitlines()))
    assert set(runs) == set(ids)
    reruns = sum(n - 1 for n in runs.values())  # completions lost to the restart, redone

    # The heartbeat's gap: last_seen_at moves every ~0.2 s, except once, by about the outage.
    steps = [(b - a).total_seconds() for a, b in itertools.pairwise(seen)]
    assert len(steps) >= 5, seen
    gap = max(steps)
    assert gap >= 0.8 * down_seconds, (gap, steps)
    assert statistics.median(steps) < 1.0, steps

    record(
        ScenarioResult(
            scenario="database-outage",
            database="postgresql",
            runs=1,
            events=len(ids),
            lost=len(ids) - sum(r["status"] == "published" for r in stored),
            duplicated_completions=summary["published"] - len(ids),
            late_completions_refused=summary["lost_leases"],
            command=COMMAND,
            soak=soak,
            notes=[
                f"PostgreSQL restarted (pg_ctl stop -m fast, start) mid-run, down {down_for:.1f} "
                f"s; the dispatcher reported {summary['storage_errors']} storage error(s), one "
                f"line each, stayed alive and drained; heartbeat gap {gap:.1f} s (median step "
                f"{statistics.median(steps):.2f} s); {reruns} handler re-run(s) for completions "
                "the restart cut off (at-least-once)",
            ],
        )
    )
