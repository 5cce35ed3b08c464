"""``init-db`` upgrades tables an earlier version made, in place; until then every other
command refuses them in one line that names ``init-db``."""

from __future__ import annotations

from tests.cli.conftest import APP, Cli
from tests.cli.test_commands import masked
from tests.old_schema import create_old_schema


async def test_init_db_upgrades_an_old_schema_in_place(cli: Cli, database_url: str) -> None:
    await create_old_schema(database_url)
    env = {"OUTBOX_DATABASE_URL": database_url}

    outdated = cli("stats", "--json", env=env)
    outdated.assert_one_error_line(
        "from an earlier version", "`outbox-tui init-db --database-url ", status=1
    )
    assert outdated.json()["exit_status"] == 1  # and no stats record
    listing = cli("dead-letter", "list", env=env)
    listing.assert_one_error_line("from an earlier version", "init-db", status=1)

    upgraded = cli("init-db", "--json", env=env)
    assert upgraded.returncode == 0, upgraded
    record = upgraded.json()
    assert set(record) == {"database_url", "schema", "upgrade_steps"}
    assert record["database_url"] == masked(database_url)
    assert record["schema"] == "upgraded"
    assert {
        "added outbox_events.ordering_key",
        "added outbox_events.seq",
        "added outbox_replay_log.action",
        "dropped index ix_outbox_events_active",
    } <= set(record["upgrade_steps"])

    again = cli("init-db", "--json", env=env)
    assert again.json() == {
        "database_url": masked(database_url),
        "schema": "present",
        "upgrade_steps": [],
    }

    stats = cli("stats", "--json", env=env)
    assert stats.returncode == 0, stats
    assert stats.json()["counts"] == {
        "pending": 2,
        "publishing": 0,
        "published": 2,
        "failed": 0,
        "dead_letter": 1,
    }
    assert stats.json()["blocked_keys"] == 0  # rows written before keys existed are unordered
    # The old rows still go out, and new, ordered ones with them.
    once = cli("dispatch-once", "--installed-app", APP, "--json", env=env)
    assert once.returncode == 0, once
    assert once.json()["published"] == 2


async def test_init_db_text_lists_the_upgrade_steps(cli: Cli, database_url: str) -> None:
    url = database_url
    await create_old_schema(url)
    console = cli("--database-url", url)  # refused before the screen opens
    console.assert_one_error_line(
        "earlier version", f"`outbox-tui init-db --database-url {masked(url)}`", status=1
    )
    result = cli("init-db", "--database-url", url)
    assert result.returncode == 0, result
    first, *steps = result.stdout.splitlines()
    assert first == f"upgraded the outbox schema at {masked(url)} in place:"
    assert "  added outbox_events.ordering_key" in steps
