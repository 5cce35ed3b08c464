"""Every statement that changes an outbox row, in one place.

Why one module (about 600 lines): the fence every completion re-checks (status,
holder, ``claim_version``, expiry) is written once here and must match the claim
that set it; keeping every row change together lets one review see that no write
goes around the fence.

Each state change is a conditional update: a claim only takes rows that are
due and unleased, and every completion re-checks the dispatcher's lease
(status, holder, fencing token ``claim_version`` and expiry). A completion that
matches nothing is a lost lease and changes nothing.

The one dialect difference is the claim. PostgreSQL locks candidate rows with
``FOR UPDATE SKIP LOCKED`` in a CTE so concurrent dispatchers take disjoint
batches without waiting. SQLite has no row locks (SQLAlchemy emits no FOR
UPDATE there), so the claim is one ``UPDATE ... WHERE id IN (SELECT ...)
RETURNING`` statement inside a ``BEGIN IMMEDIATE`` transaction: the database
write lock makes select-and-update atomic across processes.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Text,
    TextClause,
    and_,
    bindparam,
    case,
    column,
    select,
    text,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.selectable import TextualSelect

from engine.storage.database import as_dbapi_error
from engine.storage.schema import (
    DEAD_LETTER,
    FAILED,
    IN_FLIGHT_PREDICATE,
    KEY_TURN,
    KEY_UNFINISHED_PREDICATE,
    KEYED_PREDICATE,
    LEASED_PREDICATE,
    PENDING,
    PUBLISHED,
    PUBLISHING,
    UNORDERED_PREDICATE,
    WAITING_PREDICATE,
    UtcDateTime,
    outbox_events,
)

t = outbox_events
_ERROR_LIMIT = 4000


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    """A row this dispatcher holds: its columns and the fencing token it was claimed with."""

    values: Mapping[Any, Any]  # the result row's own mapping, keyed by column name
    raw_payload: Any

    @property
    def event_id(self) -> str:
        return str(self.values["id"])

    @property
    def seq(self) -> int:
        """Its write order; 0 for a SQLite row whose ``seq`` was nulled by hand (the column
        is nullable there, its trigger fills it), so one such row cannot stop every claim
        that takes it. PostgreSQL's identity column cannot be null."""
        seq = self.values["seq"]
        return seq if type(seq) is int else 0 if seq is None else int(seq)

    @property
    def ordering_key(self) -> str | None:
        key = self.values["ordering_key"]
        return None if key is None else str(key)

    @property
    def claim_version(self) -> int:
        return int(self.values["claim_version"])

    @property
    def attempt_count(self) -> int:
        return int(self.values["attempt_count"])

    @property
    def max_attempts(self) -> int:
        return int(self.values["max_attempts"])

    def problem(self) -> str | None:
        """What makes this row undeliverable as stored, naming the column; None if nothing.

        PostgreSQL's column types refuse such rows at INSERT, and so do the CHECKs of
        SQLite tables this version made; an older SQLite table takes anything. A row is
        judged on its own, so one bad row never breaks the batch it was claimed with.
        """
        values = self.values
        # Every delivered row passes through here: the common case is one expression
        # (about half the time of the loops below, which name the bad column).
        if (
            type(values["event_version"]) is int
            and type(values["attempt_count"]) is int
            and type(values["replay_count"]) is int
            and type(max_attempts := values["max_attempts"]) is int
            and max_attempts >= 1
            and values["created_at"] is not None
            and type(values["tenant_id"]) is str
            and type(values["event_type"]) is str
            and type(values["aggregate_type"]) is str
            and type(values["aggregate_id"]) is str
        ):
            return None
        for name in ("event_version", "max_attempts", "attempt_count", "replay_count"):
            if type(values[name]) is not int:
                return f"corrupt row: column {name} is {values[name]!r}, not an integer"
        if values["max_attempts"] < 1:
            return (
                f"corrupt row: column max_attempts is {values['max_attempts']}, must be at least 1"
            )
        if values["created_at"] is None:
            return "corrupt row: column created_at is not a timestamp"
        for name in ("tenant_id", "event_type", "aggregate_type", "aggregate_id"):
            if not isinstance(values[name], str):
                return f"corrupt row: column {name} is {values[name]!r}, not text"
        return None

    def decoded_payload(self) -> Any:
        """The payload, decoded here so one corrupt row cannot break a whole batch."""
        raw = self.raw_payload
        if type(raw) is str:
            return decode_json(raw)
        if isinstance(raw, str | bytes):
            return json.loads(raw, parse_constant=_not_json)
        return raw


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Strict: Python's decoder takes NaN and Infinity, which no JSON parser does (PostgreSQL's
# json type refuses them; an SQLite table without the json_valid CHECK may hold them). A
# payload with them is corrupt, not relayed as a body consumers cannot parse.
_DECODER = json.JSONDecoder(parse_constant=_not_json)
# The C scanner json.loads ends in. json.loads itself first checks the argument's type
# and matches leading and trailing white space with two regular expressions: for a
# payload of 80 bytes 1.5 µs, against 0.6 µs for the scan, on every delivered event.
_SCAN = getattr(_DECODER, "scan_once", None)


def decode_json(text: str) -> Any:
    """``json.loads(text)``, by the scanner alone when the text is one bare JSON value.

    Anything else (white space around it, trailing data, an error) goes to
    ``json.loads``, so what is accepted and every error message stay its own.
    """
    if _SCAN is not None:
        try:
            value, end = _SCAN(text, 0)
        except (StopIteration, ValueError):
            pass
        else:
            if end == len(text):
                return value
    return json.loads(text, parse_constant=_not_json)


