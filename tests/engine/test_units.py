"""Pure logic: ids, backoff, schema specs, URLs."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine import BackoffPolicy, EventRegistry, EventSchemaSpec, mask_url
from engine.clock import uuid7
from engine.errors import ConfigurationError, DatabaseUrlError, EventRegistrationError
from engine.storage.database import parse_database_url
from engine.storage.secrets import mask_secrets


def test_uuid7_is_version_7_and_strictly_increasing():
    ids = [uuid7() for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    parsed = uuid.UUID(ids[0])
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert all(str(uuid.UUID(i)) == i for i in ids)  # the canonical lowercase text form


def test_exponential_backoff_doubles_up_to_the_cap():
    policy = BackoffPolicy(base_seconds=5, max_seconds=300, jitter=0)
    assert [policy.delay(n).total_seconds() for n in range(1, 9)] == [
        5,
        10,
        20,
        40,
        80,
        160,
        300,
        300,
    ]
    assert policy.delay(1000) == timedelta(seconds=300)


def test_fixed_backoff_and_jitter_bounds():
    assert BackoffPolicy(kind="fixed", base_seconds=7, jitter=0).delay(9) == timedelta(seconds=7)
    jittery = BackoffPolicy(base_seconds=10, max_seconds=10, jitter=0.5)
    delays = {jittery.delay(3, random.Random(i)).total_seconds() for i in range(50)}
    assert all(5 <= d <= 10 for d in delays) and len(delays) > 10


@pytest.mark.parametrize(
    "kwargs", [{"kind": "linear"}, {"base_seconds": -1}, {"jitter": 2}, {"max_seconds": 1}]
)
def test_backoff_rejects_invalid_settings(kwargs):
    with pytest.raises(ConfigurationError):
        BackoffPolicy(**kwargs)


def test_registry_rejects_duplicates_and_handlers_for_unknown_types():
    reg = EventRegistry()
    reg.register_event("a.b", 1)
    with pytest.raises(EventRegistrationError, match="registered twice"):
        reg.register_event("a.b", 1)
    with pytest.raises(EventRegistrationError, match="not registered"):
        reg.register_handler("x.y", lambda e: None, key="k")

    async def handler(envelope):
        return None

    reg.register_handler("a.b", handler, key="k")
    with pytest.raises(EventRegistrationError, match="registered twice"):
        reg.register_handler("a.b", handler, key="k")


def test_schema_spec_lists_every_problem():
    spec = EventSchemaSpec(required={"a": str, "n": (int, float)}, optional={"o": list})
    assert spec.problems({"a": "x", "n": 1.5}) == []
    assert spec.problems({"n": "1", "o": {}}) == [
        "missing required field 'a'",
        "field 'n' must be int | float, got str",
        "field 'o' must be list, got dict",
    ]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner, max_size=2)
    ),
    max_leaves=4,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "n", "o", "flag", "x"]), JSON_VALUES))
def test_the_fast_conformance_check_agrees_with_the_full_one_on_json_values(payload):
    spec = EventSchemaSpec(
        required={"a": str, "n": (int, float)}, optional={"o": list, "flag": bool}
    )
    assert spec.conforms(payload) == (spec.problems(payload) == [])


def test_urls_are_normalised_and_passwords_masked():
    assert parse_database_url("postgresql://u:p@h/db").drivername == "postgresql+asyncpg"
    assert parse_database_url("sqlite:///x.db").drivername == "sqlite+aiosqlite"
    assert mask_url("postgresql+asyncpg://u:s3cret@h:5432/db") == (
        "postgresql+asyncpg://u:***@h:5432/db"
    )
    assert "s3cret" not in mask_secrets(
        "could not connect to amqp://guest:s3cret@broker/ (s3cret)",
        "postgresql://u:s3cret@h/db",
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u:p@h/db", "unsupported database URL scheme 'mysql'"),
        ("not a url", "invalid database URL"),
        ("sqlite+aiosqlite://", "in-memory SQLite"),
        ("sqlite+aiosqlite:///:memory:", "in-memory SQLite"),
        ("sqlite:///file:outbox?mode=memory&uri=true", "in-memory SQLite"),
        ("sqlite:///file::memory:?cache=shared&uri=true", "in-memory SQLite"),
    ],
)
def test_bad_urls_give_one_clear_error(url, message):
    with pytest.raises(DatabaseUrlError, match=message):
        parse_database_url(url)


def test_bare_passwords_are_masked_as_whole_tokens_only():
    url = "postgresql://app:postgres@db/app"
    assert mask_secrets("use postgresql; password postgres rejected", url) == (
        "use postgresql; password *** rejected"
    )
    assert "s3cr" not in mask_secrets("raw s3cr%40t and s3cr@t", "amqp://u:s3cr%40t@mq/")


def test_passwords_in_the_query_string_are_masked_too():
    url = "postgresql+asyncpg://app@db:5432/app?password=hunter2&sslmode=require"
    assert "hunter2" not in mask_url(url)
    assert "password=***" in mask_url(url)
    assert "hunter2" not in mask_secrets(f"connect to {url} failed: hunter2 rejected", url)


def test_a_password_with_a_raw_at_sign_is_masked_whole_and_refused():
    """A parser splits ``user:p@ss@host`` at the first ``@``: the rest of the password
    would become the host and appear in every connection error."""
    url = "postgresql+asyncpg://outbox:p@S3cret@127.0.0.1:5432/app"
    assert mask_url(url) == "postgresql+asyncpg://outbox:***@127.0.0.1:5432/app"
    assert "S3cret" not in mask_secrets(f"cannot reach the database at {url}: refused")
    assert "S3cret" not in mask_url("amqp://guest:p@S3cret@broker/")
    with pytest.raises(DatabaseUrlError, match="percent-encode it") as refused:
        parse_database_url(url)
    assert "S3cret" not in str(refused.value)
    assert parse_database_url("postgresql://outbox:p%40S3cret@h/app").password == "p@S3cret"
    # JSON with no spaces: the mask stops at the quote, the next field is left alone.
    assert mask_secrets('{"url":"postgresql://u:pw@h/d","owner":"x@y"}') == (
        '{"url":"postgresql://u:***@h/d","owner":"x@y"}'
    )


def test_masking_leaves_the_program_name_alone():
    url = "postgresql://outbox:outbox@db/app"
    assert mask_secrets("outbox-tui: error: password outbox rejected", url) == (
        "outbox-tui: error: password *** rejected"
    )


def test_libpq_sslmode_becomes_asyncpg_ssl_and_bad_ports_are_url_errors():
    parsed = parse_database_url("postgresql://u:p@h/db?sslmode=require")
    assert dict(parsed.query) == {"ssl": "require"}
    with pytest.raises(DatabaseUrlError, match="invalid database URL") as err:
        parse_database_url("postgresql://u:s3cret@h:abc/db")
    assert "s3cret" not in str(err.value)


def _loads_outcome(decode, text):
    try:
        return "ok", decode(text)
    except ValueError as exc:
        return "error", str(exc)


@settings(max_examples=300, deadline=None)
@given(
    value=JSON_VALUES,
    before=st.sampled_from(["", " ", "\n\t"]),
    after=st.sampled_from(["", " ", "\n", "x", "]", "{}", ' "z"']),
)
@example(value=float("inf"), before="", after="")
@example(value=[float("-inf")], before=" ", after="x")
def test_the_payload_decoder_accepts_and_refuses_exactly_what_strict_json_loads_does(
    value, before, after
):
    """decode_json takes the scanner's short cut only for one bare value; white space
    around it, trailing data and every error end in json.loads, message and all. Infinity
    (which json.dumps writes for inf) is refused, as by every JSON parser but Python's."""
    import json

    from engine.storage.payloads import decode_json

    text = before + json.dumps(value) + after
    ours, theirs = _loads_outcome(decode_json, text), _loads_outcome(_strict_loads, text)
    assert ours[0] == theirs[0]
    assert json.dumps(ours[1]) == json.dumps(theirs[1])


