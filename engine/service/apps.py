"""Loading installed apps: the plugin contract behind ``--installed-app MODULE``.

An installed app is any importable module with a ``register(registry)``
function that declares its event types, domain event mappings and handlers on
the ``EventRegistry`` it is given. Like uvicorn and celery, the working
directory (or ``app_dir``) is searched first, so ``--installed-app mymodule``
finds ``./mymodule.py`` without ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from pathlib import Path

from engine.errors import InstalledAppError, OutboxError
from engine.writing.registry import EventRegistry


def _search_first(app_dir: str | Path | None) -> None:
    """Put ``app_dir`` (default: the working directory) at the front of ``sys.path``."""
    path = str(Path(app_dir).resolve()) if app_dir else str(Path.cwd())
    if path not in sys.path:
        sys.path.insert(0, path)


def load_registry(modules: Iterable[str], *, app_dir: str | Path | None = None) -> EventRegistry:
    """Import each module and call its ``register(registry)``; one clear error on failure."""
    modules = list(modules)
    if app_dir is not None and not Path(app_dir).is_dir():
        raise InstalledAppError(f"--app-dir {app_dir} is not a directory")
    if modules:
        _search_first(app_dir)
    registry = EventRegistry()
    for name in modules:
        _register(name, registry)
    return registry


def _register(name: str, registry: EventRegistry) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        raise InstalledAppError(f"cannot import installed app {name!r}: {exc}") from None
    except (Exception, SystemExit) as exc:  # an app that calls sys.exit() on import, too
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
    except (Exception, SystemExit) as exc:
        raise InstalledAppError(
            f"installed app {name!r} failed in register(): {type(exc).__name__}: {exc}"
        ) from None


def delivery_problem(registry: EventRegistry, *, relaying: bool, apps: Iterable[str]) -> str | None:
    """Why a dispatcher over ``registry`` could deliver nothing useful, or None when it can.

    One rule for ``dispatch``, ``dispatch-once`` and the console's ``s``: without
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
