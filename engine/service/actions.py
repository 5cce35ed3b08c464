"""Audited dead-letter actions as every front end runs them: check first, then change.

``engine.operating.replay`` makes each change (a conditional update under a lock, audited);
this module is what the CLI and the console share around it: replay in chunks
of ``REPLAY_CHUNK`` ids (one transaction each), and the look before a replay or
a skip that tells the operator what would happen, refusing ids the same way the
engine would.

``matched`` has one meaning everywhere: the ids selected that are dead letters
now (given with ``--event-id`` or matching the ``--all`` filter), so a dry run
and a real replay of the same selection report the same number.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from sqlalchemy.ext.asyncio import AsyncEngine

from engine.errors import EventNotFoundError
from engine.operating.insights import EventFilter, OutboxInsights
from engine.operating.replay import replay_dead_letter, skip_dead_letter
from engine.storage.database import storage_errors
from engine.storage.schema import DEAD_LETTER

REPLAY_CHUNK = 500
Progress = Callable[[int], None]


@dataclass(slots=True)
class ReplayPlan:
    """The dead letters a replay would take, by type, and the ids it would refuse."""

    ids: list[str] = field(default_factory=list)
    by_type: dict[str, int] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def matched(self) -> int:
        return len(self.ids)


@dataclass(slots=True)
class SkipPlan:
    """The dead letters a skip would take, each with its key and what waits behind it."""

    ids: list[str] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)
    released: dict[str, int] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


async def plan_replay_of_ids(insights: OutboxInsights, ids: Sequence[str]) -> ReplayPlan:
    """Which of ``ids`` are dead letters (by type); the others are refused with a reason."""
    plan = ReplayPlan()
    for event_id in dict.fromkeys(ids):
        try:
            detail = await insights.event_detail(event_id)
        except EventNotFoundError:
            plan.refused[event_id] = "no such event"
            continue
        status = detail.columns["status"]
        if status != DEAD_LETTER:
            plan.refused[event_id] = f"status is {status}, not dead_letter"
            continue
        event_type = str(detail.columns["event_type"])
        plan.by_type[event_type] = plan.by_type.get(event_type, 0) + 1
        plan.ids.append(event_id)
    return plan


async def plan_replay_matching(insights: OutboxInsights, flt: EventFilter) -> ReplayPlan:
    """Every dead letter matching ``flt`` (its status filter is ignored), by type."""
    summary = await insights.match_events(_dead_letters(flt))
    return ReplayPlan(ids=list(summary.ids), by_type=dict(summary.by_type))


def _dead_letters(flt: EventFilter) -> EventFilter:
    return replace(flt, statuses=(DEAD_LETTER,))  # every other field as given


@dataclass(slots=True)
class ReplayOutcome:
    replayed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


async def replay(
    engine: AsyncEngine,
    ids: Sequence[str],
    *,
    operator: str,
    reason: str | None,
    progress: Progress | None = None,
) -> ReplayOutcome:
    """Replay exactly ``ids`` in chunks; ids that are no longer dead letters are refused."""
    outcome = ReplayOutcome()
    for start in range(0, len(ids), REPLAY_CHUNK):
        chunk = ids[start : start + REPLAY_CHUNK]
        async with storage_errors(engine.url):
            result = await replay_dead_letter(
                engine, chunk, operator=operator, reason=reason, strict=False
            )
        outcome.replayed.extend(result.replayed)
        outcome.refused.update(result.refused)
        if progress is not None:
            progress(len(chunk))
    return outcome


async def plan_skip(insights: OutboxInsights, ids: Sequence[str]) -> SkipPlan:
    """The ids that can be skipped now, each with the events waiting behind it.

    The engine checks again under a row lock when it skips; this look first tells
    the operator what each skip releases (and refuses the same ids the same way).
    """
    plan = SkipPlan()
    for event_id in dict.fromkeys(ids):
        try:
            detail = await insights.event_detail(event_id)
        except EventNotFoundError:
            plan.refused[event_id] = "no such event"
            continue
        columns = detail.columns
        if columns["status"] != DEAD_LETTER:
            plan.refused[event_id] = f"status is {columns['status']}, not dead_letter"
        elif columns.get("ordering_key") is None:
            plan.refused[event_id] = "it has no ordering key: nothing waits behind it"
        elif columns.get("skipped_at") is not None:
            plan.refused[event_id] = "it was skipped already"
        else:
            plan.keys[event_id] = str(columns["ordering_key"])
            plan.released[event_id] = await insights.waiting_behind(event_id)
            plan.ids.append(event_id)
    return plan


@dataclass(slots=True)
class SkipOutcome:
    skipped: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


async def skip(
    engine: AsyncEngine, ids: Sequence[str], *, operator: str, reason: str | None
) -> SkipOutcome:
    """Skip ``ids`` (release their keys); the ones that changed meanwhile are refused."""
    if not ids:
        return SkipOutcome()
    async with storage_errors(engine.url):
        result = await skip_dead_letter(
            engine, list(ids), operator=operator, reason=reason, strict=False
        )
    return SkipOutcome(list(result.skipped), dict(result.refused))
