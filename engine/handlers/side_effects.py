"""Run an external side effect from a handler at most once per event, handler and key."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar, overload

from engine.context import _handler_invocation, current_handler
from engine.errors import OutboxError
from engine.handlers.idempotency import SUCCEEDED, SideEffectKey

T = TypeVar("T")

# Success records still being written for handlers cancelled meanwhile (kept referenced).
_recording: set[asyncio.Future[None]] = set()
# The effects that succeeded in the running handler call: (that call's context value,
# effect key -> response). A handler that repeats a key within one call is answered from
# here; it is the only earlier record a first delivery can have.
_succeeded_in_call: ContextVar[tuple[object, dict[str, Any]] | None] = ContextVar(
    "outbox_succeeded_in_call", default=None
)


def _succeeded_in_this_call() -> dict[str, Any]:
    call = _handler_invocation.get()
    found = _succeeded_in_call.get()
    if found is None or found[0] is not call:  # a new handler call (a fresh context value)
        found = (call, {})
        _succeeded_in_call.set(found)
    return found[1]


@overload
async def run_event_side_effect(
    effect_key: str, fn: Callable[[], Awaitable[T]], *, request_payload: Any = None
) -> T | Any: ...


@overload
async def run_event_side_effect(
    effect_key: str, fn: Callable[[], T], *, request_payload: Any = None
) -> T | Any: ...


# Overloads, not one ``Callable[[], Awaitable[T] | T]``: with that union mypy solved T
# as Never for an async ``fn`` and refused the call.
async def run_event_side_effect(
    effect_key: str,
    fn: Callable[[], Awaitable[T] | T],
    *,
    request_payload: Any = None,
) -> T | Any:
    """Call ``fn`` unless this effect already succeeded for the running handler's event.

    On success the response (which must be JSON-serialisable) is recorded; a
    later retry of the same event and handler gets the recorded response back
    without calling ``fn``. If ``fn`` raises, the failure is recorded and the
    exception propagates, so the handler fails and the event is retried.

    This does not replace the external system's own idempotency key: if the
    process dies between the call and the record, the call happens again. Pass
    ``envelope.event_id`` to the external system as well. A handler cancelled in
    that window (its timeout, a shutdown) still writes the record before the
    cancellation goes on.

    A key repeated within one handler call is answered from the first one's response
    (in a task the handler started, only if the handler's own code had made a guarded
    call before starting it). Records are looked up only on a redelivery.
    """
    invocation = current_handler()
    if invocation is None:
        raise OutboxError("run_event_side_effect() must be called from inside an event handler")
    if not effect_key:
        raise OutboxError("run_event_side_effect() needs a non-empty effect_key")
    envelope = invocation.envelope
    key = SideEffectKey(
        tenant_id=envelope.tenant_id,
        actor_id=envelope.actor_id or "",
        event_id=envelope.event_id,
        handler_key=invocation.handler_key,
        effect_key=effect_key,
    )
    store = invocation.store
    succeeded = _succeeded_in_this_call()
    if effect_key in succeeded:
        return succeeded[effect_key]
    # A record from an earlier delivery exists only if there was one: a first attempt of a
    # never-replayed event has none (as for handler runs), so it costs no lookup, and its
    # handlers take no pooled connection before their calls (see decision 0037).
    if envelope.attempt_count > 1 or envelope.replay_count:
        existing = await store.find_side_effect(key)
        if existing is not None and existing.status == SUCCEEDED:
            succeeded[effect_key] = existing.response
            return existing.response
    try:
        result = fn()
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:
        await store.record_side_effect(
            key, succeeded=False, request=request_payload, error=f"{type(exc).__name__}: {exc}"
        )
        raise
    # The call has happened: from here on only a dead process may lose its record. The
    # record joins the writer's queue now, before anything else runs; a handler cancelled
    # while it waits (its timeout, a shutdown) still has it written, so the retry answers
    # from it instead of calling.
    record = store.submit_side_effect(key, succeeded=True, request=request_payload, response=result)
    _recording.add(record)
    record.add_done_callback(_recording.discard)
    try:
        await asyncio.shield(record)
    except asyncio.CancelledError:
        await asyncio.shield(record)  # finish the record, then let the cancellation go on
        raise
    succeeded[effect_key] = result
    return result
