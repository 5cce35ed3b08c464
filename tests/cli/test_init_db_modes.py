"""``init-db --check`` (is the schema current?) and ``init-db --sql`` (what init-db would run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from engine import create_engine
from tests.cli.conftest import Cli
from tests.old_schema import create_old_schema

pytestmark = pytest.mark.all_drivers


def masked(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def sqlite_file_exists(url: str) -> bool:
    return Path(make_url(url).database or "").exists()


async def run_statements(url: str, statements: list[str]) -> None:
    """What a migration would do with ``init-db --sql``'s output: run it, in one transaction."""
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            for statement in statements:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


async def test_check_tells_missing_outdated_and_current_without_changing_anything(
    cli: Cli, database_url: str
) -> None:
    missing = cli("init-db", "--check", "--database-url", database_url)
    missing.assert_one_error_line("outbox-tui init-db", status=1)
    as_json = cli("init-db", "--check", "--json", "--database-url", database_url)
    assert as_json.returncode == 1 and as_json.json()["schema"] == "missing"
    if database_url.startswith("sqlite"):
        assert not sqlite_file_exists(database_url)  # no file made

    await create_old_schema(database_url)
    outdated = cli("init-db", "--check", "--json", "--database-url", database_url)
    assert outdated.returncode == 1 and outdated.json()["schema"] == "outdated"
    assert "ordering_key" in outdated.json()["detail"]
    again = cli("init-db", "--check", "--json", "--database-url", database_url)
    assert again.json() == outdated.json()  # --check changed nothing

    assert cli("init-db", "--database-url", database_url).returncode == 0
    current = cli("init-db", "--check", "--database-url", database_url)
    assert current.returncode == 0, current
    assert current.stdout == f"the outbox schema at {masked(database_url)} is current\n"
    assert cli("init-db", "--check", "--json", "--database-url", database_url).json() == {
        "database_url": masked(database_url),
        "schema": "current",
        "detail": None,
    }


async def test_sql_prints_every_step_and_running_it_makes_a_0_1_database_current(
    cli: Cli, database_url: str
) -> None:
    await create_old_schema(database_url)
    listed = cli("init-db", "--sql", "--json", "--database-url", database_url)
    assert listed.returncode == 0, listed
    statements = listed.json()["statements"]
    joined = "\n".join(statements)
    assert "ADD COLUMN ordering_key" in joined and "DROP INDEX ix_outbox_events_active" in joined
    assert "ix_outbox_replay_log_event" in joined  # 0.1's replay log lacked it
    printed = cli("init-db", "--sql", "--database-url", database_url)
    assert printed.stdout == "".join(f"{s};\n" for s in statements)
    still = cli("init-db", "--check", "--json", "--database-url", database_url)
    assert still.json()["schema"] == "outdated"  # --sql ran nothing

    await run_statements(database_url, statements)
    assert cli("init-db", "--check", "--database-url", database_url).returncode == 0
    after = cli("init-db", "--json", "--database-url", database_url).json()
    assert after["schema"] == "present" and after["upgrade_steps"] == []
    nothing = cli("init-db", "--sql", "--database-url", database_url)
    assert (
        nothing.stdout.startswith("-- the outbox schema at ") and "nothing to run" in nothing.stdout
    )


async def test_sql_on_an_empty_database_is_the_whole_schema(cli: Cli, database_url: str) -> None:
    listed = cli("init-db", "--sql", "--json", "--database-url", database_url)
    statements = listed.json()["statements"]
    assert statements[0].startswith("CREATE TABLE outbox_events")
    if database_url.startswith("sqlite"):
        assert not sqlite_file_exists(database_url)  # no file made
        return
    await run_statements(database_url, statements)
    assert cli("init-db", "--check", "--database-url", database_url).returncode == 0


def test_check_and_sql_exclude_each_other(cli: Cli, tmp_path: Path) -> None:
    both = cli("init-db", "--check", "--sql", "--database-url", f"sqlite:///{tmp_path}/x.db")
    both.assert_one_error_line("not allowed with argument", status=2)
