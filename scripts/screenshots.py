"""Regenerate the console's screenshots (``make screenshots``) into ``screenshots/``.

The real app from ``make_app`` runs headless on the deterministic showcase
database (example orders from a fixed seed, a fixed clock) and goes through the
same scenes as the snapshot tests: overview, a paused type, events with detail, dead letters,
the replay confirmation, blocked keys, a blocked head's detail, the skip
confirmation, help, the filter, the palette, the error groups, the pause confirmation
and a replay confirmation with the dedup-window warning, the catalog, the inbox, and a traced
service's event detail (its trace id and link); then seven of them at 80x24.
Each scene gets a fresh copy of the database.

    .venv/bin/python scripts/screenshots.py [--out DIR] [--size 160x45]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.console.showcase import (  # noqa: E402 - after the path set-up above
    SCENES,
    SIZE,
    FixedClock,
    build_showcase,
    copy_database,
    prepare,
    showcase_app,
)

NAMES = {
    "overview": "overview.svg",
    "overview-paused": "paused-type.svg",
    "events-detail": "events-with-detail.svg",
    "event-chain": "event-chain.svg",
    "dead-letters": "dead-letters.svg",
    "confirm-replay": "confirm-replay.svg",
    "blocked-keys": "blocked-keys.svg",
    "blocked-head-detail": "blocked-head-detail.svg",
    "confirm-skip": "confirm-skip.svg",
    "help": "help.svg",
    "filter": "filter.svg",
    "palette": "palette.svg",
    "error-groups": "error-groups.svg",
    "confirm-pause": "confirm-pause.svg",
    "confirm-replay-dedup": "confirm-replay-dedup.svg",
    "catalog": "catalog.svg",
    "inbox": "inbox.svg",
    "inbound-dead-letter": "inbound-dead-letter.svg",
    "trace-detail": "trace-detail.svg",
}
# At 80x24 too: the terminal operators have.
SMALL = (80, 24)
SMALL_SCENES = (
    "overview",
    "overview-paused",
    "events-detail",
    "confirm-replay",
    "blocked-keys",
    "error-groups",
    "inbox",
)


async def shoot(scene: str, out: Path, size: tuple[int, int], name: str) -> Path:
    clock = FixedClock()
    await prepare(scene, clock)
    app = showcase_app(clock)
    async with app.run_test(size=size) as pilot:
        await SCENES[scene](pilot, clock)
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
        return Path(app.save_screenshot(name, path=str(out)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "screenshots")
    parser.add_argument("--size", default=f"{SIZE[0]}x{SIZE[1]}", help="COLUMNSxROWS")
    args = parser.parse_args()
    logging.getLogger("engine").setLevel(logging.ERROR)  # the showcase fails on purpose
    width, height = (int(n) for n in args.size.lower().split("x"))
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="outbox-screenshots-") as tmp:
        master = Path(tmp) / "master"
        master.mkdir()
        asyncio.run(build_showcase(f"sqlite+aiosqlite:///{master}/showcase.db"))
        shots = [(scene, (width, height), NAMES[scene]) for scene in SCENES]
        shots += [(s, SMALL, NAMES[s].replace(".svg", "-80x24.svg")) for s in SMALL_SCENES]
        for scene, size, name in shots:
            work = Path(tmp) / name
            work.mkdir()
            copy_database(master / "showcase.db", work / "showcase.db")
            os.chdir(work)  # the app opens ./showcase.db: no temporary path in the header
            path = asyncio.run(shoot(scene, out, size, name))
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        os.chdir(ROOT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
