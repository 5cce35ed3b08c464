"""The console's incident keys: g (error groups, enter lists a group's events, R replays
one), p (pause and resume the highlighted type, counting what waits), the dedup-window
warning in the replay dialogs, and a footer that shows them at 80 columns."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update
from textual.widgets import DataTable, Label, Static
from textual.widgets._footer import FooterKey

from engine import create_engine
from engine.clock import utc_now
from engine.operating.pauses import paused_backlog, waiting
from engine.storage.schema import DEAD_LETTER, outbox_events
from outbox_tui.screens.confirm import ConfirmModal
from outbox_tui.screens.error_groups import ErrorGroupsScreen
from outbox_tui.screens.group_events import GroupEventsScreen
from outbox_tui.widgets.event_detail import EventDetailPane
from outbox_tui.widgets.footer import ConsoleFooter
from tests.console.conftest import (
    SIZE,
    console,
    counts,
    dialog,
    open_dead_letters,
    started,
    until,
)

SMALL = (80, 24)


async def _pauses(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        return [h.pause.event_type for h in await paused_backlog(engine)]
    finally:
        await engine.dispose()


async def _age_dead_letters(url: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            t = outbox_events
            await conn.execute(
                update(t)
                .where(t.c.status == DEAD_LETTER)
                .values(created_at=utc_now() - timedelta(days=30))
            )
    finally:
        await engine.dispose()


def _body(app: object) -> str:
    return str(app.screen.query_one("#confirm-body", Static).render())  # type: ignore[attr-defined]


async def test_g_lists_the_groups_and_shift_r_replays_one(seeded_url, orders_registry):
    dead = (await counts(seeded_url))[DEAD_LETTER]
    app = console(seeded_url, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("g")
        assert isinstance(app.screen, ErrorGroupsScreen)
        groups = app.screen
        await until(pilot, lambda: groups.loads > 0, "the groups")
        assert groups.found is not None and groups.found.groups
        table_rows = groups.query_one("DataTable").row_count  # type: ignore[attr-defined]
        assert table_rows == len(groups.found.groups)
        # the first group with dead letters
        index = next(i for i, g in enumerate(groups.found.groups) if g.dead_letters)
        group = groups.found.groups[index]
        for _ in range(index):
            await pilot.press("down")
        await pilot.press("R")
        await dialog(pilot, "the dialog")
        body = _body(app)
        assert f"{group.dead_letters:,} dead letter" in body
        assert next(iter(group.event_types)) in body
        assert "older than" not in body
        assert "✓ inside the consumers' 7-day dedup window: safe to replay" in body
        await pilot.press("enter", "y")  # from the reason to the buttons; yes
        await until(pilot, lambda: groups.loads > 1, "the groups again")
        assert (await counts(seeded_url)).get(DEAD_LETTER, 0) == dead - group.dead_letters
        await pilot.press("escape")
        assert app.screen is app.main


async def test_replay_dialogs_warn_outside_the_dedup_window(sqlite_seeded, orders_registry):
    await _age_dead_letters(sqlite_seeded)
    dead = (await counts(sqlite_seeded))[DEAD_LETTER]
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await open_dead_letters(pilot, app)
        await pilot.press("R")
        await dialog(pilot, "the bulk dialog")
        assert f"{dead} of {dead} event(s) are older than the consumers' 7-day" in _body(app)
        await pilot.pause()
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmModal), "the dialog closed")
        await pilot.press("r")
        await dialog(pilot, "the dialog")
        assert "1 of 1 event(s) are older" in _body(app)
        await pilot.press("escape")


async def _replay_dialog_body(url, registry, ahead: timedelta, **config: object) -> str:
    """The ``r`` dialog's body on a console whose clock runs ``ahead`` of the real one."""
    app = console(url, registry, **config)
    app.clock = lambda: utc_now() + ahead
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await open_dead_letters(pilot, app)
        await pilot.press("r")
        await dialog(pilot, "the dialog")
        body = _body(app)
        await pilot.press("escape")
    return body


async def test_the_dialog_uses_the_configured_window_and_the_console_clock(
    sqlite_seeded, orders_registry
):
    """Two minutes on, fresh dead letters are outside a 1-minute window but inside 7 days;
    eight days on, outside the default window too."""
    minute = {"dedup_window_seconds": 60}
    soon = timedelta(minutes=2)
    assert "1-minute dedup window" in await _replay_dialog_body(
        sqlite_seeded, orders_registry, soon, **minute
    )
    safe = await _replay_dialog_body(sqlite_seeded, orders_registry, soon)
    assert "older than" not in safe
    # Issue 43: a safe replay says so, in one short line.
    assert "✓ inside the consumers' 7-day dedup window: safe to replay" in safe
    assert "7-day dedup window" in await _replay_dialog_body(
        sqlite_seeded, orders_registry, timedelta(days=8)
    )


