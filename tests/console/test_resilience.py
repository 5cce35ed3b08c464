"""The database goes away and comes back; start-up problems are one line, never a traceback."""

from __future__ import annotations

import html
import io
import os
import sqlite3
import uuid
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from engine import EventRegistry, OutboxEventPublisher, create_engine, create_schema, unit_of_work
from engine.settings import OutboxSettings
from engine.writing.publisher import OutboxEvent
from outbox_tui.console import run_console
from outbox_tui.widgets.event_table import EventTable

from ..engine.conftest import CTX
from .conftest import SIZE, console, screenshot_when, started, until


def banner_text(app) -> str:
    return str(app.main.query_one("#banner").render())


async def assert_lost_then_recovered(pilot, app, make_unreachable, make_reachable, expected):
    """Break the database, see the banner and the retries, mend it, see it recover."""
    await make_unreachable()
    await until(pilot, lambda: app.main.connection == "lost", "the console to notice")
    banner = app.main.query_one("#banner")
    assert banner.has_class("-visible") and "Database problem" in banner_text(app)
    await until(pilot, lambda: expected in banner_text(app), f"the banner to say {expected!r}")
    assert "Retrying every" in banner_text(app)
    failures = app.main.failures
    await until(pilot, lambda: app.main.failures > failures, "the console to keep retrying")
    assert app.is_running  # the interface never waited on the database
    await pilot.press("d")  # and stays usable meanwhile
    await make_reachable()
    await until(pilot, lambda: app.main.connection == "connected", "recovery", seconds=20)
    assert not banner.has_class("-visible")
    assert any(n.title == "Reconnected" for n in app._notifications)
    table = app.main.query_one(EventTable)
    await until(pilot, lambda: table.mode == "dead_letters", "the view chosen while it was down")


async def test_sqlite_file_moved_away_and_back(sqlite_seeded, orders_registry):
    path = Path(make_url(sqlite_seeded).database)
    moved = [
        (path.with_name(path.name + s), path.with_name("away" + s)) for s in ("", "-wal", "-shm")
    ]

    async def move_away() -> None:
        for src, dst in moved:
            if src.exists():
                src.rename(dst)

    async def move_back() -> None:
        for src, dst in moved:
            if dst.exists():
                dst.rename(src)

    app = console(sqlite_seeded, orders_registry, refresh_seconds=0.1)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await assert_lost_then_recovered(
            pilot, app, move_away, move_back, "unable to open database file"
        )
    assert os.stat(path).st_size > 0  # the real file is back, never replaced by an empty one


@pytest.mark.postgresql
async def test_postgresql_refusing_connections_then_accepting_again(pg_url, orders_registry):
    from .conftest import seed

    await seed(pg_url, orders_registry)
    url = make_url(pg_url)
    admin_url = url.set(database="postgres")

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(**admin_url.translate_connect_args(username="user"))
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    async def refuse() -> None:
        await admin(f'ALTER DATABASE "{url.database}" WITH ALLOW_CONNECTIONS false')
        await admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{url.database}' AND backend_type = 'client backend'"
        )

    async def accept() -> None:
        await admin(f'ALTER DATABASE "{url.database}" WITH ALLOW_CONNECTIONS true')

    app = console(pg_url, orders_registry, refresh_seconds=0.1)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await assert_lost_then_recovered(
            pilot, app, refuse, accept, "not currently accepting connections"
        )


# -- start-up ----------------------------------------------------------------------------


def start(url: str, *apps: str) -> tuple[int, str]:
    err = io.StringIO()
    code = run_console(
        # Not validated here: the console's own start-up checks must report a bad URL.
        OutboxSettings().model_copy(update={"database_url": url}),
        installed_apps=list(apps),
        demo=False,
        stderr=err,
    )
    return code, err.getvalue()


def assert_one_line(output: str) -> str:
    assert output.startswith("outbox-tui: error: ") and output.count("\n") == 1, output
    assert "Traceback" not in output
    return output


def test_bad_url_is_one_line():
    code, out = start("mysql://root@localhost/outbox")
    assert code == 2 and "unsupported database URL scheme 'mysql'" in assert_one_line(out)


def test_missing_sqlite_file_says_how_to_create_it(tmp_path):
    code, out = start(f"sqlite+aiosqlite:///{tmp_path}/nope.db")
    assert code == 1 and "outbox-tui init-db" in assert_one_line(out)
    assert "no SQLite database at" in out
    assert not (tmp_path / "nope.db").exists()  # the check did not create it


def test_missing_schema_says_init_db(tmp_path):
    sqlite3.connect(tmp_path / "empty.db").close()
    code, out = start(f"sqlite+aiosqlite:///{tmp_path}/empty.db")
    assert code == 1 and "outbox tables are missing" in assert_one_line(out)
    assert "`outbox-tui init-db --database-url sqlite+aiosqlite:///" in out


def test_unreachable_server_is_one_line_without_the_password():
    code, out = start("postgresql+asyncpg://outbox:s3cret@127.0.0.1:1/outbox")
    assert code == 1 and "cannot reach the database" in assert_one_line(out)
    assert "s3cret" not in out and "***" in out


@pytest.mark.postgresql
def test_a_wrong_password_is_a_refused_login_not_an_unreachable_server(pg_url):
    """Issue 43, defect 7: the console said "cannot reach the database"."""
    wrong = f"wrong-{uuid.uuid4().hex}"
    code, out = start(make_url(pg_url).set(password=wrong).render_as_string(False))
    line = assert_one_line(out)
    assert code == 1 and "the database refused the login" in line, line
    assert "password authentication failed" in line and "cannot reach" not in line
    assert wrong not in out


def test_broken_installed_app_is_one_line(sqlite_url):
    code, out = start(sqlite_url, "no_such_module_here")
    # An installed app is configuration: exit 2, as the CLI's commands say of it.
    assert code == 2 and "cannot import installed app 'no_such_module_here'" in assert_one_line(out)


def test_no_traceback_reaches_the_terminal_for_a_directory_path(tmp_path):
    os.mkdir(tmp_path / "adir.db")
    code, out = start(f"sqlite+aiosqlite:///{tmp_path}/adir.db")
    assert code == 1 and "adir.db is a directory, not a SQLite" in assert_one_line(out)


MARKUP_IDS = ("order:[/oops]", "order:[b]7", "shop[1].placed")


async def test_ids_that_look_like_markup_are_shown_as_written(sqlite_url):
    """Producers choose aggregate ids, tenants and types: square brackets are data.

    Read as console markup, ``[/oops]`` raised MarkupError while the table drew its row
    (the console crashed) and ``[b]7`` lost its brackets.
    """
    registry = EventRegistry()
    registry.register_event("shop[1].placed", 1)
    engine = create_engine(sqlite_url)
    try:
        await create_schema(engine)
        drafts = [
            OutboxEvent("shop[1].placed", {}, "order", "[/oops]"),
            OutboxEvent("shop[1].placed", {}, "order", "[b]7"),
        ]
        async with unit_of_work(engine, registry=registry, context=CTX) as session:
            await OutboxEventPublisher(session).publish_many(drafts)
    finally:
        await engine.dispose()
    app = console(sqlite_url, registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        screen = await screenshot_when(
            pilot,
            lambda shot: all(shown in html.unescape(shot) for shown in MARKUP_IDS),
            "the rows on screen",
        )
        assert app.is_running
    for shown in MARKUP_IDS:
        assert shown in html.unescape(screen), shown
