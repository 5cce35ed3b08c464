"""pydantic models as event schemas: validated at publish and before the handlers.

``registry.register_event("orders.placed", 1, schema=OrderPlaced)`` with a pydantic model
wraps it in a ``ModelSchema``, which answers the registry's two questions as
``EventSchemaSpec`` does (``conforms``, ``problems``), so publish and delivery check it
through the same code. The payload's context fields (``tenant_id``, ``actor_id``,
``request_id``, ``trace_id``) are checked by the registry itself; a model that does not
declare them never sees them, so a model with ``extra="forbid"`` works. A handler that
takes one parameter more than it would otherwise (``(envelope, model)``, or
``(envelope, model, session)`` when transactional) receives the parsed model.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from engine.errors import EventHandlerPermanentError, EventRegistrationError

if TYPE_CHECKING:
    from engine.writing.envelope import EventEnvelope
    from engine.writing.registry import EventRegistry

CONTEXT_NAMES = ("tenant_id", "actor_id", "request_id", "trace_id")


def is_model_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


class ModelSchema:
    """An event version's payload schema given as a pydantic model."""

    __slots__ = ("_hidden", "model")

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model
        declared = {field.alias or name for name, field in model.model_fields.items()}
        declared |= set(model.model_fields)
        # Context fields the model does not declare: left out of what it validates.
        self._hidden = frozenset(name for name in CONTEXT_NAMES if name not in declared)

    def parse(self, payload: Mapping[str, Any]) -> BaseModel:
        """The payload as the model (a ``ValidationError`` when it does not conform)."""
        hidden = self._hidden
        return self.model.model_validate({k: v for k, v in payload.items() if k not in hidden})

    def conforms(self, payload: Mapping[str, Any]) -> bool:
        try:
            self.parse(payload)
        except ValidationError:
            return False
        return True

    def problems(self, payload: Mapping[str, Any]) -> list[str]:
        """Each way ``payload`` breaks the model, one line each (empty when it conforms)."""
        try:
            self.parse(payload)
        except ValidationError as exc:
            return [_problem(error) for error in exc.errors()]
        return []

    def json_schema(self) -> dict[str, Any]:
        return self.model.model_json_schema()


def _problem(error: Any) -> str:
    location = ".".join(str(part) for part in error.get("loc", ()))
    message = str(error.get("msg", "invalid"))
    if error.get("type") == "missing":
        return f"missing required field {location!r}"
    return f"field {location!r}: {message}" if location else message


def payload_of(payload: Any) -> dict[str, Any]:
    """A payload given to a publisher as a plain dict: a model instance is dumped to JSON
    types (by alias, so its own model validates it again)."""
    if isinstance(payload, BaseModel):
        dumped: dict[str, Any] = payload.model_dump(mode="json", by_alias=True)
        return dumped
    return dict(payload)


def takes_model(handler: Callable[..., Any], transactional: bool = False) -> bool:
    """Whether ``handler`` takes the parsed model after the envelope: two required
    parameters, three for a transactional handler (which also takes the session)."""
    try:
        parameters = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(positional) == (3 if transactional else 2)


def with_model(
    registry: EventRegistry,
    event_type: str,
    key: str,
    handler: Callable[..., Awaitable[Any]],
) -> Callable[..., Awaitable[Any]]:
    """``handler(envelope, model, *rest)`` as a handler of ``(envelope, *rest)`` (rest: a
    transactional handler's session).

    The event's payload was checked against its version's model before delivery; here
    it is parsed into that model. A version registered without a model cannot be given
    to such a handler: that event is dead-lettered (a permanent failure).
    """
    if not any(registry.model_for(event_type, v) for v in registry.versions_of(event_type)):
        raise EventRegistrationError(
            f"handler {key!r} takes a model, but no version of {event_type!r} is "
            "registered with a pydantic model (register_event(..., schema=Model)); a "
            "handler that takes (envelope, session) is registered with transactional=True"
        )

    async def deliver(envelope: EventEnvelope, *rest: Any) -> Any:
        schema = registry.model_for(envelope.event_type, envelope.event_version)
        if schema is None:
            raise EventHandlerPermanentError(
                f"{envelope.event_type} v{envelope.event_version} has no pydantic model to "
                f"give handler {key!r}"
            )
        return await handler(envelope, schema.parse(envelope.payload), *rest)

    deliver.__qualname__ = getattr(handler, "__qualname__", deliver.__qualname__)
    deliver.__name__ = getattr(handler, "__name__", deliver.__name__)
    deliver.__doc__ = handler.__doc__
    return deliver
