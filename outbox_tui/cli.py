"""The ``outbox-tui`` command line: parse arguments, call the engine, render with ``output``.

Without a subcommand it opens the console; ``--dispatch`` runs the headless
dispatcher loop; subcommands answer one question each (``stats``,
``dead-letter list``) or make one change (``init-db``, ``dead-letter replay``,
``dispatch-once``). Every failure is one line on stderr, ``outbox-tui: error:
...``, with passwords masked, and an exit status of 1 (something failed) or 2
(the invocation or configuration is wrong). See docs/cli.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TextIO

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.database import (
    DEFAULT_DATABASE_URL,
    check_schema,
    create_engine,
    create_schema,
    mask_secrets,
    mask_url,
    parse_database_url,
    storage_errors,
)
from engine.errors import (
    ConfigurationError,
    EventNotFoundError,
    OutboxError,
    SchemaMissingError,
    SchemaOutdatedError,
)
from engine.insights import EventFilter, OutboxInsights
from engine.registry import EventRegistry
from engine.replay import default_operator, replay_dead_letter, skip_dead_letter
from engine.schema import DEAD_LETTER
from outbox_tui import __version__, output
from outbox_tui.apps import InstalledAppError, delivery_problem, load_registry
from outbox_tui.output import Output, ReplayReport, RunReporter, SkipReport
from outbox_tui.sqlite_workers import settle_sqlite_workers

PROG = "outbox-tui"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEFAULT_EXCHANGE = "outbox.events"
PG_CONNECT_TIMEOUT_SECONDS = 10.0
REPLAY_CHUNK = 500
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

log = logging.getLogger("outbox_tui.cli")


class UsageError(Exception):
    """The command line is wrong (exit status 2)."""


# -- secrets ---------------------------------------------------------------------------


class Redactor:
    """Removes the passwords of the URLs this run was given from any text it prints."""

    def __init__(self) -> None:
        self._urls: list[str] = []

    def add(self, url: str | None) -> None:
        if url:
            self._urls.append(url)

    def __call__(self, text: str) -> str:
        return mask_secrets(text, *self._urls)


class RedactingStream:
    """A text stream wrapper: everything written passes through the redactor first."""

    def __init__(self, inner: TextIO, redact: Callable[[str], str]) -> None:
        self._inner = inner
        self._redact = redact

    def write(self, text: str) -> int:
        self._inner.write(self._redact(text))
        return len(text)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._inner, "encoding", "utf-8")


class SecretFilter(logging.Filter):
    """Masks passwords in every log record (message, arguments and traceback text)."""

    def __init__(self, redact: Callable[[str], str]) -> None:
        super().__init__()
        self._redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self._redact(record.getMessage())
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self._redact(record.stack_info)
        return True


def configure_logging(level: str, out: Output, redact: Callable[[str], str]) -> None:
    """One handler on the root logger, on stderr, behind the secret filter."""
    handler: logging.Handler
    if out.err_console.is_terminal:
        from rich.logging import RichHandler

        handler = RichHandler(console=out.err_console, show_path=False, markup=False)
    else:
        handler = logging.StreamHandler(out.err_console.file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(SecretFilter(redact))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)


# -- argument parsing ------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _subparser(sub: Any, name: str, help_: str, description: str, *examples: str) -> Parser:
    parser: Parser = sub.add_parser(
        name,
        help=help_,
        description=textwrap.fill(description, 88),
        epilog=_examples(*examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def _add_common(parser: argparse.ArgumentParser, *, apps_dest: str) -> None:
    group = parser.add_argument_group("database and apps")
    group.add_argument(
        "--database-url",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="outbox database (env OUTBOX_DATABASE_URL; default "
        f"{DEFAULT_DATABASE_URL}); the password is never printed",
    )
    group.add_argument(
        "--installed-app",
        metavar="MODULE",
        action="append",
        dest=apps_dest,
        default=argparse.SUPPRESS,
        help="import MODULE and call its register(registry); repeatable",
    )
    group.add_argument(
        "--log-level",
        metavar="LEVEL",
        default=argparse.SUPPRESS,
        help="DEBUG, INFO, WARNING, ERROR (env OUTBOX_LOG_LEVEL; default WARNING, "
        "INFO for --dispatch)",
    )


def _add_json(parser: argparse._ActionsContainer, help_: str) -> None:
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=help_)


def _add_broker(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("broker (instead of local handlers)")
    group.add_argument(
        "--amqp-url",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="relay events to RabbitMQ instead of running handlers (env OUTBOX_AMQP_URL)",
    )
    group.add_argument(
        "--exchange",
        metavar="NAME",
        default=argparse.SUPPRESS,
        help=f"RabbitMQ exchange to publish to (default {DEFAULT_EXCHANGE})",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port between 0 and 65535, got {value}")
    return value


def _seconds(*, allow_zero: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
        if value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text}")
        return value

    return parse


# Settings flags are validated by engine.settings (one message naming flag and variable),
# so argparse only checks they are numbers.
def _add_dispatch(parser: argparse.ArgumentParser, *, loop: bool) -> None:
    group = parser.add_argument_group("dispatcher settings (override OUTBOX_DISPATCHER__*)")
    group.add_argument(
        "--batch-size",
        metavar="N",
        type=int,
        default=argparse.SUPPRESS,
        help="events claimed per round (default 100)",
    )
    group.add_argument(
        "--max-concurrency",
        metavar="N",
        type=int,
        default=argparse.SUPPRESS,
        help="events of a batch delivered at once (default 200)",
    )
    group.add_argument(
        "--handler-timeout-seconds",
        metavar="S",
        type=float,
        default=argparse.SUPPRESS,
        help="how long one handler may run before it counts as a transient failure "
        "(default 10; below --lease-seconds)",
    )
    group.add_argument(
        "--lease-seconds",
        metavar="S",
        type=float,
        default=argparse.SUPPRESS,
        help="how long a claim is held before others may take it over",
    )
    group.add_argument(
        "--max-attempts",
        metavar="N",
        type=int,
        default=argparse.SUPPRESS,
        help="attempt budget for every row this dispatcher handles (default: each row's "
        "own max_attempts, 10 unless published otherwise)",
    )
    group.add_argument(
        "--lock",
        action="store_true",
        default=argparse.SUPPRESS,
        help="take the cross-process dispatch lock around each claim",
    )
    group.add_argument(
        "--instance-id",
        metavar="ID",
        default=argparse.SUPPRESS,
        help="dispatcher and heartbeat id (default <host>:<pid>)",
    )
    if not loop:
        return
    group.add_argument(
        "--idle-sleep-seconds",
        metavar="S",
        type=float,
        default=argparse.SUPPRESS,
        help="sleep between rounds that found nothing (default 1)",
    )
    group.add_argument(
        "--max-iterations",
        metavar="N",
        type=_positive_int,
        default=argparse.SUPPRESS,
        help="stop after N rounds (default: run until SIGTERM/SIGINT)",
    )
    group.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=_port,
        default=argparse.SUPPRESS,
        help="serve Prometheus metrics on PORT (/metrics)",
    )
    group.add_argument(
        "--metrics-host",
        metavar="HOST",
        default=argparse.SUPPRESS,
        help="address for --metrics-port (default 127.0.0.1)",
    )


# Options that only some modes accept, and which modes.
MODE_OPTIONS: dict[str, tuple[str, ...]] = {
    "demo": ("console",),
    "refresh": ("console",),
    "amqp_url": ("console", "dispatch", "dispatch-once"),
    "exchange": ("console", "dispatch", "dispatch-once"),
    "batch_size": ("dispatch", "dispatch-once"),
    "max_concurrency": ("dispatch", "dispatch-once"),
    "handler_timeout_seconds": ("dispatch", "dispatch-once"),
    "lease_seconds": ("dispatch", "dispatch-once"),
    "max_attempts": ("dispatch", "dispatch-once"),
    "lock": ("dispatch", "dispatch-once"),
    "instance_id": ("dispatch", "dispatch-once"),
    "idle_sleep_seconds": ("dispatch",),
    "max_iterations": ("dispatch",),
    "metrics_port": ("dispatch",),
    "metrics_host": ("dispatch",),
}


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG,
        description="Operate a transactional outbox: the console (no subcommand), the "
        "headless dispatcher (--dispatch), and one-shot commands.",
        epilog=_examples(
            f"{PROG} --installed-app outbox_tui.examples.orders  # open the console",
            f"{PROG} --demo  # the console with demo traffic",
            f"{PROG} init-db --database-url postgresql+asyncpg://app:secret@db/app",
            f"{PROG} --dispatch --installed-app outbox_tui.examples.orders --json",
            f"{PROG} --dispatch --amqp-url amqp://guest:guest@rabbit/ --metrics-port 9100",
            f"{PROG} stats --json",
            f"{PROG} dead-letter list --tenant acme",
            f"{PROG} dead-letter replay --all --event-type orders.placed --dry-run",
            f"{PROG} dead-letter skip --event-id 0190... --yes --reason 'handled by hand'",
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _add_common(parser, apps_dest="installed_apps")
    console = parser.add_argument_group("console (no subcommand)")
    console.add_argument(
        "--demo",
        action="store_true",
        default=argparse.SUPPRESS,
        help="run the console on a demo database with generated traffic",
    )
    console.add_argument(
        "--refresh",
        metavar="SECONDS",
        type=_seconds(allow_zero=False),
        default=argparse.SUPPRESS,
        help="console refresh interval (default 1)",
    )
    _add_broker(parser)
    run = parser.add_argument_group("headless dispatcher")
    run.add_argument(
        "--dispatch",
        action="store_true",
        default=argparse.SUPPRESS,
        help="run the dispatcher loop until SIGTERM/SIGINT, then print a summary",
    )
    _add_json(run, "with --dispatch: one JSON object per line on stdout")
    _add_dispatch(parser, loop=True)

    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    _build_dispatch_once(sub)
    _build_dead_letter(sub)
    _build_stats(sub)
    _build_init_db(sub)
    return parser


def _build_dispatch_once(sub: Any) -> None:
    p = _subparser(
        sub,
        "dispatch-once",
        "claim and deliver one batch, print what happened",
        "Claim one batch of due events, deliver it (handlers or --amqp-url) and record "
        "the outcomes. Writes no heartbeat.",
        f"{PROG} dispatch-once --installed-app outbox_tui.examples.orders --json",
        f"{PROG} dispatch-once --amqp-url amqp://guest:guest@localhost/ --batch-size 500",
    )
    _add_common(p, apps_dest="installed_apps_sub")
    _add_broker(p)
    _add_dispatch(p, loop=False)
    _add_json(p, "print one JSON object")


def _build_dead_letter(sub: Any) -> None:
    p = _subparser(
        sub,
        "dead-letter",
        "list, replay or skip dead-letter events",
        "Inspect and replay events that exhausted their attempts or failed permanently, "
        "or skip the ones that hold back their ordering key.",
        f"{PROG} dead-letter list --json",
        f"{PROG} dead-letter replay --event-id 0190... --yes --reason 'fixed the bug'",
        f"{PROG} dead-letter skip --event-id 0190... --yes --reason 'handled by hand'",
    )
    inner = p.add_subparsers(dest="dead_letter_command", metavar="ACTION", parser_class=Parser)
    inner.required = True
    lst = _subparser(
        inner,
        "list",
        "list dead letters, newest first",
        "List dead-letter events, newest first.",
        f"{PROG} dead-letter list",
        f"{PROG} dead-letter list --tenant acme --event-type orders.placed --limit 20 --json",
    )
    _add_common(lst, apps_dest="installed_apps_sub")
    _add_filters(lst)
    lst.add_argument(
        "--limit",
        metavar="N",
        type=_positive_int,
        default=100,
        help="at most N events (default 100)",
    )
    _add_json(lst, "print a JSON list")
    rep = _subparser(
        inner,
        "replay",
        "send dead letters back to pending (audited)",
        "Move dead letters back to pending with a fresh attempt budget. The dispatcher "
        "delivers them as usual; this command never runs handlers. Every replay is "
        "recorded in outbox_replay_log with operator and reason. Ids that are not dead "
        "letters are refused one by one; the others are still replayed.",
        f"{PROG} dead-letter replay --event-id ID1 --event-id ID2 --yes --reason 'API fixed'",
        f"{PROG} dead-letter replay --all --tenant acme --dry-run",
        f"{PROG} dead-letter replay --all --event-type orders.placed --yes --operator alice",
    )
    _add_common(rep, apps_dest="installed_apps_sub")
    which = rep.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--event-id",
        metavar="ID",
        action="append",
        dest="event_ids",
        help="an event to replay; repeatable",
    )
    which.add_argument(
        "--all",
        action="store_true",
        dest="replay_all",
        help="every dead letter matching --tenant/--event-type",
    )
    _add_filters(rep)
    _add_audited_action(
        rep, "replay", "only count what would be replayed (by type); change nothing"
    )
    _build_skip(inner)


def _build_skip(inner: Any) -> None:
    skip = _subparser(
        inner,
        "skip",
        "release the ordering keys dead letters hold back (audited)",
        "A dead letter with an ordering key holds back the later events of its key. "
        "Skipping it lets them go on without it: it stays in the dead letter (a replay "
        "later sends it to the back of its key). Prints how many waiting events each skip "
        "releases. Every skip is recorded in outbox_replay_log with operator and reason. "
        "Ids that are not dead letters, have no ordering key or were skipped already are "
        "refused one by one; the others are still skipped.",
        f"{PROG} dead-letter skip --event-id ID --yes --reason 'refund handled by hand'",
        f"{PROG} dead-letter skip --event-id ID1 --event-id ID2 --dry-run --json",
    )
    _add_common(skip, apps_dest="installed_apps_sub")
    skip.add_argument(
        "--event-id",
        metavar="ID",
        action="append",
        dest="event_ids",
        required=True,
        help="a dead letter whose key to release; repeatable",
    )
    _add_audited_action(
        skip, "skip", "only report what would be skipped and released; change nothing"
    )


def _add_audited_action(parser: argparse.ArgumentParser, action: str, dry_run: str) -> None:
    """The options every audited operator action has: dry run, confirmation, who and why."""
    parser.add_argument("--dry-run", action="store_true", help=dry_run)
    parser.add_argument("--yes", action="store_true", help=f"confirm the {action} (required)")
    parser.add_argument("--reason", metavar="TEXT", help="why (stored in the audit log)")
    parser.add_argument(
        "--operator", metavar="NAME", help="who (stored in the audit log; default: the OS user)"
    )
    _add_json(parser, "print one JSON object")


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", metavar="T", help="only this tenant_id")
    parser.add_argument("--event-type", metavar="E", help="only this event type")


def _build_stats(sub: Any) -> None:
    p = _subparser(
        sub,
        "stats",
        "counts, ages and dispatcher heartbeats",
        "Counts per status, the oldest pending event's age, events stuck in publishing "
        "with an expired lease, published events awaiting the retention purge, and every "
        "dispatcher's heartbeat.",
        f"{PROG} stats",
        f"{PROG} stats --retention-seconds 86400 --json",
    )
    _add_common(p, apps_dest="installed_apps_sub")
    p.add_argument(
        "--retention-seconds",
        metavar="S",
        type=_seconds(allow_zero=True),
        help="retention used to count rows awaiting purge (default: the "
        "dispatcher setting, OUTBOX_DISPATCHER__RETENTION_SECONDS)",
    )
    _add_json(p, "print one JSON object")


def _build_init_db(sub: Any) -> None:
    p = _subparser(
        sub,
        "init-db",
        "create or upgrade the outbox tables (idempotent)",
        "Create the outbox tables and indexes if they do not exist, or upgrade tables an "
        "earlier version made in place (new columns, indexes). Safe to run again.",
        f"{PROG} init-db",
        f"{PROG} init-db --database-url postgresql+asyncpg://app:secret@db/app --json",
    )
    _add_common(p, apps_dest="installed_apps_sub")
    _add_json(p, "print one JSON object")


# -- the resolved invocation -----------------------------------------------------------


@dataclass(slots=True)
class Invocation:
    """Arguments merged with the environment: what every command works from."""

    args: argparse.Namespace
    database_url: str
    installed_apps: list[str]
    amqp_url: str | None
    exchange: str
    json: bool
    log_level: str
    out: Output
    redact: Redactor = field(default_factory=Redactor)

    def opt(self, name: str, default: Any = None) -> Any:
        return getattr(self.args, name, default)

    @property
    def masked_url(self) -> str:
        return mask_url(self.database_url)


def _mode(args: argparse.Namespace) -> str:
    if args.command is None:
        return "dispatch" if getattr(args, "dispatch", False) else "console"
    return str(args.command)


def _check_combinations(args: argparse.Namespace) -> None:
    if getattr(args, "dispatch", False) and args.command is not None:
        raise UsageError(f"--dispatch cannot be combined with the {args.command} subcommand")
    mode = _mode(args)
    if mode == "console" and hasattr(args, "json"):
        raise UsageError("--json needs --dispatch or a subcommand (the console has no JSON)")
    for name, modes in MODE_OPTIONS.items():
        if hasattr(args, name) and mode not in modes:
            flag = "--" + name.replace("_", "-")
            where = " or ".join("--dispatch" if m == "dispatch" else m for m in modes)
            raise UsageError(f"{flag} does not apply here: it is an option of {where}")


def resolve(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> Invocation:
    _check_combinations(args)
    mode = _mode(args)
    level = (getattr(args, "log_level", None) or environ.get("OUTBOX_LOG_LEVEL") or "").upper()
    if level and level not in LOG_LEVELS:
        raise UsageError(f"unknown log level {level!r}: use one of {', '.join(LOG_LEVELS)}")
    redact = Redactor()
    database_url = (
        getattr(args, "database_url", None)
        or environ.get("OUTBOX_DATABASE_URL")
        or DEFAULT_DATABASE_URL
    )
    amqp_url = getattr(args, "amqp_url", None) or environ.get("OUTBOX_AMQP_URL") or None
    redact.add(database_url)
    redact.add(amqp_url)
    json_mode = bool(getattr(args, "json", False))
    out = Output(
        json_mode=json_mode,
        stdout=RedactingStream(sys.stdout, redact),  # type: ignore[arg-type]
        stderr=RedactingStream(sys.stderr, redact),  # type: ignore[arg-type]
    )
    return Invocation(
        args=args,
        database_url=database_url,
        installed_apps=[
            *getattr(args, "installed_apps", []),
            *getattr(args, "installed_apps_sub", []),
        ],
        amqp_url=amqp_url,
        exchange=getattr(args, "exchange", None) or DEFAULT_EXCHANGE,
        json=json_mode,
        log_level=level or ("INFO" if mode == "dispatch" else "WARNING"),
        out=out,
        redact=redact,
    )


# -- the database ----------------------------------------------------------------------


def _engine_kwargs(url: URL) -> dict[str, Any]:
    if url.drivername.startswith("postgresql"):
        return {"connect_args": {"timeout": PG_CONNECT_TIMEOUT_SECONDS}}
    return {}


def _require_sqlite_file(url: URL) -> None:
    """Reading commands must not create an empty SQLite file as a side effect."""
    is_file = url.drivername.startswith("sqlite") and bool(url.database)
    if is_file and not Path(str(url.database)).exists():
        raise SchemaMissingError(
            f"the database file {url.database} does not exist; create it with `outbox-tui init-db`"
        )


@contextlib.asynccontextmanager
async def open_database(database_url: str, *, need_schema: bool) -> AsyncIterator[AsyncEngine]:
    """An engine for the command; with ``need_schema`` the outbox tables must exist."""
    url = parse_database_url(database_url)
    if need_schema:
        _require_sqlite_file(url)
    engine = create_engine(url, **_engine_kwargs(url))
    try:
        async with storage_errors(url):
            if need_schema:
                await check_schema(engine)
            yield engine
    finally:
        with contextlib.suppress(Exception):
            await engine.dispose()
        await settle_sqlite_workers()


# -- init-db ---------------------------------------------------------------------------


async def cmd_init_db(inv: Invocation) -> int:
    async with open_database(inv.database_url, need_schema=False) as engine:
        try:
            await check_schema(engine)
            before = "present"
        except SchemaMissingError:
            before = "created"
        except SchemaOutdatedError:
            before = "upgraded"
        steps = await create_schema(engine)
    # Steps on a database that looked current (an index it lacked) are an upgrade too.
    schema = "upgraded" if steps else before
    record = {"database_url": inv.masked_url, "schema": schema, "upgrade_steps": list(steps)}
    if inv.json:
        inv.out.json(record)
    elif schema == "upgraded":
        inv.out.say(f"upgraded the outbox schema at {inv.masked_url} in place:")
        for step in steps:
            inv.out.say(f"  {step}")
    elif schema == "present":
        inv.out.say(f"the outbox schema is already present at {inv.masked_url} (checked)")
    else:
        inv.out.say(f"created the outbox schema at {inv.masked_url}")
    return EXIT_OK


# -- stats -----------------------------------------------------------------------------


def _retention_seconds(inv: Invocation) -> float | None:
    given = inv.opt("retention_seconds")
    if given is not None:
        return float(given)
    from engine.settings import load_settings

    try:
        return load_settings(database_url=inv.database_url).dispatcher.retention_seconds
    except ConfigurationError as exc:
        # A read-only look during an incident must not fail on a dispatcher setting.
        inv.out.note(f"purge backlog not counted: {exc}")
        return None


async def cmd_stats(inv: Invocation) -> int:
    async with open_database(inv.database_url, need_schema=True) as engine:
        retention = _retention_seconds(inv)  # after the URL itself was checked
        snapshot = await OutboxInsights(engine, retention_seconds=retention).overview()
    if inv.json:
        inv.out.json(output.stats_record(snapshot, inv.masked_url))
    else:
        for table in output.stats_tables(snapshot, inv.masked_url):
            inv.out.console.print(table)
    return EXIT_OK


# -- dead letters ----------------------------------------------------------------------


async def cmd_dead_letter_list(inv: Invocation) -> int:
    args = inv.args
    async with open_database(inv.database_url, need_schema=True) as engine:
        page = await OutboxInsights(engine).dead_letters(
            tenant_id=args.tenant, event_type=args.event_type, limit=args.limit
        )
    if inv.json:
        inv.out.json([output.dead_letter_record(e) for e in page.events])
    elif not page.events:
        inv.out.say("no dead letters" + _filter_note(args))
    else:
        inv.out.console.print(
            output.dead_letters_table(
                page.events, has_more=page.has_more, width=inv.out.console.width
            )
        )
    return EXIT_OK


def _filter_note(args: argparse.Namespace) -> str:
    parts = [f"tenant={args.tenant}" if args.tenant else "", args.event_type or ""]
    text = " ".join(p for p in parts if p)
    return f" matching {text}" if text else ""


def _check_replay_args(args: argparse.Namespace) -> None:
    if args.event_ids and (args.tenant or args.event_type):
        raise UsageError("--tenant and --event-type filter --all; with --event-id give ids only")
    if not args.dry_run and not args.yes:
        raise UsageError(
            "refusing to replay without confirmation: add --yes (or --dry-run to only count)"
        )


async def cmd_dead_letter_replay(inv: Invocation) -> int:
    args = inv.args
    _check_replay_args(args)
    report = ReplayReport(
        dry_run=args.dry_run, operator=args.operator or default_operator(), reason=args.reason
    )
    async with open_database(inv.database_url, need_schema=True) as engine:
        insights = OutboxInsights(engine)
        flt = EventFilter(
            statuses=(DEAD_LETTER,), tenant_id=args.tenant, event_type=args.event_type
        )
        if args.dry_run and args.replay_all:
            await _count_matches(insights, flt, report)
        elif args.dry_run:
            await _check_ids(insights, args.event_ids, report)
        else:
            ids = args.event_ids or await insights.matching_ids(flt)
            report.matched = len(ids)
            await _replay(engine, ids, report, inv)
    _print_replay(inv, report)
    return EXIT_FAILURE if report.refused else EXIT_OK


async def _count_matches(insights: OutboxInsights, flt: EventFilter, report: ReplayReport) -> None:
    summary = await insights.match_summary(flt)
    report.matched = summary.total
    report.by_type = dict(summary.by_type)


async def _check_ids(insights: OutboxInsights, ids: Sequence[str], report: ReplayReport) -> None:
    """A dry run for explicit ids: which would be replayed, which refused, by type."""
    for event_id in dict.fromkeys(ids):
        try:
            detail = await insights.event_detail(event_id)
        except EventNotFoundError:
            report.refused[event_id] = "no such event"
            continue
        status = detail.columns["status"]
        if status != DEAD_LETTER:
            report.refused[event_id] = f"status is {status}, not dead_letter"
            continue
        event_type = str(detail.columns["event_type"])
        report.by_type[event_type] = report.by_type.get(event_type, 0) + 1
        report.matched += 1


async def _replay(
    engine: AsyncEngine, ids: Sequence[str], report: ReplayReport, inv: Invocation
) -> None:
    """Replay in chunks (one transaction each), with a progress bar for large sets."""
    chunks = [ids[i : i + REPLAY_CHUNK] for i in range(0, len(ids), REPLAY_CHUNK)]
    with _progress(inv, total=len(ids), show=len(chunks) > 1) as advance:
        for chunk in chunks:
            async with storage_errors(engine.url):
                result = await replay_dead_letter(
                    engine, chunk, operator=report.operator, reason=report.reason, strict=False
                )
            report.replayed += result.replayed
            report.refused.update(result.refused)
            advance(len(chunk))


@contextlib.contextmanager
def _progress(inv: Invocation, *, total: int, show: bool) -> Iterator[Callable[[int], None]]:
    if not show or not inv.out.err_console.is_terminal:
        yield lambda _n: None
        return
    from rich.progress import Progress

    with Progress(console=inv.out.err_console, transient=True) as progress:
        task = progress.add_task("replaying", total=total)
        yield lambda n: progress.advance(task, n)


def _print_replay(inv: Invocation, report: ReplayReport) -> None:
    for event_id, why in report.refused.items():
        verb = "would refuse" if report.dry_run else "cannot replay"
        inv.out.error(f"{verb} {event_id}: {why}")
    if inv.json:
        inv.out.json(report.as_dict())
        return
    if not report.dry_run and not report.matched:
        inv.out.say("nothing to replay: no dead letters match")
        return
    for line in output.replay_text(report):
        inv.out.say(line)


async def cmd_dead_letter_skip(inv: Invocation) -> int:
    args = inv.args
    if not args.dry_run and not args.yes:
        raise UsageError(
            "refusing to skip without confirmation: add --yes (or --dry-run to only check)"
        )
    report = SkipReport(
        dry_run=args.dry_run, operator=args.operator or default_operator(), reason=args.reason
    )
    async with open_database(inv.database_url, need_schema=True) as engine:
        insights = OutboxInsights(engine)
        candidates = await _check_skips(insights, args.event_ids, report)
        report.matched = len(candidates)
        if candidates and not args.dry_run:
            async with storage_errors(engine.url):
                result = await skip_dead_letter(
                    engine,
                    candidates,
                    operator=report.operator,
                    reason=report.reason,
                    strict=False,
                )
            report.skipped = list(result.skipped)
            report.refused.update(result.refused)
            report.released = {i: report.released[i] for i in result.skipped}
            report.keys = {i: report.keys[i] for i in result.skipped}
    _print_skip(inv, report)
    return EXIT_FAILURE if report.refused else EXIT_OK


async def _check_skips(
    insights: OutboxInsights, ids: Sequence[str], report: SkipReport
) -> list[str]:
    """The ids that can be skipped now, each with the events waiting behind it.

    The engine checks again under a row lock when it skips; this look first tells
    the operator what each skip releases (and refuses the same ids the same way).
    """
    candidates = []
    for event_id in dict.fromkeys(ids):
        try:
            detail = await insights.event_detail(event_id)
        except EventNotFoundError:
            report.refused[event_id] = "no such event"
            continue
        columns = detail.columns
        if columns["status"] != DEAD_LETTER:
            report.refused[event_id] = f"status is {columns['status']}, not dead_letter"
        elif columns.get("ordering_key") is None:
            report.refused[event_id] = "it has no ordering key: nothing waits behind it"
        elif columns.get("skipped_at") is not None:
            report.refused[event_id] = "it was skipped already"
        else:
            report.keys[event_id] = str(columns["ordering_key"])
            report.released[event_id] = await insights.waiting_behind(event_id)
            candidates.append(event_id)
    return candidates


def _print_skip(inv: Invocation, report: SkipReport) -> None:
    for event_id, why in report.refused.items():
        verb = "would refuse" if report.dry_run else "cannot skip"
        inv.out.error(f"{verb} {event_id}: {why}")
    if inv.json:
        inv.out.json(report.as_dict())
        return
    for line in output.skip_text(report):
        inv.out.say(line)


# -- dispatching -----------------------------------------------------------------------


def _load_settings(inv: Invocation) -> Any:
    from engine.settings import load_settings

    overrides = {
        name: inv.opt(name)
        for name in (
            "batch_size",
            "max_concurrency",
            "handler_timeout_seconds",
            "lease_seconds",
            "max_attempts",
            "idle_sleep_seconds",
        )
    }
    if inv.opt("lock"):
        overrides["use_lock"] = True
    return load_settings(database_url=inv.database_url, **overrides)


def _load_apps(inv: Invocation) -> EventRegistry:
    """The registry of the installed apps, refused when the dispatcher could deliver nothing."""
    registry = load_registry(inv.installed_apps)
    problem = delivery_problem(registry, relaying=inv.amqp_url is not None, apps=inv.installed_apps)
    if problem:
        raise ConfigurationError(problem)
    return registry


@contextlib.asynccontextmanager
async def _external_publisher(inv: Invocation) -> AsyncIterator[Any]:
    if inv.amqp_url is None:
        yield None
        return
    from engine.relay.rabbitmq import RabbitMqOutboxPublisher

    async with RabbitMqOutboxPublisher(inv.amqp_url, exchange=inv.exchange) as publisher:
        yield publisher


def _instance_id(inv: Invocation) -> str:
    from engine.dispatcher import default_dispatcher_id

    return str(inv.opt("instance_id") or default_dispatcher_id())


async def cmd_dispatch_once(inv: Invocation) -> int:
    from engine.runner import build_dispatcher

    settings = _load_settings(inv)
    registry = _load_apps(inv)
    instance_id = _instance_id(inv)
    async with (
        open_database(inv.database_url, need_schema=True) as engine,
        _external_publisher(inv) as publisher,
    ):
        dispatcher = build_dispatcher(
            engine,
            registry,
            settings.dispatcher,
            dispatcher_id=instance_id,
            external_publisher=publisher,
        )
        async with storage_errors(engine.url):
            result = await dispatcher.dispatch_once()
    record = output.dispatch_once_record(result.as_dict(), instance_id)
    if inv.json:
        inv.out.json(record)
    else:
        inv.out.console.print(output.counters_table("dispatch-once", record))
    return EXIT_OK


def _start_metrics(inv: Invocation) -> Any:
    port = inv.opt("metrics_port")
    if port is None:
        return None, None
    from engine.metrics import OutboxMetrics, serve_metrics

    metrics = OutboxMetrics()
    host = inv.opt("metrics_host") or "127.0.0.1"
    try:
        server = serve_metrics(port, metrics.registry, host=host)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
        ) from None
    log.info("serving Prometheus metrics on http://%s:%d/metrics", host, server.server_port)
    return metrics, server


class _StopDuringStartup(Exception):
    """Internal: SIGTERM/SIGINT arrived before the dispatcher started."""


@contextlib.contextmanager
def _shutdown_on_signals(shutdown: asyncio.Event, starting: list[bool]) -> Iterator[None]:
    """SIGTERM/SIGINT stop the run cleanly at any moment.

    While ``starting[0]`` is true (settings, apps, database, broker, metrics), the
    start-up is cancelled: nothing is claimed yet. Afterwards they ask the loop to
    let the handlers in flight finish and stop; a second SIGINT aborts.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def request(signame: str) -> None:
        if not shutdown.is_set():
            if starting[0]:
                log.warning("%s received during start-up: stopping", signame)
                if task is not None:
                    task.cancel(msg=_STOP_DURING_STARTUP)
            else:
                log.warning("%s received: finishing the handlers in flight, then stopping", signame)
            shutdown.set()
        loop.remove_signal_handler(signal.SIGINT)  # a second Ctrl-C interrupts at once

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, request, sig.name)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


