"""The outbox's tables: one ``MetaData`` users can hand to their own Alembic.

Why one module: the tables, their indexes, the partial-index predicates that queries
must repeat word for word (engine.dispatch.claim_sql, engine.operating.insights) and the
SQLite trigger are one contract with engine.storage.migrations; a user's Alembic imports
one ``MetaData``, and an index and the predicate it serves stay side by side.

``outbox_events`` is a documented contract: every column except id, tenant_id,
event_type, event_version, aggregate_type, aggregate_id and payload has a
server-side default, so any language can enqueue an event with plain SQL.

``seq`` is the table's own write order: an identity column on PostgreSQL and the
rowid (copied by a trigger) on SQLite. Producers leave it out. Events that share
a non-null ``ordering_key`` are delivered one at a time in ``seq`` order (see
engine.dispatch.claim_sql and docs/dispatcher.md, "Ordering keys and per-key order").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    DDL,
    JSON,
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    cast,
    event,
    literal_column,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine.interfaces import Dialect as _Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateColumn
from sqlalchemy.sql.compiler import DDLCompiler
from sqlalchemy.types import TypeEngine

from engine.clock import as_utc

PENDING = "pending"
PUBLISHING = "publishing"
PUBLISHED = "published"
FAILED = "failed"
DEAD_LETTER = "dead_letter"
STATUSES = (PENDING, PUBLISHING, PUBLISHED, FAILED, DEAD_LETTER)
ACTIVE_STATUSES = (PENDING, PUBLISHING, FAILED)


def status_is_one_of(*statuses: str) -> str:
    """``status`` equals one of ``statuses``, spelled as comparisons joined by OR.

    Not as an IN list: SQLite tests a list of three or more constants through a temporary
    table, and in a table's CHECK or a partial index's predicate it builds that table again
    for every row an UPDATE writes, which every claim and completion pays (see decision
    0026). PostgreSQL proves either spelling from the other.
    """
    return " OR ".join(f"status = '{status}'" for status in statuses)


DEFAULT_MAX_ATTEMPTS = 10
_SQLITE_TEXT_FORMAT = "%Y-%m-%d %H:%M:%S.%f"


class UtcDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend.

    PostgreSQL stores ``timestamptz``. SQLite has no date type, so values are
    stored as fixed-width text (``YYYY-MM-DD HH:MM:SS.ffffff``) that sorts and
    compares correctly as strings, and come back aware.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: _Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(26))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        value = as_utc(value)
        if dialect.name == "sqlite":
            return value.strftime(_SQLITE_TEXT_FORMAT)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        """The stored instant; None for a value that is not one.

        Only SQLite can hold such a value (a row written with plain SQL into a table
        made before its CHECK constraints): reading it must not break a whole page,
        count or claim. The dispatcher dead-letters a row whose ``created_at`` reads
        as None (see engine.dispatch.claimed.ClaimedRow.problem).
        """
        if isinstance(value, datetime):
            return as_utc(value)
        if isinstance(value, str):
            try:
                return as_utc(datetime.fromisoformat(value))
            except ValueError:
                return None
        return None


def _now_default() -> Any:
    """Server-side 'now' in the storage format of each backend."""
    return text("CURRENT_TIMESTAMP")


Json = JSON().with_variant(JSONB(), "postgresql")

# Ordering keys are opaque: only equality and some fixed order matter, never a language's.
# On PostgreSQL they compare bytewise (COLLATE "C"), so the ordered claim's walk, which
# compares keys at every step of every probe, never goes through strcoll (see decision
# 0004). UTF-8's byte order is code point order, so Python's string order is the
# database's too (engine.dispatch.claimer's key cursor relies on it).
KEY_COLLATION = "C"
OrderingKey = String(400).with_variant(String(400, collation=KEY_COLLATION), "postgresql")

metadata = MetaData()

# Inbound identity and origin: (source, id) together stay under PostgreSQL's B-tree
# entry limit (2,704 bytes) even at four bytes a character; AMQP names a queue in at
# most 255 bytes. W3C's traceparent is 55 characters in version 00; later versions
# may append fields.
INBOUND_SOURCE_LENGTH = 400
INBOUND_ID_LENGTH = 200
INBOUND_QUEUE_LENGTH = 255
TRACEPARENT_LENGTH = 256


def _created_at_column(name: str = "created_at") -> Column[Any]:
    return Column(name, UtcDateTime(), nullable=False, server_default=_now_default())


outbox_events = Table(
    "outbox_events",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("tenant_id", String(128), nullable=False),
    Column("event_type", String(200), nullable=False),
    Column("event_version", Integer, nullable=False),
    Column("aggregate_type", String(200), nullable=False),
    Column("aggregate_id", String(200), nullable=False),
    Column("payload", Json, nullable=False),
    # Null: unordered. Events with the same key are delivered one at a time, in seq order.
    Column("ordering_key", OrderingKey, nullable=True),
    Column("seq", BigInteger, Identity(), nullable=False),
    Column("status", String(16), nullable=False, server_default=PENDING),
    Column("claim_version", Integer, nullable=False, server_default="0"),
    Column("attempt_count", Integer, nullable=False, server_default="0"),
    Column("max_attempts", Integer, nullable=False, server_default=str(DEFAULT_MAX_ATTEMPTS)),
    Column("next_retry_at", UtcDateTime(), nullable=True),
    Column("locked_by", String(200), nullable=True),
    Column("locked_until", UtcDateTime(), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("published_at", UtcDateTime(), nullable=True),
    Column("dead_letter_reason", Text, nullable=True),
    Column("replay_count", Integer, nullable=False, server_default="0"),
    Column("last_replayed_at", UtcDateTime(), nullable=True),
    # Set when a dead letter stops holding back the later events of its key (the event
    # type's ``skip`` policy, or an operator's ``dead-letter skip``).
    Column("skipped_at", UtcDateTime(), nullable=True),
    # The event whose handler published this one, and the first event of its chain
    # (null on the first event itself): how an event chain is followed.
    Column("causation_id", String(200), nullable=True),
    Column("correlation_id", String(200), nullable=True),
    # W3C trace context of the event (an inbound event's, from its CloudEvents
    # ``traceparent`` and ``tracestate``), so a tracer can continue the trace.
    Column("traceparent", String(TRACEPARENT_LENGTH), nullable=True),
    Column("tracestate", Text, nullable=True),
    # Inbound events only (engine.inbox; null on local rows): the CloudEvents identity a
    # second delivery is refused by (uq_outbox_events_inbound), the queue it came from,
    # the attributes no column holds, and the raw body of a message that could not be
    # decoded (dead-lettered, bytes as received). The row's ``id`` is a local id.
    Column("inbound_source", String(INBOUND_SOURCE_LENGTH), nullable=True),
    Column("inbound_id", String(INBOUND_ID_LENGTH), nullable=True),
    Column("inbound_queue", String(INBOUND_QUEUE_LENGTH), nullable=True),
    Column("inbound_attributes", Json, nullable=True),
    Column("inbound_body", LargeBinary, nullable=True),
    _created_at_column(),
    # Tables made before keep an IN list here: the same rule, slower on SQLite, which
    # cannot change the CHECK of a table (see decision 0026).
    CheckConstraint(
        f"({status_is_one_of(*STATUSES)})",
        name="ck_outbox_events_status",
    ),
    CheckConstraint("ordering_key <> ''", name="ck_outbox_events_ordering_key"),
    CheckConstraint("max_attempts >= 1", name="ck_outbox_events_max_attempts"),
    # PostgreSQL's column types refuse these at INSERT; SQLite stores any value in any
    # column, so the same refusals are spelled out (tables made by this version).
    *(
        CheckConstraint(rule, name=f"ck_outbox_events_{name}").ddl_if(dialect="sqlite")
        for name, rule in {
            "event_version_type": "typeof(event_version) = 'integer'",
            "max_attempts_type": "typeof(max_attempts) = 'integer'",
            "attempt_count_type": "typeof(attempt_count) = 'integer'",
            "claim_version_type": "typeof(claim_version) = 'integer'",
            "replay_count_type": "typeof(replay_count) = 'integer'",
            "created_at_type": (
                "typeof(created_at) = 'text' AND created_at GLOB "
                "'[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9][ T][0-9][0-9]:[0-9][0-9]*'"
            ),
            "payload_json": "json_valid(payload)",
        }.items()
    ),
)

# The claim queries repeat these predicates exactly, so both SQLite (which matches
# partial-index predicates term by term) and PostgreSQL use the partial indexes.
ACTIVE_PREDICATE = "status IN ('pending', 'publishing', 'failed')"
# Rows a claim may take, due or not yet: the active ones less those in flight. The
# unordered claim's indexes hold only these, so that the claim, which makes its rows
# publishing, writes no entry into them (a claimed row in flight is found again, once
# its lease expires, through ix_outbox_events_lease_expiry).
WAITING_PREDICATE = "status IN ('pending', 'failed')"
UNORDERED_PREDICATE = "ordering_key IS NULL"
# Rows that hold back the later events of their key: not yet delivered, or dead-lettered
# and not skipped.
KEY_UNFINISHED_PREDICATE = (
    f"({status_is_one_of(PENDING, PUBLISHING, FAILED)} "
    f"OR (status = '{DEAD_LETTER}' AND skipped_at IS NULL))"
)
KEYED_PREDICATE = "ordering_key IS NOT NULL"
# A row is leased exactly while it is publishing: every claim sets its holder
# (locked_by) and expiry (locked_until), and every completion or release clears both.
# Two spellings of that one fact, each implied only by the queries of its own index, so
# that a planner cannot answer one index's queries with the other:
# - IN_FLIGHT_PREDICATE, SQLite's claim's "is a row of this key in flight?" probe, through
#   ix_outbox_events_key_in_flight (PostgreSQL's claim reads it from
#   ix_outbox_events_key_turn). Were the lease index's predicate the same, PostgreSQL's
#   planner could answer each probe by reading every row in flight (see decision 0005).
# - LEASED_PREDICATE, expired leases (reclaim, "stuck") and rows in flight by type,
#   through ix_outbox_events_lease_expiry.
# Neither is written on status, so the status index serves neither.
IN_FLIGHT_PREDICATE = "locked_by IS NOT NULL"
LEASED_PREDICATE = "locked_until IS NOT NULL"


def _where(*terms: str) -> Any:
    clause = text(" AND ".join(terms))
    return {"postgresql_where": clause, "sqlite_where": clause}


# Unordered claim: waiting rows in write order.
Index(
    "ix_outbox_events_waiting",
    outbox_events.c.seq,
    **_where(WAITING_PREDICATE, UNORDERED_PREDICATE),
)
# The unordered claim of a dispatcher that serves only some types, while rows of other
# types wait (a rolling deploy, services sharing a database, a paused type): one range
# per served type, so the waiting rows of the others are never walked.
Index(
    "ix_outbox_events_waiting_type",
    outbox_events.c.event_type,
    outbox_events.c.seq,
    **_where(WAITING_PREDICATE, UNORDERED_PREDICATE),
)
# An event chain: the events a first event caused, directly or not. Partial: a first
# event, which has no correlation id, writes no entry.
Index(
    "ix_outbox_events_correlation",
    outbox_events.c.correlation_id,
    outbox_events.c.seq,
    **_where("correlation_id IS NOT NULL"),
)
# Indexes only one dialect gets (ddl_if): PostgreSQL's ordered claim reads one index
# where SQLite's reads two. ``indexes_for`` lists what a database of a dialect should have.
ONLY_ON = {
    "ix_outbox_events_key_turn": "postgresql",
    "ix_outbox_events_key_order": "sqlite",
    "ix_outbox_events_key_in_flight": "sqlite",
}


def _only_on(index: Index) -> None:
    index.ddl_if(dialect=ONLY_ON[str(index.name)])


def indexes_for(dialect: str) -> list[Index]:
    """The indexes of ``outbox_events`` a database of ``dialect`` has, by name."""
    found = [i for i in outbox_events.indexes if ONLY_ON.get(str(i.name), dialect) == dialect]
    return sorted(found, key=lambda i: str(i.name))


# PostgreSQL's key index orders a key's rows by this after the key: 0 in flight, 1 at rest.
# An integer, not the bare boolean: the planner rewrites "(locked_by IS NULL) = false" as
# "locked_by IS NOT NULL", which no longer matches the index column, so a range of a key's
# rows in flight could not be bounded by seq (engine.operating.dispatch_health.key_turns).
KEY_TURN = "CAST(locked_by IS NULL AS INTEGER)"

# PostgreSQL's ordered claim: a key's rows in flight come first in this index, then its
# rows at rest in write order. So the first entry of a key is a row in flight, if any,
# else its head: the claim's walk finds the next key, its head and whether another event
# of the key is in flight with one probe per key, and never visits the rows queued
# behind a head. Against a (key, seq) index plus a probe of a per-key in-flight index,
# one index entry fewer per claimed row and one probe fewer per head (see decision 0003).
_only_on(
    Index(
        "ix_outbox_events_key_turn",
        outbox_events.c.ordering_key,
        cast(outbox_events.c.locked_by.is_(None), Integer),
        outbox_events.c.seq,
        postgresql_where=text(f"{KEYED_PREDICATE} AND {KEY_UNFINISHED_PREDICATE}"),
    )
)
# SQLite's ordered claim: the head of each key is the first entry of the key in this
# index, so the claim walks keys (one probe each), never the rows queued behind a head.
_only_on(
    Index(
        "ix_outbox_events_key_order",
        outbox_events.c.ordering_key,
        outbox_events.c.seq,
        **_where(KEYED_PREDICATE, KEY_UNFINISHED_PREDICATE),
    )
)
# Keys held back by a failed or dead-lettered event (operators' "blocked keys"): small.
KEY_STALLED_PREDICATE = "(status = 'failed' OR (status = 'dead_letter' AND skipped_at IS NULL))"
Index(
    "ix_outbox_events_key_stalled",
    outbox_events.c.ordering_key,
    outbox_events.c.seq,
    **_where(KEYED_PREDICATE, KEY_STALLED_PREDICATE),
)
# SQLite's "is any event of this key in flight?": a few entries, one per claimed ordered
# row.
_only_on(
    Index(
        "ix_outbox_events_key_in_flight",
        outbox_events.c.ordering_key,
        **_where(KEYED_PREDICATE, IN_FLIGHT_PREDICATE),
    )
)
# Expired leases (crash recovery), "stuck in publishing" counts, and rows in flight by
# type (engine.operating.insights.top_types, inside the index on SQLite).
Index(
    "ix_outbox_events_lease_expiry",
    outbox_events.c.locked_until,
    outbox_events.c.event_type,
    **_where(LEASED_PREDICATE),
)
# Retention purge and the "published recently" window.
Index(
    "ix_outbox_events_published_at",
    outbox_events.c.published_at,
    postgresql_where=text("status = 'published'"),
    sqlite_where=text("status = 'published'"),
)
# Events that wait or failed, by type: "which type is hurting" (engine.operating.insights.top_types)
# and how many events a pause holds back (engine.operating.pauses), counted inside this index.
# Spelled with status_is_one_of. PostgreSQL proves either spelling from the other, so an
# index made with an IN list still serves these queries there; SQLite matches the
# spelling, and an index made with the list is rebuilt by init-db (engine.storage.migrations).
BACKLOG_PREDICATE = f"({status_is_one_of(PENDING, FAILED, DEAD_LETTER)})"
Index(
    "ix_outbox_events_type_backlog",
    outbox_events.c.status,
    outbox_events.c.event_type,
    outbox_events.c.tenant_id,
    **_where(BACKLOG_PREDICATE),
)

# On PostgreSQL every claim and every completion writes a new row version with an entry
# in each index whose predicate it meets (the updates change indexed columns, so none is
# HOT). The two indexes below leave out what the drain writes: keyset pages within one
# status and per-status counts read the backlog statuses here, rows in flight through
# ix_outbox_events_lease_expiry, published rows through the primary key
# (engine.operating.event_views.status_clause); the aggregate filter reads rows at rest here and
# rows in flight through the lease index (engine.operating.event_views.aggregate_clause). Full
# indexes, as these were up to 0.5, slowed every drain (see decision 0006).
# SQLite changes an index entry only when a column the index names changes, so there both
# stay full: a claim never touches the aggregate's, and the status one serves every status
# without the spelling SQLite's partial indexes need.
Index(
    "ix_outbox_events_backlog_id",
    outbox_events.c.status,
    outbox_events.c.id,
    postgresql_where=text(BACKLOG_PREDICATE),
)
AT_REST_PREDICATE = f"status <> '{PUBLISHING}'"
Index(
    "ix_outbox_events_aggregate_at_rest",
    outbox_events.c.aggregate_id,
    postgresql_where=text(AT_REST_PREDICATE),
)
# Replayed events waiting for delivery: the oldest of them is due since its replay, not
# its creation (engine.operating.insights' "oldest pending"). Only replayed rows have an entry.
REPLAYED_PENDING_PREDICATE = "status = 'pending' AND last_replayed_at IS NOT NULL"
Index(
    "ix_outbox_events_replayed_pending",
    outbox_events.c.last_replayed_at,
    **_where(REPLAYED_PENDING_PREDICATE),
)


# An inbound event is identified by its CloudEvents (source, id): a second delivery of
# the pair conflicts here and is dropped by the inbox's INSERT ... ON CONFLICT DO NOTHING
# (engine.inbox.writer). Partial: local rows and undecodable inbound ones write no entry.
INBOUND_PREDICATE = "inbound_id IS NOT NULL"
Index(
    "uq_outbox_events_inbound",
    outbox_events.c.inbound_source,
    outbox_events.c.inbound_id,
    unique=True,
    **_where(INBOUND_PREDICATE),
)
# Published inbound rows, for their own retention (engine.operating.retention): they are
# kept as long as the dedup window, whatever the local rows' retention.
INBOUND_PUBLISHED_PREDICATE = f"status = '{PUBLISHED}' AND {INBOUND_PREDICATE}"
Index(
    "ix_outbox_events_inbound_published",
    outbox_events.c.published_at,
    **_where(INBOUND_PUBLISHED_PREDICATE),
)


@compiles(CreateColumn, "sqlite")
def _sqlite_identity_column(element: CreateColumn, compiler: DDLCompiler, **kw: Any) -> Any:
    """SQLite has no identity columns: ``seq`` is left nullable there and the trigger below
    copies the rowid into it (SQLite gives a new row a rowid above every existing one)."""
    ddl = compiler.visit_create_column(element, **kw)  # type: ignore[no-untyped-call]
    if ddl is not None and element.element.identity is not None:
        ddl = ddl.replace(" NOT NULL", "")
    return ddl


SQLITE_SEQ_TRIGGER = (
    "CREATE TRIGGER IF NOT EXISTS outbox_events_seq AFTER INSERT ON outbox_events "
    "FOR EACH ROW WHEN NEW.seq IS NULL BEGIN "
    "UPDATE outbox_events SET seq = NEW.rowid WHERE rowid = NEW.rowid; END"
)
event.listen(
    outbox_events,
    "after_create",
    DDL(SQLITE_SEQ_TRIGGER).execute_if(dialect="sqlite"),  # type: ignore[no-untyped-call]
)

process_heartbeats = Table(
    "process_heartbeats",
    metadata,
    Column("instance_id", String(200), primary_key=True),
    Column("kind", String(32), nullable=False, server_default="dispatcher"),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("state", String(16), nullable=False, server_default="running"),
    Column("started_at", UtcDateTime(), nullable=False),
    Column("last_seen_at", UtcDateTime(), nullable=False),
    Column("stopped_at", UtcDateTime(), nullable=True),
    Column("details", Json, nullable=False, server_default=literal_column("'{}'")),
)

handler_runs = Table(
    "outbox_handler_runs",
    metadata,
    Column("event_id", String(36), primary_key=True),
    Column("handler_key", String(200), primary_key=True),
    Column("status", String(16), nullable=False),
    Column("attempt_count", Integer, nullable=False, server_default="1"),
    Column("last_error", Text, nullable=True),
    _created_at_column(),
    Column("updated_at", UtcDateTime(), nullable=False, server_default=_now_default()),
    CheckConstraint("status IN ('succeeded', 'failed')", name="ck_outbox_handler_runs_status"),
)

side_effects = Table(
    "outbox_side_effects",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", String(128), nullable=False),
    Column("actor_id", String(200), nullable=False),
    Column("event_id", String(36), nullable=False),
    Column("handler_key", String(200), nullable=False),
    Column("effect_key", String(200), nullable=False),
    Column("status", String(16), nullable=False),
    Column("request", Json, nullable=True),
    Column("response", Json, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("attempt_count", Integer, nullable=False, server_default="1"),
    _created_at_column(),
    Column("updated_at", UtcDateTime(), nullable=False, server_default=_now_default()),
    UniqueConstraint(
        "tenant_id",
        "actor_id",
        "event_id",
        "handler_key",
        "effect_key",
        name="uq_outbox_side_effects_key",
    ),
    CheckConstraint("status IN ('succeeded', 'failed')", name="ck_outbox_side_effects_status"),
)
Index("ix_outbox_side_effects_event", side_effects.c.event_id)

replay_log = Table(
    "outbox_replay_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String(36), nullable=False),
    Column("operator", String(200), nullable=False),
    Column("reason", Text, nullable=True),
    Column("cleared_dead_letter_reason", Text, nullable=True),
    Column("cleared_last_error", Text, nullable=True),
    Column("previous_attempt_count", Integer, nullable=False),
    Column("replayed_at", UtcDateTime(), nullable=False),
    # "replay" (back to pending) or "skip" (a dead letter released its ordering key).
    Column("action", String(16), nullable=False, server_default="replay"),
)
Index("ix_outbox_replay_log_event", replay_log.c.event_id, replay_log.c.id)

# Delivery paused per event type, for every tenant (tenant_id ALL_TENANTS) or one tenant.
# Paused events stay pending and spend no attempts (see engine.operating.pauses).
ALL_TENANTS = ""
pauses = Table(
    "outbox_pauses",
    metadata,
    Column("event_type", String(200), primary_key=True),
    Column("tenant_id", String(128), primary_key=True, server_default=ALL_TENANTS),
    Column("reason", Text, nullable=False),
    Column("paused_by", String(200), nullable=False),
    Column("paused_at", UtcDateTime(), nullable=False),
)

# Who paused or resumed what, why and when (tenant_id null: every tenant).
pause_log = Table(
    "outbox_pause_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("action", String(16), nullable=False),
    Column("event_type", String(200), nullable=False),
    Column("tenant_id", String(128), nullable=True),
    Column("operator", String(200), nullable=False),
    Column("reason", Text, nullable=True),
    Column("at", UtcDateTime(), nullable=False),
    CheckConstraint("action IN ('pause', 'resume')", name="ck_outbox_pause_log_action"),
)
Index("ix_outbox_pause_log_type", pause_log.c.event_type, pause_log.c.id)

locks = Table(
    "outbox_locks",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("holder", String(200), nullable=False),
    Column("expires_at", UtcDateTime(), nullable=False),
)

ALL_TABLES = (
    outbox_events,
    process_heartbeats,
    handler_runs,
    side_effects,
    replay_log,
    pauses,
    pause_log,
    locks,
)
