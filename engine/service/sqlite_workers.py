"""Let aiosqlite's worker threads finish before a command's event loop closes.

Each aiosqlite connection runs its own thread. When opening a connection fails
(a missing directory, a directory given as the file), aiosqlite stops that thread
without waiting for it (aiosqlite 0.22, ``Connection._connect``); the thread then
reports back to the event loop, and if ``asyncio.run`` has closed the loop in the
meantime it dies with ``RuntimeError: Event loop is closed`` and a traceback on
stderr, after the one-line error. Waiting here, once the engine is disposed, for
the threads that are ending anyway keeps the output to that one line.
"""

from __future__ import annotations

import asyncio
import threading
import time

WORKER_SUFFIX = "(_connection_worker_thread)"  # how threading names aiosqlite's threads


async def settle_sqlite_workers(wait_seconds: float = 1.0) -> None:
    """Wait up to ``wait_seconds`` in all for aiosqlite threads that are ending.

    Threads of connections still open (another engine's) keep running; waiting on them
    only costs the wait, so call this after disposing the engines of the command.
    """
    deadline = time.monotonic() + wait_seconds
    for thread in threading.enumerate():
        if not thread.name.endswith(WORKER_SUFFIX) or thread is threading.current_thread():
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            return
        await asyncio.to_thread(thread.join, left)
