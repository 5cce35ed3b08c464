"""SQLite connections and aiosqlite's worker threads.

aiosqlite runs each connection on a thread of its own. When a connect fails it queues that
thread's stop and raises at once; if the program's event loop closes before the thread
hands back the stop's result, Python prints an "Event loop is closed" traceback from the
thread at exit. ``create_engine``'s connector returns from a failed connect only once the
thread has stopped, and marks every worker thread daemon, as SQLAlchemy's own does.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from engine import create_engine


def _workers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if "_connection_worker_thread" in t.name}


async def test_a_failed_connect_has_stopped_its_worker_thread_when_it_raises(
    tmp_path: Path,
) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/outbox.db")
    before = _workers()
    try:
        for _ in range(3):
            with pytest.raises(OperationalError, match="unable to open database file"):
                async with engine.connect():
                    pass
            assert {t for t in _workers() - before if t.is_alive()} == set()
    finally:
        await engine.dispose()


async def test_a_connection_runs_on_a_daemon_thread(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/outbox.db")
    before = _workers()
    try:
        async with engine.connect() as conn:
            assert (await conn.exec_driver_sql("SELECT 1")).scalar() == 1
            [worker] = _workers() - before
            assert worker.daemon
    finally:
        await engine.dispose()
