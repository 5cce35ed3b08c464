"""The published total off the refresh path: exact on screen, recounted now and then."""

from __future__ import annotations

import gc
from datetime import timedelta
from pathlib import Path

from sqlalchemy import delete, func, select

from engine import create_engine
from engine.service import open_engine
from engine.storage.schema import PUBLISHED, outbox_events
from outbox_tui.widgets.overview import CountTile

from .conftest import SIZE, console, counts, refreshed, started, until
from .showcase import copy_database
from .test_overview import Clock, _publish


async def test_the_published_tile_is_exact_between_and_after_recounts(orders_registry, seeded_url):
    clock = Clock()
    app = console(seeded_url, orders_registry, clock=clock, published_recount_seconds=10)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        main = app.main
        tile = main.query_one("#tile-published", CountTile)
        first = main.recount.totals
        assert first is not None and tile.value == (await counts(seeded_url))[PUBLISHED]
        for n in (3, 2):  # published between recounts: added from the published_at index
            clock.now += timedelta(seconds=1)
            await _publish(seeded_url, n, clock.now)
            await refreshed(pilot)
            assert tile.value == (await counts(seeded_url))[PUBLISHED]
            assert main.throughput[-1] == n
        assert main.recount.totals is first  # no recount yet: none was due
        # The retention purge deletes published rows: only a recount can see that.
        engine = create_engine(seeded_url)
        try:
            async with engine.begin() as conn:
                oldest = select(outbox_events.c.id).where(outbox_events.c.status == PUBLISHED)
                await conn.execute(
                    delete(outbox_events).where(outbox_events.c.id.in_(oldest.limit(2)))
                )
        finally:
            await engine.dispose()
        clock.now += timedelta(seconds=11)
        await refreshed(pilot)  # due now: the recount starts beside this refresh
        await until(pilot, lambda: main.recount.totals is not first, "the recount")
        await refreshed(pilot)
        assert tile.value == (await counts(seeded_url))[PUBLISHED]


async def test_the_console_freezes_its_long_lived_objects_and_unfreezes_on_exit(
    sqlite_seeded, orders_registry
):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.pause()
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


async def test_a_pooled_sqlite_connection_follows_the_file_at_its_path(sqlite_seeded, tmp_path):
    """The console's SQLite pool keeps its threads; a file replaced at the path is read anew."""
    path = Path(sqlite_seeded.split("///", 1)[1])
    other = tmp_path / "other.db"
    copy_database(path, other)
    engine = create_engine(f"sqlite+aiosqlite:///{other}")
    try:
        async with engine.begin() as conn:
            await conn.execute(delete(outbox_events))
    finally:
        await engine.dispose()
    console_engine = open_engine(sqlite_seeded, "console")
    count = select(func.count()).select_from(outbox_events)
    try:
        async with console_engine.connect() as conn:
            assert (await conn.execute(count)).scalar_one() > 0
        _replace(path, other)
        async with console_engine.connect() as conn:
            assert (await conn.execute(count)).scalar_one() == 0
    finally:
        await console_engine.dispose()


def _replace(path: Path, other: Path) -> None:
    for suffix in ("", "-wal", "-shm"):  # the pooled connection keeps them open
        old = Path(f"{path}{suffix}")
        if old.exists():
            old.rename(f"{path}{suffix}.old")
    other.rename(path)
