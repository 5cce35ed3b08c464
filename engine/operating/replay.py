"""Send dead letters back to pending, or release their ordering keys, with an audit trail.

A dead letter with an ordering key holds back the later events of its key
(``block``). Two operator actions release it: ``replay_dead_letter`` sends it
back to pending (it is delivered first, then the key goes on), and
``skip_dead_letter`` leaves it in the dead letter and lets the key go on
without it. Both write one ``outbox_replay_log`` row per event (``action``
replay or skip) with who, why and when.

A skipped event that is replayed later goes to the back of its key's queue (a
new ``seq``): its key has moved on, and it must not jump ahead of events that
may already be in flight.

``replay_group`` replays the dead letters of one error group (engine.operating.error_groups),
re-checking each row's fingerprint under the lock. ``check_dedup_window`` says how
many events of a replay are older than the consumers' dedup window: consumers
that remember event ids for that long may process those events twice.
"""

from __future__ import annotations

import getpass
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from engine.clock import utc_now
from engine.errors import ConfigurationError, ReplayError
from engine.operating.error_groups import error_text, fingerprint, group_members
from engine.storage.database import read_only_engine, storage_errors
from engine.storage.schema import DEAD_LETTER, PENDING, outbox_events, replay_log

t = outbox_events

#: How long consumers remember the event ids they processed, unless configured.
DEFAULT_DEDUP_WINDOW = timedelta(days=7)
_ID_CHUNK = 500  # ids per IN list: well under every driver's parameter limit


@dataclass(slots=True)
class ReplayResult:
    """Which events went back to pending, and why the others were refused."""

    replayed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class SkipResult:
    """Which dead letters released their keys, and why the others were refused."""

    skipped: list[str] = field(default_factory=list)
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
    return await _replay(
        engine,
        event_ids,
        lambda row: None,
        operator=operator,
        reason=reason,
        now=now,
        strict=strict,
    )


async def replay_group(
    engine: AsyncEngine,
    group: str,
    *,
    operator: str | None = None,
    reason: str | None = None,
    now: datetime | None = None,
) -> ReplayResult:
    """Replay every dead letter of the error group ``group`` (a fingerprint), audited.

    The group's dead letters are listed (engine.operating.error_groups.group_members), then
    replayed like ``replay_dead_letter``; a row whose error no longer has this
    fingerprint when it is locked is refused, as is a row that stopped being a dead
    letter. Refusals are returned, not raised. Failed rows of the group are left to
    their retries.
    """
    members = await group_members(engine, group, statuses=(DEAD_LETTER,))

    def other_group(row: Any) -> str | None:
        if fingerprint(error_text(row.last_error, row.dead_letter_reason)) != group:
            return f"its error is no longer in group {group}"
        return None

    return await _replay(
        engine,
        members.dead_letter_ids,
        other_group,
        operator=operator,
        reason=reason,
        now=now,
        strict=False,
    )


async def _replay(
    engine: AsyncEngine,
    event_ids: Sequence[str],
    refuse: Callable[[Any], str | None],
    *,
    operator: str | None,
    reason: str | None,
    now: datetime | None,
    strict: bool,
) -> ReplayResult:
    """Back to pending with a fresh attempt budget: the one replay both entry points share."""
    now = now or utc_now()

    async def to_back_of_key(conn: AsyncConnection, done: list[str], before: _Rows) -> None:
        for event_id in done:
            if before[event_id].skipped_at is not None:
                await _to_back_of_key(conn, event_id)

    replayed, refused = await _change_dead_letters(
        engine,
        event_ids,
        action=("replay", "replayed"),
        refuse=refuse,
        values={
            "status": PENDING,
            "attempt_count": 0,
            "dead_letter_reason": None,
            "last_error": None,
            "next_retry_at": None,
            "locked_by": None,
            "locked_until": None,
            "replay_count": t.c.replay_count + 1,
            "last_replayed_at": now,
            "skipped_at": None,
        },
        after=to_back_of_key,
        operator=operator,
        reason=reason,
        now=now,
        strict=strict,
    )
    return ReplayResult(replayed, refused)


async def skip_dead_letter(
    engine: AsyncEngine,
    event_ids: Sequence[str],
    *,
    operator: str | None = None,
    reason: str | None = None,
    now: datetime | None = None,
    strict: bool = True,
) -> SkipResult:
    """Let the later events of each dead letter's ordering key go on without it.

    Only dead letters with an ordering key that still hold it are skipped (a
    conditional update); they stay in the dead letter, where a replay can still
    send them (to the back of their key). Refusals work as in ``replay_dead_letter``.
    """
    now = now or utc_now()

    def refuse(row: Any) -> str | None:
        if row.ordering_key is None:
            return "it has no ordering key: nothing waits behind it"
        return "it was skipped already" if row.skipped_at is not None else None

    skipped, refused = await _change_dead_letters(
        engine,
        event_ids,
        action=("skip", "skipped"),
        refuse=refuse,
        values={"skipped_at": now},
        where=(t.c.skipped_at.is_(None),),
        operator=operator,
        reason=reason,
        now=now,
        strict=strict,
    )
    return SkipResult(skipped, refused)


_Rows = Mapping[str, Any]
_LOCKED = (
    t.c.id,
    t.c.status,
    t.c.ordering_key,
    t.c.skipped_at,
    t.c.dead_letter_reason,
    t.c.last_error,
    t.c.attempt_count,
)


