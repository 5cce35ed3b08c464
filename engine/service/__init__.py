"""The operations every front end (CLI, console, scripts) performs, built once.

- ``apps``: loading installed apps (``--installed-app``, ``--app-dir``);
- ``database``: opening the outbox database for a purpose, with one set of checks;
- ``actions``: replay and skip of dead letters, with the look before them;
- ``incidents``: error groups, pauses, and the dedup-window check before a replay;
- ``dispatch``: building and starting a dispatcher from settings given once.

Reads (overview, pages, details) come from ``engine.operating.insights.OutboxInsights``;
``insights_for`` builds it with the retention window of the settings.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import Clock, utc_now
from engine.errors import InstalledAppError, NothingToDeliverError
from engine.operating.insights import OutboxInsights
from engine.service.actions import (
    REPLAY_CHUNK,
    ReplayOutcome,
    ReplayPlan,
    SkipOutcome,
    SkipPlan,
    plan_replay_matching,
    plan_replay_of_ids,
    plan_skip,
    replay,
    skip,
)
from engine.service.apps import delivery_problem, load_registry
from engine.service.database import (
    check_database,
    dispose,
    open_database,
    open_engine,
    require_database_file,
)
from engine.service.dispatch import DispatchSpec, open_dispatcher, run
from engine.service.incidents import (
    DedupCheck,
    dedup_check,
    error_groups,
    event_type_seen,
    group_events,
    pause_type,
    paused_backlog,
    plan_replay_of_group,
    replay_of_group,
    resume_type,
    waiting_of_type,
)
from engine.settings import DispatcherSettings


def insights_for(
    engine: AsyncEngine,
    dispatcher: DispatcherSettings | None = None,
    *,
    clock: Clock = utc_now,
    recent_window_seconds: float = 300.0,
    stale_after_seconds: float = 30.0,
) -> OutboxInsights:
    """The read service, counting "awaiting purge" with the dispatcher's retention."""
    return OutboxInsights(
        engine,
        clock=clock,
        recent_window_seconds=recent_window_seconds,
        stale_after_seconds=stale_after_seconds,
        retention_seconds=dispatcher.retention_seconds if dispatcher is not None else None,
    )


__all__ = [
    "REPLAY_CHUNK",
    "DedupCheck",
    "DispatchSpec",
    "InstalledAppError",
    "NothingToDeliverError",
    "ReplayOutcome",
    "ReplayPlan",
    "SkipOutcome",
    "SkipPlan",
    "check_database",
    "dedup_check",
    "delivery_problem",
    "dispose",
    "error_groups",
    "event_type_seen",
    "group_events",
    "insights_for",
    "load_registry",
    "open_database",
    "open_dispatcher",
    "open_engine",
    "pause_type",
    "paused_backlog",
    "plan_replay_matching",
    "plan_replay_of_group",
    "plan_replay_of_ids",
    "plan_skip",
    "replay",
    "replay_of_group",
    "require_database_file",
    "resume_type",
    "run",
    "skip",
    "waiting_of_type",
]