# Why a payload that is valid JSON cannot be decoded: it nests deeper than the recursion
# limit lets json's decoder go (a RecursionError, not a ValueError). SQLite's JSON check
# allows 1,000 levels and PostgreSQL's jsonb more: such a row can be stored.
PAYLOAD_TOO_DEEP = "nested too deeply to decode"


def truncate_error(message: str) -> str:
    return message if len(message) <= _ERROR_LIMIT else message[: _ERROR_LIMIT - 1] + "…"


# The claim, as SQL text: a recursive walk over keys reads better here than its
# SQLAlchemy spelling. Three parts, each a CTE:
#
# abandoned  one row whose lease expired, reclaimed alone (see claim_batch).
# ordered    the heads of ordering keys. ``keys`` walks the distinct keys that have
#            unfinished rows (a skip scan: one index probe per key, from the dispatcher's
#            key cursor on), each key's first unfinished row is its head, and a head is
#            claimed only if it is due and no row of its key is in flight. PostgreSQL
#            reads all three from one probe of ix_outbox_events_key_turn per key; SQLite
#            walks ix_outbox_events_key_order, then probes ix_outbox_events_key_in_flight.
#            Rows queued behind a head are never visited.
# unordered  due rows without a key, in seq order, through ix_outbox_events_waiting.
#
# The two sources share the batch; which one fills it first alternates by round. On
# PostgreSQL, FOR UPDATE SKIP LOCKED makes concurrent dispatchers take disjoint rows and
# re-checks each locked row against its latest version. On SQLite the statement runs
# inside BEGIN IMMEDIATE: the write lock makes it atomic across processes.
def _due(alias: str) -> str:
    return (
        f"{alias}.status IN ('pending', 'failed') "
        f"AND ({alias}.next_retry_at IS NULL OR {alias}.next_retry_at <= :now) "
        f"AND ({alias}.locked_until IS NULL OR {alias}.locked_until < :now)"
    )


_DUE = _due("e")


def _ref(dialect: str) -> str:
    """How each part of the claim names a row it picks: its address on PostgreSQL (the
    update fetches it directly), its id on SQLite."""
    return "ctid AS ref" if dialect == "postgresql" else "id AS ref"


_UNFINISHED_KEYED = f"{KEYED_PREDICATE} AND {KEY_UNFINISHED_PREDICATE}"


def _table_for(dialect: str) -> Callable[..., str]:
    def table(index: str, alias: str = "") -> str:
        # SQLite's planner, like PostgreSQL's on tiny tables, may prefer another index;
        # INDEXED BY pins the one each part is written for (and fails loudly without it).
        named = f"outbox_events AS {alias}" if alias else "outbox_events"
        return named if dialect == "postgresql" else f"{named} INDEXED BY ix_outbox_events_{index}"

    return table


def _from_cursor(include_cursor_key: bool) -> str:
    """Where a walk starts: at the keys after ``:key_cursor``, or at that key itself."""
    return "ordering_key >= :key_cursor" if include_cursor_key else "ordering_key > :key_cursor"


def _key_walk(table: Callable[..., str], unfinished: str, include_cursor_key: bool) -> str:
    """Distinct keys with unfinished rows from ``:key_cursor`` on: at most ``:walk_limit``."""
    return f"""keys(k, n) AS (
    SELECT min(ordering_key), 1 FROM {table("key_order")}
    WHERE {_from_cursor(include_cursor_key)} AND {unfinished}
    UNION ALL
    SELECT (SELECT min(ordering_key) FROM {table("key_order")}
            WHERE ordering_key > keys.k AND {unfinished}), keys.n + 1
    FROM keys WHERE keys.k IS NOT NULL AND keys.n < :walk_limit
)"""


# ix_outbox_events_key_turn's order: a key's rows in flight first, then its rows at rest
# in write order (engine.storage.schema.KEY_TURN).
_KEY_TURN_ORDER = f"ordering_key, {KEY_TURN}, seq"


def _key_walk_with_heads(unfinished: str, include_cursor_key: bool) -> str:
    """PostgreSQL's walk: each step's one probe finds the next key, its head, and whether
    a row of the key is in flight, at once.

    The first unfinished entry after key ``k`` in ix_outbox_events_key_turn is a row of
    the next key in flight, if there is one, else the key's head (its first unfinished
    row in ``seq`` order). So one index scan per key replaces the three of ``_key_walk``
    with SQLite's heads and in-flight probe: mid-drain, each probe also steps over the
    dead entries of rows published since the last vacuum. The step has that row in
    hand, so it also says where the row is (``ctid``) and whether it is a due head (a
    row in flight never is): ``ordered`` then fetches only due heads, by row address,
    not again through the primary key. A key in flight costs its one probe and nothing
    more.
    """
    head = f"ordering_key, ctid, w.locked_by IS NULL AND {_due('w')}"
    return f"""keys(k, head, due, n) AS (
    (SELECT {head}, 1 FROM outbox_events AS w
     WHERE {_from_cursor(include_cursor_key)} AND {unfinished}
     ORDER BY {_KEY_TURN_ORDER} LIMIT 1)
    UNION ALL
    SELECT next_head.ordering_key, next_head.ctid, next_head.due, keys.n + 1
    FROM keys CROSS JOIN LATERAL (
        SELECT {head} AS due FROM outbox_events AS w
        WHERE ordering_key > keys.k AND {unfinished}
        ORDER BY {_KEY_TURN_ORDER} LIMIT 1
    ) AS next_head
    WHERE keys.n < :walk_limit
)"""