_STOP_DURING_STARTUP = "outbox-tui: stop during start-up"


def _run_details(
    inv: Invocation, instance_id: str, settings: Any, metrics_port: int | None
) -> dict[str, Any]:
    dispatcher = settings.dispatcher
    return {
        "instance_id": instance_id,
        "database_url": inv.masked_url,
        "delivery": "rabbitmq" if inv.amqp_url else "handlers",
        "amqp_url": mask_url(inv.amqp_url) if inv.amqp_url else None,
        "exchange": inv.exchange if inv.amqp_url else None,
        "installed_apps": list(inv.installed_apps),
        "max_iterations": inv.opt("max_iterations"),
        "metrics_port": metrics_port,
        "settings": dispatcher.model_dump(mode="json"),
    }


async def cmd_dispatch(inv: Invocation) -> int:
    """Signals are handled from the first moment (see ``_shutdown_on_signals``)."""
    shutdown, starting = asyncio.Event(), [True]
    instance_id = _instance_id(inv)
    reporter = RunReporter(inv.out)
    with _shutdown_on_signals(shutdown, starting):
        try:
            summary = await _dispatch(inv, instance_id, reporter, shutdown, starting)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if _STOP_DURING_STARTUP not in exc.args or task is None:
                raise
            task.uncancel()
            from engine.runner import RunSummary

            summary = RunSummary(shutdown_requested=True)
    reporter.finished(summary.as_dict(), instance_id)
    return EXIT_OK


