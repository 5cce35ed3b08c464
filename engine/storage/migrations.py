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
  column named (engine.dispatch.claimed.ClaimedRow.problem).

Version 0.3 ("Incident workflows"): the tables ``outbox_pauses`` and ``outbox_pause_log``
(made by ``create_all`` before the upgrade runs), and the indexes
``ix_outbox_events_type_backlog`` and ``ix_outbox_events_replayed_pending`` (made by the
index step above).

Version 0.4 ("Performance"): the unordered claim's indexes ``ix_outbox_events_waiting``
and ``ix_outbox_events_waiting_type`` replace ``ix_outbox_events_unordered`` and
``ix_outbox_events_unordered_type``; they leave out rows in flight, so a claim writes
no entry into them; ``ix_outbox_events_lease_expiry`` (``locked_until IS NOT NULL``)
replaces ``ix_outbox_events_leased`` (``locked_by IS NOT NULL``), so PostgreSQL can no
longer answer the claim's per-key in-flight probe by reading every leased row (decisions
0005 and 0006). A database without them is outdated (``missing_indexes``): SQLite's
claim names them, and PostgreSQL's would walk another index. On PostgreSQL the upgrade
builds them with a plain ``CREATE INDEX``, which blocks writes to the table while it
reads the table once: stop the producers, or build them first with ``CREATE INDEX
CONCURRENTLY`` under the same names and definitions (docs/table-contract.md, "Upgrading
with init-db").

Version 0.5: SQLite's ``ix_outbox_events_type_backlog`` and ``ix_outbox_events_key_order``
are rebuilt with their predicates spelled as comparisons instead of IN lists
(``respelled_indexes``; see ``engine.storage.schema.BACKLOG_PREDICATE`` and decision 0026).
New tables also spell the status CHECK so; SQLite cannot change the CHECK of an existing
table, which keeps the list (the same rule).

Version 0.6: ``ix_outbox_events_backlog_id`` and ``ix_outbox_events_aggregate_at_rest``
replace ``ix_outbox_events_status_id`` and ``ix_outbox_events_aggregate_id``. On
PostgreSQL they leave out the row versions a drain writes (published rows, rows in
flight), so a claim and a completion write no entry into them (decision 0006); on
SQLite they are the same full indexes under the new names. A database with the old ones
is outdated (``missing_indexes``); the upgrade drops them and builds the new ones, with
the same caution on a large PostgreSQL table as 0.4's.

Version 0.7: on PostgreSQL ``outbox_events.ordering_key`` compares bytewise (``COLLATE
"C"``, see ``engine.storage.schema.OrderingKey``), so the ordered claim's index probes no longer
compare keys through the default collation's strcoll. A column with another collation is
outdated (``recollated_columns``); the upgrade changes it in place: no table rewrite,
but its three key indexes are rebuilt under a lock that blocks writes (decision 0004).

Version 0.8: on PostgreSQL ``ix_outbox_events_key_turn`` (a key's rows in flight first,
then its rows at rest in ``seq`` order) replaces ``ix_outbox_events_key_order`` and
``ix_outbox_events_key_in_flight``, which SQLite keeps (``engine.storage.schema.ONLY_ON``). A
PostgreSQL database without it is outdated (``missing_indexes``); the upgrade builds it
and drops the two, with the same caution on a large table as 0.4's (decision 0003).

Version 0.9 ("Exactly-once effects"): ``outbox_events.causation_id`` and
``correlation_id`` (the event whose handler published a row, and the first event of its
chain), and the partial index ``ix_outbox_events_correlation`` that lists a chain.

Version 0.10 ("The inbox"): ``outbox_events.traceparent`` and ``tracestate`` (W3C trace
context), and the inbound columns ``inbound_source``, ``inbound_id``, ``inbound_queue``,
``inbound_attributes`` and ``inbound_body`` (engine.inbox; null on every row written
before); the unique partial index ``uq_outbox_events_inbound`` on (source, id) that
refuses a second delivery of an inbound event, and ``ix_outbox_events_inbound_published``
for the inbound rows' own retention. Both hold no existing row (their predicates need
``inbound_id``), so on PostgreSQL they are built at once, with no rewrite of the table.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, create_mock_engine, inspect, text
from sqlalchemy.engine import URL, Inspector, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.schema import CreateIndex