# SQLite's heads: each key's first unfinished row, looked up after the walk found the key.
_HEADS_OF_KEYS = """SELECT (SELECT id FROM {key_order}
            WHERE ordering_key = keys.k AND {unfinished}
            ORDER BY seq LIMIT 1) AS id
    FROM keys WHERE keys.k IS NOT NULL"""


_NO_JIT = text("SET LOCAL jit = off")


@functools.cache
def _walk_end_statement(dialect: str, include_cursor_key: bool) -> TextClause:
    """The last key a capped walk from ``:key_cursor`` reaches, and how many it saw."""
    walk = _key_walk(_table_for(dialect), _UNFINISHED_KEYED, include_cursor_key)
    return text(
        f"WITH RECURSIVE {walk} SELECT k, n FROM keys WHERE k IS NOT NULL ORDER BY n DESC LIMIT 1"
    )


@functools.cache
def _keys_passed_statement(dialect: str) -> TextClause:
    """Whether a key with unfinished rows lies after ``:after`` or before ``:before``: one
    probe each into ix_outbox_events_key_order.

    In key order, so through that index: for a bare EXISTS PostgreSQL's planner chose a
    sequential scan, expecting a match at once, and read every published row first.
    """
    table = _table_for(dialect)("key_order")

    def first(where: str) -> str:
        return (
            f"(SELECT ordering_key FROM {table} WHERE {where} AND {_UNFINISHED_KEYED} "
            "ORDER BY ordering_key LIMIT 1) IS NOT NULL"
        )

    return text(f"SELECT {first('ordering_key > :after')} OR {first('ordering_key < :before')}")


@dataclass(frozen=True, slots=True)
class ClaimScope:
    """Which rows a dispatcher may claim: the event types it can deliver, minus pauses.

    ``types`` are the types this dispatcher serves (its handlers, or everything its
    relay can publish) with fully paused types already taken out; ``paused_pairs``
    are (event_type, tenant_id) pairs paused for one tenant. Rows outside the scope
    stay as they are, spending no attempt: another dispatcher may serve them, and a
    paused type waits for its resume. A key whose head is out of scope waits too.
    """

    types: frozenset[str]
    paused_pairs: frozenset[tuple[str, str]] = frozenset()

    def admits(self, event_type: str, tenant_id: str) -> bool:
        return event_type in self.types and (event_type, tenant_id) not in self.paused_pairs


# Above this many served types with waiting rows, the unordered claim walks the seq
# index with the type filter instead of one index range per type.
_PER_TYPE_LIMIT = 16
_PAIR_SEPARATOR = 31  # ASCII unit separator: cannot occur in a type name someone types


def _scope_filter(dialect: str, alias: str, paused_pairs: bool) -> str:
    """SQL that admits a row of ``alias`` only within the claim scope (see ClaimScope).

    The per-tenant part only while some (type, tenant) pair is paused: otherwise it
    is true of every row, and each row paid a concatenation and a lookup for it.
    """
    if dialect == "postgresql":
        types = f"{alias}.event_type = ANY(:scope_types)"
        pairs = (
            f"NOT ({alias}.event_type || chr({_PAIR_SEPARATOR}) || {alias}.tenant_id "
            "= ANY(:scope_pairs))"
        )
    else:
        types = f"{alias}.event_type IN (SELECT value FROM json_each(:scope_types))"
        pairs = (
            f"{alias}.event_type || char({_PAIR_SEPARATOR}) || {alias}.tenant_id "
            "NOT IN (SELECT value FROM json_each(:scope_pairs))"
        )
    return f"{types} AND {pairs}" if paused_pairs else types


def _scope_params(dialect: str, scope: ClaimScope) -> dict[str, Any]:
    types = sorted(scope.types)
    pairs = sorted(f"{t}{chr(_PAIR_SEPARATOR)}{tenant}" for t, tenant in scope.paused_pairs)
    if dialect == "postgresql":
        return {"scope_types": types, "scope_pairs": pairs}
    return {"scope_types": json.dumps(types), "scope_pairs": json.dumps(pairs)}


@functools.cache
def _waiting_types_statement(dialect: str) -> TextClause:
    """Distinct event types of waiting unordered rows: one index probe per type."""
    table = _table_for(dialect)("waiting_type")
    where = f"{WAITING_PREDICATE} AND {UNORDERED_PREDICATE}"
    return text(
        f"""WITH RECURSIVE types(t) AS (
    SELECT min(event_type) FROM {table} WHERE {where}
    UNION ALL
    SELECT (SELECT min(event_type) FROM {table} WHERE event_type > types.t AND {where})
    FROM types WHERE types.t IS NOT NULL
)
SELECT t FROM types WHERE t IS NOT NULL"""
    )


@dataclass(frozen=True, slots=True)
class ClaimShape:
    """What varies between claim statements: one statement (and one cached compiled form)
    per shape. ``scoped``: limited to a ClaimScope; ``per_type``: ranges per served type
    (_unordered_cte); ``paused_pairs``: some (type, tenant) pair is paused."""

    ordered_first: bool = True
    scoped: bool = False
    per_type: int | None = None
    include_cursor_key: bool = False
    paused_pairs: bool = False


def _scope_clause(dialect: str, shape: ClaimShape) -> str:
    """`` AND `` the scope filter on alias ``e``, for a scoped shape; else nothing."""
    return f" AND {_scope_filter(dialect, 'e', shape.paused_pairs)}" if shape.scoped else ""


