"""Every setting has its flag, and a settings error names only flags the command accepts.

Walks ``OutboxSettings`` and each of its sections: the flag ``flag_of`` gives a field is an
option of some parser and sets that field; an invalid value in the field's environment
variable, under every command, gives one line that names the variable and either a flag of
that command or no flag at all. A flag's value reaches the command
(``--max-concurrency``, ``--handler-timeout-seconds``, ``--retention-seconds none``).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from typing import Any, Literal, get_args, get_origin

import pytest
from pydantic import BaseModel

from engine.errors import ConfigurationError
from engine.settings import OutboxSettings, env_of, flag_of
from outbox_tui.cli import (
    STRICT_SECTIONS,
    STRICT_SETTINGS,
    _options,
    _parsers,
    _subcommands,
    build_parser,
)
from outbox_tui.cli.options import resolve

from .conftest import APP, Cli, sqlite_only


def _fields(
    model: type[BaseModel] = OutboxSettings, within: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _fields(annotation, (*within, name))
        else:
            yield (*within, name), info


SETTINGS = list(_fields())
# Strings without a rule: any value is a valid one.
NO_INVALID_VALUE = {("amqp_url",)}


# Values the walk cannot derive from a field's type.
INVALID = {
    ("database_url",): "mysql://db/outbox",
    ("consumer", "queue"): "",
    ("consumer", "bindings"): "no-colon",
    ("consumer", "default_tenant"): "t" * 129,
}


def _invalid(loc: tuple[str, ...], info: Any) -> str:
    """A value the field refuses, from its type (the walk fails on a type it cannot handle)."""
    if loc in INVALID:
        return INVALID[loc]
    annotation = info.annotation
    args = [a for a in get_args(annotation) if a is not type(None)]
    if args and get_origin(annotation) is not Literal:
        annotation = args[0]
    if annotation is bool:
        return "maybe"
    if annotation in (int, float):
        return "lots"
    if get_origin(annotation) is Literal:
        return "nonsense"
    if annotation is str:
        return "Not A-Name!" if any(hasattr(m, "pattern") for m in info.metadata) else ""
    raise AssertionError(f"no invalid value known for {loc} ({info.annotation})")


def _commands() -> list[tuple[str, set[str]]]:
    """Every command that runs (the root is the console) with its own options."""
    return [
        (path or "console", _options(parser))
        for path, parser in _parsers(build_parser(), "")
        if not _subcommands(parser)
    ] + [("console", _options(build_parser()))]


COMMANDS = _commands()


def test_the_walk_covers_every_section() -> None:
    sections = {loc[0] for loc, _info in SETTINGS if len(loc) == 2}
    assert sections == {"dispatcher", "console", "consumer"}
    assert ("console", "page_size") in {loc for loc, _info in SETTINGS}


@pytest.mark.parametrize("loc", [loc for loc, _info in SETTINGS], ids="_".join)
def test_every_setting_has_its_flag_on_some_parser(loc: tuple[str, ...]) -> None:
    flag = flag_of(loc)
    owners = [
        action
        for _path, parser in _parsers(build_parser(), "")
        for action in parser._actions
        if flag in action.option_strings
    ]
    assert owners, f"{env_of(loc)}: no command has {flag}"
    assert {a.dest for a in owners} == {loc[-1]}, f"{flag} does not set {loc[-1]}"


def _settings_message(command: str, flags: set[str]) -> str | None:
    """The error (or, for a read-only command, the reported problem) resolving gives."""
    strict = command in STRICT_SETTINGS
    sections = STRICT_SECTIONS.get(command, ())
    try:
        inv = resolve(
            argparse.Namespace(),
            command=command,
            strict_settings=strict,
            flags=flags,
            strict_sections=sections,
        )
    except ConfigurationError as exc:
        return str(exc)
    return inv.settings_problem


@pytest.mark.parametrize(
    ("loc", "info"),
    [(loc, info) for loc, info in SETTINGS if loc not in NO_INVALID_VALUE],
    ids=lambda v: "_".join(v) if isinstance(v, tuple) else "",
)
def test_an_invalid_variable_names_a_flag_the_command_accepts(
    monkeypatch: pytest.MonkeyPatch, loc: tuple[str, ...], info: Any
) -> None:
    variable = env_of(loc)
    monkeypatch.setenv(variable, _invalid(loc, info))
    named = 0
    for command, flags in COMMANDS:
        message = _settings_message(command, flags)
        if message is None:  # a read-only command went on without the section
            assert loc[0] in ("dispatcher", "console", "consumer")
            assert command not in STRICT_SETTINGS
            assert loc[0] not in STRICT_SECTIONS.get(command, ())
            continue
        assert "\n" not in message
        assert message.startswith(variable), (command, message)
        after = message[len(variable) :]
        match = re.match(r" / (--[a-z-]+)", after)
        if match:
            assert match.group(1) in flags, f"{command}: {message}"
            assert match.group(1) == flag_of(loc)
            named += 1
        else:
            assert flag_of(loc) not in flags, f"{command} has {flag_of(loc)}: {message}"
    assert named, f"no command names {flag_of(loc)} for {variable}"


# -- the audit's cases, end to end -------------------------------------------------------


def test_a_bad_console_page_size_names_its_flag_and_does_not_stop_stats(cli: Cli) -> None:
    env = {"OUTBOX_CONSOLE__PAGE_SIZE": "0"}
    cli("--demo", env=env).assert_one_error_line(
        "OUTBOX_CONSOLE__PAGE_SIZE / --page-size must be an integer between 1 and 1000, got 0",
        status=2,
    )
    cli("--page-size", "0").assert_one_error_line("--page-size must be", status=2)
    assert cli("init-db").returncode == 0
    stats = cli("stats", "--json", env=env)
    assert stats.returncode == 0, stats
    assert stats.stderr == ""


@pytest.mark.parametrize("command", [("stats",), ("dispatch-once",), ("init-db",)])
def test_the_dedup_window_is_named_by_its_variable_where_there_is_no_flag(
    cli: Cli, command: tuple[str, ...]
) -> None:
    result = cli(*command, env={"OUTBOX_DEDUP_WINDOW_SECONDS": "x"})
    line = result.assert_one_error_line(
        "OUTBOX_DEDUP_WINDOW_SECONDS must be a number greater than 0", status=2
    )
    assert "--dedup-window-seconds" not in line
    env = {"OUTBOX_DEDUP_WINDOW_SECONDS": "x"}
    replay = cli("dead-letter", "replay", "--all", "--dry-run", env=env)
    replay.assert_one_error_line("OUTBOX_DEDUP_WINDOW_SECONDS / --dedup-window-seconds", status=2)


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


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (["--max-concurrency", "0"], ["--max-concurrency must be an integer between 1"]),
        (["--max-concurrency", "many"], ["--max-concurrency must be an integer", "got many"]),
        (
            ["--handler-timeout-seconds", "45"],
            ["--handler-timeout-seconds must be below lease_seconds (30)", "45"],
        ),
        (
            ["--handler-timeout-seconds", "-1"],
            ["OUTBOX_DISPATCHER__HANDLER_TIMEOUT_SECONDS / --handler-timeout-seconds"],
        ),
    ],
)
@pytest.mark.parametrize("mode", [["dispatch-once"], ["--dispatch", "--max-iterations", "1"]])
def test_a_bad_concurrency_or_timeout_is_one_line_naming_the_flag(
    cli: Cli, orders_url: str, mode: list[str], flags: list[str], fragments: list[str]
) -> None:
    result = cli(*mode, "--installed-app", APP, *flags, env={"OUTBOX_DATABASE_URL": orders_url})
    result.assert_one_error_line(*fragments, status=2)
    assert result.stdout == ""


async def test_concurrency_and_timeout_reach_the_dispatcher(cli: Cli, orders_url: str) -> None:
    env = {"OUTBOX_DATABASE_URL": orders_url}
    run = cli(
        "--dispatch",
        "--installed-app",
        APP,
        "--max-iterations",
        "1",
        "--max-concurrency",
        "3",
        "--handler-timeout-seconds",
        "2.5",
        "--json",
        env=env,
    )
    assert run.returncode == 0, run
    settings = run.json_lines()[0]["settings"]
    assert (settings["max_concurrency"], settings["handler_timeout_seconds"]) == (3, 2.5)
    once = cli(
        "dispatch-once",
        "--installed-app",
        APP,
        "--max-concurrency",
        "1",
        "--handler-timeout-seconds",
        "1",
        "--json",
        env=env,
    )
    assert once.returncode == 0, once
    assert once.json()["claimed"] > 0
    wrong_mode = cli("stats", "--max-concurrency", "3", env=env)
    assert wrong_mode.returncode == 2


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
