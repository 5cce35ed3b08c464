"""``outbox-tui --demo``: a fresh directory becomes a living console within seconds."""

from __future__ import annotations

import asyncio
import os

from engine.settings import DispatcherSettings, load_settings
from outbox_tui.console import prepare_console
from outbox_tui.demo import DEMO_DATABASE_URL, DEMO_NOTE, HEAD_START_ORDERS
from outbox_tui.widgets.note_line import NoteLine

from .conftest import SIZE, started, until


async def test_demo_creates_its_database_and_comes_alive(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OUTBOX_DISPATCHER__IDLE_SLEEP_SECONDS", "0.05")
    app = await asyncio.to_thread(
        prepare_console,
        load_settings(refresh_seconds=0.2),  # the CLI's default URL: the demo picks its own
        installed_apps=[],
        demo=True,
    )
    assert app.config.database_url == DEMO_DATABASE_URL and app.config.autostart_dispatch
    assert isinstance(app.dispatch.spec.settings.dispatcher, DispatcherSettings)
    files = await asyncio.to_thread(os.listdir, ".")
    assert "outbox-demo.db" in files and "outbox.db" not in files
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        # Issue 43: the demo says under its header that its failures are on purpose.
        note = app.main.query_one("#note", NoteLine)
        assert note.display and "on purpose" in str(note.render())
        assert "amounts ending in 7 fail twice" in str(note.render())
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: note.content_size.width == 80, "the note at 80 columns")
        assert str(note.render()).strip() == DEMO_NOTE[-1].strip()
        await pilot.resize_terminal(*SIZE)
        await until(pilot, lambda: app.main.dispatch_state == "running", "the demo dispatcher")
        first = app.main.last_snapshot
        assert sum(first.counts.values()) >= HEAD_START_ORDERS

        def alive() -> bool:
            snap = app.main.last_snapshot
            return (
                snap.counts["published"] > first.counts["published"]
                and snap.counts["dead_letter"] > 0
                and snap.blocked_keys > 0  # a refused order holds back its cancellation
                and sum(snap.counts.values()) > sum(first.counts.values())  # traffic arrives
                and any(hb.state == "alive" for hb in snap.heartbeats)
            )

        await until(
            pilot, alive, "published rows, dead letters, a blocked key and new orders", seconds=30
        )
        assert app.traffic is not None and app.traffic.placed >= 0