def _unordered_cte(dialect: str, limit: str, lock: str, shape: ClaimShape) -> str:
    """Due unordered rows in seq order: one walk of the seq index, or one range per type.

    With a scope, rows of types outside it may sit in the seq index in any number (a
    type no running dispatcher serves, a paused type); a number ``per_type`` reads only
    the ranges of that many served types (``:type_0``...) in
    ix_outbox_events_waiting_type and merges them by seq, so those rows are never
    walked (0: no served type has waiting rows). None walks the seq index.
    """
    table = _table_for(dialect)
    ref = _ref(dialect)
    scope = _scope_clause(dialect, shape)
    per_type = shape.per_type
    where = (
        f"{WAITING_PREDICATE} AND {UNORDERED_PREDICATE} AND e.seq >= :seq_floor "
        f"AND NOT EXISTS (SELECT 1 FROM abandoned) AND {_DUE}{scope}"
    )
    if per_type == 0:
        # No table at all: SQLite scans a whole index for "FROM outbox_events WHERE 1 = 0"
        # here (tests/engine/test_query_plans.py), the very walk over waiting rows of other
        # types that the ranges avoid.
        nothing = "tid" if dialect == "postgresql" else "VARCHAR"
        return f"unordered AS (SELECT CAST(NULL AS {nothing}) AS ref WHERE 1 = 0)"
    if per_type is None:
        return f"""unordered AS (
    SELECT e.{ref} FROM {table("waiting", "e")}
    WHERE {where}
    ORDER BY e.seq LIMIT {limit}{lock}
)"""
    ranges = "\n    UNION ALL ".join(
        f"SELECT * FROM (SELECT e.{ref}, e.seq FROM {table('waiting_type', 'e')} "
        f"WHERE e.event_type = :type_{i} AND {where} "
        f"ORDER BY e.seq LIMIT {limit}{lock}) AS r{i}"
        for i in range(per_type)
    )
    return f"""unordered AS (
    SELECT u.ref FROM (
    {ranges}
    ) AS u ORDER BY u.seq LIMIT {limit}
)"""


def _claim_sql(dialect: str, shape: ClaimShape) -> str:
    ordered_first, include_cursor_key = shape.ordered_first, shape.include_cursor_key
    lock = " FOR UPDATE OF e SKIP LOCKED" if dialect == "postgresql" else ""
    table = _table_for(dialect)
    unfinished = _UNFINISHED_KEYED
    first, second = ("ordered", "unordered") if ordered_first else ("unordered", "ordered")
    ref = _ref(dialect)
    limits = {first: ":batch", second: f"(:batch - (SELECT count(*) FROM {first}))"}
    scope = _scope_clause(dialect, shape)
    if dialect == "postgresql":
        # keys.due: the walk found the key's head, and no row of the key in flight.
        ordered = f"""SELECT e.ctid AS ref FROM keys CROSS JOIN outbox_events AS e
    WHERE keys.due AND e.ctid = keys.head AND NOT EXISTS (SELECT 1 FROM abandoned)
    AND {_DUE}{scope}
    LIMIT {limits["ordered"]}{lock}"""
    else:
        in_flight = f"""(
        SELECT 1 FROM {table("key_in_flight", "f")}
        WHERE f.ordering_key = e.ordering_key AND {KEYED_PREDICATE} AND {IN_FLIGHT_PREDICATE}
        LIMIT 1
    ) IS NULL"""
        # Each head looked up on its own, not joined: for the join SQLite builds a Bloom
        # filter over the table first, a walk over every row however few keys there are
        # (test_query_plans). Heads keep the walk's key order.
        ordered = f"""SELECT heads.id AS ref FROM heads
    WHERE NOT EXISTS (SELECT 1 FROM abandoned) AND EXISTS (
        SELECT 1 FROM outbox_events AS e
        WHERE e.id = heads.id AND {_DUE}{scope} AND {in_flight}
    )
    LIMIT {limits["ordered"]}"""
    picked = """(
    SELECT ref FROM abandoned
    UNION ALL SELECT ref FROM ordered
    UNION ALL SELECT ref FROM unordered
)"""
    # SQLite: the heads of the walk's keys (PostgreSQL's walk found them as it went).
    heads = (
        ""
        if dialect == "postgresql"
        else "heads AS (\n    "
        + _HEADS_OF_KEYS.format(key_order=table("key_order"), unfinished=unfinished)
        + "\n),\n"
    )
    # PostgreSQL: an array of the picked rows' addresses (ctid), so the update fetches
    # each row directly (a TID scan), not again through the primary key, whatever the
    # planner guesses of the CTEs' sizes. Each part locked its rows (FOR UPDATE), so none
    # moves before the update. A row that another transaction changed after this
    # statement's snapshot and that is still due is locked at its new address, which the
    # update cannot see: it is left as it is for the next claim, never claimed twice.
    claimed = f"ctid = ANY(ARRAY{picked})" if dialect == "postgresql" else f"id IN {picked}"
    walk = (
        _key_walk_with_heads(unfinished, include_cursor_key)
        if dialect == "postgresql"
        else _key_walk(table, unfinished, include_cursor_key)
    )
    return f"""
WITH RECURSIVE
abandoned AS (
    SELECT e.{ref} FROM {table("lease_expiry", "e")}
    WHERE e.{LEASED_PREDICATE} AND e.locked_until < :now{scope}
    ORDER BY e.locked_until LIMIT 1{lock}
),
{walk},
{heads}ordered AS (
    {ordered}
),
{_unordered_cte(dialect, limits["unordered"], lock, shape)}
UPDATE outbox_events SET
    status = 'publishing',
    locked_by = :dispatcher_id,
    locked_until = :locked_until,
    claim_version = claim_version + 1,
    attempt_count = attempt_count + 1
WHERE {claimed}
"""


