"""The ``outbox-tui`` command line: one module per command group, one error handler.

Without a subcommand it opens the console (``console``); ``dispatch`` (alias
``--dispatch``) runs the headless dispatcher loop; the other commands answer
one question each (``stats``, ``dead-letter list|groups``) or make one change
(``init-db``, ``dead-letter replay|skip``, ``pause``, ``resume``, ``dispatch-once``);
``consume`` takes CloudEvents off a RabbitMQ queue into the outbox (the inbox).
A command group is a module with ``register(subparsers)`` that sets ``run`` on its
parsers; add it to ``COMMAND_GROUPS``. Every failure is one line on stderr (``errors``).
See docs/cli.md.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Iterator, Sequence
from types import ModuleType

from engine.service import load_registry
from engine.storage.secrets import mask_secrets
from outbox_tui import PROG, __version__
from outbox_tui.cli import (
    catalog,
    console,
    consume,
    dead_letter,
    dispatch,
    event,
    init_db,
    pause,
    stats,
)
from outbox_tui.cli.errors import EXIT_USAGE, UsageError, run_guarded
from outbox_tui.cli.event_loop import run_coroutine
from outbox_tui.cli.options import (
    Invocation,
    Parser,
    add_common,
    examples,
    redacting_output,
    resolve,
)
from outbox_tui.cli.redaction import RedactingStream, Redactor, SecretFilter, configure_logging

COMMAND_GROUPS: tuple[ModuleType, ...] = (
    dispatch,
    consume,
    dead_letter,
    pause,
    stats,
    event,
    init_db,
    catalog,
)
# Commands that need every setting valid; the others only read and go on without a bad
# dispatcher setting (stats says what it could not count).
STRICT_SETTINGS = ("console", "dispatch", "dispatch-once", "consume")
# The settings sections a read-only command reads: their errors stop it (any other
# section's falls back to its defaults).
STRICT_SECTIONS: dict[str, tuple[str, ...]] = {"catalog": ("consumer",)}
DISPATCH_ALIAS = "--dispatch"

__all__ = ["RedactingStream", "Redactor", "SecretFilter", "build_parser", "main"]


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG,
        description="Operate a transactional outbox: the console (no subcommand), the "
        "headless dispatcher (dispatch, or --dispatch), and one-shot commands.",
        epilog=examples(
            f"{PROG} --installed-app outbox_tui.examples.orders  # open the console",
            f"{PROG} --demo  # the console with demo traffic",
            f"{PROG} init-db --database-url postgresql+asyncpg://app:secret@db/app",
            f"{PROG} --dispatch --installed-app outbox_tui.examples.orders --json",
            f"{PROG} dispatch --amqp-url amqp://guest:guest@rabbit/ --metrics-port 9100",
            f"{PROG} consume --amqp-url amqp://guest:guest@rabbit/ --queue billing.inbox "
            "--bind outbox.events:orders.# --installed-app billing.outbox",
            f"{PROG} stats --json",
            f"{PROG} dead-letter list --tenant acme",
            f"{PROG} dead-letter replay --all --event-type orders.placed --dry-run",
            f"{PROG} dead-letter skip --event-id 0190... --yes --reason 'handled by hand'",
            f"{PROG} dead-letter groups",
            f"{PROG} pause --event-type orders.placed --reason 'CRM down' --yes",
            f"{PROG} catalog --installed-app outbox_tui.examples.orders --asyncapi",
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    add_common(parser, apps_dest="installed_apps")
    console.add_options(parser)
    parser.add_argument(
        DISPATCH_ALIAS,
        action="store_true",
        default=argparse.SUPPRESS,
        help="the same as the dispatch command: run the dispatcher loop (see dispatch --help)",
    )
    parser.set_defaults(run=console.console)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _parsers(
    parser: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for name, child in _subcommands(parser).items():
        yield from _parsers(child, f"{path} {name}".strip())


def _command_path(parser: argparse.ArgumentParser, tokens: list[str]) -> list[str]:
    path = []
    for token in tokens:
        children = _subcommands(parser)
        if token in children:
            path.append(token)
            parser = children[token]
    return path


def _command_parser(parser: argparse.ArgumentParser, path: list[str]) -> argparse.ArgumentParser:
    for name in path:
        parser = _subcommands(parser)[name]
    return parser


def prepare_argv(parser: Parser, argv: list[str]) -> list[str]:
    """``--dispatch`` becomes the ``dispatch`` command; an option of another command is
    named as such (instead of argparse's "unrecognized arguments")."""
    end = argv.index("--") if "--" in argv else len(argv)
    tokens = argv[:end]
    path = _command_path(parser, tokens)
    if DISPATCH_ALIAS in tokens:
        if path:
            raise UsageError(f"--dispatch cannot be combined with the {path[0]} subcommand")
        tokens.remove(DISPATCH_ALIAS)
        argv = ["dispatch", *tokens, *argv[end:]]
        tokens, path = argv[: len(tokens) + 1], ["dispatch"]
    allowed = _options(_command_parser(parser, path))
    for token in tokens:
        flag = token.split("=", 1)[0]
        if not flag.startswith("--") or flag in allowed:
            continue
        owners = [
            p or "the console" for p, child in _parsers(parser, "") if flag in _options(child)
        ]
        if owners:
            raise UsageError(
                f"{flag} does not apply here: it is an option of {' or '.join(owners)}"
            )
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    # Before the settings resolve (their errors may echo a value holding a URL): the
    # fallback masks the credentials of any URL it prints.
    given = list(sys.argv[1:] if argv is None else argv)
    fallback = redacting_output(Redactor(), json_mode="--json" in given)
    parser = build_parser()
    try:
        args_list = prepare_argv(parser, given)
        args = parser.parse_args(args_list)
        path = _command_path(parser, args_list)
        command = " ".join(path) or "console"
        flags = _options(_command_parser(parser, path))
    except UsageError as exc:
        return fallback.failed(mask_secrets(str(exc)), EXIT_USAGE)
    inv: Invocation | None = None

    def resolved() -> int:
        nonlocal inv
        inv = resolve(
            args,
            command=command,
            strict_settings=command in STRICT_SETTINGS,
            flags=flags,
            strict_sections=STRICT_SECTIONS.get(command, ()),
        )
        return EXIT_USAGE if inv is None else 0

    status = run_guarded(resolved, fallback)
    if inv is None:
        return status
    return run_guarded(lambda: _run(inv), inv.out)


def _run(inv: Invocation) -> int:
    configure_logging(inv.log_level, inv.out, inv.redact)
    if inv.installed_apps and inv.command not in STRICT_SETTINGS:
        # A bad name is an error even for a command that does not need the registry.
        inv.registry = load_registry(inv.installed_apps, app_dir=inv.app_dir)
    result = inv.args.run(inv)
    if inspect.iscoroutine(result):
        result = run_coroutine(result)
    return int(result)
