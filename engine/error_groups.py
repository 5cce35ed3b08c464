"""Which failures are the same failure: error fingerprints and error groups.

Failed rows and dead letters are grouped by a fingerprint of their error text
(``last_error``, or the dead-letter reason when there is none) with the parts that
differ from event to event normalised away: UUIDs, timestamps, quoted values, hex,
ids and numbers. ``orders.crm: HTTPError: 503 for order o-17`` and ``... 503 for
order o-92`` are one group, labelled ``orders.crm: HTTPError: <num> for order o-<num>``.

Nothing is stored: the groups are computed in Python from the failed and
dead-lettered rows, read newest first through ``ix_outbox_events_status_id`` in
keyset pages. ``error_groups`` reads at most ``scan_limit`` rows (it answers a
console that refreshes, and says when it stopped short); ``group_members``, which
feeds a replay, reads them all. A stored fingerprint column would make both
index lookups, but it would have to be written by every completion in
engine.store, and rows written before it existed would have none.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.database import read_only_engine, storage_errors
from engine.errors import ConfigurationError
from engine.schema import DEAD_LETTER, FAILED, outbox_events

t = outbox_events

#: Statuses whose rows carry an error worth grouping.
GROUPED_STATUSES = (FAILED, DEAD_LETTER)
#: Rows ``error_groups`` reads at most (newest first).
DEFAULT_SCAN_LIMIT = 50_000
FINGERPRINT_LENGTH = 12
NO_ERROR = "(no error text)"
_PAGE = 2_000

# Order matters: the wider shapes go first so a UUID is not read as hex and numbers.
_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
        "<uuid>",
    ),
    (
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?)?"
            r"(?:Z|[+-]\d{2}:?\d{2}\b)?"
        ),
        "<time>",
    ),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
    (re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""), "<str>"),
    (re.compile(r"\b0[xX][0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b\d+\.\d+\b"), "<num>"),
)
_TOKEN = re.compile(r"[A-Za-z0-9_-]*\d[A-Za-z0-9_-]*")
_DIGITS = re.compile(r"\d+")
# An id-like token: long enough that it names one thing (a hash, "cus_9aB3xQ", "order-123456").
_ID_LENGTH = 8
_REPEATS = re.compile(r"(<(?:uuid|time|str|hex|num|id)>)(?:,\s*\1)+")
_SPACE = re.compile(r"\s+")


def _token(match: re.Match[str]) -> str:
    token = match.group(0)
    if len(token) >= _ID_LENGTH and not token.isdigit():
        return "<id>"
    return _DIGITS.sub("<num>", token)


def normalise_error(error: str | None) -> str:
    """The error text with what varies per event replaced by ``<uuid>``, ``<num>``, ...

    Short words with a digit keep their letters (``o-17`` reads ``o-<num>``, ``utf8``
    ``utf<num>``); long ones are ids (``<id>``). A comma-separated list of one
    placeholder (``ids 4, 5, 6``) reads as one.
    """
    if error is None or not error.strip():
        return NO_ERROR
    text = error
    for pattern, placeholder in _RULES:
        text = pattern.sub(placeholder, text)
    text = _TOKEN.sub(_token, text)
    text = _REPEATS.sub(r"\1", text)
    return _SPACE.sub(" ", text).strip()


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
    # created_at of the group's oldest and newest event
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
class GroupMembers:
    """The rows of one group now: ids (oldest first) by status, and counts by type."""

    fingerprint: str
    ids: tuple[str, ...]
    dead_letter_ids: tuple[str, ...]
    by_type: dict[str, int]


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


async def _rows(
    engine: AsyncEngine, statuses: Sequence[str], limit: int | None
) -> AsyncIterator[Any]:
    """Rows of ``statuses``, newest first, one keyset page per short read transaction.

    Each status is paged on its own (status, id) range of ix_outbox_events_status_id.
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
            for row in found:
                yield row
            if left is not None:
                left -= len(found)
            if len(found) < page:
                break
            before = found[-1].id


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
    async for row in _rows(engine, wanted, scan_limit + 1):
        if scanned == scan_limit:
            return ErrorGroups(_largest_first(groups), scanned, complete=False)
        scanned += 1
        message = normalise_error(error_text(row.last_error, row.dead_letter_reason))
        key = _hash(message)  # fingerprint(), without normalising twice
        group = groups.get(key)
        if group is None:
            group = groups[key] = ErrorGroup(key, message)
        group.add(row)
    return ErrorGroups(_largest_first(groups), scanned, complete=True)


async def group_members(
    engine: AsyncEngine, group: str, *, statuses: Sequence[str] = GROUPED_STATUSES
) -> GroupMembers:
    """Every row of the group ``group`` (a fingerprint) now, read in full."""
    wanted = _check_statuses(statuses)
    ids: list[tuple[str, str]] = []
    by_type: Counter[str] = Counter()
    async for row in _rows(engine, wanted, None):
        if fingerprint(error_text(row.last_error, row.dead_letter_reason)) == group:
            ids.append((row.id, row.status))
            by_type[row.event_type] += 1
    ids.sort()
    return GroupMembers(
        fingerprint=group,
        ids=tuple(i for i, _ in ids),
        dead_letter_ids=tuple(i for i, s in ids if s == DEAD_LETTER),
        by_type=dict(by_type.most_common()),
    )


def _hash(message: str) -> str:
    return hashlib.sha256(message.encode("utf-8")).hexdigest()[:FINGERPRINT_LENGTH]


def _largest_first(groups: dict[str, ErrorGroup]) -> list[ErrorGroup]:
    return sorted(groups.values(), key=lambda g: (-g.count, g.message))