# What a claim returns of each row: what delivery reads (ClaimedRow, its problem check,
# EventEnvelope.from_row), nothing else. The delivery-state columns (status, lease,
# errors, the published and replay times) are the claim's own writes or unused. All
# columns cost about 30k more instructions a row on SQLite (a tenth of a bare claim and
# completion): five more timestamps through UtcDateTime.
CLAIM_RETURNS = (
    "id",
    "tenant_id",
    "event_type",
    "event_version",
    "aggregate_type",
    "aggregate_id",
    "ordering_key",
    "seq",
    "claim_version",
    "attempt_count",
    "max_attempts",
    "replay_count",
    "created_at",
)


@functools.cache
def _claim_statement(dialect: str, shape: ClaimShape) -> TextualSelect:
    returned = [t.c[name] for name in CLAIM_RETURNS]
    returning = ", ".join(c.name for c in returned) + ", payload"
    params: list[BindParameter[Any]] = [
        bindparam("now", type_=UtcDateTime()),
        bindparam("locked_until", type_=UtcDateTime()),
    ]
    if dialect == "postgresql":
        returning = returning.replace("payload", "payload::text AS payload")
        if shape.scoped:
            params.append(bindparam("scope_types", type_=ARRAY(Text)))
        if shape.scoped and shape.paused_pairs:
            params.append(bindparam("scope_pairs", type_=ARRAY(Text)))
    return (
        text(_claim_sql(dialect, shape) + "RETURNING " + returning)
        .bindparams(*params)
        .columns(*returned, column("payload", Text))
    )


async def _per_type_plan(conn: AsyncConnection, scope: ClaimScope | None) -> list[str] | None:
    """The served types to read one by one, or None to walk the seq index (_unordered_cte).

    Ranges per type pay off only while rows of types outside the scope wait: then
    walking the seq index would step over all of them on every claim.
    """
    if scope is None:
        return None
    waiting = set((await conn.execute(_waiting_types_statement(conn.dialect.name))).scalars())
    paused_waiting = {t for t, _tenant in scope.paused_pairs if t in waiting}
    if waiting <= scope.types and not paused_waiting:
        return None
    served = sorted(waiting & scope.types)
    return served if len(served) <= _PER_TYPE_LIMIT else None


# A dispatcher's keyset floor (claim_batch's ``seq_floor``) goes back to 0 at least this
# often, so rows below it that became due again wait at most this long.
SEQ_FLOOR_RESET = timedelta(seconds=1)


_DRIVER_SQL: dict[TextualSelect, tuple[str, tuple[str, ...]]] = {}


def _driver_sql(stmt: TextualSelect, dialect: Dialect) -> tuple[str, tuple[str, ...]]:
    """``stmt`` as asyncpg runs it: its SQL with ``$n`` parameters, and their names in order.

    Compiled once per statement (the claim statements are cached themselves).
    """
    found = _DRIVER_SQL.get(stmt)
    if found is None:
        compiled = stmt.compile(dialect=dialect)
        found = _DRIVER_SQL[stmt] = (compiled.string, tuple(compiled.positiontup or ()))
    return found


async def _fetch_on_driver(
    conn: AsyncConnection, stmt: TextualSelect, values: Mapping[str, Any]
) -> list[Any]:
    """Run the claim on the connection's asyncpg connection, in its transaction.

    asyncpg's records are the rows (mapping access by column name, timestamps already
    aware): SQLAlchemy's per-row result processing was a fifth of a no-op delivery's
    CPU (3 µs a row). The transaction is SQLAlchemy's (begun by the claim's first
    statement, ``SET LOCAL jit``), errors are translated as ``execute`` would raise them
    (engine.storage.database.as_dbapi_error), and the claim's parameters need no bind
    processing (aware UTC datetimes, text, integers and text arrays).
    """
    sql, names = _driver_sql(stmt, conn.dialect)
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    assert driver is not None and driver.is_in_transaction(), "the claim runs in a transaction"
    try:
        return list(await driver.fetch(sql, *(values[name] for name in names)))
    except Exception as exc:
        raise as_dbapi_error(conn.dialect, sql, exc) from exc


@dataclass(frozen=True, slots=True)
class ClaimedBatch:
    """The rows one claim took, and where this dispatcher's walk over keys got to."""

    rows: list[ClaimedRow]
    key_cursor: str
    # Where this dispatcher's next unordered claim may start (see claim_batch).
    seq_floor: int = 0
    # The unordered part's plan, for the next claim from the floor (see claim_batch).
    ranges: tuple[str, ...] | None = None
    # The next walk starts at the cursor's key itself, not after it (see claim_batch).
    include_cursor_key: bool = False


