"""Bad input (issue 9): rows another language's producer could write, odd data, bad arguments.

Rows go in with plain SQL, as a producer without this library would write them; delivery
runs through the real CLI (``outbox-tui dispatch-once --installed-app``) with
tests/reliability/bad_input_app.py. Each bad row must end as a dead letter whose reason
names what is wrong, a good row claimed in the same batch must still be published, and
what the database itself refuses must be refused at INSERT, never left to a dispatcher.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Text, TextClause, cast, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import EventRegistry, OutboxEventPublisher, create_engine, create_schema, unit_of_work
from engine.running.heartbeat import Heartbeat
from engine.storage.schema import outbox_events
from tests.cli.conftest import Cli, Result
from tests.engine.conftest import CTX
from tests.reliability import bad_input_app as app
from tests.reliability.results import ROOT, ScenarioResult, record

APP = "tests.reliability.bad_input_app"
INSERT = (
    "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, aggregate_type, "
    "aggregate_id, payload, ordering_key) VALUES (:id, :tenant_id, :event_type, {version}, "
    ":aggregate_type, :aggregate_id, :payload, :ordering_key)"
)


def insert_sql(values: Mapping[str, Any]) -> TextClause:
    """The INSERT a producer in another language writes; a text version goes in literally."""
    version = values["event_version"]
    literal = f"'{version}'" if isinstance(version, str) else ":event_version"
    return text(INSERT.format(version=literal))


UNKNOWN_TYPE = "billing.invoiced"  # no dispatcher here serves it


def payload(tenant: str = "acme", **fields: Any) -> dict[str, Any]:
    return {"tenant_id": tenant, "actor_id": "u-1", "request_id": "r-1", **fields}


def good(**fields: Any) -> dict[str, Any]:
    return payload(order_id="o-1", amount=5, **fields)


def row(event_id: str, body: Any, **columns: Any) -> dict[str, Any]:
    """One plain-SQL row: ``body`` is the payload as the producer's JSON text."""
    return {
        "id": event_id,
        "tenant_id": "acme",
        "event_type": app.ORDER,
        "event_version": 1,
        "aggregate_type": "order",
        "aggregate_id": "o-1",
        "ordering_key": None,
        **columns,
        "payload": body if isinstance(body, str) else json.dumps(body),
    }


# id -> (row, a fragment the dead-letter reason must contain): valid for both databases.
BAD_ROWS: dict[str, tuple[dict[str, Any], str]] = {
    "unknown-version": (
        row("unknown-version", good(), event_version=7),
        "permanent: schema: event type 'bad.order' version 7 is not registered "
        "(registered versions: [1])",
    ),
    "tenant-mismatch": (
        row("tenant-mismatch", good(tenant="globex")),
        "payload tenant_id 'globex' does not match the event's tenant 'acme'",
    ),
    "no-tenant": (
        row("no-tenant", {"actor_id": "u-1", "request_id": "r-1", "order_id": "o", "amount": 1}),
        "bad.order v1: missing required field 'tenant_id'",
    ),
    "array-payload": (
        row("array-payload", [1, 2, 3]),
        "bad.order v1: payload must be a JSON object, got list",
    ),
    "string-payload": (
        row("string-payload", '"just text"'),
        "bad.order v1: payload must be a JSON object, got str",
    ),
    "schema-violation": (
        row("schema-violation", payload(amount="ten")),
        "bad.order v1: missing required field 'order_id'; field 'amount' must be int, got str",
    ),
}
# What PostgreSQL's column types refuse at INSERT: SQLite refuses them too (the CHECKs of
# tables this version makes), but a table an earlier version made takes them, so there
# they must become dead letters naming the problem.
REFUSED_ROWS: dict[str, tuple[dict[str, Any], dict[str, str], str]] = {
    # id -> (row, each database's refusal, the dead-letter reason on an older SQLite table)
    "corrupt-json": (
        row("corrupt-json", '{"tenant_id": "acme", "order_id": '),
        {
            "postgresql": "invalid input syntax for type json",
            "sqlite": "CHECK constraint failed: ck_outbox_events_payload_json",
        },
        "corrupt payload: not valid JSON (",
    ),
    "version-v1": (
        row("version-v1", good(), event_version="v1"),
        {
            "postgresql": "invalid input syntax for type integer",
            "sqlite": "CHECK constraint failed: ck_outbox_events_event_version_type",
        },
        "corrupt row: column event_version is 'v1', not an integer",
    ),
}
# Every text column, with unicode and control characters (NUL only where it can be stored).
ODD = "ü✓\t\x01\x1b[31m\x7f😀\u200b\u202ee\u0301\n\r\\\"'%_"


def odd(text_: str, nul: bool) -> str:
    return text_ + ODD + ("\x00" if nul else "")


