"""Blocked ordering keys on the command line: ``stats`` names them and the oldest head,
``dead-letter skip`` releases one (audited), and refuses what it cannot release."""

from __future__ import annotations

import re

from sqlalchemy import select

from engine import create_engine
from engine.operating.insights import BlockedKey, OutboxInsights
from engine.storage.schema import DEAD_LETTER, replay_log
from tests.cli.conftest import Cli, status_counts
from tests.cli.test_commands import STATS_KEYS
from tests.old_schema import OLD_STATUSES, create_old_schema

SKIP_KEYS = {
    "dry_run",
    "matched",
    "skipped",
    "released",
    "ordering_keys",
    "refused",
    "operator",
    "reason",
}


async def _blocked(url: str) -> list[BlockedKey]:
    engine = create_engine(url)
    try:
        return await OutboxInsights(engine).blocked_keys()
    finally:
        await engine.dispose()


async def _waiting_dead_letter(url: str) -> BlockedKey:
    """A key held back by a dead letter with an event waiting behind it (a refused order
    that was cancelled: the seed's 15th order)."""
    return next(k for k in await _blocked(url) if k.head_status == DEAD_LETTER and k.waiting)


async def _skip_audit(url: str) -> list[dict[str, object]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(select(replay_log).order_by(replay_log.c.id))
            return [dict(r) for r in rows.mappings() if r["action"] == "skip"]
    finally:
        await engine.dispose()


async def test_stats_names_blocked_keys_and_the_oldest_head(
    cli: Cli, dead_letters_url: str
) -> None:
    env = {"OUTBOX_DATABASE_URL": dead_letters_url}
    blocked = await _blocked(dead_letters_url)
    assert blocked
    result = cli("stats", "--json", env=env)
    assert result.returncode == 0, result
    record = result.json()
    assert set(record) == STATS_KEYS
    assert record["blocked_keys"] == len(blocked)
    assert record["oldest_blocked_head_age_seconds"] >= 0
    assert record["oldest_blocked_head_at"].endswith("Z")

    text = cli("stats", env=env)
    assert text.returncode == 0, text
    assert re.search(rf"blocked ordering keys .*\b{len(blocked)}\b", text.stdout)
    assert "oldest blocked head age" in text.stdout


async def test_skip_releases_a_blocked_key_audited(cli: Cli, dead_letters_url: str) -> None:
    env = {"OUTBOX_DATABASE_URL": dead_letters_url}
    key = await _waiting_dead_letter(dead_letters_url)
    before = len(await _blocked(dead_letters_url))

    unconfirmed = cli("dead-letter", "skip", "--event-id", key.head_id, env=env)
    unconfirmed.assert_one_error_line("refusing to skip without confirmation", "--yes", status=2)

    dry = cli("dead-letter", "skip", "--event-id", key.head_id, "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry
    assert dry.json()["released"] == {key.head_id: key.waiting} and dry.json()["skipped"] == []
    assert len(await _blocked(dead_letters_url)) == before

    done = cli(
        "dead-letter",
        "skip",
        "--event-id",
        key.head_id,
        "--yes",
        "--reason",
        "refund handled by hand",
        "--operator",
        "alice",
        env=env,
    )
    assert done.returncode == 0, done
    assert done.stderr == ""
    assert (
        f"skipped {key.head_id}: released {key.waiting} waiting event"
        f"{'' if key.waiting == 1 else 's'} of key {key.ordering_key}"
    ) in done.stdout
    assert "1 skipped" in done.stdout and "0 refused" in done.stdout
    assert key.ordering_key not in {k.ordering_key for k in await _blocked(dead_letters_url)}
    assert (await status_counts(dead_letters_url))[DEAD_LETTER] > 0  # it stays a dead letter
    [audit] = await _skip_audit(dead_letters_url)
    assert (audit["event_id"], audit["operator"], audit["reason"]) == (
        key.head_id,
        "alice",
        "refund handled by hand",
    )


async def test_skip_refuses_what_it_cannot_release_one_line_each(
    cli: Cli, dead_letters_url: str
) -> None:
    env = {"OUTBOX_DATABASE_URL": dead_letters_url}
    key = await _waiting_dead_letter(dead_letters_url)
    failed = next(k for k in await _blocked(dead_letters_url) if k.head_status == "failed")

    refused = cli("dead-letter", "skip", "--event-id", failed.head_id, "--yes", env=env)
    line = refused.assert_one_error_line(failed.head_id, "status is failed", status=1)
    assert re.match(rf"outbox-tui: error: cannot skip {failed.head_id}: ", line)
    assert "0 skipped" in refused.stdout

    mixed = cli(
        "dead-letter",
        "skip",
        "--event-id",
        failed.head_id,
        "--event-id",
        key.head_id,
        "--yes",
        "--json",
        env=env,
    )
    mixed.assert_one_error_line(f"cannot skip {failed.head_id}: status is failed", status=1)
    report = mixed.json()
    assert set(report) == SKIP_KEYS
    assert report["dry_run"] is False and report["matched"] == 1
    assert report["skipped"] == [key.head_id]
    assert report["released"] == {key.head_id: key.waiting}
    assert report["ordering_keys"] == {key.head_id: key.ordering_key}
    assert report["refused"] == {failed.head_id: "status is failed, not dead_letter"}
    assert report["reason"] is None and report["operator"]

    again = cli("dead-letter", "skip", "--event-id", key.head_id, "--yes", "--json", env=env)
    again.assert_one_error_line("it was skipped already", status=1)
    assert again.json()["skipped"] == []
    assert len(await _skip_audit(dead_letters_url)) == 1


async def test_skip_refuses_an_unordered_or_unknown_event(cli: Cli, database_url: str) -> None:
    url = database_url
    await create_old_schema(url)  # rows written before ordering keys existed
    env = {"OUTBOX_DATABASE_URL": url}
    assert cli("init-db", env=env).returncode == 0
    unordered = f"0190aaaa-0000-7000-8000-{OLD_STATUSES.index(DEAD_LETTER):012d}"
    result = cli(
        "dead-letter", "skip", "--event-id", unordered, "--event-id", "nope", "--yes", env=env
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"outbox-tui: error: cannot skip {unordered}: it has no ordering key: "
        "nothing waits behind it",
        "outbox-tui: error: cannot skip nope: no such event",
    ]
