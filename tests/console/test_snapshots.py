"""What the console looks like, on deterministic data with a fixed clock (pytest-textual-snapshot).

Each scene runs on its own copy of the showcase database, opened through a relative URL
from the test's working directory, so no temporary path, host or pid reaches the image.
Update with ``--snapshot-update`` and look at the SVGs before committing them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from .showcase import (
    SCENES,
    SIZE,
    SIZES,
    FixedClock,
    build_showcase,
    copy_database,
    prepare,
    showcase_app,
)


@pytest.fixture(scope="module")
def showcase_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("showcase")
    url = f"sqlite+aiosqlite:///{where}/showcase.db"
    asyncio.run(build_showcase(url))
    return where / "showcase.db"


def _compare(scene, size, showcase_db, tmp_path, monkeypatch, snap_compare) -> bool:
    copy_database(showcase_db, tmp_path / "showcase.db")
    monkeypatch.chdir(tmp_path)
    clock = FixedClock()
    asyncio.run(prepare(scene, clock))
    app = showcase_app(clock)

    async def run_before(pilot) -> None:
        await SCENES[scene](pilot, clock)

    return snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("scene", list(SCENES))
def test_console_looks_right(scene, showcase_db, tmp_path, monkeypatch, snap_compare):
    assert _compare(scene, SIZE, showcase_db, tmp_path, monkeypatch, snap_compare)


@pytest.mark.parametrize("size", [name for name in SIZES if SIZES[name] != SIZE])
@pytest.mark.parametrize("scene", list(SCENES))
def test_console_fits_the_terminal(scene, size, showcase_db, tmp_path, monkeypatch, snap_compare):
    """80x24 (every panel and dialog usable, no number cut) and 160x48 (the room used)."""
    assert _compare(scene, SIZES[size], showcase_db, tmp_path, monkeypatch, snap_compare)