async def insert_rows(engine: AsyncEngine, rows: list[dict[str, Any]]) -> None:
    async with engine.begin() as conn:
        for values in rows:
            await conn.execute(insert_sql(values), values)


async def stored(engine: AsyncEngine) -> dict[str, dict[str, Any]]:
    """Every row, its payload as stored text (a corrupt one cannot be decoded)."""
    t = outbox_events
    columns = [c for c in t.c if c.name != "payload"] + [cast(t.c.payload, Text).label("payload")]
    async with engine.connect() as conn:
        result = await conn.execute(select(*columns))
        return {r["id"]: dict(r) for r in result.mappings()}


def dispatch_once(cli: Cli, url: str, log: Path) -> dict[str, Any]:
    result = cli(
        "dispatch-once",
        "--installed-app",
        APP,
        "--batch-size",
        "100",
        "--instance-id",
        "bad-input",
        "--json",
        env={"OUTBOX_DATABASE_URL": url, "PYTHONPATH": str(ROOT), "BAD_INPUT_LOG": str(log)},
    )
    assert result.returncode == 0, result
    assert "Traceback" not in result.output
    record_: dict[str, Any] = result.json()
    return record_


def delivered(log: Path) -> dict[str, dict[str, Any]]:
    if not log.exists():
        return {}
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    by_id = {line["id"]: line for line in lines}
    assert len(by_id) == len(lines), "an event was delivered twice"
    return by_id


