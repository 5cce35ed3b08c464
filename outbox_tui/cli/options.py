"""Shared options and the resolved invocation every command works from.

Settings flags are generated from the settings models (``engine.settings``), so
every setting with an ``OUTBOX_...`` variable has its flag, named as the
settings' error messages name it; argparse only collects strings and the
settings validate them once.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, NoReturn, get_args

from pydantic import BaseModel

from engine.operating.error_groups import FINGERPRINT_LENGTH
from engine.settings import (
    ConsoleSettings,
    ConsumerSettings,
    DispatcherSettings,
    OutboxSettings,
    flag_of,
    load_settings,
    load_settings_for_reading,
    misspelt_variables,
)
from engine.storage.secrets import mask_url
from engine.writing.registry import EventRegistry
from outbox_tui.cli.errors import UsageError
from outbox_tui.cli.redaction import RedactingStream, Redactor
from outbox_tui.output import Output

# Settings every command takes; the others belong to the commands that use them.
COMMON_SETTINGS = ("database_url", "log_level")
BROKER_SETTINGS = ("amqp_url", "exchange", "amqp_probe_seconds", "amqp_max_probe_seconds")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


# The largest count a flag takes: what every database's integer parameters hold.
MAX_COUNT = 2**31 - 1


def positive_int(text: str) -> int:
    """An argparse type: a whole number from 1 to ``MAX_COUNT``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"expected a number from 1 to {MAX_COUNT}, got {value}")
    return value


