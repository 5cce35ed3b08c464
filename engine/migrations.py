"""Bring outbox tables made by an earlier version up to the current schema.

``create_schema`` (``outbox-tui init-db``) runs ``upgrade_schema`` after creating
missing tables, so an existing database gains the new columns, indexes and the
SQLite ``seq`` trigger in place; every step is idempotent. ``check_schema``
refuses an outdated database with one line that names the command to run.

Steps, in order (version 0.2, "Delivery v2"):
- ``outbox_events.ordering_key``, ``seq`` (filled for existing rows), ``skipped_at``;
- ``outbox_replay_log.action``;
- the claim indexes of this version; the old ``ix_outbox_events_active`` and
  ``ix_outbox_events_lease`` are dropped;
- PostgreSQL: the checks on ``ordering_key`` (not empty) and ``max_attempts`` (at least 1).
  SQLite cannot add constraints to an existing table, so an upgraded SQLite table keeps
  accepting rows its CHECKs would refuse; the dispatcher dead-letters those rows with the
  column named (engine.store.ClaimedRow.problem).

Version 0.3 ("Incident workflows"): the tables ``outbox_pauses`` and ``outbox_pause_log``
(made by ``create_all`` before the upgrade runs), and the indexes
``ix_outbox_events_type_backlog`` and ``ix_outbox_events_replayed_pending`` (made by the
index step above).

Version 0.4 ("Performance"): the unordered claim's indexes ``ix_outbox_events_waiting``
and ``ix_outbox_events_waiting_type`` replace ``ix_outbox_events_unordered`` and
``ix_outbox_events_unordered_type``; they leave out rows in flight, so a claim writes
no entry into them; ``ix_outbox_events_lease_expiry`` (``locked_until IS NOT NULL``)
replaces ``ix_outbox_events_leased`` (``locked_by IS NOT NULL``), so PostgreSQL can no
longer answer the claim's per-key in-flight probe by reading every leased row (see
``engine.schema``). A database without them is outdated (``missing_indexes``): SQLite's
claim names them, and PostgreSQL's would walk another index. On PostgreSQL the upgrade
builds them with a plain ``CREATE INDEX``, which blocks writes to the table while it
reads the table once: stop the producers, or build them first with ``CREATE INDEX
CONCURRENTLY`` under the same names and definitions (docs/dispatcher.md).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.schema import SQLITE_SEQ_TRIGGER, outbox_events, replay_log

#: Columns added since the first release: (table, column).
ADDED_COLUMNS = (
    ("outbox_events", "ordering_key"),
    ("outbox_events", "seq"),
    ("outbox_events", "skipped_at"),
    ("outbox_replay_log", "action"),
)
#: Tables added since the first release: every dispatcher reads them.
ADDED_TABLES = ("outbox_pauses", "outbox_pause_log")
# Replaced by ix_outbox_events_unordered and ix_outbox_events_leased (now on locked_by),
# then (0.4) the unordered ones by ix_outbox_events_waiting and _waiting_type, which hold
# no row in flight, and _leased by ix_outbox_events_lease_expiry, whose predicate the
# per-key in-flight probe does not imply.
_RETIRED_INDEXES = (
    "ix_outbox_events_active",
    "ix_outbox_events_lease",
    "ix_outbox_events_unordered",
    "ix_outbox_events_unordered_type",
    "ix_outbox_events_leased",
)


def missing_columns(sync_conn: Connection) -> list[str]:
    """``table.column`` names, then whole tables, this version needs and the database lacks."""
    inspector = inspect(sync_conn)
    found: dict[str, set[str]] = {}
    missing = []
    for table, column in ADDED_COLUMNS:
        if table not in found:
            found[table] = {c["name"] for c in inspector.get_columns(table)}
        if column not in found[table]:
            missing.append(f"{table}.{column}")
    tables = set(inspector.get_table_names())
    missing.extend(table for table in ADDED_TABLES if table not in tables)
    return missing


def _index_names(sync_conn: Connection) -> set[str | None]:
    return {i["name"] for i in inspect(sync_conn).get_indexes("outbox_events")}


def missing_indexes(sync_conn: Connection) -> list[str]:
    """``index name`` for each index of ``outbox_events`` this version has and the
    database lacks (the claim names its indexes on SQLite, and needs them everywhere)."""
    found = _index_names(sync_conn)
    return [f"index {i.name}" for i in outbox_events.indexes if i.name not in found]


def outdated_parts(sync_conn: Connection) -> list[str]:
    """Everything this version needs and the database lacks: columns, tables, indexes."""
    return missing_columns(sync_conn) + missing_indexes(sync_conn)


def _upgrade(sync_conn: Connection) -> list[str]:
    pg = sync_conn.dialect.name == "postgresql"
    done: list[str] = []

    def run(sql: str) -> None:
        sync_conn.execute(text(sql))

    for name in missing_columns(sync_conn):
        if "." not in name:  # a table: create_all made it before this step
            continue
        table, column = name.split(".")
        if name == "outbox_events.seq":
            if pg:  # PostgreSQL numbers the existing rows as it adds the identity column
                run(
                    "ALTER TABLE outbox_events "
                    "ADD COLUMN seq BIGINT GENERATED BY DEFAULT AS IDENTITY"
                )
            else:
                run("ALTER TABLE outbox_events ADD COLUMN seq BIGINT")
                run("UPDATE outbox_events SET seq = rowid")
        elif name == "outbox_replay_log.action":
            run(
                "ALTER TABLE outbox_replay_log "
                "ADD COLUMN action VARCHAR(16) NOT NULL DEFAULT 'replay'"
            )
        else:
            source = outbox_events if table == "outbox_events" else replay_log
            ddl_type = source.c[column].type.compile(dialect=sync_conn.dialect)
            run(f"ALTER TABLE {table} ADD COLUMN {column} {ddl_type}")
        done.append(f"added {name}")
    if not pg:
        run(SQLITE_SEQ_TRIGGER)
    indexes = _index_names(sync_conn)
    for retired in _RETIRED_INDEXES:
        if retired in indexes:
            run(f"DROP INDEX {retired}")
            done.append(f"dropped index {retired}")
    for index in outbox_events.indexes:
        if index.name not in indexes:
            index.create(sync_conn)
            done.append(f"created index {index.name}")
    if pg and "ck_outbox_events_ordering_key" not in {
        c["name"] for c in inspect(sync_conn).get_check_constraints("outbox_events")
    }:
        run(
            "ALTER TABLE outbox_events ADD CONSTRAINT ck_outbox_events_ordering_key "
            "CHECK (ordering_key <> '')"
        )
        # NOT VALID: new rows are checked; an old row with 0 is dead-lettered on its claim.
        run(
            "ALTER TABLE outbox_events ADD CONSTRAINT ck_outbox_events_max_attempts "
            "CHECK (max_attempts >= 1) NOT VALID"
        )
        done.append("added checks ck_outbox_events_ordering_key, ck_outbox_events_max_attempts")
    return done


async def upgrade_schema(conn: AsyncConnection) -> list[str]:
    """Apply the steps this database still needs (inside the caller's transaction)."""
    result: Any = await conn.run_sync(_upgrade)
    return list(result)