from engine.storage.schema import (
    KEY_COLLATION,
    SQLITE_SEQ_TRIGGER,
    indexes_for,
    metadata,
    outbox_events,
    replay_log,
)

#: Columns added since the first release: (table, column).
ADDED_COLUMNS = (
    ("outbox_events", "ordering_key"),
    ("outbox_events", "seq"),
    ("outbox_events", "skipped_at"),
    ("outbox_events", "causation_id"),
    ("outbox_events", "correlation_id"),
    ("outbox_events", "traceparent"),
    ("outbox_events", "tracestate"),
    ("outbox_events", "inbound_source"),
    ("outbox_events", "inbound_id"),
    ("outbox_events", "inbound_queue"),
    ("outbox_events", "inbound_attributes"),
    ("outbox_events", "inbound_body"),
    ("outbox_replay_log", "action"),
)
# Replaced by ix_outbox_events_unordered and ix_outbox_events_leased (now on locked_by),
# then (0.4) the unordered ones by ix_outbox_events_waiting and _waiting_type, which hold
# no row in flight, and _leased by ix_outbox_events_lease_expiry, whose predicate the
# per-key in-flight probe does not imply; (0.6) the full status and aggregate indexes by
# ix_outbox_events_backlog_id and _aggregate_at_rest, partial on PostgreSQL.
_RETIRED_INDEXES = (
    "ix_outbox_events_active",
    "ix_outbox_events_lease",
    "ix_outbox_events_unordered",
    "ix_outbox_events_unordered_type",
    "ix_outbox_events_leased",
    "ix_outbox_events_status_id",
    "ix_outbox_events_aggregate_id",
)

# (0.8) PostgreSQL's ordered claim reads ix_outbox_events_key_turn instead of these two.
_RETIRED_ON = {
    "postgresql": ("ix_outbox_events_key_order", "ix_outbox_events_key_in_flight"),
    "sqlite": (),
}

# Index -> the predicate text an earlier version gave it (``schema`` says why it changed).
_RESPELLED = {
    "ix_outbox_events_type_backlog": "status IN ('pending', 'failed', 'dead_letter')",
    "ix_outbox_events_key_order": "status IN ('pending', 'publishing', 'failed')",
}


def missing_tables(sync_conn: Connection) -> list[str]:
    """The tables of this version the database lacks (a new database lacks them all):
    added since an earlier version, or dropped by hand. ``create_all`` makes them."""
    return _missing_tables(inspect(sync_conn))


def _missing_tables(inspector: Inspector) -> list[str]:
    present = set(inspector.get_table_names())
    return [table.name for table in metadata.sorted_tables if table.name not in present]


def missing_columns(sync_conn: Connection) -> list[str]:
    """``table.column`` names this version needs and the database's tables lack (a table
    that is missing altogether is made whole: see ``missing_tables``)."""
    return _missing_columns(inspect(sync_conn))


def _missing_columns(inspector: Inspector) -> list[str]:
    present = set(inspector.get_table_names())
    found: dict[str, set[str]] = {}
    missing = []
    for table, column in ADDED_COLUMNS:
        if table not in present:
            continue
        if table not in found:
            found[table] = {c["name"] for c in inspector.get_columns(table)}
        if column not in found[table]:
            missing.append(f"{table}.{column}")
    return missing


def _index_names(sync_conn: Connection) -> set[str | None]:
    return {i["name"] for i in inspect(sync_conn).get_indexes("outbox_events")}


def respelled_indexes(sync_conn: Connection) -> list[str]:
    """SQLite indexes of this version's name whose predicate has an earlier spelling.

    SQLite uses a partial index only for a query that repeats its predicate as written,
    so such an index serves none of this version's queries; init-db rebuilds it.
    PostgreSQL proves one spelling from the other and keeps its index.
    """
    if sync_conn.dialect.name != "sqlite":
        return []
    stored = sync_conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'index'"))
    return [name for name, sql in stored if name in _RESPELLED and _RESPELLED[name] in sql]


def missing_indexes(sync_conn: Connection) -> list[str]:
    """``index name`` for each index of ``outbox_events`` this version has and the
    database lacks (the claim names its indexes on SQLite, and needs them everywhere),
    or has with a predicate spelled as an earlier version did (``respelled_indexes``)."""
    found = _index_names(sync_conn)
    names = [str(i.name) for i in indexes_for(sync_conn.dialect.name)]
    missing = [f"index {name}" for name in names if name not in found]
    respelled = respelled_indexes(sync_conn)
    return missing + [f"index {name} (this version's predicate)" for name in respelled]


