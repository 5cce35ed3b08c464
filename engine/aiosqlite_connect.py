"""Opening aiosqlite connections for SQLAlchemy: ``create_engine``'s connector on SQLite."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aiosqlite

# How long a failed connect waits for aiosqlite's worker thread to stop.
_WORKER_STOP_SECONDS = 1.0


async def connect_aiosqlite(*args: Any, **kwargs: Any) -> Any:
    """``aiosqlite.connect`` that, when the connect fails, returns only once the
    connection's worker thread has stopped.

    On a failed connect aiosqlite queues its thread's stop and raises at once; the thread
    then hands the stop's result to the event loop. A program that ends right after such
    a failure (an unopenable file, then a stop) has closed its loop by then, and Python
    prints the thread's "Event loop is closed" traceback at exit (omnilib/aiosqlite#241).
    """
    connection = aiosqlite.connect(*args, **kwargs)
    # Before aiosqlite 0.22 the connection was the thread; since, it holds one (SQLAlchemy's
    # own connector reads both the same way).
    worker = (
        connection
        if isinstance(connection, threading.Thread)
        else getattr(connection, "_thread", None)
    )
    if worker is not None:
        worker.daemon = True  # as SQLAlchemy sets it: a leaked connection never holds exit
    try:
        return await connection
    except Exception:
        if worker is not None:  # the loop stays open (and takes the stop's result) meanwhile
            await asyncio.to_thread(worker.join, _WORKER_STOP_SECONDS)
        raise
