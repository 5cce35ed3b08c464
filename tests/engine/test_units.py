"""Pure logic: ids, backoff, schema specs, URLs."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import BackoffPolicy, EventRegistry, EventSchemaSpec, mask_url
from engine.clock import uuid7
from engine.database import mask_secrets, parse_database_url
from engine.errors import ConfigurationError, DatabaseUrlError, EventRegistrationError


def test_uuid7_is_version_7_and_strictly_increasing():
    ids = [uuid7() for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    parsed = uuid.UUID(ids[0])
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert all(str(uuid.UUID(i)) == i for i in ids)  # the canonical lowercase text form


def test_exponential_backoff_doubles_up_to_the_cap():
    policy = BackoffPolicy(base_seconds=5, max_seconds=300)
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
    assert BackoffPolicy(kind="fixed", base_seconds=7).delay(9) == timedelta(seconds=7)
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
    lambda inner: st.lists(inner, max_size=2)
    | st.dictionaries(st.text(max_size=2), inner, max_size=2),
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
