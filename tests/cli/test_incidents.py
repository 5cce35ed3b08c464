"""Incident commands as a user runs them: dead-letter groups, replay --group, the dedup
window's refusal, pause and resume, and what stats says about pauses and top types."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from engine import create_engine
from engine.clock import utc_now
from engine.operating.pauses import pause_history, paused_backlog
from engine.storage.schema import DEAD_LETTER, PENDING, outbox_events
from tests.cli.conftest import APP, Cli, sqlite_only, status_counts

GROUP_KEYS = {
    "fingerprint",
    "message",
    "count",
    "statuses",
    "event_types",
    "tenants",
    "first_seen",
    "last_seen",
    "example_error",
}
PAUSE_KEYS = {"event_type", "tenant_id", "since", "by", "reason", "waiting"}


async def _ids(url: str, status: str) -> list[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            t = outbox_events
            rows = await conn.execute(select(t.c.id).where(t.c.status == status).order_by(t.c.id))
            return list(rows.scalars())
    finally:
        await engine.dispose()


async def _age(url: str, ids: list[str], days: int) -> None:
    """Make ``ids`` look created ``days`` ago (older than the default 7-day window)."""
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            t = outbox_events
            when = utc_now() - timedelta(days=days)
            await conn.execute(update(t).where(t.c.id.in_(ids)).values(created_at=when))
    finally:
        await engine.dispose()


def _env(url: str) -> dict[str, str]:
    return {"OUTBOX_DATABASE_URL": url}


# -- groups ----------------------------------------------------------------------------


async def test_groups_list_every_failed_row_and_dead_letter(
    cli: Cli, dead_letters_url: str
) -> None:
    counts = await status_counts(dead_letters_url)
    result = cli("dead-letter", "groups", "--json", env=_env(dead_letters_url))
    assert result.returncode == 0, result
    found = result.json()
    assert found["complete"] is True
    assert found["scanned"] == counts.get(DEAD_LETTER, 0) + counts.get("failed", 0)
    assert found["groups"] and all(set(g) == GROUP_KEYS for g in found["groups"])
    assert sum(g["count"] for g in found["groups"]) == found["scanned"]
    dead = sum(g["statuses"].get(DEAD_LETTER, 0) for g in found["groups"])
    assert dead == counts[DEAD_LETTER]

    text = cli("dead-letter", "groups", env=_env(dead_letters_url))
    assert text.returncode == 0, text
    assert found["groups"][0]["fingerprint"] in text.stdout
    assert "scan incomplete" not in text.stderr


@sqlite_only
async def test_groups_say_when_the_scan_stopped_short(cli: Cli, dead_letters_url: str) -> None:
    short = cli("dead-letter", "groups", "--scan-limit", "1", env=_env(dead_letters_url))
    assert short.returncode == 0, short
    assert "scan incomplete: read the newest 1 rows only" in short.stderr
    as_json = cli(
        "dead-letter", "groups", "--scan-limit", "1", "--json", env=_env(dead_letters_url)
    )
    assert as_json.json()["complete"] is False and as_json.json()["scanned"] == 1
    bad = cli("dead-letter", "groups", "--scan-limit", "0", env=_env(dead_letters_url))
    bad.assert_one_error_line("--scan-limit", status=2)


async def test_replay_a_group(cli: Cli, dead_letters_url: str) -> None:
    env = _env(dead_letters_url)
    groups = cli("dead-letter", "groups", "--json", env=env).json()["groups"]
    group = next(g for g in groups if g["statuses"].get(DEAD_LETTER))
    fp, size = group["fingerprint"], group["statuses"][DEAD_LETTER]

    cli("dead-letter", "replay", "--group", fp, env=env).assert_one_error_line(
        "add --yes", status=2
    )
    dry = cli("dead-letter", "replay", "--group", fp, "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry
    assert dry.json()["matched"] == size and dry.json()["outside_dedup_window"] == 0
    assert sum(dry.json()["by_type"].values()) == size

    done = cli(
        "dead-letter", "replay", "--group", fp, "--yes", "--reason", "fixed", "--json", env=env
    )
    assert done.returncode == 0, done
    assert len(done.json()["replayed"]) == size and done.json()["refused"] == {}
    before = sum(g["statuses"].get(DEAD_LETTER, 0) for g in groups)
    assert (await status_counts(dead_letters_url)).get(DEAD_LETTER, 0) == before - size

    mixed = cli("dead-letter", "replay", "--group", fp, "--tenant", "acme", "--yes", env=env)
    mixed.assert_one_error_line("--tenant", status=2)


async def test_a_group_replay_of_an_unknown_fingerprint_says_so(
    cli: Cli, dead_letters_url: str
) -> None:
    env = _env(dead_letters_url)
    before = await status_counts(dead_letters_url)
    for extra in ((), ("--json",), ("--dry-run",)):
        unknown = cli("dead-letter", "replay", "--group", "000000000000", "--yes", *extra, env=env)
        line = unknown.assert_one_error_line(
            "no error group has the fingerprint '000000000000'", status=1
        )
        if "--json" in extra:
            assert unknown.json() == {"error": line.split(": ", 2)[2], "exit_status": 1}
        else:
            assert unknown.stdout == ""
    assert await status_counts(dead_letters_url) == before

    # A group of failed rows only is known: nothing to replay, and that is not an error.
    groups = cli("dead-letter", "groups", "--json", env=env).json()["groups"]
    retrying = [g for g in groups if not g["statuses"].get(DEAD_LETTER)]
    for group in retrying[:1]:
        done = cli("dead-letter", "replay", "--group", group["fingerprint"], "--yes", env=env)
        assert done.returncode == 0, done
        assert f"the group has {group['count']:,} failed rows and no dead letters" in done.stdout


# -- the dedup window ------------------------------------------------------------------


async def test_replays_outside_the_dedup_window_are_refused_unless_allowed(
    cli: Cli, dead_letters_url: str
) -> None:
    env = _env(dead_letters_url)
    dead = await _ids(dead_letters_url, DEAD_LETTER)
    await _age(dead_letters_url, dead[:1], days=30)
    before = await status_counts(dead_letters_url)

    by_id = cli("dead-letter", "replay", "--event-id", dead[0], "--yes", env=env)
    by_id.assert_one_error_line(
        "refusing to replay: 1 of 1 event(s) are older than",
        "--allow-outside-dedup-window",
        status=2,
    )
    everything = cli("dead-letter", "replay", "--all", "--yes", "--json", env=env)
    everything.assert_one_error_line(f"1 of {len(dead)} event(s)", status=2)
    report = everything.json()
    assert report["outside_dedup_window"] == 1 and report["replayed"] == []
    assert report["refused_all"] == "outside the dedup window"
    assert await status_counts(dead_letters_url) == before

    dry = cli("dead-letter", "replay", "--all", "--dry-run", env=env)
    assert dry.returncode == 0, dry
    assert f"warning: 1 of {len(dead)} event(s) are older than" in dry.stdout
    dry_json = cli("dead-letter", "replay", "--all", "--dry-run", "--json", env=env)
    assert dry_json.returncode == 0 and dry_json.json()["outside_dedup_window"] == 1

    # A wider window takes the old event in: nothing outside it.
    wide = cli(
        "dead-letter",
        "replay",
        "--event-id",
        dead[0],
        "--dry-run",
        "--json",
        "--dedup-window-seconds",
        str(60 * 86_400),
        env=env,
    )
    assert wide.json()["outside_dedup_window"] == 0

    allowed = cli(
        "dead-letter", "replay", "--all", "--yes", "--allow-outside-dedup-window", env=env
    )
    assert allowed.returncode == 0, allowed
    assert f"{len(dead)} replayed, 0 refused" in allowed.stdout
    assert "older than the consumers'" in allowed.stderr
    assert DEAD_LETTER not in await status_counts(dead_letters_url)


@sqlite_only
async def test_a_group_replay_checks_the_dedup_window_too(cli: Cli, dead_letters_url: str) -> None:
    env = _env(dead_letters_url)
    groups = cli("dead-letter", "groups", "--json", env=env).json()["groups"]
    fp = next(g for g in groups if g["statuses"].get(DEAD_LETTER))["fingerprint"]
    await _age(dead_letters_url, await _ids(dead_letters_url, DEAD_LETTER), days=8)
    refused = cli("dead-letter", "replay", "--group", fp, "--yes", env=env)
    refused.assert_one_error_line("dedup window", status=2)
    ok = cli(
        "dead-letter", "replay", "--group", fp, "--yes", "--allow-outside-dedup-window", env=env
    )
    assert ok.returncode == 0, ok


# -- pause and resume ------------------------------------------------------------------


async def _pauses(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        return [h.pause.event_type for h in await paused_backlog(engine)]
    finally:
        await engine.dispose()


async def test_pausing_a_type_no_one_publishes_is_refused_unless_forced(
    cli: Cli, orders_url: str
) -> None:
    """Issue 43, defect 3: ``pause --event-type no.such.type --reason x --yes`` paused a
    type that neither the installed apps register nor the outbox holds, and exited 0."""
    env = _env(orders_url)
    typo = cli("pause", "--event-type", "no.such.type", "--reason", "x", "--yes", env=env)
    typo.assert_one_error_line(
        "refusing to pause 'no.such.type'", "the outbox holds no event of that type", status=2
    )
    assert "--force" in typo.stderr
    args = ("--reason", "typo?", "--yes", "--installed-app", APP)
    registered = cli("pause", "--event-type", "orders.plcaed", *args, env=env)
    registered.assert_one_error_line("no installed app registers it", status=2)
    assert await _pauses(orders_url) == []
    forced = cli("pause", "--event-type", "orders.plcaed", *args, "--force", env=env)
    assert forced.returncode == 0, forced  # held: a dispatcher of another service may serve it
    assert "register no event type 'orders.plcaed'; check the name" in forced.stderr
    # Known by the outbox's rows (no app installed) or by an installed app: paused.
    in_table = cli("pause", "--event-type", "orders.cancelled", "--reason", "x", "--yes", env=env)
    assert in_table.returncode == 0, in_table
    known = cli("pause", "--event-type", "orders.placed", *args, env=env)
    assert known.returncode == 0 and "check the name" not in known.stderr, known
    assert sorted(await _pauses(orders_url)) == [
        "orders.cancelled",
        "orders.placed",
        "orders.plcaed",
    ]


async def test_pause_and_resume_are_audited_and_listed_by_stats(cli: Cli, orders_url: str) -> None:
    env = _env(orders_url)
    waiting = (await status_counts(orders_url))[PENDING]

    no = cli("pause", "--event-type", "orders.placed", "--reason", "CRM down", env=env)
    no.assert_one_error_line("refusing to pause orders.placed (every tenant)", "--yes", status=2)
    missing = cli("pause", "--event-type", "orders.placed", "--yes", env=env)
    missing.assert_one_error_line("--reason", status=2)

    made = cli(
        "pause",
        "--event-type",
        "orders.placed",
        "--reason",
        "CRM down",
        "--yes",
        "--operator",
        "alice",
        "--json",
        env=env,
    )
    assert made.returncode == 0, made
    assert made.json()["action"] == "paused" and made.json()["paused_by"] == "alice"
    again = cli("pause", "--event-type", "orders.placed", "--reason", "again", "--yes", env=env)
    again.assert_one_error_line("already paused", "alice", "CRM down", status=1)

    stats = cli("stats", "--json", env=env).json()
    [held] = stats["pauses"]
    assert set(held) == PAUSE_KEYS
    assert (held["event_type"], held["tenant_id"], held["by"]) == ("orders.placed", None, "alice")
    assert held["reason"] == "CRM down" and 0 < held["waiting"] <= waiting
    top = {row["event_type"]: row for row in stats["top_types"]}
    assert top["orders.placed"]["counts"][PENDING] == held["waiting"]
    assert sum(row["undelivered"] for row in stats["top_types"]) == waiting
    text = cli("stats", env=env)
    assert "paused" in text.stdout and "CRM down" in text.stdout and "top types" in text.stdout

    cli("resume", "--event-type", "orders.placed", env=env).assert_one_error_line("--yes", status=2)
    other = cli("resume", "--event-type", "orders.placed", "--tenant", "acme", "--yes", env=env)
    other.assert_one_error_line("orders.placed (tenant acme) is not paused", status=1)
    ended = cli("resume", "--event-type", "orders.placed", "--yes", "--reason", "back", env=env)
    assert ended.returncode == 0, ended
    assert "resumed orders.placed (every tenant)" in ended.stdout
    assert cli("stats", "--json", env=env).json()["pauses"] == []

    engine = create_engine(orders_url)
    try:
        history = await pause_history(engine)
    finally:
        await engine.dispose()
    assert [(h.action, h.reason) for h in history] == [("resume", "back"), ("pause", "CRM down")]


@sqlite_only
async def test_a_tenant_pause(cli: Cli, orders_url: str) -> None:
    env = _env(orders_url)
    made = cli(
        "pause",
        "--event-type",
        "orders.placed",
        "--tenant",
        "acme",
        "--reason",
        "r",
        "--yes",
        env=env,
    )
    assert made.returncode == 0, made
    assert "paused orders.placed (tenant acme)" in made.stdout
    [held] = cli("stats", "--json", env=env).json()["pauses"]
    assert held["tenant_id"] == "acme"
    for command in ("pause", "resume"):
        assert cli(command, "--help").returncode == 0
