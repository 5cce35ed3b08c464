"""CLI fixtures: run ``python -m outbox_tui`` as a real subprocess, and seed outbox databases.

Seeding happens in-process through the engine and the example app (fast); everything under
test runs in a child process with a clean ``OUTBOX_*`` environment and a private working
directory, so the default ``./outbox.db`` never lands in the repository.
"""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from sqlalchemy import func, select, update

from engine import OutboxDispatcher, create_engine, create_schema
from engine.service import load_registry
from engine.storage.schema import outbox_events
from outbox_tui.examples.orders import create_tables
from outbox_tui.examples.orders.traffic import generate_orders
from tests.cli.prestarted import PrestartedCli

APP = "outbox_tui.examples.orders"
# For behaviour of the CLI itself rather than of a backend: one backend is enough.
sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
ERROR_PREFIX = "outbox-tui: error: "


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def json_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def assert_one_error_line(self, *fragments: str, status: int) -> str:
        """Exit ``status``, exactly one stderr line with the prefix, no traceback."""
        assert self.returncode == status, self
        lines = self.stderr.splitlines()
        assert len(lines) == 1, self.stderr
        assert lines[0].startswith(ERROR_PREFIX), lines[0]
        assert "Traceback" not in self.output
        for fragment in fragments:
            assert fragment in lines[0], lines[0]
        return lines[0]


REPO = Path(__file__).resolve().parents[2]
ORDERED_APP = "tests.cli.ordered_app"
COUNTING_APP = "tests.cli.counting_app"


def ordered_app_env(database_url: str, log: Path, *, quick_retries: bool = True) -> dict[str, str]:
    """The environment of a dispatcher process running ``tests/cli/ordered_app.py``.

    ``log`` receives its handler start/end lines; ``quick_retries``: a fixed 50 ms
    backoff without jitter, so failing events come back at once and predictably.
    """
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "ORDERED_APP_LOG": str(log),
        "PYTHONPATH": str(REPO),
    }
    if quick_retries:
        env.update(
            OUTBOX_DISPATCHER__BACKOFF_KIND="fixed",
            OUTBOX_DISPATCHER__BACKOFF_BASE_SECONDS="0.05",
            OUTBOX_DISPATCHER__BACKOFF_JITTER="0",
        )
    return env


def counting_app_env(database_url: str, log: Path, go: Path, **extra: str) -> dict[str, str]:
    """The environment of a dispatcher process running ``tests/cli/counting_app.py``.

    ``log`` receives its handled lines; its handlers wait until the file ``go`` exists.
    """
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "COUNTING_APP_LOG": str(log),
        "COUNTING_APP_GO": str(go),
        "PYTHONPATH": str(REPO),
    }
    env.update(extra)
    return env


def dispatch_args(app: str, *options: str) -> tuple[str, ...]:
    """``--dispatch`` of the test app ``app`` with ``options``, JSON lines out."""
    return ("--dispatch", "--installed-app", app, *options, "--json")


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    # PYTHONFAULTHANDLER: a child that hangs prints its threads' stacks on SIGABRT.
    env.update(COLUMNS="200", PYTHONUNBUFFERED="1", NO_COLOR="1", PYTHONFAULTHANDLER="1")
    env.update(extra)
    return env


def abort_for_stacks(proc: subprocess.Popen[str]) -> None:
    """End a child that did not exit in time with SIGABRT, so that its stderr ends with
    every thread's Python stack (faulthandler, see ``cli_env``): where it hung, in the
    failure message, instead of a bare timeout."""
    proc.send_signal(signal.SIGABRT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def sigterm_handled(proc: subprocess.Popen[str], within: float = 30) -> None:
    """Wait until ``proc`` has its SIGTERM handler (``SigCgt`` in /proc): a signal before
    that ends the interpreter by default, a window no program can close, and longer than
    a test's fixed delay when a loaded machine starts Python slowly."""
    bit = 1 << (signal.SIGTERM - 1)
    deadline = time.monotonic() + within
    while True:
        assert proc.poll() is None, "exited before handling SIGTERM"
        status = Path(f"/proc/{proc.pid}/status").read_text()  # noqa: ASYNC240 - procfs
        caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
        if int(caught.split()[1], 16) & bit:
            return
        assert time.monotonic() < deadline, f"no SIGTERM handler within {within}s"
        await asyncio.sleep(0.005)


# A command runs in a child forked from a process that imported the CLI once
# (tests/cli/prestarted.py); OUTBOX_TEST_CLI_FRESH=1: in a fresh interpreter each.
FRESH_INTERPRETERS = os.environ.get("OUTBOX_TEST_CLI_FRESH") == "1"
_PRESTARTED = PrestartedCli()


class Cli:
    """Runs the CLI in ``cwd`` with a clean environment: ``cli(...)`` to completion (in a
    prestarted child), ``popen`` as a real process."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "outbox_tui", *args]

    def __call__(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> Result:
        if not FRESH_INTERPRETERS:
            return Result(*_PRESTARTED.run(list(args), self.cwd, cli_env(**(env or {})), timeout))
        done = subprocess.run(
            self.command(*args),
            cwd=self.cwd,
            env=cli_env(**(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr)

    def popen(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        stdout: IO[str] | int = subprocess.PIPE,
        stderr: IO[str] | int = subprocess.PIPE,
    ) -> subprocess.Popen[str]:
        """Start the CLI; ``stdout``/``stderr`` may be files for long runs (a pipe fills up)."""
        return subprocess.Popen(
            self.command(*args),
            cwd=self.cwd,
            env=cli_env(**(env or {})),
            stdout=stdout,
            stderr=stderr,
            text=True,
        )


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def read_json_lines(
    proc: subprocess.Popen[str], *, timeout: float = 30
) -> Iterator[dict[str, Any]]:
    """JSON lines from a running process's stdout, failing the test after ``timeout``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                proc.kill()
                pytest.fail(f"no JSON line within {timeout}s")
            line = proc.stdout.readline()
            if not line:
                return
            yield json.loads(line)


# -- seeding ---------------------------------------------------------------------------


async def seed_orders(url: str, count: int = 20, *, dispatch: bool = False) -> None:
    """Outbox schema, the example's tables, ``count`` orders; optionally one dispatch round.

    One round over the seed's fixed amounts publishes most events, fails the flaky ones
    (retried later) and dead-letters the orders over the credit limit.
    """
    engine = create_engine(url)
    try:
        await create_schema(engine)
        await create_tables(engine)
        registry = load_registry([APP])
        await generate_orders(engine, registry, count)
        if dispatch:
            await OutboxDispatcher(engine, registry, dispatcher_id="seed").dispatch_once()
    finally:
        await engine.dispose()


async def status_counts(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            t = outbox_events
            rows = await conn.execute(select(t.c.status, func.count()).group_by(t.c.status))
            return {status: int(n) for status, n in rows}
    finally:
        await engine.dispose()


async def rewrite_dead_letters(url: str, **values: str) -> None:
    """Overwrite columns of every dead letter, as a plain-SQL writer (or an outside
    system's error text) could have left them."""
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            t = outbox_events
            await conn.execute(update(t).where(t.c.status == "dead_letter").values(**values))
    finally:
        await engine.dispose()


@pytest.fixture
async def orders_url(database_url: str) -> str:
    """A database with 20 orders' events pending (24 with the cancellations)."""
    await seed_orders(database_url)
    return database_url


@pytest.fixture
async def dead_letters_url(database_url: str) -> str:
    """A database after one dispatch round: published, failed and dead-letter rows."""
    await seed_orders(database_url, dispatch=True)
    return database_url
