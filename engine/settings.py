"""One validated settings object, from arguments and ``OUTBOX_...`` environment variables.

Nested settings use ``__``: ``OUTBOX_DISPATCHER__BATCH_SIZE=50`` sets
``settings.dispatcher.batch_size``. Explicit arguments to ``load_settings``
(the CLI's flags, the console's form) win over the environment; ``None`` means
"not given". Every invalid value becomes one ``ConfigurationError`` line naming
both the variable and the flag, e.g.
``OUTBOX_DISPATCHER__BATCH_SIZE / --batch-size must be an integer between 1 and
1000, got 0`` (only the variable when the command has no such flag).

Why one module: the models, the loading and the error wording
are one contract read from the same field metadata. Each field's bounds,
description and flag make the CLI's options (``outbox_tui.cli.options``), the
``--help`` text and the one-line error; split, a field added in one module would
silently lack its flag or its wording in another.

The attempt budget: each outbox row carries its own ``max_attempts``, fixed
when it is published (explicitly, or the column default 10).
``DispatcherSettings.max_attempts`` is unset by default, and then the
dispatcher honours each row's value. Set it (``--max-attempts``,
``OUTBOX_DISPATCHER__MAX_ATTEMPTS``) to give every row this dispatcher handles
that budget instead, for instance to ride out a long broker outage; give all
dispatchers of one outbox the same value. See docs/dispatcher.md, "Attempts, backoff and
dead letters".
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Mapping
from typing import Annotated, Any, Literal, get_args, get_origin

import annotated_types
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from engine.dispatch import CONCURRENCY_PER_BATCH, MAX_BATCH_SIZE
from engine.dispatch.backoff import DEFAULT_BACKOFF
from engine.errors import ConfigurationError, DatabaseUrlError
from engine.operating.replay import DEFAULT_DEDUP_WINDOW
from engine.storage.database import DEFAULT_DATABASE_URL, parse_database_url
from engine.storage.secrets import mask_secrets

ENV_PREFIX = "OUTBOX_"
_HOUR = 3600.0
_TEN_YEARS = 10 * 365 * 24 * _HOUR
_NONE_WORDS = {"", "none", "null", "off", "keep", "never"}

DEFAULT_EXCHANGE = "outbox.events"
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class DispatcherSettings(BaseModel):
    """How a dispatcher runs. Every field has a default; docs/settings.md lists them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_size: Annotated[
        int, Field(ge=1, le=MAX_BATCH_SIZE, description="events claimed per round (default 100)")
    ] = 100
    max_concurrency: Annotated[
        int | None,
        Field(
            ge=1,
            le=10_000,
            description=f"events delivered at once (default {CONCURRENCY_PER_BATCH} x the "
            "batch size); handlers that await I/O overlap",
        ),
    ] = None
    handler_timeout_seconds: Annotated[
        float | None,
        Field(
            gt=0,
            le=_HOUR,
            description="how long one handler may run before it counts as a transient "
            "failure (default 10, or half the lease when that is shorter; below "
            "--lease-seconds)",
        ),
    ] = None
    idle_sleep_seconds: Annotated[
        float, Field(gt=0, le=_HOUR, description="sleep between rounds that found nothing")
    ] = 1.0
    lease_seconds: Annotated[
        float,
        Field(gt=0, le=_HOUR, description="how long a claim is held before others may take it"),
    ] = 30.0
    max_attempts: Annotated[
        int | None,
        Field(
            ge=1,
            le=1000,
            description="attempt budget for every row this dispatcher handles (default: each "
            "row's own max_attempts, 10 unless published otherwise)",
        ),
    ] = None
    backoff_kind: Annotated[
        Literal["exponential", "fixed"], Field(description="how retry waits grow")
    ] = DEFAULT_BACKOFF.kind
    backoff_base_seconds: Annotated[
        float, Field(ge=0, le=24 * _HOUR, description="the first retry wait")
    ] = DEFAULT_BACKOFF.base_seconds
    backoff_max_seconds: Annotated[
        float, Field(ge=0, le=24 * _HOUR, description="the longest retry wait")
    ] = DEFAULT_BACKOFF.max_seconds
    backoff_jitter: Annotated[
        float, Field(ge=0, le=1, description="random spread of retry waits (fraction)")
    ] = DEFAULT_BACKOFF.jitter
    retention_seconds: Annotated[
        float | None,
        Field(
            ge=0,
            le=_TEN_YEARS,
            description="delete published rows after this long (none keeps them; 0 at once)",
        ),
    ] = 7 * 24 * _HOUR
    retention_batch_size: Annotated[
        int, Field(ge=1, le=100_000, description="rows deleted per retention statement")
    ] = 500
    inbound_retention_seconds: Annotated[
        float | None,
        Field(
            gt=0,
            le=_TEN_YEARS,
            description="delete published inbound rows (engine.inbox) after this long: the "
            "inbox's dedup window (default: dedup_window_seconds, 7 days)",
            json_schema_extra={
                "requirement": "a number of seconds greater than 0 and at most 315360000"
            },
        ),
    ] = None
    heartbeat_retention_seconds: Annotated[
        float | None,
        Field(
            gt=0,
            le=_TEN_YEARS,
            description="delete heartbeat rows of processes not seen for this long (none keeps)",
        ),
    ] = 7 * 24 * _HOUR
    use_lock: Annotated[
        bool,
        Field(
            description="take the cross-process dispatch lock around each claim",
            json_schema_extra={"flag": "--lock"},
        ),
    ] = False
    wakeup: Annotated[
        Literal["auto", "off"],
        Field(description="wake idle dispatchers by LISTEN/NOTIFY on PostgreSQL"),
    ] = "auto"
    wakeup_channel: Annotated[
        str,
        Field(pattern=r"^[a-z_][a-z0-9_]{0,62}$", description="the LISTEN/NOTIFY channel"),
    ] = "outbox_events"
    notify_interval_ms: Annotated[
        float,
        Field(
            ge=0,
            le=60_000,
            description="producers notify at most once per process per this many ms",
        ),
    ] = 100.0
    heartbeat_seconds: Annotated[
        float, Field(gt=0, le=_HOUR, description="longest gap between heartbeats while idle")
    ] = 5.0
    heartbeat_min_interval_seconds: Annotated[
        float,
        Field(
            ge=0,
            le=_HOUR,
            description="shortest gap between heartbeats while busy (0: every round)",
        ),
    ] = 1.0
    housekeeping_seconds: Annotated[
        float,
        Field(gt=0, le=_HOUR, description="how often metric gauges and retention run"),
    ] = 5.0
    storage_retry_initial_seconds: Annotated[
        float, Field(gt=0, le=_HOUR, description="first wait after a storage error")
    ] = 0.5
    storage_retry_max_seconds: Annotated[
        float, Field(gt=0, le=_HOUR, description="longest wait after storage errors")
    ] = 30.0

    @field_validator(
        "retention_seconds", "max_attempts", "heartbeat_retention_seconds", mode="before"
    )
    @classmethod
    def _none_words(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in _NONE_WORDS:
            return None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DispatcherSettings:
        if self.backoff_max_seconds < self.backoff_base_seconds:
            raise _conflict(
                "backoff_max_seconds",
                self.backoff_max_seconds,
                f"at least backoff_base_seconds ({self.backoff_base_seconds:g})",
            )
        if (
            self.handler_timeout_seconds is not None
            and self.handler_timeout_seconds >= self.lease_seconds
        ):
            raise _conflict(
                "handler_timeout_seconds",
                self.handler_timeout_seconds,
                f"below lease_seconds ({self.lease_seconds:g})",
            )
        if self.storage_retry_max_seconds < self.storage_retry_initial_seconds:
            raise _conflict(
                "storage_retry_max_seconds",
                self.storage_retry_max_seconds,
                f"at least storage_retry_initial_seconds ({self.storage_retry_initial_seconds:g})",
            )
        return self


class ConsoleSettings(BaseModel):
    """How the console polls."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    refresh_seconds: Annotated[
        float,
        Field(
            gt=0,
            le=_HOUR,
            description="console refresh interval (default 1)",
            json_schema_extra={"flag": "--refresh"},
        ),
    ] = 1.0
    page_size: Annotated[
        int, Field(ge=1, le=1000, description="events per console page (default 100)")
    ] = 100
    trace_url_template: Annotated[
        str | None,
        Field(
            pattern=r"^https?://[^\s]*\{trace_id\}[^\s]*$",
            description="the link an event's detail shows for its trace, e.g. "
            "https://tempo.example/trace/{trace_id}",
            json_schema_extra={"requirement": "an http(s) URL containing {trace_id}"},
        ),
    ] = None


# AMQP names a queue in at most 255 bytes; a binding is EXCHANGE:ROUTING_KEY.
_QUEUE_PATTERN = r"^[^\x00-\x1f]{1,255}$"
_BINDING_PATTERN = r"^[^:\x00-\x1f]{1,255}:[^\x00-\x1f]{0,255}$"


class ConsumerSettings(BaseModel):
    """How an inbox consumer (``outbox-tui consume``, engine.inbox) takes messages."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    queue: Annotated[
        str | None,
        Field(
            pattern=_QUEUE_PATTERN,
            description="the queue to consume (declared durable unless --passive)",
            json_schema_extra={"requirement": "a queue name of 1 to 255 characters"},
        ),
    ] = None
    bindings: Annotated[
        tuple[Annotated[str, Field(pattern=_BINDING_PATTERN)], ...],
        NoDecode,  # the variable is read by _bindings: one binding, a list, or JSON
        Field(
            description="bind the queue to EXCHANGE by ROUTING_KEY (in the variable: "
            "bindings separated by spaces, or a JSON list)",
            json_schema_extra={
                "flag": "--bind",
                "requirement": "EXCHANGE:ROUTING_KEY (an exchange name, a colon, a routing key)",
            },
        ),
    ] = ()
    prefetch: Annotated[
        int,
        Field(
            ge=1,
            le=65_535,
            description="unacked messages the broker sends ahead (default 1000)",
        ),
    ] = 1000
    max_batch: Annotated[
        int,
        Field(
            ge=1,
            le=1000,
            description="messages written in one transaction, at most (default 500)",
        ),
    ] = 500
    max_message_bytes: Annotated[
        int,
        Field(
            ge=1,
            le=128 * 1024 * 1024,
            description="a larger message is stored dead-lettered, not decoded (default 1 MiB)",
        ),
    ] = 1024 * 1024
    passive: Annotated[
        bool,
        Field(description="only check that the queue exists: declare and bind nothing"),
    ] = False
    single_active_consumer: Annotated[
        bool,
        Field(
            description="declare the queue with x-single-active-consumer: one consumer "
            "at a time takes messages, the others stand by (per-key order with several)"
        ),
    ] = False
    default_tenant: Annotated[
        str,
        Field(
            max_length=128,
            description="tenant of events that name none (default '')",
            json_schema_extra={"requirement": "a tenant id of at most 128 characters"},
        ),
    ] = ""

    @field_validator("bindings", mode="before")
    @classmethod
    def _bindings(cls, value: Any) -> Any:
        """``ex:a.# ex:b.*`` or ``["ex:a.#", "ex:b.*"]`` from the variable."""
        if not isinstance(value, str):
            return value
        if value.lstrip().startswith("["):
            try:
                return json.loads(value)
            except ValueError:
                return (value,)  # refused by the pattern, with the value shown
        return tuple(value.split())


