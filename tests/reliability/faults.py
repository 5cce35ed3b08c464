"""What the fault scenarios share: dispatcher processes they can kill, and a commit log.

``Dispatcher`` is one ``outbox-tui --dispatch --json`` process started through the CLI
tests' ``Cli`` helper, with stdout and stderr in files (a long run would fill a pipe, and a
killed process's last lines stay readable). ``install_commit_log`` adds a trigger that
writes one row per completed claim (a row leaving ``publishing``) in the same transaction
as the completion, so a second completion of one claim, or a second ``published``, is
visible afterwards however the processes died.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text

from engine import create_engine
from engine.storage.schema import PUBLISHING, outbox_events
from tests.cli.conftest import Cli, abort_for_stacks


def database_name(url: str) -> str:
    """The ``database`` of a ScenarioResult for ``url``."""
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def reproduce(test_file: str, *, soak: bool) -> str:
    """The command that runs ``test_file`` again, at the sizes this run used."""
    extra = " --soak" if soak else ""
    return f'make test PYTEST_ARGS="{test_file}{extra}"'


# -- dispatcher processes --------------------------------------------------------------


@dataclass
class Dispatcher:
    """One ``--dispatch --json`` process; ``killed_at`` is CLOCK_MONOTONIC ns once it is gone."""

    name: str
    proc: Any  # subprocess.Popen[str]
    out: Path
    err: Path
    killed_at: int | None = None
    _started: bool = False

    @property
    def pid(self) -> str:
        return str(self.proc.pid)

    def lines(self) -> list[dict[str, Any]]:
        """Its JSON lines so far (a line cut short by SIGKILL is left out)."""
        lines = []
        for line in self.out.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return lines

    def started(self) -> bool:
        """Whether its first line, ``started``, is out (read once per poll, cheaply)."""
        if not self._started:
            with self.out.open() as out:
                first = out.readline()
            self._started = first.endswith("\n") and '"event": "started"' in first
        return self._started

    def summary(self) -> dict[str, Any] | None:
        return next((line for line in self.lines() if line.get("event") == "summary"), None)

    def refused(self) -> int:
        """Completions the fence refused (``lost_leases``), as far as it reported them."""
        seen = 0
        for line in self.lines():
            totals = line if line.get("event") == "summary" else line.get("totals", {})
            seen = max(seen, int(totals.get("lost_leases", 0)))
        return seen

    def published(self) -> int:
        seen = 0
        for line in self.lines():
            totals = line if line.get("event") == "summary" else line.get("totals", {})
            seen = max(seen, int(totals.get("published", 0)))
        return seen

    def stderr(self) -> str:
        return self.err.read_text()

    def wait_exit(self, timeout: float) -> int:
        """Its exit code; fails with its threads' stacks if it is still running after
        ``timeout`` s (it hung: see ``abort_for_stacks``)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            abort_for_stacks(self.proc)
            self.killed_at = time.monotonic_ns()
            pytest.fail(f"{self.name} still running after {timeout:g} s:\n{self.stderr()[-8000:]}")

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone (its handlers can no longer run)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.killed_at = time.monotonic_ns()


def spawn(
    cli: Cli, name: str, args: tuple[str, ...], env: dict[str, str], where: Path
) -> Dispatcher:
    """Start ``outbox-tui <args> --instance-id name``; output goes to files in ``where``."""
    out, err = where / f"{name}.out", where / f"{name}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = cli.popen(*args, "--instance-id", name, env=env, stdout=stdout, stderr=stderr)
    return Dispatcher(name, proc, out, err)