@settings(deadline=None)
@given(text=st.text(max_size=40))
def test_the_payload_decoder_agrees_with_json_loads_on_any_text(text):
    import json

    from engine.storage.payloads import decode_json

    ours, theirs = _loads_outcome(decode_json, text), _loads_outcome(_strict_loads, text)
    assert ours[0] == theirs[0]
    assert json.dumps(ours[1]) == json.dumps(theirs[1])


def _strict_loads(text):
    """json.loads with NaN, Infinity and -Infinity refused: the oracle for decode_json."""
    import json

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("text", ["NaN", "[1, Infinity]", ' {"a": -Infinity}', "NaN x"])
def test_the_payload_decoder_refuses_what_only_python_calls_json(text):
    from engine.storage.payloads import decode_json

    with pytest.raises(ValueError, match="is not JSON"):
        decode_json(text)


def _row(**changes):
    from datetime import UTC, datetime

    row = {
        "id": "0193f2c4-0000-7000-8000-000000000001",
        "tenant_id": "acme",
        "event_type": "orders.placed",
        "event_version": 2,
        "aggregate_type": "order",
        "aggregate_id": "o-1",
        "ordering_key": None,
        "seq": 7,
        "claim_version": 3,
        "attempt_count": 2,
        "max_attempts": 5,
        "replay_count": 1,
        "created_at": datetime(2026, 12, 3, 12, 0, tzinfo=UTC),
        "causation_id": "0193f2c4-0000-7000-8000-000000000000",
        "correlation_id": "0193f2c4-0000-7000-8000-00000000000a",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "vendor=abc",
        "payload": '{"tenant_id": "acme"}',
    }
    row.update(changes)
    return row