def text_of_at_most(limit: int) -> Callable[[str], str]:
    """An argparse type: a non-empty value of at most ``limit`` characters (the column
    that stores it), so an empty or oversized one is refused before anything runs."""

    def checked(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("expected a value, got an empty one")
        if len(text) > limit:
            raise argparse.ArgumentTypeError(
                f"expected at most {limit} characters, got {len(text):,}"
            )
        return text

    return checked


def fingerprint(text: str) -> str:
    """An argparse type: an error group's fingerprint, as ``dead-letter groups`` shows it."""
    value = text.strip().lower()
    if len(value) != FINGERPRINT_LENGTH or any(c not in "0123456789abcdef" for c in value):
        raise argparse.ArgumentTypeError(
            f"expected a fingerprint of {FINGERPRINT_LENGTH} hex digits "
            f"(see dead-letter groups), got {text!r}"
        )
    return value


def examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def subparser(sub: Any, name: str, help_: str, description: str, *example: str) -> Parser:
    """A subcommand parser with the shared options every command takes."""
    parser: Parser = sub.add_parser(
        name,
        help=help_,
        description=textwrap.fill(description, 88),
        epilog=examples(*example),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(parser, apps_dest="installed_apps_sub")
    return parser


def add_common(parser: argparse.ArgumentParser, *, apps_dest: str) -> None:
    """Database, apps and log level. Two destinations for the apps, because a subcommand's
    namespace replaces the root's: ``--installed-app`` before and after it add up."""
    group = parser.add_argument_group("database and apps")
    add_settings(group, OutboxSettings, COMMON_SETTINGS[:1])
    group.add_argument(
        "--installed-app",
        metavar="MODULE",
        action="append",
        dest=apps_dest,
        default=argparse.SUPPRESS,
        help="import MODULE and call its register(registry); repeatable",
    )
    group.add_argument(
        "--app-dir",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="look for --installed-app modules in DIR first (default: the working directory)",
    )
    add_settings(group, OutboxSettings, COMMON_SETTINGS[1:])


def add_json(parser: argparse._ActionsContainer, help_: str) -> None:
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=help_)


def add_broker(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("broker (instead of local handlers)")
    add_settings(group, OutboxSettings, BROKER_SETTINGS)


def add_bindings(group: argparse._ActionsContainer) -> None:
    """``--bind EXCHANGE:ROUTING_KEY``, repeatable: the inbox's bindings (``bindings``)."""
    group.add_argument(
        "--bind",
        metavar="EXCHANGE:ROUTING_KEY",
        action="append",
        dest="bindings",
        default=argparse.SUPPRESS,
        help="bind the queue to EXCHANGE by ROUTING_KEY (# and * as in topic exchanges); "
        "repeatable (env OUTBOX_CONSUMER__BINDINGS, a JSON list)",
    )


def add_settings(
    group: argparse._ActionsContainer, model: type[BaseModel], names: tuple[str, ...] | None = None
) -> None:
    """One flag per settings field: ``--batch-size`` sets ``batch_size`` (env stays below)."""
    for name in names or tuple(model.model_fields):
        info = model.model_fields[name]
        flag = flag_of((name,)) if model is OutboxSettings else _nested_flag(model, name)
        env = "OUTBOX_" + ("" if model is OutboxSettings else _section(model) + "__") + name.upper()
        help_ = f"{info.description or name} (env {env})"
        if info.annotation is bool:
            group.add_argument(
                flag, dest=name, action="store_true", default=argparse.SUPPRESS, help=help_
            )
            continue
        group.add_argument(
            flag,
            dest=name,
            metavar=_metavar(name, info.annotation),
            default=argparse.SUPPRESS,
            help=help_,
        )


_SECTION_OF: dict[type[BaseModel], str] = {
    DispatcherSettings: "DISPATCHER",
    ConsoleSettings: "CONSOLE",
    ConsumerSettings: "CONSUMER",
}


def _section(model: type[BaseModel]) -> str:
    return _SECTION_OF[model]


def _nested_flag(model: type[BaseModel], name: str) -> str:
    return flag_of((_section(model).lower(), name))


def _metavar(name: str, annotation: Any) -> str:
    if name.endswith("_url"):
        return "URL"
    if name in ("exchange", "queue"):
        return "NAME"
    if name == "default_tenant":
        return "TENANT"
    args = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
    if args[0] is int:
        return "N"
    if args[0] is float:
        return "S"
    if get_args(args[0]):  # a Literal
        return "{" + ",".join(str(a) for a in get_args(args[0])) + "}"
    return "VALUE"


SETTING_NAMES = (
    set(OutboxSettings.model_fields)
    | set(DispatcherSettings.model_fields)
    | set(ConsoleSettings.model_fields)
    | set(ConsumerSettings.model_fields)
)


@dataclass(slots=True)
class Invocation:
    """Arguments merged with the environment: what every command works from."""

    args: argparse.Namespace
    command: str
    settings: OutboxSettings
    installed_apps: list[str]
    app_dir: str | None
    json: bool
    out: Output
    redact: Redactor = field(default_factory=Redactor)
    # A bad dispatcher setting a read-only command went on without (None: all fine; a bad
    # console setting is not kept: no read-only command uses it).
    settings_problem: str | None = None
    # The installed apps' registry, loaded once before the command runs (None: no
    # ``--installed-app``, or a command that loads its own: console and dispatch).
    registry: EventRegistry | None = None

    def opt(self, name: str, default: Any = None) -> Any:
        return getattr(self.args, name, default)

    @property
    def database_url(self) -> str:
        return self.settings.database_url

    @property
    def masked_url(self) -> str:
        return mask_url(self.database_url)

    @property
    def log_level(self) -> str:
        running = self.command in ("dispatch", "consume")
        return self.settings.log_level or ("INFO" if running else "WARNING")


def redacting_output(redact: Redactor, *, json_mode: bool) -> Output:
    """The command's output on stdout and stderr, with ``redact``'s secrets masked."""
    # RedactingStream has what Output and Rich's Console call on a stream (write, flush,
    # isatty, fileno, encoding), not all of typeshed's TextIO, which Rich's ``file`` takes.
    return Output(
        json_mode=json_mode,
        stdout=RedactingStream(sys.stdout, redact),  # type: ignore[arg-type]
        stderr=RedactingStream(sys.stderr, redact),  # type: ignore[arg-type]
    )


def resolve(
    args: argparse.Namespace,
    *,
    command: str,
    strict_settings: bool,
    flags: Collection[str] | None = None,
    strict_sections: Collection[str] = (),
) -> Invocation:
    """Settings from flags over ``OUTBOX_...`` variables, and the redacting output.

    ``flags`` are the command's own options: a settings error names the flag only when
    the command has it (otherwise just the ``OUTBOX_...`` variable). ``strict_sections``:
    the sections a read-only command reads, whose errors stop it.
    """
    overrides = {name: getattr(args, name) for name in SETTING_NAMES if hasattr(args, name)}
    problem = None
    if strict_settings:
        settings = load_settings(flags=flags, **overrides)
    else:
        settings, problem = load_settings_for_reading(
            flags=flags, strict_sections=strict_sections, **overrides
        )
    redact = Redactor()
    redact.add(settings.database_url)
    redact.add(settings.amqp_url)
    json_mode = bool(getattr(args, "json", False))
    out = redacting_output(redact, json_mode=json_mode)
    for line in misspelt_variables():
        out.note(line)
    return Invocation(
        args=args,
        command=command,
        settings=settings,
        installed_apps=[
            *getattr(args, "installed_apps", []),
            *getattr(args, "installed_apps_sub", []),
        ],
        app_dir=getattr(args, "app_dir", None),
        json=json_mode,
        out=out,
        redact=redact,
        settings_problem=problem,
    )