# Columns of outbox_events that PostgreSQL compares bytewise in this version.
_BYTEWISE_COLUMNS = ("ordering_key",)


def recollated_columns(sync_conn: Connection) -> list[str]:
    """The columns of outbox_events that PostgreSQL should compare bytewise and the
    database compares under another collation (SQLite's text is bytewise already; a
    column not there yet gets the collation as it is added)."""
    if sync_conn.dialect.name != "postgresql":
        return []
    collation_of = text(
        "SELECT c.collname FROM pg_attribute AS a "
        "JOIN pg_collation AS c ON c.oid = a.attcollation "
        "WHERE a.attrelid = to_regclass(:table) AND a.attname = :column AND NOT a.attisdropped"
    )
    stale = []
    for column in _BYTEWISE_COLUMNS:
        found = sync_conn.execute(
            collation_of, {"table": outbox_events.name, "column": column}
        ).scalar()
        if found is not None and found != KEY_COLLATION:
            stale.append(column)
    return stale


def outdated_parts(sync_conn: Connection) -> list[str]:
    """Everything this version needs and the database lacks: tables, columns, indexes,
    collations.

    One inspector for the tables and columns: it reads the table list once.
    """
    inspector = inspect(sync_conn)
    tables = [f"table {name}" for name in _missing_tables(inspector)]
    collations = [
        f'{outbox_events.name}.{column} COLLATE "{KEY_COLLATION}"'
        for column in recollated_columns(sync_conn)
    ]
    return tables + _missing_columns(inspector) + missing_indexes(sync_conn) + collations


def upgrade_steps(sync_conn: Connection) -> list[tuple[str, list[str]]]:
    """The upgrade steps this database still needs, each as (what it does, its SQL), in
    order, decided from the database as it is now; nothing is changed.

    Empty for a current database. ``_upgrade`` runs them (init-db); ``schema_sql`` prints
    them (``init-db --sql``); ``engine.storage.alembic_ops`` runs them in a migration. The
    outbox tables must exist (``create_all`` makes missing ones first).
    """
    dialect = sync_conn.dialect
    pg = dialect.name == "postgresql"
    steps: list[tuple[str, list[str]]] = []
    for name in missing_columns(sync_conn):
        table, column = name.split(".")
        if name == "outbox_events.seq":
            if pg:  # PostgreSQL numbers the existing rows as it adds the identity column
                sql = [
                    "ALTER TABLE outbox_events "
                    "ADD COLUMN seq BIGINT GENERATED BY DEFAULT AS IDENTITY"
                ]
            else:
                sql = [
                    "ALTER TABLE outbox_events ADD COLUMN seq BIGINT",
                    "UPDATE outbox_events SET seq = rowid",
                ]
        elif name == "outbox_replay_log.action":
            sql = [
                "ALTER TABLE outbox_replay_log "
                "ADD COLUMN action VARCHAR(16) NOT NULL DEFAULT 'replay'"
            ]
        else:
            source = outbox_events if table == "outbox_events" else replay_log
            ddl_type = source.c[column].type.compile(dialect=dialect)
            sql = [f"ALTER TABLE {table} ADD COLUMN {column} {ddl_type}"]
        steps.append((f"added {name}", sql))
    if not pg and not _has_seq_trigger(sync_conn):
        steps.append(("", [SQLITE_SEQ_TRIGGER]))
    for column in recollated_columns(sync_conn):
        ddl_type = outbox_events.c[column].type.compile(dialect=dialect)
        steps.append(
            (
                f'{outbox_events.name}.{column} compared bytewise (COLLATE "{KEY_COLLATION}")',
                [f"ALTER TABLE {outbox_events.name} ALTER COLUMN {column} TYPE {ddl_type}"],
            )
        )
    respelled = respelled_indexes(sync_conn)
    for name in respelled:
        steps.append(("", [f"DROP INDEX {name}"]))  # made again below, spelled as now
    indexes = _index_names(sync_conn) - set(respelled)
    for index in indexes_for(dialect.name):
        if index.name not in indexes:
            create = str(CreateIndex(index).compile(dialect=dialect))
            steps.append((f"created index {index.name}", [create]))
    steps += _other_tables_indexes(sync_conn)
    for retired in _RETIRED_INDEXES + _RETIRED_ON.get(dialect.name, ()):
        if retired in indexes:
            steps.append((f"dropped index {retired}", [f"DROP INDEX {retired}"]))
    if pg and "ck_outbox_events_ordering_key" not in {
        c["name"] for c in inspect(sync_conn).get_check_constraints("outbox_events")
    }:
        steps.append(
            (
                "added checks ck_outbox_events_ordering_key, ck_outbox_events_max_attempts",
                [
                    "ALTER TABLE outbox_events ADD CONSTRAINT ck_outbox_events_ordering_key "
                    "CHECK (ordering_key <> '')",
                    # NOT VALID: new rows are checked; an old row with 0 is dead-lettered on
                    # its claim.
                    "ALTER TABLE outbox_events ADD CONSTRAINT ck_outbox_events_max_attempts "
                    "CHECK (max_attempts >= 1) NOT VALID",
                ],
            )
        )
    return steps


