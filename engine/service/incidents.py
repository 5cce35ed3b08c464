"""Incident operations every front end shares: error groups, pauses, replay safety.

The CLI (``dead-letter groups``, ``dead-letter replay --group``, ``pause``,
``resume``, ``stats``) and the console (``g``, ``R``, ``p``, the overview) take
these from here rather than from the engine modules, so both read the same
numbers the same way:

- ``plan_replay_of_group``: the dead letters of one error group, by type (the
  look before ``replay_of_group``);
- ``dedup_check``: how many events of a replay are older than the consumers'
  dedup window (``OutboxSettings.dedup_window_seconds``);
- ``group_events``: every failed row and dead letter of one error group (the
  console's list of a group; ``dead-letter replay --group`` tells an unknown
  fingerprint from a group without dead letters with it);
- ``pause_type`` / ``resume_type``: pause and resume, audited (``engine.operating.pauses``);
  ``waiting_of_type``: what a pause would hold back now.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from engine.operating.error_groups import (
    ErrorGroup,
    ErrorGroups,
    GroupMember,
    GroupMembers,
    error_groups,
    group_members,
)
from engine.operating.pauses import (
    Pause,
    PausedBacklog,
    pause,
    paused_backlog,
    resume,
    type_in_outbox,
    waiting,
)
from engine.operating.replay import (
    DEFAULT_DEDUP_WINDOW,
    DedupCheck,
    check_dedup_window,
    replay_group,
)
from engine.service.actions import ReplayOutcome, ReplayPlan
from engine.storage.schema import DEAD_LETTER

__all__ = [
    "DedupCheck",
    "ErrorGroup",
    "ErrorGroups",
    "GroupMember",
    "GroupMembers",
    "Pause",
    "PausedBacklog",
    "dedup_check",
    "dedup_window",
    "error_groups",
    "group_events",
    "pause_type",
    "paused_backlog",
    "plan_replay_of_group",
    "replay_of_group",
    "resume_type",
    "waiting_of_type",
]


def dedup_window(seconds: float | None) -> timedelta:
    """The consumers' dedup window from the setting (None: the default, 7 days)."""
    return DEFAULT_DEDUP_WINDOW if seconds is None else timedelta(seconds=seconds)


async def dedup_check(
    engine: AsyncEngine,
    ids: Sequence[str],
    *,
    window_seconds: float | None = None,
    now: datetime | None = None,
) -> DedupCheck:
    """How many of ``ids`` are older than the dedup window (consumers may process them twice)."""
    return await check_dedup_window(engine, ids, window=dedup_window(window_seconds), now=now)


async def plan_replay_of_group(engine: AsyncEngine, fingerprint: str) -> ReplayPlan:
    """The dead letters of the error group ``fingerprint`` now, by type (failed rows retry)."""
    members = await group_members(engine, fingerprint, statuses=(DEAD_LETTER,))
    return ReplayPlan(ids=list(members.dead_letter_ids), by_type=dict(members.by_type))


async def group_events(engine: AsyncEngine, fingerprint: str) -> GroupMembers:
    """Every failed row and dead letter of the group ``fingerprint`` now, oldest first.

    No members: no such group (or it has just been worked off).
    """
    return await group_members(engine, fingerprint)


async def replay_of_group(
    engine: AsyncEngine, fingerprint: str, *, operator: str, reason: str | None
) -> ReplayOutcome:
    """Replay the group's dead letters; rows whose error changed group are refused."""
    result = await replay_group(engine, fingerprint, operator=operator, reason=reason)
    return ReplayOutcome(list(result.replayed), dict(result.refused))


async def pause_type(
    engine: AsyncEngine, event_type: str, tenant_id: str | None, *, reason: str, operator: str
) -> Pause:
    """Pause delivery of a type (for one tenant or all); ``PauseError`` when paused already."""
    return await pause(engine, event_type, tenant_id, reason=reason, operator=operator)


async def resume_type(
    engine: AsyncEngine,
    event_type: str,
    tenant_id: str | None,
    *,
    operator: str,
    reason: str | None = None,
) -> Pause:
    """End exactly this pause; ``PauseError`` when it is not paused."""
    return await resume(engine, event_type, tenant_id, reason=reason, operator=operator)


async def event_type_seen(engine: AsyncEngine, event_type: str) -> bool:
    """Whether any event of the type is in the outbox (a pause's check against typos)."""
    return await type_in_outbox(engine, event_type)


async def waiting_of_type(engine: AsyncEngine, event_type: str, tenant_id: str | None) -> int:
    """How many events of a type (and tenant) wait now: what a pause would hold back."""
    return await waiting(engine, event_type, tenant_id)
