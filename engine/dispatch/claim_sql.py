"""The claim as SQL: which rows a dispatcher takes, in one statement per dialect.

A claim has three parts, each a CTE:

- ``abandoned``: one row whose lease expired, reclaimed alone;
- ``ordered``: the heads of ordering keys. ``keys`` walks the distinct keys that have
  unfinished rows (a skip scan: one index probe per key, from the claimer's key cursor
  on); a key's head is its first unfinished row, claimed only if it is due and no row of
  its key is in flight. Rows queued behind a head are never visited;
- ``unordered``: due rows without a key, in ``seq`` order.

The two sources share the batch; which one fills it first alternates by claim. On
PostgreSQL, ``FOR UPDATE SKIP LOCKED`` makes concurrent dispatchers take disjoint rows.
SQLite has no row locks, so its claim is one ``UPDATE ... RETURNING`` inside ``BEGIN
IMMEDIATE``: the write lock makes it atomic across processes. ``engine.dispatch.claimer``
runs these statements; decisions 0001-0003 say why they are shaped so.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Text, TextClause, bindparam, column, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.selectable import TextualSelect

from engine.storage.schema import (
    IN_FLIGHT_PREDICATE,
    KEY_TURN,
    KEY_UNFINISHED_PREDICATE,
    KEYED_PREDICATE,
    LEASED_PREDICATE,
    UNORDERED_PREDICATE,
    WAITING_PREDICATE,
    UtcDateTime,
    outbox_events,
)

if TYPE_CHECKING:
    from engine.dispatch.claimer import ClaimScope

t = outbox_events


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


NO_JIT = text("SET LOCAL jit = off")


@functools.cache
def walk_end_statement(dialect: str, include_cursor_key: bool) -> TextClause:
    """The last key a capped walk from ``:key_cursor`` reaches, and how many it saw."""
    walk = _key_walk(_table_for(dialect), _UNFINISHED_KEYED, include_cursor_key)
    return text(
        f"WITH RECURSIVE {walk} SELECT k, n FROM keys WHERE k IS NOT NULL ORDER BY n DESC LIMIT 1"
    )


@functools.cache
def keys_passed_statement(dialect: str) -> TextClause:
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


# Above this many served types with waiting rows, the unordered claim walks the seq
# index with the type filter instead of one index range per type.
PER_TYPE_LIMIT = 16
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


def scope_params(dialect: str, scope: ClaimScope) -> dict[str, Any]:
    types = sorted(scope.types)
    pairs = sorted(f"{t}{chr(_PAIR_SEPARATOR)}{tenant}" for t, tenant in scope.paused_pairs)
    if dialect == "postgresql":
        return {"scope_types": types, "scope_pairs": pairs}
    return {"scope_types": json.dumps(types), "scope_pairs": json.dumps(pairs)}


@functools.cache
def waiting_types_statement(dialect: str) -> TextClause:
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
        # No table at all: SQLite would scan a whole index for "FROM outbox_events WHERE
        # 1 = 0", the very walk over other types' rows that the ranges avoid (decision 0009).
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


def claim_sql(dialect: str, shape: ClaimShape) -> str:
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
# EventEnvelope.from_row), nothing else; every column costs decoding on every claimed row
# (decision 0025).
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
    "causation_id",
    "correlation_id",
    "traceparent",
    "tracestate",
)


@functools.cache
def claim_statement(dialect: str, shape: ClaimShape) -> TextualSelect:
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
        text(claim_sql(dialect, shape) + "RETURNING " + returning)
        .bindparams(*params)
        .columns(*returned, column("payload", Text))
    )
