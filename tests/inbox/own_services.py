"""A RabbitMQ broker of a test's own (scripts/services.sh), which it may kill and restart.

The shared broker of ``make test`` is never stopped: a test that restarts a broker starts
one on a free loopback port under a short /tmp directory, kills it with SIGKILL (its beam
process, as a crash would), starts it again on the same data directory (durable queues
and persistent messages come back), and removes it at the end.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.reliability.results import ROOT

SERVICES = ROOT / "scripts" / "services.sh"
RMQBIN = Path(os.environ.get("RMQBIN", "/usr/lib/rabbitmq/bin"))


async def services(*args: str, seconds: float = 180) -> str:
    """Run one function of scripts/services.sh; its stdout."""
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        '. "$0" && "$@"',
        str(SERVICES),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=seconds)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"services.sh {' '.join(args)} did not finish within {seconds:g} s")
    if proc.returncode != 0:
        pytest.fail(f"services.sh {' '.join(args)} exited {proc.returncode}: {err.decode()}")
    return out.decode().strip()


class OwnBroker:
    """A broker in ``base`` on a free port: ``up``, ``kill`` (SIGKILL), ``up`` again."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = 0
        self.url = ""

    async def up(self) -> None:
        if not self.port:
            self.port = int(await services("free_port", "30000", "2000", "20000"))
        self.url = await services("rmq_up", str(self.base), str(self.port))

    def kill(self) -> None:
        """SIGKILL the broker's beam process, and wait until it is gone."""
        pid = int((self.base / "rabbit.pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
        for _ in range(300):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{pid}/stat") as stat:
                if ") Z" in stat.read():
                    break
            time.sleep(0.05)
        (self.base / "rabbit.pid").unlink(missing_ok=True)

    async def down(self) -> None:
        await services("rmq_down", str(self.base))


@pytest.fixture
async def own_broker() -> AsyncIterator[OwnBroker]:
    """A broker of this test's own; fails (never skips) without the RabbitMQ binaries."""
    if not (RMQBIN / "rabbitmq-server").exists():
        pytest.fail(f"no RabbitMQ in {RMQBIN}: this test restarts a broker of its own")
    base = Path(tempfile.mkdtemp(prefix="obxq.", dir="/tmp"))
    broker = OwnBroker(base)
    try:
        await broker.up()
        yield broker
    finally:
        try:
            await broker.down()
        finally:
            shutil.rmtree(base, ignore_errors=True)