def counters(record_: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    return (
        record_["claimed"],
        record_["published"],
        record_["failed"],
        record_["dead_lettered"],
        record_["lost_leases"],
    )


async def refuse_or_accept_as_old_table(engine: AsyncEngine, database: str) -> list[str]:
    """REFUSED_ROWS at INSERT: PostgreSQL refuses them; SQLite refuses them, and an older
    SQLite table (no CHECKs: ``ignore_check_constraints``) takes them. Returns the ids
    stored, which must become dead letters."""
    for values, refusals, _reason in REFUSED_ROWS.values():
        expected = IntegrityError if database == "sqlite" else DBAPIError
        with pytest.raises(expected) as refused:
            await insert_rows(engine, [values])
        assert refusals[database] in str(refused.value)
    if database != "sqlite":
        return []
    async with engine.begin() as conn:
        await conn.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
        for values, _refusal, _reason in REFUSED_ROWS.values():
            await conn.execute(insert_sql(values), values)
        await conn.exec_driver_sql("PRAGMA ignore_check_constraints = OFF")
    return list(REFUSED_ROWS)


async def bad_rows(engine: AsyncEngine, database: str, cli: Cli, url: str, log: Path) -> int:
    """Each bad row is dead-lettered with its reason, beside good rows that publish."""
    await insert_rows(engine, [row("good-first", good())])
    old_table = await refuse_or_accept_as_old_table(engine, database)
    await insert_rows(engine, [values for values, _why in BAD_ROWS.values()])
    await insert_rows(engine, [row("unknown-type", good(), event_type=UNKNOWN_TYPE)])
    await insert_rows(engine, [row("good-last", good())])
    expected = {event_id: why for event_id, (_values, why) in BAD_ROWS.items()}
    expected |= {event_id: REFUSED_ROWS[event_id][2] for event_id in old_table}

    result = dispatch_once(cli, url, log)
    # One batch: every bad row and both good rows; the unknown type is not even claimed.
    assert counters(result) == (len(expected) + 2, 2, 0, len(expected), 0)
    assert sorted(delivered(log)) == ["good-first", "good-last"]
    rows = await stored(engine)
    for event_id in ("good-first", "good-last"):
        assert rows[event_id]["status"] == "published"
    for event_id, why in expected.items():
        dead = rows[event_id]
        assert dead["status"] == "dead_letter", dead
        assert why in dead["dead_letter_reason"], (event_id, dead["dead_letter_reason"])
        assert dead["attempt_count"] == 1 and dead["locked_by"] is None
    # Issue 9, defect 6: a dispatcher claims only the types it serves; the others wait,
    # untouched (no attempt spent), and stats show them as served by no dispatcher.
    unknown = rows["unknown-type"]
    assert (unknown["status"], unknown["attempt_count"], unknown["claim_version"]) == (
        "pending",
        0,
        0,
    )
    assert counters(dispatch_once(cli, url, log)) == (0, 0, 0, 0, 0)  # nothing churns

    env = {"OUTBOX_DATABASE_URL": url}
    listed = cli("dead-letter", "list", "--json", env=env)
    assert listed.returncode == 0, listed
    assert "Traceback" not in listed.output
    assert {e["id"] for e in json_records(listed)} == set(expected)
    await Heartbeat(engine, "bad-input:1").beat({"serves": [app.ORDER, app.ODD_TYPE]})
    stats = cli("stats", "--json", env=env)
    assert stats.returncode == 0, stats
    [unserved] = stats.json()["unserved"]
    assert (unserved["event_type"], unserved["count"]) == (UNKNOWN_TYPE, 1)
    return len(rows)


def json_records(result: Result) -> list[dict[str, Any]]:
    """``dead-letter list --json``: one JSON document (a list, or an object with events)."""
    data = result.json()
    if isinstance(data, dict):
        data = data.get("events", data.get("dead_letters", data))
    assert isinstance(data, list), data
    return data


async def large_and_odd(engine: AsyncEngine, database: str, cli: Cli, url: str, log: Path) -> int:
    """A 1 MB payload and unicode/control characters in every text field publish intact."""
    nul = database == "sqlite"  # PostgreSQL's text and jsonb cannot hold NUL (see below)
    blob = ("0123456789abcdef✓ü😀\t\n" * 50_000)[: 1 << 20]
    big = row("big", good(blob=blob, nested={"list": [blob[:1000]] * 50}))
    odd_tenant = odd("tenant-", nul)
    odd_payload = payload(odd_tenant, **{odd("key-", nul): odd("value-", nul), "n": [ODD, 1.5]})
    strange = row(
        odd("id-", nul)[:36],
        odd_payload,
        tenant_id=odd_tenant,
        event_type=app.ODD_TYPE,
        aggregate_type=odd("aggregate-type-", nul),
        aggregate_id=odd("aggregate-", nul),
        ordering_key=odd("key-", nul),
    )
    assert len(big["payload"].encode()) > 1 << 20
    written = [big, strange, row("plain", good())]
    await insert_rows(engine, written)

    result = dispatch_once(cli, url, log)
    assert counters(result) == (3, 3, 0, 0, 0), result
    seen = delivered(log)
    rows = await stored(engine)
    for values in written:
        event_id = values["id"]
        assert rows[event_id]["status"] == "published", rows[event_id]
        got = seen[event_id]
        for column in ("tenant_id", "event_type", "aggregate_type", "aggregate_id"):
            assert got[column] == values[column], column
            assert rows[event_id][column] == values[column], column
        assert rows[event_id]["ordering_key"] == values["ordering_key"]
        assert got["payload"] == json.loads(values["payload"])
        assert json.loads(rows[event_id]["payload"]) == json.loads(values["payload"])
    return len(written)


async def nul_on_postgresql(engine: AsyncEngine, cli: Cli, url: str, log: Path) -> list[str]:
    """PostgreSQL refuses NUL at INSERT with its own clear error: nothing reaches a dispatcher."""
    notes = []
    cases = {
        "NUL in a text column": (
            row("nul-text", good(tenant="ac\x00me"), tenant_id="ac\x00me"),
            'invalid byte sequence for encoding "UTF8": 0x00',
        ),
        "NUL in the payload": (
            row("nul-json", good(note="a\x00b")),
            "unsupported Unicode escape sequence",
        ),
    }
    for what, (values, refusal) in cases.items():
        with pytest.raises(DBAPIError, match=refusal):
            await insert_rows(engine, [values])
        notes.append(f"{what}: refused at INSERT ({refusal})")
    registry = EventRegistry()
    app.register(registry)
    with pytest.raises(DBAPIError, match="unsupported Unicode escape sequence"):
        async with unit_of_work(engine, registry=registry, context=CTX) as session:
            await OutboxEventPublisher(session).publish(
                app.ORDER, {"order_id": "o\x00", "amount": 1}, aggregate_type="o", aggregate_id="1"
            )
    notes.append("NUL through OutboxEventPublisher: the same refusal, raised by publish()")
    await insert_rows(engine, [row("after-nul", good())])
    assert counters(dispatch_once(cli, url, log)) == (1, 1, 0, 0, 0)
    assert sorted(await stored(engine)) == ["after-nul"]  # the refused rows left nothing
    return notes


async def test_bad_input(database_url: str, cli: Cli, tmp_path: Path) -> None:
    database = "postgresql" if database_url.startswith("postgresql") else "sqlite"
    await create_schema(database_url)
    engine = create_engine(database_url)
    notes: list[str] = []
    try:
        events = await bad_rows(engine, database, cli, database_url, tmp_path / "bad.log")
        await clear(engine)
        events += await large_and_odd(engine, database, cli, database_url, tmp_path / "odd.log")
        if database == "postgresql":
            await clear(engine)
            notes += await nul_on_postgresql(engine, cli, database_url, tmp_path / "nul.log")
            events += 1
    finally:
        await engine.dispose()
    dead = sorted(BAD_ROWS) + (sorted(REFUSED_ROWS) if database == "sqlite" else [])
    if database == "sqlite":
        notes.insert(
            0,
            "corrupt-json and version-v1 are refused at INSERT by this version's "
            "CHECKs; on a table made before them they become dead letters",
        )
    else:
        notes.insert(0, "corrupt-json and version-v1 are refused at INSERT by the column types")
    record(
        ScenarioResult(
            scenario="bad-input",
            database=database,
            runs=1,
            events=events,
            command=f'make test PYTEST_ARGS="tests/reliability/test_bad_input.py -k {database}"',
            notes=[
                f"dead letters with their reason: {', '.join(dead)}",
                f"an unknown type ({UNKNOWN_TYPE}) stays pending unattempted, "
                "listed as served by no dispatcher",
                "a 1 MB payload and unicode/control characters in every text field "
                f"{'(with NUL) ' if database == 'sqlite' else ''}published intact",
                *notes,
            ],
            soak=False,
        )
    )


async def clear(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM outbox_handler_runs"))
        await conn.execute(text("DELETE FROM outbox_events"))
        await conn.execute(text("DELETE FROM process_heartbeats"))


# -- bad arguments and URLs, through the CLI (beyond tests/cli/test_errors.py) ------------

SECRET = "hunter2"


@pytest.mark.parametrize(
    ("args", "fragments", "status"),
    [
        pytest.param(
            ["stats", "--database-url", f"postgresql+asyncpg://app:{SECRET}@db:notaport/app"],
            ["invalid database URL", "'postgresql+asyncpg://app:***@db:notaport/app'"],
            2,
            id="non-numeric-port",
        ),
        pytest.param(
            ["stats", "--database-url", "no scheme at all"],
            ["invalid database URL 'no scheme at all'", "Could not parse"],
            2,
            id="not-a-url",
        ),
        pytest.param(
            ["dispatch-once", "--installed-app", APP, "--database-url", "sqlite+aiosqlite://"],
            ["an in-memory SQLite database lasts as long as one connection", "give a file path"],
            2,
            id="in-memory-sqlite",
        ),
        pytest.param(
            ["init-db", "--database-url", "sqlite+aiosqlite:///:memory:"],  # said it created one
            ["an in-memory SQLite database lasts as long as one connection", "give a file path"],
            2,
            id="memory-sqlite-init-db",
        ),
        pytest.param(
            ["dispatch-once", "--installed-app", APP, "--amqp-url", "http://broker/"],
            ["RabbitMQ URL must start with amqp:// or amqps://", "scheme 'http'"],
            2,
            id="amqp-wrong-scheme",
        ),
        pytest.param(
            ["dispatch-once", "--installed-app", APP, "--amqp-url", f"guest:{SECRET}@broker/"],
            ["RabbitMQ URL must start with amqp:// or amqps://", "no scheme"],
            2,
            id="amqp-no-scheme",
        ),
        pytest.param(
            ["dispatch-once", "--installed-app", APP, "--amqp-url", f"amqp//guest:{SECRET}@b/"],
            ["RabbitMQ URL must start with amqp:// or amqps://", "no scheme"],
            2,
            id="amqp-scheme-without-colon",
        ),
        pytest.param(
            [
                "dispatch-once",
                "--installed-app",
                APP,
                "--amqp-url",
                f"amqp://guest:{SECRET}@broker:notaport/",
            ],
            ["invalid RabbitMQ URL", "notaport"],
            2,
            id="amqp-non-numeric-port",
        ),
        pytest.param(
            ["dispatch-once", "--installed-app", APP, "--lease-seconds", "nan"],
            ["--lease-seconds must be a number greater than 0", "got nan"],
            2,
            id="lease-nan",
        ),
        pytest.param(
            ["dispatch-once", "--installed-app", APP, "--batch-size", "0"],
            ["--batch-size must be an integer between 1 and 1000, got 0"],
            2,
            id="batch-size-zero",
        ),
        pytest.param(
            ["dead-letter", "list", "--limit", "many"],
            ["argument --limit: expected a whole number, got 'many'"],
            2,
            id="limit-not-a-number",
        ),
        pytest.param(
            ["dead-letter", "replay", "--event-id", "x"],
            ["refusing to replay without confirmation: add --yes"],
            2,
            id="replay-without-yes",
        ),
    ],
)
async def test_bad_arguments_get_one_clear_line(
    cli: Cli, sqlite_url: str, args: list[str], fragments: list[str], status: int
) -> None:
    await create_schema(sqlite_url)
    env = {"OUTBOX_DATABASE_URL": sqlite_url, "PYTHONPATH": str(ROOT)}
    result = cli(*args, env=env)
    result.assert_one_error_line(*fragments, status=status)
    assert result.stdout == ""
    assert SECRET not in result.output