async def _dispatch(
    inv: Invocation,
    instance_id: str,
    reporter: RunReporter,
    shutdown: asyncio.Event,
    starting: list[bool],
) -> Any:
    from engine.runner import build_dispatcher, run_dispatcher

    settings = _load_settings(inv)
    registry = _load_apps(inv)
    async with (
        open_database(inv.database_url, need_schema=True) as engine,
        _external_publisher(inv) as publisher,
    ):
        metrics, server = _start_metrics(inv)
        try:
            dispatcher = build_dispatcher(
                engine,
                registry,
                settings.dispatcher,
                dispatcher_id=instance_id,
                external_publisher=publisher,
                metrics=metrics,
            )
            port = server.server_port if server is not None else None
            reporter.started(_run_details(inv, instance_id, settings, port))
            starting[0] = False  # from here on a signal lets the loop finish its round
            try:
                return await run_dispatcher(
                    dispatcher,
                    settings=settings.dispatcher,
                    shutdown=shutdown,
                    max_iterations=inv.opt("max_iterations"),
                    instance_id=instance_id,
                    on_iteration=lambda s, r: reporter.iteration(s.as_dict(), r.as_dict()),
                )
            finally:
                reporter.stop()
        finally:
            if server is not None:
                server.shutdown()


# -- the console -----------------------------------------------------------------------