async def test_p_pauses_and_resumes_the_highlighted_type(seeded_url, orders_registry):
    app = console(seeded_url, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        event_type = app.main.browser.target().kind.rsplit(" v", 1)[0]
        await pilot.press("p")
        await dialog(pilot, "the pause dialog")
        assert f"Pause {event_type} (every tenant)?" in _body(app)
        await pilot.press("enter", "y")  # no reason: the dialog stays, at the reason
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmModal), "the dialog closed")
        assert await _pauses(seeded_url) == []

        await pilot.press("p")
        await dialog(pilot, "the pause dialog")
        await pilot.press(*"vendor down", "enter", "y")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmModal), "the dialog closed")
        await app.workers.wait_for_complete()
        assert await _pauses(seeded_url) == [event_type]

        await pilot.press("p")
        await dialog(pilot, "the resume dialog")
        assert "vendor down" in _body(app) and f"Resume {event_type}" in _body(app)
        await pilot.press("enter", "y")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmModal), "the dialog closed")
        await app.workers.wait_for_complete()
        assert await _pauses(seeded_url) == []


async def _waiting(url: str, event_type: str) -> int:
    engine = create_engine(url)
    try:
        return await waiting(engine, event_type)
    finally:
        await engine.dispose()


async def test_enter_lists_a_groups_events_and_opens_their_detail(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SMALL) as pilot:
        await started(pilot)
        await pilot.press("g")
        groups = app.screen
        assert isinstance(groups, ErrorGroupsScreen)
        await until(pilot, lambda: groups.loads > 0, "the groups")
        group = groups.found.groups[0]  # type: ignore[union-attr]
        table = groups.query_one("#groups", DataTable)
        labels = [str(c.label) for c in table.columns.values()]
        assert labels[:6] == ["count", "dead", "oldest", "newest", "types", "tenants"]
        # the highlighted group in full under the table: every tenant, the fingerprint
        summary = str(groups.query_one("#group-summary", Static).render())
        assert group.fingerprint in summary
        assert all(tenant in summary for tenant in group.tenants)

        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, GroupEventsScreen), "the group's events")
        events = app.screen
        assert isinstance(events, GroupEventsScreen)
        await until(pilot, lambda: events.loads > 0, "the events")
        assert len(events.members) == group.count
        assert {m.event_type for m in events.members} == set(group.event_types)
        assert {m.tenant_id for m in events.members} == set(group.tenants)
        rows = events.query_one("#group-events", DataTable)
        assert rows.row_count == group.count
        assert events.members[0].error and events.members[0].error in str(rows.get_row_at(0)[-1])

        await pilot.press("down", "enter")  # the detail of the second event
        pane = events.query_one(EventDetailPane)
        wanted = events.members[1].id
        await until(pilot, lambda: pane.event_id == wanted and pane.detail, "the detail")
        await pilot.press("escape")  # closes the detail first
        assert app.screen is events and not events.detail_open
        await pilot.press("escape")  # then back to the groups
        assert app.screen is groups
        await pilot.press("escape")
        assert app.screen is app.main


async def test_the_pause_dialog_counts_what_waits_and_asks_for_a_reason(
    seeded_url, orders_registry
):
    app = console(seeded_url, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        event_type = app.main.browser.target().kind.rsplit(" v", 1)[0]
        expected = await _waiting(seeded_url, event_type)
        assert expected > 0
        await pilot.press("p")
        await dialog(pilot, "the pause dialog")
        assert f"waiting now   {expected:,} events" in _body(app)
        label = str(app.screen.query_one("#reason-label", Label).render())
        assert label == "Reason (required)  ·  enter, then y"
        await pilot.press(*"vendor down", "enter", "y")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmModal), "the dialog closed")
        await app.workers.wait_for_complete()

        await pilot.press("p")
        await dialog(pilot, "the resume dialog")
        assert f"{expected:,} events" in _body(app)
        label = str(app.screen.query_one("#reason-label", Label).render())
        assert label == "Reason (optional)  ·  enter, then y"
        await pilot.press("enter", "y")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmModal), "the dialog closed")


INCIDENT_KEYS = ["r", "R", "g", "p", "s", "?", "q"]
WIDE_KEYS = {"/", "d", "e", "b", "^p"}


def _footer(screen: object) -> list[str]:
    """The footer's keys as shown: ``["r Replay", ...]`` (hidden ones left out)."""
    keys = screen.query(FooterKey)  # type: ignore[attr-defined]
    return [f"{k.key_display} {k.description}".strip() for k in keys if k.display]


def _keys(screen: object) -> list[str]:
    """The footer's keys as shown, without their descriptions: ``["r", "R", ...]``."""
    return [s.split()[0] for s in _footer(screen)]


def _laid_out(footer: ConsoleFooter) -> bool:
    """Every key shown has its width (a key the footer composed anew has none until then)."""
    return all(k.outer_size.width > 0 for k in footer.query(FooterKey) if k.display)


def _shows_the_wide_footer(keys: list[str]) -> bool:
    return keys[:7] == INCIDENT_KEYS and set(keys) >= WIDE_KEYS


async def test_the_footer_shows_the_incident_keys_whole_at_80_columns(
    sqlite_seeded, orders_registry
):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SMALL) as pilot:
        await started(pilot)
        footer = app.main.query_one(ConsoleFooter)
        await until(
            pilot,
            lambda: _keys(app.main) == INCIDENT_KEYS and _laid_out(footer),
            "the footer at 80 columns",
        )
        assert _keys(app.main) == INCIDENT_KEYS
        assert sum(k.outer_size.width for k in footer.query(FooterKey) if k.display) <= 80
        await pilot.resize_terminal(160, 48)
        await until(pilot, lambda: _shows_the_wide_footer(_keys(app.main)), "the wide footer")
        wide = _keys(app.main)
        assert wide[:7] == INCIDENT_KEYS
        assert set(wide) >= WIDE_KEYS
