"""Which failures are the same failure: error fingerprints and error groups.

Failed rows and dead letters are grouped by a fingerprint of their error text
(``last_error``, or the dead-letter reason when there is none) with the parts that
differ from event to event normalised away: UUIDs, timestamps, quoted values, hex,
ids and numbers. ``orders.crm: HTTPError: 503 for order o-17`` and ``... 503 for
order o-92`` are one group, labelled ``orders.crm: HTTPError: <num> for order o-<num>``.

Nothing is stored: the groups are computed in Python from the failed and
dead-lettered rows, read newest first through ``ix_outbox_events_backlog_id`` in
keyset pages. ``error_groups`` reads at most ``scan_limit`` rows (it answers a
console that refreshes, and says when it stopped short); ``group_members``, which
feeds a replay, reads them all. A stored fingerprint column would make both
index lookups, but it would have to be written by every completion in
engine.dispatch.fenced_writes, and rows written before it existed would have none.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.errors import ConfigurationError
from engine.storage.database import read_only_engine, storage_errors
from engine.storage.schema import DEAD_LETTER, FAILED, outbox_events

t = outbox_events

#: Statuses whose rows carry an error worth grouping.
GROUPED_STATUSES = (FAILED, DEAD_LETTER)
#: Rows ``error_groups`` reads at most (newest first).
DEFAULT_SCAN_LIMIT = 20_000  # about a second of normalising
FINGERPRINT_LENGTH = 12
NO_ERROR = "(no error text)"
_PAGE = 2_000

# One pass over the text: at each position the first alternative that matches wins, so
# the wider shapes come first (a UUID is not read as hex and numbers).
_SHAPES = (
    ("uuid", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
    (
        "time",
        r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2}\b)?"
        r"|\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b",
    ),
    ("str", r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""),
    ("hex", r"\b0[xX][0-9a-fA-F]+\b"),
    ("num", r"\b\d+\.\d+\b"),
    # Any other word with a digit: an id when long enough to name one thing (a hash,
    # "cus_9aB3xQ12", "order-123456"), else its digits are numbers ("o-17", "utf8").
    ("word", r"[A-Za-z0-9_-]*\d[A-Za-z0-9_-]*"),
)
_VARYING = re.compile("|".join(f"(?P<{name}>{pattern})" for name, pattern in _SHAPES))
_DIGITS = re.compile(r"\d+")
_ID_LENGTH = 8
_REPEATS = re.compile(r"(<(?:uuid|time|str|hex|num|id)>)(?:,\s*\1)+")


def _placeholder(match: re.Match[str]) -> str:
    if match.lastgroup != "word":
        return f"<{match.lastgroup}>"
    word = match.group(0)
    if len(word) >= _ID_LENGTH and not word.isdigit():
        return "<id>"
    return _DIGITS.sub("<num>", word)


@functools.lru_cache(maxsize=4096)  # the same text recurs (timeouts, refusals without ids)
def normalise_error(error: str | None) -> str:
    """The error text with what varies per event replaced by ``<uuid>``, ``<num>``, ...

    Short words with a digit keep their letters (``o-17`` reads ``o-<num>``, ``utf8``
    ``utf<num>``); long ones are ids (``<id>``). A comma-separated list of one
    placeholder (``ids 4, 5, 6``) reads as one.
    """
    if error is None or not error.strip():
        return NO_ERROR
    text = _REPEATS.sub(r"\1", _VARYING.sub(_placeholder, error))
    return " ".join(text.split())


def fingerprint(error: str | None) -> str:
    """A short, stable name for an error's group: 12 hex digits of the normalised text's hash."""
    return _hash(normalise_error(error))


def error_text(last_error: str | None, dead_letter_reason: str | None) -> str | None:
    """The text a row is grouped by: its last error, else its dead-letter reason.

    ``last_error`` is the handler's own error on failed rows and dead letters alike,
    so a failure that is still retrying and one that ran out of attempts group together.
    """
    return last_error or dead_letter_reason


@dataclass(slots=True)
class ErrorGroup:
    """Failed rows and dead letters that failed the same way."""

    fingerprint: str
    message: str  # the normalised error text: the group's label
    count: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    event_types: Counter[str] = field(default_factory=Counter)
    tenants: Counter[str] = field(default_factory=Counter)
    # created_at of the group's oldest and newest event: outbox_events stores no failure
    # time (no updated or failed-at column), so "seen" is when those events were written.
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    example_error: str | None = None  # one row's error text as stored

    @property
    def dead_letters(self) -> int:
        """How many of the group a replay can send back (failed rows retry by themselves)."""
        return self.statuses[DEAD_LETTER]

    def add(self, row: Any) -> None:
        self.count += 1
        self.statuses[row.status] += 1
        self.event_types[row.event_type] += 1
        self.tenants[row.tenant_id] += 1
        created = row.created_at
        if created is not None:
            if self.first_seen is None or created < self.first_seen:
                self.first_seen = created
            if self.last_seen is None or created > self.last_seen:
                self.last_seen = created
        if self.example_error is None:
            self.example_error = error_text(row.last_error, row.dead_letter_reason)


@dataclass(frozen=True, slots=True)
class ErrorGroups:
    """The groups, largest first; ``complete`` is False when the scan stopped at its limit."""

    groups: Sequence[ErrorGroup]
    scanned: int
    complete: bool


@dataclass(frozen=True, slots=True)
class GroupMember:
    """One row of a group, as the console's list of a group's events shows it."""

    id: str
    status: str
    event_type: str
    tenant_id: str
    created_at: datetime | None
    error: str | None  # the text it was grouped by, as stored


@dataclass(frozen=True, slots=True)
class GroupMembers:
    """The rows of one group now: ids (oldest first) by status, and counts by type."""

    fingerprint: str
    ids: tuple[str, ...]
    dead_letter_ids: tuple[str, ...]
    by_type: dict[str, int]
    members: tuple[GroupMember, ...] = ()  # the rows themselves, oldest first


_COLUMNS = (
    t.c.id,
    t.c.status,
    t.c.event_type,
    t.c.tenant_id,
    t.c.created_at,
    t.c.last_error,
    t.c.dead_letter_reason,
)


def _check_statuses(statuses: Sequence[str]) -> tuple[str, ...]:
    wrong = [s for s in statuses if s not in GROUPED_STATUSES]
    if wrong or not statuses:
        raise ConfigurationError(
            f"error groups cover {' and '.join(GROUPED_STATUSES)} rows, not {wrong[0]!r}"
            if wrong
            else "error groups need at least one status"
        )
    return tuple(dict.fromkeys(statuses))


async def _pages(
    engine: AsyncEngine, statuses: Sequence[str], limit: int | None
) -> AsyncIterator[Sequence[Any]]:
    """Rows of ``statuses``, newest first, one keyset page per short read transaction.

    Each status is paged on its own (status, id) range of ix_outbox_events_backlog_id.
    """
    reader = read_only_engine(engine)
    left = limit
    for status in statuses:
        before: str | None = None
        while left is None or left > 0:
            page = _PAGE if left is None else min(_PAGE, left)
            stmt = select(*_COLUMNS).where(t.c.status == status)
            if before is not None:
                stmt = stmt.where(t.c.id < before)
            stmt = stmt.order_by(t.c.id.desc()).limit(page)
            async with storage_errors(engine.url), reader.connect() as conn:
                found = (await conn.execute(stmt)).all()
            if found:
                yield found
            if left is not None:
                left -= len(found)
            if len(found) < page:
                break
            before = found[-1].id


# Normalising is CPU work on every row: each page is done in a worker thread so the
# caller's event loop (the console) keeps running (see decision 0032).


def _add_page(groups: dict[str, ErrorGroup], rows: Sequence[Any]) -> None:
    for row in rows:
        message = normalise_error(error_text(row.last_error, row.dead_letter_reason))
        key = _hash(message)  # fingerprint(), without normalising twice
        group = groups.get(key)
        if group is None:
            group = groups[key] = ErrorGroup(key, message)
        group.add(row)


def _members_of(group: str, rows: Sequence[Any]) -> list[Any]:
    return [r for r in rows if fingerprint(error_text(r.last_error, r.dead_letter_reason)) == group]


async def error_groups(
    engine: AsyncEngine,
    *,
    statuses: Sequence[str] = GROUPED_STATUSES,
    scan_limit: int = DEFAULT_SCAN_LIMIT,
) -> ErrorGroups:
    """Group the newest ``scan_limit`` failed and dead-lettered rows by fingerprint."""
    if scan_limit < 1:
        raise ConfigurationError(f"scan_limit must be at least 1, got {scan_limit}")
    wanted = _check_statuses(statuses)
    groups: dict[str, ErrorGroup] = {}
    scanned = 0
    async for page in _pages(engine, wanted, scan_limit + 1):
        rows = page[: scan_limit - scanned]
        await asyncio.to_thread(_add_page, groups, rows)
        scanned += len(rows)
        if len(rows) < len(page):
            return ErrorGroups(_largest_first(groups), scanned, complete=False)
    return ErrorGroups(_largest_first(groups), scanned, complete=True)


async def group_members(
    engine: AsyncEngine, group: str, *, statuses: Sequence[str] = GROUPED_STATUSES
) -> GroupMembers:
    """Every row of the group ``group`` (a fingerprint) now, read in full."""
    wanted = _check_statuses(statuses)
    members: list[Any] = []
    async for page in _pages(engine, wanted, None):
        members.extend(await asyncio.to_thread(_members_of, group, page))
    members.sort(key=lambda r: r.id)
    return GroupMembers(
        fingerprint=group,
        ids=tuple(r.id for r in members),
        dead_letter_ids=tuple(r.id for r in members if r.status == DEAD_LETTER),
        by_type=dict(Counter(r.event_type for r in members).most_common()),
        members=tuple(
            GroupMember(
                r.id,
                r.status,
                r.event_type,
                r.tenant_id,
                r.created_at,
                error_text(r.last_error, r.dead_letter_reason),
            )
            for r in members
        ),
    )


def _hash(message: str) -> str:
    return hashlib.sha256(message.encode("utf-8")).hexdigest()[:FINGERPRINT_LENGTH]


def _largest_first(groups: dict[str, ErrorGroup]) -> list[ErrorGroup]:
    return sorted(groups.values(), key=lambda g: (-g.count, g.message))
