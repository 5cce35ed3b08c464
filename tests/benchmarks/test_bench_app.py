"""The benchmark's installed app waits for the go file once the dispatcher is up
(``EventRegistry.on_ready``), not while the app is loaded: a drain's clock leaves out
start-up. Nothing here is timed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from benchmarks import bench_app
from engine import EventRegistry


def test_loading_the_app_does_not_wait_for_the_go_file(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OUTBOX_BENCH_SYNC_DIR", str(tmp_path))
    registry = EventRegistry()
    bench_app.register(registry)  # returns at once: no go file, nothing reported ready
    assert list(tmp_path.iterdir()) == []
    assert len(registry.ready_hooks()) == 1


async def test_the_ready_hook_reports_ready_then_waits_for_go(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OUTBOX_BENCH_SYNC_DIR", str(tmp_path))
    registry = EventRegistry()
    bench_app.register(registry)
    (hook,) = registry.ready_hooks()
    waiting = asyncio.ensure_future(hook())
    ready = tmp_path / f"ready.{os.getpid()}"
    for _ in range(500):
        if ready.exists():
            break
        await asyncio.sleep(0.01)
    assert ready.exists()
    await asyncio.sleep(0.05)
    assert not waiting.done()  # no go file yet
    (tmp_path / "go").write_text("")
    await asyncio.wait_for(waiting, 10)


def test_without_a_sync_dir_there_is_no_hook(monkeypatch) -> None:
    monkeypatch.delenv("OUTBOX_BENCH_SYNC_DIR", raising=False)
    registry = EventRegistry()
    bench_app.register(registry)
    assert registry.ready_hooks() == ()


@pytest.fixture(autouse=True)
def _no_call_log(monkeypatch) -> None:
    monkeypatch.delenv("OUTBOX_BENCH_LOG_DIR", raising=False)