def _other_tables_indexes(sync_conn: Connection) -> list[tuple[str, list[str]]]:
    """Indexes of the other outbox tables that an earlier version's tables lack (0.1's
    ``outbox_replay_log`` had no ``ix_outbox_replay_log_event``); a missing table is made
    whole by ``create_all`` and is not looked at here."""
    inspector = inspect(sync_conn)
    present = set(inspector.get_table_names())
    steps = []
    for table in metadata.sorted_tables:
        if table is outbox_events or table.name not in present or not table.indexes:
            continue
        found = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            if index.name not in found:
                create = str(CreateIndex(index).compile(dialect=sync_conn.dialect))
                steps.append((f"created index {index.name}", [create]))
    return steps


def _has_seq_trigger(sync_conn: Connection) -> bool:
    found = sync_conn.execute(
        text("SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = 'outbox_events_seq'")
    )
    return found.first() is not None


def _upgrade(sync_conn: Connection) -> list[str]:
    done: list[str] = []
    for description, statements in upgrade_steps(sync_conn):
        for sql in statements:
            sync_conn.execute(text(sql))
        if description:
            done.append(description)
    return done


def _printable(ddl: str) -> str:
    """DDL as SQLAlchemy renders it, with its tabs as spaces and no trailing blanks."""
    return "\n".join(line.rstrip() for line in ddl.expandtabs(4).strip().splitlines())


def new_schema_sql(url: str | URL) -> list[str]:
    """Every statement that creates the outbox schema on an empty database of ``url``'s
    dialect, made without connecting (``init-db --sql`` for a SQLite file not there yet)."""
    statements: list[str] = []
    mock_url = make_url(url)

    def record(sql: Any, *_multiparams: Any, **_params: Any) -> None:
        statements.append(_printable(str(sql.compile(dialect=mock.dialect))))

    mock = create_mock_engine(mock_url, record)
    metadata.create_all(mock, checkfirst=False)
    return statements


def schema_sql(sync_conn: Connection) -> list[str]:
    """Every statement ``create_schema`` would run on this database, in order, without
    running any: the tables it lacks (with their indexes and, on SQLite, the ``seq``
    trigger), then the upgrade steps of tables an earlier version made. Empty when the
    database is current (``outbox-tui init-db --sql``)."""
    missing = [metadata.tables[name] for name in missing_tables(sync_conn)]
    statements: list[str] = []
    if missing:

        def record(sql: Any, *_multiparams: Any, **_params: Any) -> None:
            statements.append(_printable(str(sql.compile(dialect=sync_conn.dialect))))

        mock = create_mock_engine(sync_conn.engine.url, record)
        metadata.create_all(mock, tables=missing, checkfirst=False)
    if outbox_events not in missing:
        statements += [sql for _what, step in upgrade_steps(sync_conn) for sql in step]
    return statements


async def upgrade_schema(conn: AsyncConnection) -> list[str]:
    """Apply the steps this database still needs (inside the caller's transaction)."""
    result: Any = await conn.run_sync(_upgrade)
    return list(result)


async def schema_statements(engine: AsyncEngine) -> list[str]:
    """The SQL ``create_schema`` would run on this database, without running it (empty
    when the database is current); see engine.storage.migrations.schema_sql."""
    from engine.storage.database import read_only_engine, storage_errors

    async with storage_errors(engine.url), read_only_engine(engine).connect() as conn:
        statements: list[str] = await conn.run_sync(schema_sql)
    return statements