async def claim_batch(
    conn: AsyncConnection,
    *,
    dispatcher_id: str,
    batch_size: int,
    lease: timedelta,
    now: datetime,
    key_cursor: str = "",
    include_cursor_key: bool = False,
    seq_floor: int = 0,
    ordered_first: bool = True,
    walk_limit: int | None = None,
    scope: ClaimScope | None = None,
    ranges: tuple[str, ...] | None = None,
) -> ClaimedBatch:
    """Claim up to ``batch_size`` due rows in one statement (see ``_claim_sql``).

    A row whose lease expired is reclaimed alone, one per claim, ahead of waiting
    rows: if it is what killed the last dispatcher, it can only spend its own
    attempts, never those of a whole batch of innocent rows claimed with it.

    Ordered rows are heads of their keys only, at most one per key, and only
    while no other row of the key is in flight. ``key_cursor`` is where the walk
    over keys starts (keys after it, or from it with ``include_cursor_key``); the
    returned cursor continues the walk next time, or starts over when this walk
    reached the last key. A walk visits at most ``walk_limit`` keys (default: 4 x
    batch, at least 100), so many blocked keys cost bounded work per claim.

    A claim that found no key due after its cursor went round from the first key. If
    it had to pass keys it could not take (after the cursor, or before the keys it
    took), those are in flight with other dispatchers or blocked, and most likely
    still are when this dispatcher claims next: the next walk starts at this batch's
    first key, whose events are the ones it is free to take, instead of walking the
    others' keys once more and going round again. Only the claim right after such a
    one: that claim goes on after its last key as usual, so every key is still
    reached within a lap plus one batch.

    ``seq_floor`` (a keyset floor) starts the unordered part at that ``seq``: a
    dispatcher that claimed a full batch goes on after its last unordered row instead of
    walking again, from the start of ix_outbox_events_waiting, over the entries of
    every row published since the last vacuum (PostgreSQL keeps them until then: on a
    large backlog that walk was most of a claim). Rows below the floor that become due
    again (a retry, a hand-back) are found when a claim from the floor finds nothing
    (it goes round from 0 at once) and when the dispatcher starts from 0 again, which
    it does at least every ``SEQ_FLOOR_RESET``. The returned floor is the one to pass
    next time.

    ``scope`` (None: every row) limits the claim to the event types the dispatcher
    can deliver, without pauses; rows outside it are left untouched (ClaimScope).
    ``ranges`` is the unordered part's plan a claim from a floor reuses: the returned
    batch's ``ranges``, from the last claim (see _per_type_plan).
    """
    walk_limit = walk_limit or max(4 * batch_size, 100)
    dialect = conn.dialect.name
    if dialect == "postgresql":
        # Never JIT-compile a claim: it runs in milliseconds, compiling takes hundreds.
        # The key walk's probes are estimated per step from a generic range selectivity,
        # so on a large backlog without keys the estimate passes jit_above_cost.
        await conn.execute(_NO_JIT)
    if scope is not None and not scope.types:
        return ClaimedBatch([], key_cursor)  # serves nothing now (all paused): claim nothing
    common = {
        **(_scope_params(dialect, scope) if scope is not None else {}),
        "now": now,
        "locked_until": now + lease,
        "dispatcher_id": dispatcher_id,
        "batch": batch_size,
        "walk_limit": walk_limit,
    }

    async def claim_from(cursor: str, floor: int, include_cursor: bool) -> list[ClaimedRow]:
        # Only a claim from the first row plans the unordered part anew; one from a floor
        # keeps the plan its dispatcher passed back (``ranges``). The plan's probe walks
        # ix_outbox_events_waiting_type from its start, over the dead entries of every
        # row claimed since the last vacuum: 3.6 ms a claim at 1,000,000 rows, a tenth
        # of PostgreSQL's time in that drain. A served type that starts waiting while
        # the plan reads ranges of others is read from the next claim from the first
        # row, within SEQ_FLOOR_RESET, as rows below a floor are. The plan is only a
        # route: each range still filters by the scope, so a pause holds at once.
        nonlocal ranges
        if floor == 0 or scope is None:
            planned = await _per_type_plan(conn, scope)
            ranges = None if planned is None else tuple(planned)
        shape = ClaimShape(
            ordered_first,
            scope is not None,
            None if ranges is None else len(ranges),
            include_cursor,
            scope is not None and bool(scope.paused_pairs),
        )
        stmt = _claim_statement(dialect, shape)
        values = {
            **common,
            **{f"type_{i}": name for i, name in enumerate(ranges or ())},
            "key_cursor": cursor,
            "seq_floor": floor,
        }
        records: Iterable[Any]
        if dialect == "postgresql":
            records = await _fetch_on_driver(conn, stmt, values)
        else:
            records = (await conn.execute(stmt, values)).mappings()
        # The row's own mapping (no copy per row): read-only, as ClaimedRow needs.
        return [ClaimedRow(values=row, raw_payload=row["payload"]) for row in records]

    rows = await claim_from(key_cursor, seq_floor, include_cursor_key)
    went_round_from = None  # the key cursor of a claim that found nothing after it
    if not rows and (key_cursor or seq_floor):
        # Nothing due after the cursor or the floor: go round from the first key and the
        # first row now, in the same transaction, rather than report an empty round (the
        # run loop would sleep on it).
        went_round_from = key_cursor or None
        key_cursor, include_cursor_key, seq_floor = "", False, 0
        rows = await claim_from(key_cursor, seq_floor, include_cursor_key)
    rows.sort(key=lambda r: r.seq)
    full = len(rows) >= batch_size
    unordered = [r.seq for r in rows if r.ordering_key is None]
    # A full batch goes on after its last unordered row; one that is not full (nothing
    # more is due above the floor) starts from the first row next time.
    next_floor = (max(unordered) + 1 if unordered else seq_floor) if full else 0
    keys = [r.ordering_key for r in rows if r.ordering_key is not None]
    if keys and full:
        # Python's string order is the keys' order in the database: bytes of UTF-8
        # (COLLATE "C" on PostgreSQL, BINARY on SQLite). It only says where the next
        # walk starts, never which rows it may take.
        first, last = min(keys), max(keys)
        if went_round_from is not None:
            passed = {"after": max(went_round_from, last), "before": first}
            if (await conn.execute(_keys_passed_statement(dialect), passed)).scalar():
                return ClaimedBatch(rows, first, next_floor, ranges, include_cursor_key=True)
        # the batch filled up: go on after its last key
        return ClaimedBatch(rows, last, next_floor, ranges)
    if full and not ordered_first:
        # Unordered rows went first and filled the batch: the walk never ran (no room
        # was left for heads), so it starts where it would have this time.
        return ClaimedBatch(rows, key_cursor, next_floor, ranges, include_cursor_key)
    # The walk either reached the last key (start over next time) or stopped at its cap
    # among keys that are blocked or in flight (go on after the last key it saw).
    walk = {"key_cursor": key_cursor, "walk_limit": walk_limit}
    walk_end = _walk_end_statement(dialect, include_cursor_key)
    end = (await conn.execute(walk_end, walk)).first()
    capped = end is not None and int(end.n) >= walk_limit
    cursor = str(end.k) if capped and end is not None else ""
    return ClaimedBatch(rows, cursor, next_floor, ranges)


