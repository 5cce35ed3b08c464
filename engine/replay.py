"""Send dead letters back to pending, with an audit trail."""

from __future__ import annotations

import getpass
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import utc_now
from engine.errors import ReplayError
from engine.schema import DEAD_LETTER, PENDING, outbox_events, replay_log

t = outbox_events


@dataclass(slots=True)
class ReplayResult:
    """Which events went back to pending, and why the others were refused."""

    replayed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def default_operator() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user database entry (containers)
        return "unknown"


async def replay_dead_letter(
    engine: AsyncEngine,
    event_ids: Sequence[str],
    *,
    operator: str | None = None,
    reason: str | None = None,
    now: datetime | None = None,
    strict: bool = True,
) -> ReplayResult:
    """Move dead-letter events back to pending with a fresh attempt budget.

    Only rows whose status is ``dead_letter`` change (a conditional update);
    each replay is written to ``outbox_replay_log`` with who, why, when and
    the dead-letter reason it cleared. With ``strict`` (the default) any
    refused id raises ``ReplayError`` after the others are replayed; pass
    ``strict=False`` to get per-id refusals in the result instead. Handlers
    are never run here: the dispatcher picks the events up as usual.
    """
    operator = operator or default_operator()
    now = now or utc_now()
    result = ReplayResult()
    unique_ids = list(dict.fromkeys(event_ids))
    async with engine.begin() as conn:
        current = {
            row.id: row
            for row in await conn.execute(
                select(
                    t.c.id, t.c.status, t.c.dead_letter_reason, t.c.last_error, t.c.attempt_count
                )
                .where(t.c.id.in_(unique_ids))
                .with_for_update()
            )
        }
        for event_id in unique_ids:
            row = current.get(event_id)
            if row is None:
                result.refused[event_id] = "no such event"
            elif row.status != DEAD_LETTER:
                result.refused[event_id] = f"status is {row.status}, not dead_letter"
        candidates = [i for i in unique_ids if i not in result.refused]
        if candidates:
            replayed = set(
                (
                    await conn.execute(
                        update(t)
                        .where(t.c.id.in_(candidates), t.c.status == DEAD_LETTER)
                        .values(
                            status=PENDING,
                            attempt_count=0,
                            dead_letter_reason=None,
                            last_error=None,
                            next_retry_at=None,
                            locked_by=None,
                            locked_until=None,
                            replay_count=t.c.replay_count + 1,
                            last_replayed_at=now,
                        )
                        .returning(t.c.id)
                    )
                ).scalars()
            )
            result.replayed = [i for i in candidates if i in replayed]
            for event_id in candidates:
                if event_id not in replayed:
                    result.refused[event_id] = "changed status while being replayed"
        if result.replayed:
            await conn.execute(
                insert(replay_log),
                [
                    {
                        "event_id": event_id,
                        "operator": operator,
                        "reason": reason,
                        "cleared_dead_letter_reason": current[event_id].dead_letter_reason,
                        "cleared_last_error": current[event_id].last_error,
                        "previous_attempt_count": current[event_id].attempt_count,
                        "replayed_at": now,
                    }
                    for event_id in result.replayed
                ],
            )
    if strict and result.refused:
        detail = "; ".join(f"{i}: {why}" for i, why in result.refused.items())
        raise ReplayError(f"refused to replay {len(result.refused)} event(s): {detail}")
    return result