async def _change_dead_letters(
    engine: AsyncEngine,
    event_ids: Sequence[str],
    *,
    action: tuple[str, str],
    refuse: Callable[[Any], str | None],
    values: Mapping[str, Any],
    where: Sequence[Any] = (),
    after: Callable[[AsyncConnection, list[str], _Rows], Awaitable[None]] | None = None,
    operator: str | None,
    reason: str | None,
    now: datetime,
    strict: bool,
) -> tuple[list[str], dict[str, str]]:
    """One audited operator action on dead letters, in one transaction.

    Locks the rows, refuses per id (missing, not a dead letter, or ``refuse``'s
    reason), changes the rest with one conditional update, runs ``after`` on the
    changed ids and writes one audit row each. Returns (changed, refused).
    """
    verb, past = action
    operator = operator or default_operator()
    unique_ids = list(dict.fromkeys(event_ids))
    refused: dict[str, str] = {}
    changed: list[str] = []
    async with engine.begin() as conn:
        locked = select(*_LOCKED).where(t.c.id.in_(unique_ids)).with_for_update()
        current = {row.id: row for row in await conn.execute(locked)}
        for event_id in unique_ids:
            row = current.get(event_id)
            if row is None:
                refused[event_id] = "no such event"
            elif row.status != DEAD_LETTER:
                refused[event_id] = f"status is {row.status}, not dead_letter"
            elif (why := refuse(row)) is not None:
                refused[event_id] = why
        candidates = [i for i in unique_ids if i not in refused]
        if candidates:
            stmt = (
                update(t)
                .where(t.c.id.in_(candidates), t.c.status == DEAD_LETTER, *where)
                .values(**values)
                .returning(t.c.id)
            )
            done = set((await conn.execute(stmt)).scalars())
            changed = [i for i in candidates if i in done]
            for event_id in candidates:
                if event_id not in done:
                    refused[event_id] = f"changed status while being {past}"
            if after is not None:
                await after(conn, changed, current)
        await _audit(conn, verb, changed, current, operator, reason, now)
    if strict and refused:
        detail = "; ".join(f"{i}: {why}" for i, why in refused.items())
        raise ReplayError(f"refused to {verb} {len(refused)} event(s): {detail}")
    return changed, refused


async def _audit(
    conn: AsyncConnection,
    action: str,
    event_ids: Sequence[str],
    before: Mapping[str, Any],
    operator: str,
    reason: str | None,
    now: datetime,
) -> None:
    """One ``outbox_replay_log`` row per event an operator action changed."""
    if not event_ids:
        return
    await conn.execute(
        insert(replay_log),
        [
            {
                "event_id": event_id,
                "action": action,
                "operator": operator,
                "reason": reason,
                "cleared_dead_letter_reason": before[event_id].dead_letter_reason,
                "cleared_last_error": before[event_id].last_error,
                "previous_attempt_count": before[event_id].attempt_count,
                "replayed_at": now,
            }
            for event_id in event_ids
        ],
    )


async def _to_back_of_key(conn: AsyncConnection, event_id: str) -> None:
    """Give a replayed, skipped event a new ``seq``: after every event of its key.

    PostgreSQL draws it from the identity sequence. On SQLite, ``seq`` is the
    rowid, so the row takes the next rowid and the two stay equal.
    """
    if conn.dialect.name == "postgresql":
        sql = (
            "UPDATE outbox_events SET seq = nextval(pg_get_serial_sequence('outbox_events', 'seq'))"
            " WHERE id = :id"
        )
    else:
        sql = (
            "UPDATE outbox_events SET rowid = (SELECT max(rowid) + 1 FROM outbox_events), "
            "seq = (SELECT max(rowid) + 1 FROM outbox_events) WHERE id = :id"
        )
    await conn.execute(text(sql), {"id": event_id})


@dataclass(frozen=True, slots=True)
class DedupCheck:
    """How many events of a replay are older than the consumers' dedup window."""

    window: timedelta
    checked: int
    outside: int  # created before now - window
    oldest_created_at: datetime | None  # of those outside

    @property
    def safe(self) -> bool:
        return self.outside == 0

    def assurance(self) -> str | None:
        """One short line for a confirmation dialog when the replay is safe, else None."""
        if not self.safe:
            return None
        return f"inside the consumers' {_duration(self.window)} dedup window: safe to replay"

    def warning(self) -> str | None:
        """One line for a confirmation dialog or the CLI, or None when the replay is safe."""
        if self.safe:
            return None
        return (
            f"{self.outside} of {self.checked} event(s) are older than the consumers' "
            f"{_duration(self.window)} dedup window: consumers may process them twice"
        )


async def check_dedup_window(
    engine: AsyncEngine,
    event_ids: Sequence[str],
    *,
    window: timedelta = DEFAULT_DEDUP_WINDOW,
    now: datetime | None = None,
) -> DedupCheck:
    """Count the events among ``event_ids`` created more than ``window`` ago.

    By ``created_at``: consumers first saw an event around then, and remember its
    id for ``window``. Primary-key lookups, ``_ID_CHUNK`` ids a query.
    """
    if window <= timedelta(0):
        raise ConfigurationError(f"the dedup window must be positive, got {window}")
    cutoff = (now or utc_now()) - window
    unique_ids = list(dict.fromkeys(event_ids))
    outside = 0
    oldest: datetime | None = None
    async with storage_errors(engine.url), read_only_engine(engine).connect() as conn:
        for start in range(0, len(unique_ids), _ID_CHUNK):
            chunk = unique_ids[start : start + _ID_CHUNK]
            stmt = select(func.count(), func.min(t.c.created_at)).where(
                t.c.id.in_(chunk), t.c.created_at < cutoff
            )
            count, first = (await conn.execute(stmt)).one()
            outside += int(count)
            if first is not None and (oldest is None or first < oldest):
                oldest = first
    return DedupCheck(window, len(unique_ids), outside, oldest)


def _duration(window: timedelta) -> str:
    """7 days, 36 hours, 90 minutes: the largest whole unit."""
    seconds = int(window.total_seconds())
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}-{unit}"
    return f"{seconds}-second"