async def wait_started(dispatcher: Dispatcher, within: float = 60) -> None:
    """Until its ``started`` line (it opened the database and is about to claim)."""
    deadline = time.monotonic() + within
    while not dispatcher.started():
        if dispatcher.proc.poll() is not None:
            pytest.fail(
                f"{dispatcher.name} exited {dispatcher.proc.returncode}: "
                f"{dispatcher.stderr()[-2000:]}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"{dispatcher.name} did not start within {within}s")
        await asyncio.sleep(0.02)


def stop_all(dispatchers: list[Dispatcher], timeout: float = 60) -> list[int]:
    """SIGTERM every live one, wait for each; their exit codes (killed ones excluded)."""
    alive = [d for d in dispatchers if d.killed_at is None]
    for d in alive:
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
    for d in alive:
        d.wait_exit(timeout)
    return [d.proc.returncode for d in alive]


# -- what the database says --------------------------------------------------------------


async def held_claims(url: str, locked_by: str | None = None) -> int:
    """Rows in ``publishing`` (held by ``locked_by``, or by anyone)."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            t = outbox_events
            query = select(func.count()).where(t.c.status == PUBLISHING)
            if locked_by is not None:
                query = query.where(t.c.locked_by == locked_by)
            return int((await conn.execute(query)).scalar_one())
    finally:
        await engine.dispose()


_SQLITE_LOG = (
    """CREATE TABLE reliability_completions (
        n INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL,
        claim_version INTEGER NOT NULL, locked_by TEXT, status TEXT NOT NULL)""",
    """CREATE TRIGGER reliability_completions_log AFTER UPDATE OF status ON outbox_events
    WHEN OLD.status = 'publishing' AND NEW.status <> 'publishing'
    BEGIN
        INSERT INTO reliability_completions (event_id, claim_version, locked_by, status)
        VALUES (OLD.id, OLD.claim_version, OLD.locked_by, NEW.status);
    END""",
)
_POSTGRES_LOG = (
    """CREATE TABLE reliability_completions (
        n bigserial PRIMARY KEY, event_id text NOT NULL, claim_version integer NOT NULL,
        locked_by text, status text NOT NULL)""",
    """CREATE FUNCTION reliability_log_completion() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO reliability_completions (event_id, claim_version, locked_by, status)
        VALUES (OLD.id, OLD.claim_version, OLD.locked_by, NEW.status);
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER reliability_completions_log AFTER UPDATE OF status ON outbox_events
    FOR EACH ROW WHEN (OLD.status = 'publishing' AND NEW.status <> 'publishing')
    EXECUTE FUNCTION reliability_log_completion()""",
)


async def install_commit_log(url: str) -> None:
    """One ``reliability_completions`` row per completed claim, written with the completion.

    A completion is any write that takes a row out of ``publishing``: published, failed,
    dead letter, or handed back unattempted. It records the claim it completed (the
    fencing token ``claim_version`` and the holder).
    """
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            for statement in _POSTGRES_LOG if engine.dialect.name == "postgresql" else _SQLITE_LOG:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


@dataclass(frozen=True)
class Completions:
    """The commit log, read back: (event id, claim version, holder, new status) per row."""

    entries: list[tuple[str, int, str | None, str]]

    def duplicated(self) -> int:
        """Events completed twice: one claim completed more than once, or published twice.

        A redelivery after a crash or an expired lease is a new claim (a new
        ``claim_version``), so it is at-least-once delivery, not a duplicate completion.
        """
        per_claim = Counter((event_id, version) for event_id, version, _by, _s in self.entries)
        published = Counter(e for e, _v, _by, status in self.entries if status == "published")
        twice = {e for (e, _v), n in per_claim.items() if n > 1}
        twice |= {e for e, n in published.items() if n > 1}
        return len(twice)

    def published_by(self) -> dict[str, str | None]:
        """Who completed each published event."""
        return {e: by for e, _v, by, status in self.entries if status == "published"}


async def completions(url: str) -> Completions:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT event_id, claim_version, locked_by, status "
                    "FROM reliability_completions ORDER BY n"
                )
            )
            return Completions([(r[0], int(r[1]), r[2], r[3]) for r in rows])
    finally:
        await engine.dispose()
