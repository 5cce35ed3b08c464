"""One-shot commands as a user runs them: init-db, stats, dispatch-once, dead-letter list/replay."""

from __future__ import annotations

import getpass
import re
from datetime import datetime

import pytest
from sqlalchemy import select, update
from sqlalchemy.engine import make_url

from engine import EventRegistry, OutboxEventPublisher, create_engine, create_schema, unit_of_work
from engine.operating.insights import EventFilter, OutboxInsights
from engine.storage.schema import DEAD_LETTER, PUBLISHED, outbox_events, replay_log
from outbox_tui.cli import main
from tests.cli.conftest import APP, Cli, rewrite_dead_letters, sqlite_only, status_counts
from tests.engine.conftest import CTX

STATS_KEYS = {
    "database_url",
    "taken_at",
    "counts",
    "total",
    "oldest_pending_at",
    "oldest_pending_age_seconds",
    "stuck_publishing",
    "published_recent",
    "recent_window_seconds",
    "awaiting_purge",
    "retention_seconds",
    "inbound_rows",
    "inbound_retention_seconds",
    "blocked_keys",
    "oldest_blocked_head_at",
    "oldest_blocked_head_age_seconds",
    "held_by_dead_letters",
    "heartbeats",
    "lag",
    "unserved",
    "pauses",
    "top_types",
}
DEAD_LETTER_KEYS = {
    "id",
    "tenant_id",
    "event_type",
    "event_version",
    "aggregate_type",
    "aggregate_id",
    "attempt_count",
    "last_error",
    "dead_letter_reason",
    "created_at",
    "replay_count",
    "ordering_key",
}
COUNTER_KEYS = {"claimed", "published", "failed", "dead_lettered", "lost_leases"}
REPLAY_KEYS = {
    "dry_run",
    "matched",
    "by_type",
    "replayed",
    "refused",
    "operator",
    "reason",
    "outside_dedup_window",
    "dedup_window_seconds",
    "refused_all",
}