def test_an_envelope_from_a_row_is_the_one_its_constructor_makes():
    from dataclasses import replace

    from engine import TaskContext
    from engine.writing.envelope import EventEnvelope

    row, payload = (
        _row(ordering_key="order:o-1"),
        {"tenant_id": "acme", "actor_id": 7, "trace_id": "t"},
    )
    built = EventEnvelope.from_row(row, payload)
    made = EventEnvelope(
        row["id"], "acme", "orders.placed", 2, "order", "o-1", payload, row["created_at"]
    )
    assert built == replace(
        made,
        attempt_count=2,
        max_attempts=5,
        claim_version=3,
        replay_count=1,
        causation_id=row["causation_id"],
        correlation_id=row["correlation_id"],
        ordering_key="order:o-1",
        traceparent=row["traceparent"],
        tracestate="vendor=abc",
    )
    assert built.chain_id == row["correlation_id"]
    assert made.chain_id == made.event_id  # a first event is its own chain
    assert type(built) is EventEnvelope and hash(built.event_id)
    with pytest.raises(AttributeError):
        built.attempt_count = 9  # type: ignore[misc]  # still frozen
    context = built.task_context()
    assert context == TaskContext("acme", "7", "", "t")

    class Traced(EventEnvelope):
        __slots__ = ()

    assert type(Traced.from_row(row, payload)) is Traced
    with pytest.raises(TypeError, match="not a JSON object"):
        EventEnvelope.from_row(row, ["not", "a", "mapping"])


def _decode_outcomes(registry, row, payload_text, max_attempts=None):
    """What the dispatcher's quick decode and its full checks make of one claimed row."""
    from engine.dispatch.claimed import ClaimedRow
    from engine.dispatch.decoding import Decoder

    decoder = Decoder(registry, max_attempts)
    claimed = ClaimedRow(row, payload_text)
    envelope, problem = decoder._decode(claimed)
    if envelope is not None and claimed.attempt_count > decoder.budget(claimed):
        envelope, problem = None, "attempts exhausted"
    return decoder._clean_envelope(claimed), envelope, problem


_SOUND = '{"tenant_id": "acme", "actor_id": "a", "request_id": "r", "total": 5}'