@dataclass(frozen=True, slots=True)
class Fence:
    """Who completes, and when: a completion holds only if the lease is still this one's."""

    dispatcher_id: str
    now: datetime


# A fenced update finds its rows by id (the primary key) and tests holder, status and
# lease as one opaque filter on each row found: "IS TRUE" keeps them out of the planner's
# index matching and out of its row estimates. Spelled plainly, statistics taken while
# few rows were in flight (a preload, a quiet hour) say that ``locked_by = :me``,
# ``status = 'publishing'`` and ``locked_until > now`` each match a row or two, and the
# planner trusted that: it walked the status index's publishing range (up to 0.5) or
# ix_outbox_events_lease_expiry, whose ranges also hold an entry for every row claimed
# since the last vacuum (a 1,000,000-event drain slowed by a third as it went), or it
# scanned the table for the holder (docs/dispatcher.md, "A fenced update probes ids").
def _held(fence: Fence) -> Any:
    return and_(
        t.c.locked_by == fence.dispatcher_id,
        t.c.status == PUBLISHING,
        t.c.locked_until > fence.now,
    ).is_(true())


_RELEASE_LOCK = {"locked_by": None, "locked_until": None}


# PostgreSQL: the batch's claims travel as two strings (the ids each after a character none
# of them holds, the versions joined by commas), so the statement text is the same for every batch
# and compiles (and is prepared) once, and the ids it published come back as one string.
# As two arrays, asyncpg tested each element against abstract base classes while encoding
# them (0.59 against 0.17 µs of Python a claim, a 500-claim statement timed alone), and
# SQLAlchemy processed one returned row per id. An IN list of (id, claim_version)
# pairs is compiled anew for every batch, which cost more than the update. Each claim is
# looked up on its own (a LATERAL subquery with a LIMIT is never merged into a join), so
# the only way to it is the primary key: joined to the arrays, the planner was free to
# hash them against a scan of the table. The lookup locks the row (FOR UPDATE), and the
# update then fetches it by the address the lookup found, as the claim does. The lock is
# what keeps the fence whole: a row that another transaction changed after this
# statement's snapshot (a dispatcher that took it over once the lease ran out) is waited
# for and tested again in its new version, and left out when the fence no longer holds.
# Without it, the update would meet the new version at the old address and rely on
# PostgreSQL testing that address again (TidRecheck), which some releases did not do
# (tests/engine/test_fencing.py: the takeover that commits while the completion waits).
_PUBLISH_PG = (
    text(
        f"""WITH published AS (
UPDATE outbox_events SET
    status = '{PUBLISHED}', published_at = :now, last_error = NULL, next_retry_at = NULL,
    locked_by = NULL, locked_until = NULL
WHERE ctid = ANY(ARRAY(
    SELECT held.ref
    FROM unnest(
        CAST((string_to_array(:ids, :separator))[2:] AS varchar[]),
        CAST(string_to_array(:versions, ',') AS integer[])
    ) AS c(id, claim_version)
    CROSS JOIN LATERAL (
        SELECT e.ctid AS ref FROM outbox_events AS e
        WHERE e.id = c.id AND e.claim_version = c.claim_version
            AND (e.locked_by = :dispatcher_id AND e.status = '{PUBLISHING}'
                AND e.locked_until > :now) IS TRUE
        LIMIT 1 FOR UPDATE
    ) AS held
))
RETURNING id
)
SELECT string_agg(id, :separator) AS ids FROM published"""
    )
    .bindparams(bindparam("now", type_=UtcDateTime()))
    .columns(column("ids", Text))
)


def joined_ids(ids: Sequence[str]) -> tuple[str, str]:
    """``ids`` as one string, each after a separator, and that separator: a character none
    of them holds.

    Each id comes after a separator, not between two, so the SQL drops the empty first
    element of the split and an empty id (text written with plain SQL may be one) is kept:
    ``string_to_array('', ...)`` is an empty array, not one empty id. The unit separator
    (U+001F) as good as always; a batch with an id that holds it takes the first of the
    other control characters, then of the code points past the surrogates, that none of
    its ids holds.
    """
    joined = "\x1f".join(ids)
    if joined.count("\x1f") == len(ids) - 1:
        return "\x1f" + joined, "\x1f"
    used = set("".join(ids))
    candidates = itertools.chain(range(0x1E, 0, -1), range(0xE000, 0x110000))
    separator = next(chr(c) for c in candidates if chr(c) not in used)
    return separator + separator.join(ids), separator


