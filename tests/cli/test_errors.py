"""Failures are one line on stderr (``outbox-tui: error: ...``), never a traceback or a password;
a reader that goes away (a closed pipe) ends a command quietly."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from engine import create_schema
from tests.cli.conftest import APP, Cli, cli_env, sqlite_only

BROKER_DOWN = "amqp://guest:guest@127.0.0.1:1/"


@pytest.fixture
async def ready_url(sqlite_url: str) -> str:
    """An SQLite outbox with its schema, so failures come from what each case changes."""
    await create_schema(sqlite_url)
    return sqlite_url


@pytest.mark.parametrize(
    ("args", "env", "fragments", "status"),
    [
        pytest.param(
            ["stats", "--database-url", "mysql://app:hunter2@db/app"],
            {},
            ["unsupported database URL scheme 'mysql'"],
            2,
            id="bad-url-scheme",
        ),
        pytest.param(
            ["init-db", "--database-url", "sqlite+aiosqlite:////no-such-dir/outbox.db"],
            {},
            ["cannot reach the database", "unable to open database file"],
            1,
            id="unreachable-sqlite",
        ),
        pytest.param(
            ["dispatch-once", "--installed-app", "no_such_app_module"],
            {},
            ["cannot import installed app 'no_such_app_module'"],
            2,
            id="unknown-installed-app",
        ),
        pytest.param(
            ["dispatch-once", "--installed-app", "json"],
            {},
            ["installed app 'json' has no register(registry) function"],
            2,
            id="app-without-register",
        ),
        pytest.param(
            ["dispatch-once", "--installed-app", APP],
            {"OUTBOX_DISPATCHER__BATCH_SIZE": "lots"},
            ["OUTBOX_DISPATCHER__BATCH_SIZE / --batch-size must be an integer", "lots"],
            2,
            id="invalid-batch-size-setting",
        ),
        pytest.param(
            ["--dispatch"],
            {},
            ["nothing would deliver the events", "--installed-app", "--amqp-url"],
            2,
            id="no-handlers-no-broker",
        ),
        pytest.param(
            ["dispatch-once", "--amqp-url", BROKER_DOWN],
            {},
            ["no event types are registered", "--installed-app"],
            2,
            id="relay-without-event-types",
        ),
        pytest.param(
            ["dispatch-once", "--installed-app", APP, "--amqp-url", BROKER_DOWN],
            {},
            ["cannot reach RabbitMQ", "127.0.0.1:1"],
            1,
            id="broker-down",
        ),
        pytest.param(
            ["--demo"],
            {},
            ["the console needs a terminal", "stats, dead-letter, dispatch"],
            2,
            id="console-without-a-terminal",
        ),
        pytest.param(
            ["stats"],
            {"OUTBOX_DISPATCHER": "{not json"},
            ["OUTBOX_DISPATCHER must be a JSON object, got '{not json'"],
            2,
            id="section-not-json",
        ),
        pytest.param(
            ["stats"],
            {"outbox_dispatcher": "{lower case"},  # read in any case, as the settings do
            ["OUTBOX_DISPATCHER must be a JSON object, got '{lower case'"],
            2,
            id="section-not-json-lower-case",
        ),
        pytest.param(
            ["dead-letter", "replay", "--group", "", "--yes"],
            {},
            ["--group: expected a fingerprint of 12 hex digits", "''"],
            2,
            id="empty-group",
        ),
        pytest.param(
            ["dead-letter", "replay", "--event-id", "", "--yes"],
            {},
            ["--event-id: expected a value, got an empty one"],
            2,
            id="empty-event-id",
        ),
        pytest.param(
            ["dispatch-once", "--installed-app", APP, "--instance-id", "x" * 201],
            {},
            ["--instance-id: expected at most 200 characters, got 201"],
            2,
            id="instance-id-longer-than-its-column",
        ),
        pytest.param(
            ["dead-letter", "list", "--limit", "99999999999999999999999"],
            {},
            ["--limit: expected a number from 1 to 2147483647"],
            2,
            id="huge-limit",
        ),
        pytest.param(
            ["stats", "--bogus"],
            {},
            ["unrecognized arguments: --bogus", "--help"],
            2,
            id="unknown-option",
        ),
        pytest.param(
            ["--batch-size", "5", "stats"],
            {},
            ["--batch-size does not apply here"],
            2,
            id="option-of-another-mode",
        ),
        pytest.param(
            ["stats", "--installed-app", "no_such_app_module"],
            {},
            ["cannot import installed app"],
            2,
            id="stats-unknown-app",
        ),
        pytest.param(
            ["--installed-app", "no_such_app_module"],
            {},
            ["cannot import installed app"],
            2,
            id="console-unknown-app",
        ),
    ],
)
def test_one_line_errors(
    cli: Cli,
    ready_url: str,
    args: list[str],
    env: dict[str, str],
    fragments: list[str],
    status: int,
) -> None:
    result = cli(*args, env={"OUTBOX_DATABASE_URL": ready_url, **env})
    result.assert_one_error_line(*fragments, status=status)
    assert result.stdout == ""
    assert ":hunter2@" not in result.output and ":guest@" not in result.output


def test_with_json_a_failure_is_also_a_json_object_on_stdout(cli: Cli, tmp_path: Path) -> None:
    """A script reading stdout learns why there is no result: the same line as stderr's,
    and the exit status."""
    missing = f"sqlite+aiosqlite:///{tmp_path}/missing.db"
    for args, status in (
        (("stats", "--json", "--database-url", missing), 1),
        (("dead-letter", "list", "--json", "--limit", "0"), 2),
        (("stats", "--json", "--database-url", "mysql://app:hunter2@db/app"), 2),
    ):
        result = cli(*args)
        line = result.assert_one_error_line(status=status)
        assert result.json() == {
            "error": line.removeprefix("outbox-tui: error: "),
            "exit_status": status,
        }
        assert "hunter2" not in result.output


def test_console_refuses_a_missing_database_in_one_line(cli: Cli, tmp_path: Path) -> None:
    result = cli("--database-url", f"sqlite+aiosqlite:///{tmp_path}/missing.db")
    result.assert_one_error_line("init-db", status=1)
    assert not (tmp_path / "missing.db").exists()


def test_missing_tables_name_init_db(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "empty.db").touch()
    result = cli(
        "dead-letter", "list", "--database-url", f"sqlite+aiosqlite:///{tmp_path}/empty.db"
    )
    result.assert_one_error_line(
        "outbox tables are missing", "`outbox-tui init-db --database-url ", status=1
    )


@pytest.mark.postgresql
async def test_passwords_are_never_printed(cli: Cli, pg_url: str) -> None:
    url = make_url(pg_url)
    password = str(url.password)
    env = {"OUTBOX_DATABASE_URL": pg_url}

    missing = cli("stats", "--json", env=env)
    missing.assert_one_error_line("outbox tables are missing", status=1)
    created = cli("init-db", "--database-url", pg_url)
    stats = cli("stats", "--json", env=env)
    run = cli(
        "--dispatch",
        "--installed-app",
        APP,
        "--max-iterations",
        "1",
        "--json",
        "--log-level",
        "DEBUG",
        env=env,
    )
    for result in (created, stats, run):
        assert result.returncode == 0, result
    assert stats.json()["database_url"] == url.render_as_string(hide_password=True)

    wrong_port = cli("stats", env={"OUTBOX_DATABASE_URL": url.set(port=1).render_as_string(False)})
    wrong_port.assert_one_error_line("cannot reach the database", status=1)

    for result in (missing, created, stats, run, wrong_port):
        assert password not in result.output, result

    wrong = f"wrong-{uuid.uuid4().hex}"
    bad_login = cli(
        "dead-letter", "list", "--database-url", url.set(password=wrong).render_as_string(False)
    )
    # Issue 43, defect 7: a wrong password is a refused login, not an unreachable server.
    bad_login.assert_one_error_line(
        "the database refused the login", "password authentication failed", status=1
    )
    assert "cannot reach" not in bad_login.output
    assert wrong not in bad_login.output


def test_a_url_in_the_wrong_setting_is_masked_in_its_error(cli: Cli, tmp_path: Path) -> None:
    """Settings errors echo the bad value; one holding a URL must not print its password
    (also before the database URL itself is known, and upper-cased by --log-level)."""
    url = f"sqlite+aiosqlite:///{tmp_path}/x.db"
    channel = cli(
        "dispatch-once",
        "--installed-app",
        APP,
        "--database-url",
        url,
        env={"OUTBOX_DISPATCHER__WAKEUP_CHANNEL": "postgresql://u:EnvS3cret@h/d"},
    )
    channel.assert_one_error_line(
        "--wakeup-channel must be", "got postgresql://u:***@h/d", status=2
    )
    level = cli(
        "stats", "--database-url", url, env={"OUTBOX_LOG_LEVEL": "postgresql://u:LvS3cret@h/d"}
    )
    level.assert_one_error_line("--log-level must be", status=2)
    for result in (channel, level):
        assert "S3CRET" not in result.output.upper(), result


def test_the_engine_and_the_front_end_name_the_same_program() -> None:
    """The engine's hints (``outbox-tui init-db``) and the CLI's ``PROG`` cannot drift."""
    from engine.storage.database import INIT_DB, PROGRAM
    from outbox_tui import PROG

    assert PROGRAM == PROG
    assert f"{PROG} init-db" == INIT_DB


@sqlite_only
@pytest.mark.parametrize(
    "args",
    [
        ("stats", "--json"),
        ("--dispatch", "--installed-app", APP, "--max-iterations", "2", "--json"),
        # Text mode: rich's consoles meet the closed pipe (``| head -1``, ``| true``).
        ("stats",),
        ("dead-letter", "list"),
        ("dead-letter", "groups"),
        ("--dispatch", "--installed-app", APP, "--max-iterations", "2"),
        ("dispatch-once", "--installed-app", APP),
    ],
)
def test_a_closed_pipe_ends_the_command_quietly(cli: Cli, dead_letters_url: str, args) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write meets EPIPE
    try:
        result = subprocess.run(
            cli.command(*args),
            cwd=cli.cwd,
            env=cli_env(OUTBOX_DATABASE_URL=dead_letters_url),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert result.returncode == 0
    assert "BrokenPipe" not in result.stderr and "Traceback" not in result.stderr
    assert "error" not in result.stderr
