"""Who and what a piece of work is for: the task context and the running handler.

Both travel in context variables so that code deep inside a handler (the
side-effect helper, logging) sees them without threading arguments through.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.handlers.idempotency import IdempotencyStore
    from engine.writing.envelope import EventEnvelope


@dataclass(frozen=True, slots=True)
class TaskContext:
    """Tenant, actor and request identity of a unit of work or a handler run.

    Request handlers build it from the request; background code without a
    request passes one explicitly.
    """

    tenant_id: str
    actor_id: str
    request_id: str
    trace_id: str | None = None

    def envelope_fields(self) -> dict[str, Any]:
        """The fields every outbox payload carries."""
        fields: dict[str, Any] = {
            "tenant_id": self.tenant_id,
            "actor_id": self.actor_id,
            "request_id": self.request_id,
        }
        if self.trace_id is not None:
            fields["trace_id"] = self.trace_id
        return fields


@dataclass(frozen=True, slots=True)
class HandlerInvocation:
    """The handler currently running, as the side-effect helper needs it."""

    envelope: EventEnvelope
    handler_key: str
    store: IdempotencyStore


# A unit of work sets a TaskContext; the dispatcher sets the envelope it delivers, whose
# context is built only when something asks: most handlers never do, and building it for
# every delivered event was a good share of a quick handler call (see decision 0025).
_task_context: ContextVar[TaskContext | EventEnvelope | None] = ContextVar(
    "outbox_task_context", default=None
)
# Likewise (envelope, handler key, store): a HandlerInvocation only when asked for.
_handler_invocation: ContextVar[tuple[EventEnvelope, str, IdempotencyStore] | None] = ContextVar(
    "outbox_handler_invocation", default=None
)


def current_task_context() -> TaskContext | None:
    """The task context of the running handler or unit of work, if any."""
    found = _task_context.get()
    if found is None or isinstance(found, TaskContext):
        return found
    return found.task_context()  # an envelope being delivered


def current_handler() -> HandlerInvocation | None:
    """The handler invocation the current code runs inside, if any."""
    found = _handler_invocation.get()
    return None if found is None else HandlerInvocation(*found)
