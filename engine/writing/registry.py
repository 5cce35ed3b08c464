"""Which events exist, what their payloads look like, and who handles them.

An event type and version must be registered before it can be published. A
schema spec, when given, is checked at publish time and again by the
dispatcher before handlers run, so a row written before a schema change (or by
another language) cannot reach a handler malformed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.errors import (
    EventRegistrationError,
    EventValidationError,
    TenantMismatchError,
    UnknownEventTypeError,
)
from engine.handlers.transactional import TransactionalHandler, check_signature
from engine.storage.database import parse_database_url
from engine.writing.envelope import EventEnvelope
from engine.writing.models import ModelSchema, is_model_class, takes_model, with_model
from engine.writing.schema_spec import CONTEXT_FIELDS, OPTIONAL_CONTEXT_FIELDS, EventSchemaSpec

Handler = Callable[[EventEnvelope], Awaitable[Any]]
# A handler that also takes its event's parsed pydantic model (engine.writing.models).
ModelHandler = Callable[..., Awaitable[Any]]
AnyHandler = TypeVar("AnyHandler", bound=Callable[..., Awaitable[Any]])
ReadyHook = Callable[[], Awaitable[None]]
SubjectSelector = Callable[[Any], str]
#: "aggregate" orders by ``aggregate_type:aggregate_id``; a callable picks the key from the payload.
OrderingKeySource = Literal["aggregate"] | Callable[[Mapping[str, Any]], str]
DeadLetterPolicy = Literal["block", "skip"]
MAX_ORDERING_KEY_LENGTH = 400

_CONTEXT_SPEC = EventSchemaSpec(CONTEXT_FIELDS, OPTIONAL_CONTEXT_FIELDS)


@dataclass(frozen=True, slots=True)
class RegisteredHandler:
    """A handler under its stable key; a ``transactional`` one takes ``(envelope, session)``
    (``engine.handlers.transactional``)."""

    event_type: str
    key: str
    handler: Handler | TransactionalHandler
    transactional: bool = False


@dataclass(frozen=True, slots=True)
class Ordering:
    """How the events of one type are ordered: by which key, and what a dead letter does.

    ``on_dead_letter="block"`` (the default) keeps the later events of the key
    waiting until the dead letter is replayed or skipped; ``"skip"`` releases
    the key at once.
    """

    key: OrderingKeySource = "aggregate"
    on_dead_letter: DeadLetterPolicy = "block"

    def key_for(self, aggregate_type: str, aggregate_id: str, payload: Mapping[str, Any]) -> str:
        if self.key == "aggregate":
            return f"{aggregate_type}:{aggregate_id}"
        return self.key(payload)


def check_ordering_key(event_type: str, key: Any) -> str:
    """``key`` if it is a usable ordering key, else an ``EventValidationError``."""
    if not isinstance(key, str) or not key:
        raise EventValidationError(f"{event_type}: ordering_key must be a non-empty string")
    if len(key) > MAX_ORDERING_KEY_LENGTH:
        raise EventValidationError(
            f"{event_type}: ordering_key is longer than {MAX_ORDERING_KEY_LENGTH} characters"
        )
    return key


@dataclass(frozen=True, slots=True)
class DomainEventMapping:
    """How one domain event class becomes an outbox row."""

    event_class: type
    event_type: str
    event_version: int
    aggregate_type: str
    subject: SubjectSelector | None = None


# What a registered version's payload is checked against: field types, or a pydantic model.
PayloadSchema = EventSchemaSpec | ModelSchema


class EventRegistry:
    """Event types with versions and schemas, their handlers, and domain event mappings."""

    def __init__(self) -> None:
        self._schemas: dict[tuple[str, int], PayloadSchema | None] = {}
        self._handlers: dict[str, tuple[RegisteredHandler, ...]] = {}
        self._domain_events: dict[type, DomainEventMapping] = {}
        self._ordering: dict[str, Ordering] = {}
        self._ready_hooks: list[ReadyHook] = []
        self.expected_database: URL | None = None

    # -- event types -----------------------------------------------------
    def register_event(
        self,
        event_type: str,
        version: int = 1,
        schema: EventSchemaSpec | type[Any] | None = None,
    ) -> None:
        """Declare that ``event_type`` at ``version`` may be published.

        ``schema``: an ``EventSchemaSpec``, or a pydantic model class (engine.writing.models),
        checked at publish and again before the handlers.
        """
        if not event_type or not isinstance(event_type, str):
            raise EventRegistrationError("event_type must be a non-empty string")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise EventRegistrationError(f"event_version of {event_type!r} must be an int >= 1")
        key = (event_type, version)
        if key in self._schemas:
            raise EventRegistrationError(f"event {event_type!r} v{version} is registered twice")
        checked: PayloadSchema | None
        if schema is None or isinstance(schema, EventSchemaSpec):
            checked = schema
        elif is_model_class(schema):
            checked = ModelSchema(schema)
        else:
            raise EventRegistrationError(
                f"the schema of {event_type!r} v{version} must be an EventSchemaSpec or a "
                f"pydantic model class, got {schema!r}"
            )
        self._schemas[key] = checked

    def is_registered(self, event_type: str, version: int) -> bool:
        return (event_type, version) in self._schemas

    def event_types(self) -> list[tuple[str, int]]:
        """Registered (event_type, version) pairs, sorted."""
        return sorted(self._schemas)

    def versions_of(self, event_type: str) -> list[int]:
        """The registered versions of ``event_type``, ascending."""
        return sorted(v for (t, v) in self._schemas if t == event_type)

    def schema_for(self, event_type: str, version: int) -> PayloadSchema | None:
        """The schema a registered version is checked against (None: context fields only)."""
        return self._schemas.get((event_type, version))

    def model_for(self, event_type: str, version: int) -> ModelSchema | None:
        """The pydantic model schema of a registered version, if it was given one."""
        schema = self._schemas.get((event_type, version))
        return schema if isinstance(schema, ModelSchema) else None

    def conforms(self, event_type: str, event_version: int, payload: Any, tenant_id: str) -> bool:
        """True when the event certainly passes ``validate_event`` (False: ask it why not).

        The whole check for the common case, without building an error: registered,
        a decoded JSON object whose fields have their exact types, and its tenant.
        """
        key = (event_type, event_version)
        if key not in self._schemas:
            return False
        spec = self._schemas[key]
        return (
            type(payload) is dict
            and _CONTEXT_SPEC.conforms(payload)
            and (spec is None or spec.conforms(payload))
            and payload["tenant_id"] == tenant_id
        )

    def validate_event(
        self, event_type: str, event_version: int, payload: Any, tenant_id: str
    ) -> None:
        """Raise an ``EventValidationError`` unless the event may be published/handled.

        On every publish and every delivery: one lookup of the spec, and a decoded
        payload (a dict) passes the mapping check without the ABC's isinstance.
        """
        if self.conforms(event_type, event_version, payload, tenant_id):
            return
        try:
            spec = self._schemas[(event_type, event_version)]
        except KeyError:
            known = sorted(v for (t, v) in self._schemas if t == event_type)
            hint = f" (registered versions: {known})" if known else ""
            raise UnknownEventTypeError(
                f"event type {event_type!r} version {event_version} is not registered{hint}"
            ) from None
        if type(payload) is not dict and not isinstance(payload, Mapping):
            raise EventValidationError(
                f"{event_type} v{event_version}: payload must be a JSON object, "
                f"got {type(payload).__name__}"
            )
        if not (_CONTEXT_SPEC.conforms(payload) and (spec is None or spec.conforms(payload))):
            problems = _CONTEXT_SPEC.problems(payload)
            if spec is not None:
                problems += [p for p in spec.problems(payload) if p not in problems]
            if problems:
                raise EventValidationError(f"{event_type} v{event_version}: " + "; ".join(problems))
        if payload["tenant_id"] != tenant_id:
            raise TenantMismatchError(
                f"{event_type} v{event_version}: payload tenant_id {payload['tenant_id']!r} "
                f"does not match the event's tenant {tenant_id!r}"
            )

    # -- ordering ---------------------------------------------------------
    def set_ordering(
        self,
        event_type: str,
        *,
        key: OrderingKeySource = "aggregate",
        on_dead_letter: DeadLetterPolicy = "block",
    ) -> None:
        """Deliver the events of ``event_type`` one at a time per key, in write order.

        Declared once per type (all its versions). Publishing then sets each row's
        ``ordering_key`` (``publish(..., ordering_key=...)`` overrides it).
        """
        if not any(t == event_type for (t, _v) in self._schemas):
            raise EventRegistrationError(
                f"cannot order {event_type!r}: the event type is not registered"
            )
        if event_type in self._ordering:
            raise EventRegistrationError(f"the ordering of {event_type!r} is declared twice")
        if on_dead_letter not in ("block", "skip"):
            raise EventRegistrationError(
                f"on_dead_letter of {event_type!r} must be 'block' or 'skip', "
                f"got {on_dead_letter!r}"
            )
        if key != "aggregate" and not callable(key):
            raise EventRegistrationError(
                f"the ordering key of {event_type!r} must be 'aggregate' or a callable"
            )
        self._ordering[event_type] = Ordering(key, on_dead_letter)

    def ordering(self, event_type: str) -> Ordering | None:
        return self._ordering.get(event_type)

    def ordering_key_for(
        self,
        event_type: str,
        aggregate_type: str,
        aggregate_id: str,
        payload: Mapping[str, Any],
    ) -> str | None:
        """The ordering key a new event of this type gets (None: unordered)."""
        ordering = self._ordering.get(event_type)
        if ordering is None:
            return None
        return check_ordering_key(
            event_type, ordering.key_for(aggregate_type, aggregate_id, payload)
        )

    def dead_letter_policy(self, event_type: str) -> DeadLetterPolicy:
        """What a dead letter of this type does to its key (``block`` unless declared)."""
        ordering = self._ordering.get(event_type)
        return ordering.on_dead_letter if ordering is not None else "block"

    # -- handlers ---------------------------------------------------------
    def register_handler(
        self,
        event_type: str,
        handler: Handler | TransactionalHandler | ModelHandler,
        *,
        key: str,
        transactional: bool = False,
    ) -> None:
        """Attach ``handler`` to ``event_type`` under a stable ``key``.

        The key names the handler in idempotency records, so it must not change
        between deployments (renaming it makes a replay re-run the handler). With
        ``transactional=True`` the handler is called as ``handler(envelope, session)``
        and its writes through ``session`` commit with its run record and the events it
        publishes (``engine.handlers.transactional``).
        """
        if not key:
            raise EventRegistrationError("a handler needs a stable, non-empty key")
        if not any(t == event_type for (t, _v) in self._schemas):
            raise EventRegistrationError(
                f"cannot attach handler {key!r}: event type {event_type!r} is not registered"
            )
        existing = self._handlers.get(event_type, ())
        if any(h.key == key for h in existing):
            raise EventRegistrationError(
                f"handler key {key!r} is registered twice for {event_type}"
            )
        if takes_model(handler, transactional):
            # handler(envelope, model[, session]): it gets its event's parsed model
            handler = with_model(self, event_type, key, cast(ModelHandler, handler))
        check_signature(event_type, key, handler, transactional)
        registered = RegisteredHandler(
            event_type, key, cast(Handler | TransactionalHandler, handler), transactional
        )
        self._handlers[event_type] = (*existing, registered)

    def handler(
        self, event_type: str, *, key: str, transactional: bool = False
    ) -> Callable[[AnyHandler], AnyHandler]:
        """Decorator form of ``register_handler``."""

        def decorate(fn: AnyHandler) -> AnyHandler:
            self.register_handler(event_type, fn, key=key, transactional=transactional)
            return fn

        return decorate

    def expect_database(self, database: str | URL | AsyncEngine) -> None:
        """Declare the database this app's transactional handlers write to (its business
        tables): a dispatcher on another database refuses to start, since their writes
        could not commit with the outbox's records."""
        self.expected_database = parse_database_url(
            database.url if isinstance(database, AsyncEngine) else database
        )

    # -- start-up -------------------------------------------------------
    def on_ready(self, hook: ReadyHook) -> ReadyHook:
        """Have every run loop (``--dispatch``, the console's dispatcher, ``run_dispatcher``)
        await ``hook()`` once its database is open and checked, before its first claim.

        For set-up that needs the running event loop (a client session the handlers
        share), or to tell a supervisor the dispatcher is ready. A hook that raises stops
        the run before anything is claimed. Usable as a decorator.
        """
        if not callable(hook):
            raise EventRegistrationError("on_ready takes a callable that returns an awaitable")
        self._ready_hooks.append(hook)
        return hook

    def ready_hooks(self) -> tuple[ReadyHook, ...]:
        return tuple(self._ready_hooks)

    def handlers_for(self, event_type: str) -> tuple[RegisteredHandler, ...]:
        """The handlers of ``event_type`` in registration order (a tuple: no copy per call)."""
        return self._handlers.get(event_type, ())

    def has_handlers(self) -> bool:
        return any(self._handlers.values())

    def all_handlers(self) -> Iterable[RegisteredHandler]:
        for handlers in self._handlers.values():
            yield from handlers

    # -- domain events ----------------------------------------------------
    def map_domain_event(
        self,
        event_class: type,
        *,
        event_type: str,
        event_version: int = 1,
        aggregate_type: str,
        subject: SubjectSelector | None = None,
        ordering: Ordering | None = None,
    ) -> None:
        """Map a domain event class to its outbox event, once.

        ``subject`` picks the aggregate id from the event (for example
        ``lambda e: str(e.order_id)``); without it the aggregate's primary key is
        used. ``ordering`` (for example ``Ordering("aggregate")``) declares the
        event type's ordering, as ``set_ordering`` does.
        """
        if event_class in self._domain_events:
            raise EventRegistrationError(f"domain event {event_class.__qualname__} is mapped twice")
        if not self.is_registered(event_type, event_version):
            self.register_event(event_type, event_version)
        if ordering is not None:
            self.set_ordering(event_type, key=ordering.key, on_dead_letter=ordering.on_dead_letter)
        self._domain_events[event_class] = DomainEventMapping(
            event_class, event_type, event_version, aggregate_type, subject
        )

    def domain_event_mapping(self, event_class: type) -> DomainEventMapping | None:
        return self._domain_events.get(event_class)