@pytest.mark.parametrize(
    ("changes", "payload", "max_attempts", "quick_way"),
    [
        ({}, _SOUND, None, True),
        ({}, " " + _SOUND + "\n", None, True),  # white space around: json.loads takes it
        ({}, _SOUND.replace("5}", "5.5}"), None, True),  # a float where a float may go
        ({}, _SOUND.replace('"a"', '"\\ud800"'), None, True),  # a lone surrogate
        ({"attempt_count": 5}, _SOUND, None, True),  # the last attempt of five
        ({"attempt_count": 6}, _SOUND, None, False),  # spent: dead letter
        ({"attempt_count": 3}, _SOUND, 2, False),  # spent by the dispatcher's own budget
        ({"event_version": 3}, _SOUND, None, False),  # not registered
        ({"event_type": "orders.shipped"}, _SOUND, None, False),
        ({"tenant_id": "other"}, _SOUND, None, False),  # the payload's tenant differs
        ({}, _SOUND.replace('"total": 5', '"total": "5"'), None, False),  # schema
        ({}, _SOUND.replace('"actor_id": "a", ', ""), None, False),  # no actor
        ({}, '{"tenant_id": "acme"', None, False),  # not JSON
        ({}, "[1, 2]", None, False),  # not an object
        ({}, _SOUND + " {}", None, False),  # trailing data
        ({"id": 17}, _SOUND, None, False),  # an old SQLite table took an integer id
        ({"max_attempts": 0}, _SOUND, None, False),
        ({"replay_count": None}, _SOUND, None, False),
        ({"created_at": None}, _SOUND, None, False),
        ({"aggregate_id": 5}, _SOUND, None, False),
    ],
)
def test_the_quick_decode_takes_only_rows_the_full_checks_pass_and_builds_the_same(
    changes, payload, max_attempts, quick_way
):
    registry = EventRegistry()
    registry.register_event(
        "orders.placed", 2, EventSchemaSpec(required={"total": float}, optional={})
    )
    quick, full, problem = _decode_outcomes(registry, _row(**changes), payload, max_attempts)
    assert quick is None or quick == full, problem
    assert (quick is not None) is quick_way
    if quick is not None:
        assert registry.conforms("orders.placed", 2, dict(quick.payload), quick.tenant_id)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("event_version", "2"),
        ("event_version", True),
        ("attempt_count", 2.0),
        ("replay_count", None),
        ("max_attempts", 0),
        ("created_at", None),
        ("tenant_id", 1),
        ("event_type", None),
        ("aggregate_type", b"order"),
        ("aggregate_id", 5),
    ],
)
def test_a_corrupt_row_is_named_by_its_column_and_a_sound_one_passes(column, value):
    from engine.dispatch.claimed import ClaimedRow

    assert ClaimedRow(_row(), "{}").problem() is None
    problem = ClaimedRow(_row(**{column: value}), "{}").problem()
    assert problem is not None and problem.startswith(f"corrupt row: column {column} ")


def test_a_read_only_sqlite_file_says_what_the_reader_lacks():
    """WAL mode writes the -wal and -shm files even to read: a user who can only read the
    file gets the reason, not a bare driver message."""
    import sqlite3

    from engine.storage.database import translate_storage_error

    error = translate_storage_error(
        sqlite3.OperationalError("attempt to write a readonly database")
    )
    assert str(error).startswith("database error: attempt to write a readonly database: ")
    assert "-wal and -shm files" in str(error)


async def test_a_url_query_parameter_the_driver_does_not_take_is_a_url_error():
    """asyncpg's connect() raises TypeError for ``?bogus=1``: a bad URL (exit 2), not a bug."""
    from engine.storage.database import storage_errors

    with pytest.raises(DatabaseUrlError, match="query parameter its driver does not take: 'bogus'"):
        async with storage_errors():
            raise TypeError("connect() got an unexpected keyword argument 'bogus'")
    with pytest.raises(TypeError, match="unsupported operand"):  # any other TypeError: a bug
        async with storage_errors():
            raise TypeError("unsupported operand type(s)")
