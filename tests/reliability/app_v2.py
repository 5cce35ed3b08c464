"""Installed app "v2" of the fault suite: v1's ``reliability.a`` plus the new ``reliability.b``.

The new version in the rolling-deploy scenario; its handlers log like v1's (see app_v1).
"""

from __future__ import annotations

from engine import EventRegistry
from tests.reliability import app_v1

TYPE_B = "reliability.b"


def register(registry: EventRegistry) -> None:
    app_v1.register(registry)
    registry.register_event(TYPE_B, 1)
    registry.register_handler(TYPE_B, app_v1.record, key="reliability.b.record")
