"""Loading installed apps: the plugin contract behind ``--installed-app MODULE``.

An installed app is any importable module with a ``register(registry)``
function that declares its event types, domain event mappings and handlers on
the ``EventRegistry`` it is given.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from engine import EventRegistry, OutboxError


class InstalledAppError(OutboxError):
    """An installed app could not be imported or registered."""


def load_registry(modules: Iterable[str]) -> EventRegistry:
    """Import each module and call its ``register(registry)``; one clear error on failure."""
    registry = EventRegistry()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise InstalledAppError(f"cannot import installed app {name!r}: {exc}") from None
        except Exception as exc:
            raise InstalledAppError(
                f"installed app {name!r} failed while importing: {type(exc).__name__}: {exc}"
            ) from None
        register = getattr(module, "register", None)
        if not callable(register):
            raise InstalledAppError(f"installed app {name!r} has no register(registry) function")
        try:
            register(registry)
        except OutboxError as exc:
            raise InstalledAppError(f"installed app {name!r}: {exc}") from None
        except Exception as exc:
            raise InstalledAppError(
                f"installed app {name!r} failed in register(): {type(exc).__name__}: {exc}"
            ) from None
    return registry


def delivery_problem(registry: EventRegistry, *, relaying: bool, apps: Iterable[str]) -> str | None:
    """Why a dispatcher over ``registry`` could deliver nothing useful, or None when it can.

    One rule for ``--dispatch``, ``dispatch-once`` and the console's ``s``: without
    handlers there must be a relay, and even a relay needs the event types
    registered, because the dispatcher dead-letters every type it does not know.
    """
    names = ", ".join(apps) or "none given"
    if not relaying and not registry.has_handlers():
        return (
            f"nothing would deliver the events: no handlers are registered (installed apps: "
            f"{names}) and no relay is configured; add --installed-app MODULE with handlers, "
            "or --amqp-url URL to relay to RabbitMQ"
        )
    if not registry.event_types():
        return (
            f"no event types are registered (installed apps: {names}): the dispatcher checks "
            "every event against the registry and dead-letters unknown types, so relaying "
            "would dead-letter everything; add --installed-app MODULE that registers them"
        )
    return None
