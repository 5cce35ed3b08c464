"""SIGTERM at any moment of a ``--dispatch`` run's start-up exits 0, leaves nothing claimed."""

from __future__ import annotations

import asyncio
import signal

import pytest

from tests.cli.conftest import APP, Cli, status_counts


async def sigterm_during_start_up(cli: Cli, url: str, delay: float) -> bool:
    """SIGTERM a ``--dispatch`` run ``delay`` s after its start and check the clean exit:
    exit 0, no traceback, nothing left in publishing, nothing touched if it had not
    started. Returns whether it had got as far as its ``started`` line."""
    before = await status_counts(url)
    proc = cli.popen(
        "--dispatch", "--installed-app", APP, "--json", env={"OUTBOX_DATABASE_URL": url}
    )
    try:
        await asyncio.sleep(delay)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr + stdout
    assert "SIGTERM received" in stderr
    after = await status_counts(url)
    assert after.get("publishing", 0) == 0
    started = '"event": "started"' in stdout
    if not started:  # stopped before it could claim anything
        assert after == before
    return started


@pytest.mark.parametrize("delay", [0.5, 1.0, 2.0])
async def test_sigterm_during_start_up_exits_zero_and_claims_nothing(
    cli: Cli, orders_url: str, delay: float
) -> None:
    """Imports alone take about a second: these signals land while it is still starting
    (the first long before the database is opened), or just after."""
    await sigterm_during_start_up(cli, orders_url, delay)
