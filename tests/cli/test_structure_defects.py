"""Issue 11's defects: settings errors name real flags, a closed pipe is quiet, one meaning of
``matched``, ``--retention-seconds none``, installed apps from the working directory."""

from __future__ import annotations

import os
import subprocess

import pytest

from engine.storage.schema import DEAD_LETTER, PUBLISHED

from .conftest import APP, Cli, cli_env, sqlite_only
from .test_commands import _ids


@sqlite_only
@pytest.mark.parametrize(
    ("variable", "value", "flag"),
    [
        ("USE_LOCK", "maybe", "--lock"),
        ("BACKOFF_KIND", "linear", "--backoff-kind"),
        ("BACKOFF_MAX_SECONDS", "lots", "--backoff-max-seconds"),
        ("BACKOFF_JITTER", "2", "--backoff-jitter"),
        ("WAKEUP", "sometimes", "--wakeup"),
        ("RETENTION_SECONDS", "-1", "--retention-seconds"),
    ],
)
def test_settings_errors_name_a_flag_that_exists(
    cli: Cli, orders_url: str, variable: str, value: str, flag: str
) -> None:
    env = {"OUTBOX_DATABASE_URL": orders_url, f"OUTBOX_DISPATCHER__{variable}": value}
    from_env = cli("--dispatch", "--installed-app", APP, "--max-iterations", "1", env=env)
    from_env.assert_one_error_line(f"OUTBOX_DISPATCHER__{variable} / {flag} must be", status=2)
    given = [flag] if flag == "--lock" else [flag, value]
    # The flag it names is accepted by the same command (a bad value fails the same way).
    env = {"OUTBOX_DATABASE_URL": orders_url}
    by_flag = cli("dispatch", "--installed-app", APP, "--max-iterations", "1", *given, env=env)
    if flag == "--lock":
        assert by_flag.returncode == 0, by_flag
    else:
        by_flag.assert_one_error_line(f"{flag} must be", status=2)


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


@sqlite_only
def test_retention_none_on_the_command_line(cli: Cli, orders_url: str) -> None:
    env = {"OUTBOX_DATABASE_URL": orders_url}
    counted = cli("stats", "--json", "--retention-seconds", "86400", env=env)
    unset = cli("stats", "--json", "--retention-seconds", "none", env=env)
    assert counted.returncode == unset.returncode == 0, unset
    assert counted.json()["awaiting_purge"] == 0
    assert unset.json()["awaiting_purge"] is None
    cli("stats", "--retention-seconds", "soon", env=env).assert_one_error_line(
        "--retention-seconds must be", status=2
    )


@sqlite_only
def test_an_installed_app_in_the_working_directory_or_app_dir(
    cli: Cli, orders_url: str, tmp_path
) -> None:
    body = f"from {APP} import register  # noqa: F401\n"
    (cli.cwd / "local_orders.py").write_text(body)
    elsewhere = tmp_path / "apps_elsewhere"
    elsewhere.mkdir()
    (elsewhere / "far_orders.py").write_text(body)
    env = {"OUTBOX_DATABASE_URL": orders_url}
    here = cli("dispatch-once", "--installed-app", "local_orders", "--json", env=env)
    assert here.returncode == 0, here
    there = cli(
        "dispatch-once", "--installed-app", "far_orders", "--app-dir", str(elsewhere), env=env
    )
    assert there.returncode == 0, there
    missing = cli("dispatch-once", "--installed-app", "far_orders", env=env)
    missing.assert_one_error_line("cannot import installed app 'far_orders'", status=2)


def test_an_installed_app_that_exits_while_importing_is_one_line(cli: Cli) -> None:
    """``sys.exit(3)`` in an app module ended the CLI with status 3 and no word."""
    (cli.cwd / "quitting_app.py").write_text("import sys\nsys.exit(3)\n")
    result = cli("dispatch-once", "--installed-app", "quitting_app")
    result.assert_one_error_line(
        "installed app 'quitting_app' failed while importing: SystemExit: 3", status=2
    )


@sqlite_only
def test_an_installed_apps_failing_ready_hook_stops_dispatch_in_one_line(
    cli: Cli, orders_url: str
) -> None:
    """``registry.on_ready``: the hook runs once the dispatcher is up; its failure ends
    ``--dispatch`` before the first claim, as a configuration error."""
    (cli.cwd / "cold_app.py").write_text(
        f"from {APP} import register as register_orders\n\n\n"
        "def register(registry):\n"
        "    register_orders(registry)\n\n"
        "    @registry.on_ready\n"
        "    async def warm_up():\n"
        "        raise RuntimeError('the cache is unreachable')\n"
    )
    env = {"OUTBOX_DATABASE_URL": orders_url}
    result = cli("--dispatch", "--installed-app", "cold_app", env=env)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr, result.stderr
    started, failed = result.stderr.splitlines()  # the start line, then the error
    assert started.startswith("dispatching as "), started
    assert failed == (
        "outbox-tui: error: the ready hook register.<locals>.warm_up failed: RuntimeError: "
        "the cache is unreachable"
    )
    published = cli("stats", "--json", env=env).json()
    assert published["counts"]["publishing"] == 0, published
