"""What the outage and rolling-deploy scenarios share: seeding, ``--dispatch`` processes, polling.

``DispatchProcess`` runs ``outbox-tui --dispatch --json`` through the CLI tests' ``Cli``
(a clean ``OUTBOX_*`` environment, a private working directory) and reads its stdout and
stderr on threads as they come, so a long run never blocks on a full pipe and a test can
look at its lines while it runs.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import IO, Any

import pytest

from engine import (
    EventRegistry,
    OutboxEventPublisher,
    TaskContext,
    create_engine,
    create_schema,
    unit_of_work,
)
from engine.writing.publisher import OutboxEvent
from tests.cli.conftest import Cli
from tests.engine.conftest import rows
from tests.reliability import app_v2
from tests.reliability.app_v1 import TYPE_A
from tests.reliability.results import ROOT

CTX = TaskContext(tenant_id="acme", actor_id="fault-suite", request_id="req-1")
PUBLISH_CHUNK = 500


def database_name(url: str) -> str:
    """ScenarioResult's ``database``: "sqlite" or "postgresql"."""
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def registry_v2() -> EventRegistry:
    """Every type the suite's apps know (the producer's view: it writes A and B)."""
    registry = EventRegistry()
    app_v2.register(registry)
    return registry


async def seed(
    url: str,
    count: int,
    *,
    event_type: str = TYPE_A,
    prefix: str = "e",
    create: bool = False,
    max_attempts: int | None = None,
) -> list[str]:
    """Publish ``count`` events through the engine's unit of work; returns their ids."""
    engine = create_engine(url)
    registry = registry_v2()
    ids: list[str] = []
    try:
        if create:
            await create_schema(engine)
        for start in range(0, count, PUBLISH_CHUNK):
            drafts = [
                OutboxEvent(event_type, {}, "item", f"{prefix}-{i}", max_attempts=max_attempts)
                for i in range(start, min(start + PUBLISH_CHUNK, count))
            ]
            async with unit_of_work(engine, registry=registry, context=CTX) as session:
                ids += await OutboxEventPublisher(session).publish_many(drafts)
    finally:
        await engine.dispose()
    return ids


async def outbox_rows(url: str) -> list[dict[str, object]]:
    engine = create_engine(url)
    try:
        return await rows(engine)
    finally:
        await engine.dispose()


async def eventually(
    check: Callable[[], Awaitable[bool]],
    what: str,
    *,
    seconds: float = 30.0,
    every: float = 0.05,
    explain: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Poll ``check`` until it holds; fail the test with ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            detail = f": {await explain()}" if explain is not None else ""
            pytest.fail(f"{what} did not happen within {seconds:g} s{detail}")
        await asyncio.sleep(every)


class DispatchProcess:
    """One ``outbox-tui --dispatch --json`` subprocess; ``lines`` / ``errors`` fill as it runs."""

    def __init__(
        self,
        cli: Cli,
        *args: str,
        env: dict[str, str],
        instance_id: str,
    ) -> None:
        self.instance_id = instance_id
        self.proc = cli.popen(
            "--dispatch",
            "--json",
            "--instance-id",
            instance_id,
            *args,
            env={"PYTHONPATH": str(ROOT), **env},
        )
        self.lines: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, True), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, False), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str] | None, is_json: bool) -> None:
        assert stream is not None
        for line in stream:
            if not is_json:
                self.errors.append(line.rstrip("\n"))
                continue
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                self.errors.append(f"(stdout) {line.rstrip()}")

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [line for line in list(self.lines) if line.get("event") == kind]

    def totals(self) -> dict[str, int]:
        """The run's totals so far (the last iteration line's)."""
        iterations = self.events("iteration")
        return dict(iterations[-1]["totals"]) if iterations else {}

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    async def started(self, seconds: float = 30.0) -> dict[str, Any]:
        async def up() -> bool:
            if not self.running:
                pytest.fail(f"{self.instance_id} exited {self.proc.returncode}: {self.output()}")
            return bool(self.events("started"))

        await eventually(up, f"{self.instance_id} to start", seconds=seconds)
        return self.events("started")[0]

    def output(self) -> str:
        return "\n".join([*(json.dumps(line) for line in self.lines[-5:]), *self.errors[-20:]])

    async def stop(self, seconds: float = 30.0) -> dict[str, Any]:
        """SIGTERM, wait for a clean exit (0) and return the summary line."""
        if self.running:
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.proc.wait, seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.instance_id} did not stop within {seconds:g} s: {self.output()}")
        for reader in self._readers:
            reader.join(10)
        assert self.proc.returncode == 0, self.output()
        assert not any("Traceback" in line for line in self.errors), self.output()
        [summary] = self.events("summary")
        return summary

    def kill(self) -> None:
        if self.running:
            self.proc.kill()
            self.proc.wait()


def stop_all(processes: Iterable[DispatchProcess]) -> None:
    """Teardown: kill whatever a failed test left running (by its own Popen handle)."""
    for process in processes:
        process.kill()


def handled(log_lines: Sequence[str]) -> list[tuple[str, str, str]]:
    """(event id, event type, pid) per handler run, from the apps' log (see app_v1)."""
    return [(a, b, c) for a, b, c in (line.split() for line in log_lines if line.strip())]
