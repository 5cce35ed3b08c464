"""``--installed-app``: found in the working directory or under ``--app-dir``; an app that
exits while importing, or whose ready hook fails, is one line and exit status 2."""

from __future__ import annotations

from .conftest import APP, Cli, sqlite_only


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