def cmd_console(inv: Invocation) -> int:
    demo = bool(inv.opt("demo"))
    if not demo:
        parse_database_url(inv.database_url)
        load_registry(inv.installed_apps)  # fail with one line before the screen switches
    from outbox_tui.console import run_console

    return run_console(
        database_url=inv.database_url,
        installed_apps=list(inv.installed_apps),
        amqp_url=inv.amqp_url,
        exchange=inv.exchange,
        refresh_seconds=float(inv.opt("refresh", 1.0)),
        demo=demo,
        stderr=inv.out.stderr,
    )


# -- entry point -----------------------------------------------------------------------

ASYNC_COMMANDS = {
    "init-db": cmd_init_db,
    "stats": cmd_stats,
    "dispatch-once": cmd_dispatch_once,
    "dispatch": cmd_dispatch,
    "dead-letter list": cmd_dead_letter_list,
    "dead-letter replay": cmd_dead_letter_replay,
    "dead-letter skip": cmd_dead_letter_skip,
}


def run(inv: Invocation) -> int:
    mode = _mode(inv.args)
    if mode == "console":
        return cmd_console(inv)
    if mode not in ("dispatch", "dispatch-once") and inv.installed_apps:
        load_registry(inv.installed_apps)  # unused here, but a wrong name is still an error
    if mode == "dead-letter":
        mode = f"dead-letter {inv.args.dead_letter_command}"
    return asyncio.run(ASYNC_COMMANDS[mode](inv))


def exit_status(exc: OutboxError) -> int:
    """2 when the invocation or configuration must change, 1 when something failed."""
    return EXIT_USAGE if isinstance(exc, ConfigurationError | InstalledAppError) else EXIT_FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    fallback = Output(json_mode=False)
    try:
        args = build_parser().parse_args(argv)
        inv = resolve(args, os.environ)
    except UsageError as exc:
        fallback.error(mask_secrets(str(exc)))
        return EXIT_USAGE
    configure_logging(inv.log_level, inv.out, inv.redact)
    try:
        return run(inv)
    except UsageError as exc:
        inv.out.error(str(exc))
        return EXIT_USAGE
    except OutboxError as exc:
        inv.out.error(str(exc) or type(exc).__name__)
        return exit_status(exc)
    except KeyboardInterrupt:
        inv.out.error("interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: one line for the operator, the traceback at DEBUG
        log.debug("unexpected error", exc_info=True)
        inv.out.error(
            f"unexpected {type(exc).__name__}: {exc} (run with --log-level DEBUG for details)"
        )
        return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