class OutboxSettings(BaseSettings):
    """Everything a process of this project reads from its environment."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="forbid",
        frozen=True,
    )

    database_url: Annotated[
        str,
        Field(description=f"outbox database (default {DEFAULT_DATABASE_URL}); never printed"),
    ] = DEFAULT_DATABASE_URL
    amqp_url: Annotated[
        str | None,
        Field(
            description="RabbitMQ: dispatch relays events to it instead of running handlers, "
            "consume takes events from it"
        ),
    ] = None
    exchange: Annotated[
        str, Field(min_length=1, description=f"RabbitMQ exchange (default {DEFAULT_EXCHANGE})")
    ] = DEFAULT_EXCHANGE
    # The relay's circuit breaker (engine.relay.circuit).
    amqp_probe_seconds: Annotated[
        float,
        Field(
            ge=0,
            le=_HOUR,
            description="first wait between probes of a broker found away (default 1)",
        ),
    ] = 1.0
    amqp_max_probe_seconds: Annotated[
        float,
        Field(
            ge=0,
            le=_HOUR,
            description="longest wait between probes; each failed probe doubles it (default 30)",
        ),
    ] = 30.0
    # None: WARNING, or INFO for the dispatcher loop.
    log_level: Annotated[
        LogLevel | None,
        Field(
            description="DEBUG, INFO, WARNING, ERROR, CRITICAL (default WARNING, INFO for "
            "dispatch and consume)"
        ),
    ] = None
    console: ConsoleSettings = Field(default_factory=lambda: ConsoleSettings())
    dispatcher: DispatcherSettings = Field(default_factory=lambda: DispatcherSettings())
    consumer: ConsumerSettings = Field(default_factory=lambda: ConsumerSettings())
    # How long consumers remember event ids: replays of older events warn (engine.operating.replay).
    dedup_window_seconds: Annotated[
        float,
        Field(
            gt=0,
            le=_TEN_YEARS,
            description="consumers' dedup window: replays of older events warn (default 7 days)",
        ),
    ] = DEFAULT_DEDUP_WINDOW.total_seconds()

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.strip().upper() or None if isinstance(value, str) else value

    @field_validator("amqp_url", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value == "" else value

    @model_validator(mode="after")
    def _probes(self) -> OutboxSettings:
        if self.amqp_max_probe_seconds < self.amqp_probe_seconds:
            raise _conflict(
                "amqp_max_probe_seconds",
                self.amqp_max_probe_seconds,
                f"at least amqp_probe_seconds ({self.amqp_probe_seconds:g})",
            )
        return self

    @model_validator(mode="after")
    def _inbound_window(self) -> OutboxSettings:
        """Inbound rows are kept as long as the dedup window unless told otherwise: a
        duplicate is refused only while the row of its first copy is there."""
        if self.dispatcher.inbound_retention_seconds is None:
            window = {"inbound_retention_seconds": self.dedup_window_seconds}
            object.__setattr__(self, "dispatcher", self.dispatcher.model_copy(update=window))
        return self


_SECTIONS: dict[str, type[BaseModel]] = {
    "dispatcher": DispatcherSettings,
    "console": ConsoleSettings,
    "consumer": ConsumerSettings,
}


def load_settings(*, flags: Collection[str] | None = None, **overrides: Any) -> OutboxSettings:
    """Settings from the environment, with explicit (non-None) ``overrides`` on top.

    Overrides are top-level names (``database_url``), fields of a section by
    their own name (``batch_size=7``, ``refresh_seconds=2``), or a whole section
    (``dispatcher={...}``). Raises ``ConfigurationError`` with one line naming
    the variable and the flag; an unknown keyword is a programming error
    (``TypeError``). ``flags`` are the flags the calling command accepts: an
    error about a setting whose flag is not among them names the variable only
    (None: every setting's flag is named).
    """
    return _validated(_init_values(overrides), flags)


def _validated(init: dict[str, Any], flags: Collection[str] | None) -> OutboxSettings:
    try:
        settings = _from_environment(init)
    except ValidationError as exc:
        raise ConfigurationError(describe_validation_error(exc, flags=flags)) from None
    return _check_url(settings, flags)


def _from_environment(init: dict[str, Any]) -> OutboxSettings:
    """``OutboxSettings(**init)``, with a section variable that is not JSON (say
    ``OUTBOX_DISPATCHER='{not json'``) reported in one line instead of pydantic-settings'
    ``SettingsError``, which names neither the variable nor what it must be."""
    try:
        return OutboxSettings(**init)
    except SettingsError as exc:
        field = re.search(r'field "(\w+)"', str(exc))
        name = env_of((field.group(1),)) if field else ENV_PREFIX + "*"
        # Read as pydantic-settings reads it: the name in any case.
        value = next((v for k, v in os.environ.items() if k.upper() == name), "")
        shown = mask_secrets(repr(value))
        raise ConfigurationError(f"{name} must be a JSON object, got {shown}") from None


def _check_url(settings: OutboxSettings, flags: Collection[str] | None) -> OutboxSettings:
    try:
        parse_database_url(settings.database_url)
    except DatabaseUrlError as exc:
        raise DatabaseUrlError(f"{setting_names(('database_url',), flags)}: {exc}") from None
    return settings


def load_settings_for_reading(
    *,
    flags: Collection[str] | None = None,
    strict_sections: Collection[str] = (),
    **overrides: Any,
) -> tuple[OutboxSettings, str | None]:
    """Like ``load_settings``, but a bad dispatcher or console section is not raised.

    A read-only look during an incident (``stats``, the dead-letter commands)
    must not fail on a setting only the dispatcher or the console uses: that
    section falls back to its defaults (plus the values given on purpose, which
    must still be right) and validation goes on. The dispatcher's problem comes
    back as the second item (``stats`` says what it could not count); a console
    problem does not, because no read-only command uses the console's settings.
    ``strict_sections`` raise as ``load_settings`` raises: the sections the command
    reads (``catalog`` describes the consumer's queue and bindings).
    """
    init = _init_values(overrides)
    problem: str | None = None
    fallen: set[str] = set()
    while True:
        try:
            settings = _from_environment(init)
        except ValidationError as exc:
            loc = exc.errors()[0]["loc"]
            section = str(loc[0]) if loc else ""
            message = describe_validation_error(exc, flags=flags)
            if section not in _SECTIONS or section in fallen or section in strict_sections:
                raise ConfigurationError(message) from None
            fallen.add(section)
            if section == "dispatcher":
                problem = message
            # A model instance (not a dict) replaces the environment's section instead of
            # merging with it.
            init[section] = _explicit_section(section, init.get(section, {}), flags)
            continue
        return _check_url(settings, flags), problem


def _explicit_section(section: str, given: Any, flags: Collection[str] | None) -> BaseModel:
    """The section from the values given on purpose only (flags, a section override)."""
    values = given if isinstance(given, dict) else {}
    try:
        return _SECTIONS[section](**values)
    except ValidationError as exc:
        message = describe_validation_error(exc, within=(section,), flags=flags)
        raise ConfigurationError(message) from None


def _init_values(overrides: dict[str, Any]) -> dict[str, Any]:
    init: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in _SECTIONS:
            given = value.model_dump(exclude_unset=True) if isinstance(value, BaseModel) else value
            sections.setdefault(key, {}).update(
                {k: v for k, v in dict(given).items() if v is not None}
            )
        elif key in OutboxSettings.model_fields:
            init[key] = value
        else:
            section = next((n for n, m in _SECTIONS.items() if key in m.model_fields), None)
            if section is None:
                raise TypeError(f"load_settings() got an unexpected keyword argument {key!r}")
            sections.setdefault(section, {})[key] = value
    for name, values in sections.items():
        if values:
            init[name] = values
    return init


def flag_of(loc: tuple[str, ...]) -> str:
    """The command-line flag of a setting: ``--lock`` for ``("dispatcher", "use_lock")``."""
    field = _field_info(loc)
    extra = field.json_schema_extra if field is not None else None
    if isinstance(extra, dict) and isinstance(extra.get("flag"), str):
        return str(extra["flag"])
    return "--" + loc[-1].replace("_", "-")


def misspelt_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """A line for each ``OUTBOX_...`` variable that is no setting but nearly spells one.

    pydantic-settings ignores such a variable, so its setting keeps the default: a
    misspelt ``OUTBOX_DATABSE_URL`` would quietly point a command at the default SQLite
    file. Variables far from every setting (a deployment's own ``OUTBOX_...``) pass.
    """
    known = _variable_names()
    lines = []
    for name in sorted(os.environ if environ is None else environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known:
            continue
        suffix = upper.removeprefix(ENV_PREFIX)
        edits, nearest = min((_edits(suffix, k.removeprefix(ENV_PREFIX)), k) for k in known)
        if edits <= (2 if len(suffix) > 6 else 1):
            lines.append(f"{name} is not a setting and is ignored: did you mean {nearest}?")
    return lines


def _variable_names() -> set[str]:
    names = {env_of((name,)) for name in OutboxSettings.model_fields}
    for section, model in _SECTIONS.items():
        names.update(env_of((section, name)) for name in model.model_fields)
    return names


def _edits(a: str, b: str) -> int:
    """Edit distance with adjacent transpositions (``DATABSE`` is one edit from ``DATABASE``)."""
    if abs(len(a) - len(b)) > 2:
        return 3
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            cost = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, previous2[j - 2] + 1)
            current.append(cost)
        previous2, previous = previous, current
    return previous[-1]


def env_of(loc: tuple[str, ...]) -> str:
    """The environment variable of a setting: ``OUTBOX_DISPATCHER__USE_LOCK``."""
    return ENV_PREFIX + "__".join(part.upper() for part in loc)


def setting_names(loc: tuple[str, ...], flags: Collection[str] | None = None) -> str:
    """``OUTBOX_DISPATCHER__BATCH_SIZE / --batch-size`` for ``("dispatcher", "batch_size")``.

    Only the variable when ``flags`` (the calling command's) does not have the flag.
    """
    flag = flag_of(loc)
    if flags is not None and flag not in flags:
        return env_of(loc)
    return f"{env_of(loc)} / {flag}"


def describe_validation_error(
    exc: ValidationError,
    *,
    within: tuple[str, ...] = (),
    flags: Collection[str] | None = None,
) -> str:
    """The first problem of a settings ``ValidationError`` (of a section ``within``) as one line.

    ``flags``: as for ``load_settings``.
    """
    error = exc.errors()[0]
    # An item of a list setting (a binding) is named by its setting.
    loc = within + tuple(str(part) for part in error["loc"] if not isinstance(part, int))
    ctx = error.get("ctx") or {}
    if "setting" in ctx:  # a cross-field rule names the field it blames
        loc = (*loc, str(ctx["setting"]))
    if error["type"] == "extra_forbidden":
        return f"{env_of(loc)} is not a known setting"
    field = _field_info(loc)
    requirement = ctx.get("requirement") or (
        _requirement(field) if field is not None else error["msg"]
    )
    value = ctx.get("value", error.get("input"))
    shown = repr(value) if value == "" or not isinstance(value, str | int | float) else value
    # A URL pasted into the wrong setting must not print its password.
    return mask_secrets(f"{setting_names(loc, flags)} must be {requirement}, got {shown}")


def _conflict(setting: str, value: float, requirement: str) -> PydanticCustomError:
    return PydanticCustomError(
        "setting_conflict",
        "{setting} must be {requirement}",
        {"setting": setting, "value": value, "requirement": requirement},
    )


def _field_info(loc: tuple[str, ...]) -> FieldInfo | None:
    model: type[BaseModel] = OutboxSettings
    info: FieldInfo | None = None
    for part in loc:
        info = model.model_fields.get(part)
        if info is None:
            return None
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            model = info.annotation
    return info


def _requirement(field: FieldInfo) -> str:
    """What a valid value looks like, from the field's type and bounds (or its own words)."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("requirement"), str):
        return str(extra["requirement"])
    annotation = field.annotation
    optional = False
    args = get_args(annotation)
    if args and type(None) in args:
        optional = True
        annotation = next(a for a in args if a is not type(None))
    if get_origin(annotation) is Literal:
        text = "one of " + ", ".join(str(a) for a in get_args(annotation))
    elif annotation is bool:
        text = "true or false"
    elif annotation is int or annotation is float:
        noun = "an integer" if annotation is int else "a number"
        text = noun + _bounds(field)
    elif annotation is str:
        pattern = next((m.pattern for m in field.metadata if hasattr(m, "pattern")), None)
        non_empty = any(getattr(m, "min_length", 0) for m in field.metadata)
        if pattern:
            text = "a name of lower-case letters, digits and _"
        else:
            text = "a non-empty string" if non_empty else "a string"
    else:
        text = "a valid value"
    return text + (", or none" if optional else "")


def _bounds(field: FieldInfo) -> str:
    low: Any = None
    high: Any = None
    low_open = high_open = False
    for item in field.metadata:
        if isinstance(item, annotated_types.Ge):
            low = item.ge
        elif isinstance(item, annotated_types.Gt):
            low, low_open = item.gt, True
        elif isinstance(item, annotated_types.Le):
            high = item.le
        elif isinstance(item, annotated_types.Lt):
            high, high_open = item.lt, True
    if low is not None and high is not None and not low_open and not high_open:
        return f" between {_num(low)} and {_num(high)}"
    parts = []
    if low is not None:
        parts.append(f"{'greater than' if low_open else 'at least'} {_num(low)}")
    if high is not None:
        parts.append(f"{'below' if high_open else 'at most'} {_num(high)}")
    return (" " + " and ".join(parts)) if parts else ""


def _num(value: Any) -> str:
    number = float(value)
    return str(int(number)) if number.is_integer() else f"{number:g}"