def masked(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["dispatch-once"],
        ["dead-letter"],
        ["dead-letter", "list"],
        ["dead-letter", "replay"],
        ["dead-letter", "skip"],
        ["stats"],
        ["init-db"],
    ],
)
def test_every_command_has_help_with_examples(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text
    assert f"outbox-tui {' '.join(command)}".strip() in text


def test_help_runs_as_a_program(cli: Cli) -> None:
    result = cli("--help")
    assert result.returncode == 0
    assert "--dispatch" in result.stdout and "dead-letter" in result.stdout


@pytest.mark.all_drivers
async def test_init_db_then_stats(cli: Cli, database_url: str) -> None:
    missing = cli("stats", "--json", "--database-url", database_url)
    missing.assert_one_error_line("outbox-tui init-db", status=1)

    created = cli("init-db", "--database-url", database_url)
    assert created.returncode == 0, created
    assert created.stdout.startswith("created the outbox schema at ")
    again = cli("init-db", "--database-url", database_url, "--json")
    assert again.returncode == 0, again
    assert again.json() == {
        "database_url": masked(database_url),
        "schema": "present",
        "upgrade_steps": [],
    }

    stats = cli("stats", "--database-url", database_url, "--json", "--retention-seconds", "60")
    assert stats.returncode == 0, stats
    record = stats.json()
    assert set(record) == STATS_KEYS
    assert record["lag"] is None  # no live dispatcher measures it
    assert record["counts"] == dict.fromkeys(
        ("pending", "publishing", "published", "failed", "dead_letter"), 0
    )
    assert record["total"] == 0
    assert record["awaiting_purge"] == 0 and record["retention_seconds"] == 60
    assert record["inbound_rows"] == 0 and record["inbound_retention_seconds"] == 7 * 86_400
    assert record["oldest_pending_at"] is None and record["heartbeats"] == []
    assert record["blocked_keys"] == 0 and record["oldest_blocked_head_age_seconds"] is None
    assert record["database_url"] == masked(database_url)
    assert record["taken_at"].endswith("Z")


async def test_dispatch_once_with_the_example_app(cli: Cli, orders_url: str) -> None:
    env = {"OUTBOX_DATABASE_URL": orders_url}
    result = cli("dispatch-once", "--installed-app", APP, "--batch-size", "10", "--json", env=env)
    assert result.returncode == 0, result
    record = result.json()
    assert set(record) == COUNTER_KEYS | {"dispatcher_id"}
    assert record["claimed"] == 10
    assert record["published"] + record["failed"] + record["dead_lettered"] == 10
    assert record["lost_leases"] == 0
    counts = await status_counts(orders_url)
    assert counts.get("pending") == 24 - 10

    text = cli("dispatch-once", "--installed-app", APP, env=env)
    assert text.returncode == 0, text
    assert "claimed" in text.stdout and "published" in text.stdout


@sqlite_only
@pytest.mark.all_drivers
async def test_stats_after_work(cli: Cli, dead_letters_url: str) -> None:
    result = cli("stats", "--json", env={"OUTBOX_DATABASE_URL": dead_letters_url})
    assert result.returncode == 0, result
    record = result.json()
    counts = await status_counts(dead_letters_url)
    assert record["counts"] == {s: counts.get(s, 0) for s in record["counts"]}
    assert record["total"] == sum(counts.values())
    assert record["retention_seconds"] == 7 * 24 * 3600  # the dispatcher setting's default

    text = cli("stats", env={"OUTBOX_DATABASE_URL": dead_letters_url})
    assert text.returncode == 0, text
    assert "dead_letter" in text.stdout and "no dispatcher heartbeats yet" in text.stdout


@sqlite_only
async def test_a_misspelt_variable_is_named_on_stderr_and_the_command_goes_on(
    cli: Cli, dead_letters_url: str
) -> None:
    env = {"OUTBOX_DATABASE_URL": dead_letters_url, "OUTBOX_DISPATCHER_BATCH_SIZE": "50"}
    result = cli("stats", "--json", env=env)
    assert result.returncode == 0, result
    assert result.json()["total"] > 0
    assert result.stderr.strip() == (
        "OUTBOX_DISPATCHER_BATCH_SIZE is not a setting and is ignored: "
        "did you mean OUTBOX_DISPATCHER__BATCH_SIZE?"
    )


async def test_dead_letter_list(cli: Cli, dead_letters_url: str) -> None:
    env = {"OUTBOX_DATABASE_URL": dead_letters_url}
    result = cli("dead-letter", "list", "--json", env=env)
    assert result.returncode == 0, result
    events = result.json()
    assert isinstance(events, list)
    assert len(events) == (await status_counts(dead_letters_url))[DEAD_LETTER] >= 2
    for event in events:
        assert set(event) == DEAD_LETTER_KEYS
        assert event["dead_letter_reason"].startswith("permanent:")
        assert event["created_at"].endswith("Z")
        datetime.fromisoformat(event["created_at"])
    assert [e["id"] for e in events] == sorted((e["id"] for e in events), reverse=True)

    tenant = events[-1]["tenant_id"]
    narrowed = cli("dead-letter", "list", "--tenant", tenant, "--limit", "1", "--json", env=env)
    assert narrowed.returncode == 0, narrowed
    assert [e["tenant_id"] for e in narrowed.json()] == [tenant]

    table = cli("dead-letter", "list", "--event-type", "orders.placed", env=env)
    assert table.returncode == 0, table
    assert all(e["id"] in table.stdout for e in events)


async def test_control_characters_stored_in_rows_are_shown_not_sent(
    cli: Cli, dead_letters_url: str
) -> None:
    """An error text from an outside system may hold escape sequences: in text output they
    are spelled out, never sent to the operator's terminal (JSON escapes them anyway)."""
    await rewrite_dead_letters(
        dead_letters_url,
        tenant_id="t\x1b]0;TITLE\x07",
        last_error="\x1b[31mRED\x1b[0m vendor said no",
        dead_letter_reason="\x1b[2Jcleared",
    )
    env = {"OUTBOX_DATABASE_URL": dead_letters_url, "COLUMNS": "200"}
    for args in (("dead-letter", "list"), ("dead-letter", "groups"), ("stats",)):
        result = cli(*args, env=env)
        assert result.returncode == 0, result
        assert "\x1b" not in result.stdout and "\x07" not in result.stdout, args
    listed = cli("dead-letter", "list", env=env).stdout
    assert "\\x1b[2Jcleared" in listed


async def _ids(url: str, status: str) -> list[str]:
    engine = create_engine(url)
    try:
        return await OutboxInsights(engine).matching_ids(EventFilter(statuses=(status,)))
    finally:
        await engine.dispose()


async def _audit(url: str) -> list[dict[str, object]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(select(replay_log).order_by(replay_log.c.id))
            return [dict(r) for r in rows.mappings()]
    finally:
        await engine.dispose()


@pytest.mark.all_drivers
async def test_replay_safeguards_dry_run_and_audit(cli: Cli, dead_letters_url: str) -> None:
    env = {"OUTBOX_DATABASE_URL": dead_letters_url}
    dead = await _ids(dead_letters_url, DEAD_LETTER)
    published = (await _ids(dead_letters_url, PUBLISHED))[0]
    before = await status_counts(dead_letters_url)

    refused = cli("dead-letter", "replay", "--event-id", dead[0], env=env)
    refused.assert_one_error_line("add --yes", status=2)

    dry = cli(
        "dead-letter",
        "replay",
        "--all",
        "--event-type",
        "orders.placed",
        "--dry-run",
        "--json",
        env=env,
    )
    assert dry.returncode == 0, dry
    report = dry.json()
    assert set(report) == REPLAY_KEYS
    assert report["dry_run"] is True and report["replayed"] == []
    assert report["matched"] == len(dead) and report["by_type"] == {"orders.placed": len(dead)}
    assert await status_counts(dead_letters_url) == before
    assert await _audit(dead_letters_url) == []

    mixed = cli(
        "dead-letter",
        "replay",
        "--event-id",
        published,
        "--event-id",
        dead[0],
        "--yes",
        "--reason",
        "credit limit raised",
        "--operator",
        "alice",
        "--json",
        env=env,
    )
    line = mixed.assert_one_error_line(published, "status is published", status=1)
    assert re.match(rf"outbox-tui: error: cannot replay {published}: ", line)
    report = mixed.json()
    assert report["replayed"] == [dead[0]]
    assert list(report["refused"]) == [published]
    audit = await _audit(dead_letters_url)
    assert [(a["event_id"], a["operator"], a["reason"]) for a in audit] == [
        (dead[0], "alice", "credit limit raised")
    ]
    assert audit[0]["cleared_dead_letter_reason"].startswith("permanent:")

    rest = cli("dead-letter", "replay", "--all", "--yes", env=env)
    assert rest.returncode == 0, rest
    assert f"{len(dead) - 1} replayed, 0 refused" in rest.stdout
    assert DEAD_LETTER not in await status_counts(dead_letters_url)
    operators = {a["operator"] for a in (await _audit(dead_letters_url))[1:]}
    assert operators == {getpass.getuser()}


@sqlite_only
async def test_replay_dry_run_by_id_reports_what_would_be_refused(
    cli: Cli, dead_letters_url: str
) -> None:
    dead = (await _ids(dead_letters_url, DEAD_LETTER))[0]
    result = cli(
        "dead-letter",
        "replay",
        "--event-id",
        dead,
        "--event-id",
        "no-such-id",
        "--dry-run",
        "--json",
        env={"OUTBOX_DATABASE_URL": dead_letters_url},
    )
    result.assert_one_error_line("would refuse no-such-id: no such event", status=1)
    assert result.json()["matched"] == 1
    assert await _audit(dead_letters_url) == []


async def test_stats_works_despite_an_invalid_dispatcher_setting(
    cli: Cli, dead_letters_url: str
) -> None:
    env = {"OUTBOX_DATABASE_URL": dead_letters_url, "OUTBOX_DISPATCHER__BATCH_SIZE": "0"}
    result = cli("stats", "--json", env=env)
    assert result.returncode == 0, result
    assert result.json()["awaiting_purge"] is None
    assert "OUTBOX_DISPATCHER__BATCH_SIZE" in result.stderr


async def test_tables_show_bracketed_data_as_written(cli: Cli, tmp_path) -> None:
    """Ids, types and errors are data: read as rich markup, ``[/x]`` failed the command."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'brackets.db'}"
    registry = EventRegistry()
    registry.register_event("shop.placed", 1)
    engine = create_engine(url)
    try:
        await create_schema(engine)
        async with unit_of_work(engine, registry=registry, context=CTX) as session:
            await OutboxEventPublisher(session).publish(
                "shop.placed", {}, aggregate_type="order", aggregate_id="[/oops]"
            )
        async with engine.begin() as conn:  # as a dispatcher would leave it
            await conn.execute(
                update(outbox_events).values(
                    status=DEAD_LETTER, last_error="boom [/x]", dead_letter_reason="permanent: [b]7"
                )
            )
    finally:
        await engine.dispose()
    env = {"OUTBOX_DATABASE_URL": url}
    listing = cli("dead-letter", "list", env=env)
    assert listing.returncode == 0, listing
    assert "[/oops]" in listing.stdout and "permanent: [b]7" in listing.stdout
    groups = cli("dead-letter", "groups", env=env)
    assert groups.returncode == 0, groups
    assert "boom [/x]" in groups.stdout


@sqlite_only
async def test_matched_counts_the_selected_dead_letters_in_a_dry_run_and_a_replay(
    cli: Cli, dead_letters_url: str
) -> None:
    dead = (await _ids(dead_letters_url, DEAD_LETTER))[0]
    published = (await _ids(dead_letters_url, PUBLISHED))[0]
    args = ("dead-letter", "replay", "--event-id", dead, "--event-id", published, "--json")
    env = {"OUTBOX_DATABASE_URL": dead_letters_url}
    dry = cli(*args, "--dry-run", env=env)
    real = cli(*args, "--yes", env=env)
    assert dry.json()["matched"] == real.json()["matched"] == 1
    assert list(dry.json()["refused"]) == list(real.json()["refused"]) == [published]
    assert real.json()["replayed"] == [dead]