# SQLite, likewise: the claims travel as one JSON array of [id, claim_version] pairs
# (json_each), and SQLite probes its (status, id) index for each pair
# (tests/engine/test_query_plans.py). Against the IN list of pairs it replaced, a no-op
# drain of 100,000 events ran at 17.6k instead of 15.0k events/s, and its SQL floor at
# 18.4k instead of 16.7k (in-process, alternating, 3 runs each).
_PUBLISH_SQLITE = text(
    f"""UPDATE outbox_events SET
    status = '{PUBLISHED}', published_at = :now, last_error = NULL, next_retry_at = NULL,
    locked_by = NULL, locked_until = NULL
WHERE (id, claim_version) IN (
        SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:claims)
    )
    AND status = '{PUBLISHING}' AND locked_by = :dispatcher_id AND locked_until > :now
RETURNING id"""
).bindparams(bindparam("now", type_=UtcDateTime()))


async def mark_published(
    conn: AsyncConnection,
    claims: Sequence[tuple[str, int]],
    fence: Fence,
) -> set[str]:
    """Complete a batch as published; returns the ids whose lease still held."""
    if not claims:
        return set()
    if conn.dialect.name == "postgresql":
        ids, separator = joined_ids([event_id for event_id, _version in claims])
        params = {
            "now": fence.now,
            "dispatcher_id": fence.dispatcher_id,
            "ids": ids,
            "separator": separator,
            "versions": ",".join([str(version) for _event_id, version in claims]),
        }
        published = (await conn.execute(_PUBLISH_PG, params)).scalar()
        return set() if published is None else set(published.split(separator))
    if not any("\x00" in event_id for event_id, _version in claims):
        params = {
            "now": fence.now,
            "dispatcher_id": fence.dispatcher_id,
            "claims": json.dumps(claims),
        }
        return set((await conn.execute(_PUBLISH_SQLITE, params)).scalars())
    # SQLite's JSON functions end a string at NUL, which an id written with plain SQL may
    # hold (SQLite text can): such a batch goes as bound pairs, compiled for this batch.
    stmt = (
        update(t)
        .where(tuple_(t.c.id, t.c.claim_version).in_(list(claims)), _held(fence))
        .values(
            status=PUBLISHED,
            published_at=fence.now,
            last_error=None,
            next_retry_at=None,
            **_RELEASE_LOCK,
        )
        .returning(t.c.id)
    )
    return set((await conn.execute(stmt)).scalars())


async def mark_failed(
    conn: AsyncConnection,
    event_id: str,
    claim_version: int,
    fence: Fence,
    *,
    error: str,
    next_retry_at: datetime,
    refund_attempt: bool = False,
) -> bool:
    """Record a transient failure and when to retry; False if the lease was lost.

    ``refund_attempt``: the failure was not the event's (the broker was away), so the
    attempt this claim took is given back.
    """
    refund = {"attempt_count": t.c.attempt_count - 1} if refund_attempt else {}
    stmt = (
        update(t)
        .where(t.c.id == event_id, t.c.claim_version == claim_version, _held(fence))
        .values(
            status=FAILED,
            last_error=truncate_error(error),
            next_retry_at=next_retry_at,
            **refund,
            **_RELEASE_LOCK,
        )
        .returning(t.c.id)
    )
    return (await conn.execute(stmt)).first() is not None


async def mark_dead_letter(
    conn: AsyncConnection,
    event_id: str,
    claim_version: int,
    fence: Fence,
    *,
    error: str,
    reason: str,
    release_key: bool = False,
) -> bool:
    """Move an event to the dead letter; False if the lease was lost.

    A dead letter with an ordering key holds back the later events of its key
    until it is replayed or skipped; ``release_key`` skips it at once (the event
    type's ``skip`` policy).
    """
    stmt = (
        update(t)
        .where(t.c.id == event_id, t.c.claim_version == claim_version, _held(fence))
        .values(
            status=DEAD_LETTER,
            last_error=truncate_error(error),
            dead_letter_reason=truncate_error(reason),
            next_retry_at=None,
            skipped_at=fence.now if release_key else None,
            **_RELEASE_LOCK,
        )
        .returning(t.c.id)
    )
    return (await conn.execute(stmt)).first() is not None


async def release_unattempted(
    conn: AsyncConnection,
    claims: Iterable[tuple[str, int]],
    fence: Fence,
) -> set[str]:
    """Hand back claimed rows that were never attempted, without spending an attempt."""
    pairs = list(claims)
    if not pairs:
        return set()
    stmt = (
        update(t)
        .where(tuple_(t.c.id, t.c.claim_version).in_(pairs), _held(fence))
        .values(
            status=case((t.c.attempt_count <= 1, PENDING), else_=FAILED),
            attempt_count=case((t.c.attempt_count > 0, t.c.attempt_count - 1), else_=0),
            **_RELEASE_LOCK,
        )
        .returning(t.c.id)
    )
    return set((await conn.execute(stmt)).scalars())


async def completions_landed(
    conn: AsyncConnection, claims: Sequence[tuple[str, int]]
) -> dict[str, str]:
    """The status of each claim whose completion was committed, though its writer saw an error.

    A commit whose acknowledgement is lost (the server restarted, the connection
    was cut) may have landed. A completion clears the lease and keeps
    ``claim_version``; a later claim raises it. So a row that still has the claim's
    version and a completed status was completed by that claim's writer, and by no
    one else. Rows that have moved on since (reclaimed, replayed) are left out.
    """
    versions = dict(claims)
    if not versions:
        return {}
    stmt = select(t.c.id, t.c.claim_version, t.c.status).where(
        t.c.id.in_(list(versions)), t.c.status.in_([PUBLISHED, FAILED, DEAD_LETTER])
    )
    rows = (await conn.execute(stmt)).all()
    return {
        str(event_id): str(status)
        for event_id, version, status in rows
        if versions.get(str(event_id)) == version
    }
