"""Settings: defaults, OUTBOX_ environment with __ nesting, overrides, one-line errors."""

from __future__ import annotations

import random

import pytest

from engine import EventRegistry, OutboxDispatcher, build_dispatcher, create_engine
from engine.errors import ConfigurationError, DatabaseUrlError
from engine.settings import DispatcherSettings, OutboxSettings, load_settings, misspelt_variables


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("OUTBOX_") and not name.startswith("OUTBOX_TEST_"):
            monkeypatch.delenv(name)


def test_defaults_survive_a_short_outage():
    settings = load_settings()
    assert settings.database_url == "sqlite+aiosqlite:///./outbox.db"
    d = settings.dispatcher
    assert (d.batch_size, d.idle_sleep_seconds, d.lease_seconds, d.max_attempts) == (
        100,
        1,
        30,
        None,
    )
    assert (d.backoff_kind, d.backoff_base_seconds, d.backoff_max_seconds) == (
        "exponential",
        5,
        300,
    )
    assert d.retention_seconds == 7 * 24 * 3600 and d.use_lock is False and d.wakeup == "auto"
    # the waits between the 10 attempts: 5, 10, ..., 160, then capped at 300
    waits = [min(300, 5 * 2 ** (n - 1)) for n in range(1, 10)]
    assert sum(waits) == 1215  # ~20 minutes of consecutive failure before a dead letter


def test_a_dispatcher_built_directly_retries_as_one_built_from_settings(tmp_path):
    """One backoff default: ``OutboxDispatcher(engine, registry)`` without a policy spreads
    its retries with the same jitter as ``build_dispatcher`` from default settings."""
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'outbox.db'}")
    direct = OutboxDispatcher(engine, EventRegistry())
    built = build_dispatcher(engine, EventRegistry(), DispatcherSettings())
    assert direct.backoff == built.backoff
    assert direct.backoff.jitter == DispatcherSettings().backoff_jitter > 0
    waits = {direct.backoff.delay(1, random.Random(seed)).total_seconds() for seed in range(20)}
    assert len(waits) > 1 and all(4.5 <= wait <= 5 for wait in waits)  # 5 s, less up to 10 %


def test_environment_with_prefix_and_nesting(monkeypatch):
    monkeypatch.setenv("OUTBOX_DISPATCHER__BATCH_SIZE", "7")
    monkeypatch.setenv("OUTBOX_DISPATCHER__USE_LOCK", "true")
    monkeypatch.setenv("OUTBOX_DISPATCHER__RETENTION_SECONDS", "none")
    monkeypatch.setenv("OUTBOX_DATABASE_URL", "postgresql+asyncpg://u:p@db/outbox")
    settings = load_settings()
    assert settings.dispatcher.batch_size == 7
    assert settings.dispatcher.use_lock is True
    assert settings.dispatcher.retention_seconds is None
    assert settings.database_url == "postgresql+asyncpg://u:p@db/outbox"
    assert OutboxSettings().dispatcher.batch_size == 7  # the class reads the environment too


def test_explicit_overrides_win_and_none_means_not_given(monkeypatch):
    monkeypatch.setenv("OUTBOX_DISPATCHER__BATCH_SIZE", "7")
    monkeypatch.setenv("OUTBOX_DISPATCHER__IDLE_SLEEP_SECONDS", "2.5")
    settings = load_settings(batch_size=50, lease_seconds=None, database_url=None)
    assert settings.dispatcher.batch_size == 50
    assert settings.dispatcher.idle_sleep_seconds == 2.5  # env kept beside the override
    assert settings.dispatcher.lease_seconds == 30
    nested = load_settings(dispatcher={"retention_seconds": 0})
    assert nested.dispatcher.retention_seconds == 0 and nested.dispatcher.batch_size == 7
    with pytest.raises(TypeError, match="batchsize"):
        load_settings(batchsize=3)


@pytest.mark.parametrize(
    ("overrides", "env", "message"),
    [
        (
            {"batch_size": 0},
            {},
            "OUTBOX_DISPATCHER__BATCH_SIZE / --batch-size must be an integer between 1 and 1000,"
            " got 0",
        ),
        (
            {},
            {"OUTBOX_DISPATCHER__BATCH_SIZE": "lots"},
            "OUTBOX_DISPATCHER__BATCH_SIZE / --batch-size must be an integer between 1 and 1000,"
            " got lots",
        ),
        (
            {"idle_sleep_seconds": 0},
            {},
            "OUTBOX_DISPATCHER__IDLE_SLEEP_SECONDS / --idle-sleep-seconds must be a number"
            " greater than 0 and at most 3600, got 0",
        ),
        (
            {"backoff_kind": "linear"},
            {},
            "OUTBOX_DISPATCHER__BACKOFF_KIND / --backoff-kind must be one of exponential, fixed,"
            " got linear",
        ),
        (
            {"backoff_jitter": 2},
            {},
            "OUTBOX_DISPATCHER__BACKOFF_JITTER / --backoff-jitter must be a number between 0 and 1,"
            " got 2",
        ),
        (
            {"backoff_base_seconds": 10, "backoff_max_seconds": 5},
            {},
            "OUTBOX_DISPATCHER__BACKOFF_MAX_SECONDS / --backoff-max-seconds must be at least"
            " backoff_base_seconds (10), got 5.0",
        ),
        (
            {"retention_seconds": -1},
            {},
            "OUTBOX_DISPATCHER__RETENTION_SECONDS / --retention-seconds must be a number between"
            " 0 and 315360000, or none, got -1",
        ),
        (
            {},
            {"OUTBOX_DISPATCHER__WAKEUP": "always"},
            "OUTBOX_DISPATCHER__WAKEUP / --wakeup must be one of auto, off, got always",
        ),
        (
            {},
            {"OUTBOX_DISPATCHER__BATCHSIZE": "7"},
            "OUTBOX_DISPATCHER__BATCHSIZE is not a known setting",
        ),
        (
            {},
            {"OUTBOX_EXCHANGE": ""},
            "OUTBOX_EXCHANGE / --exchange must be a non-empty string, got ''",
        ),
    ],
)
def test_invalid_values_give_one_line_naming_the_setting(monkeypatch, overrides, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings(**overrides)
    assert str(caught.value) == message
    assert "\n" not in str(caught.value)


def test_an_unsupported_database_url_is_a_configuration_error():
    with pytest.raises(DatabaseUrlError) as caught:
        load_settings(database_url="mysql://u:secret@db/outbox")
    text = str(caught.value)
    assert text.startswith("OUTBOX_DATABASE_URL / --database-url: unsupported database URL")
    assert "secret" not in text and "\n" not in text


def test_dispatcher_settings_are_validated_and_frozen():
    with pytest.raises(ValueError):
        DispatcherSettings(batch_size=5000)
    settings = DispatcherSettings(batch_size=5)
    with pytest.raises(ValueError):
        settings.batch_size = 6


def test_a_variable_that_nearly_spells_a_setting_is_named_with_the_setting():
    lines = misspelt_variables(
        {
            "OUTBOX_DATABSE_URL": "postgresql://db/x",  # a transposition
            "OUTBOX_DISPATCHER_BATCH_SIZE": "50",  # one underscore for two
            "outbox_exchang": "events",  # any case, like the settings themselves
            "OUTBOX_DATABASE_URL": "sqlite:///x.db",  # a setting
            "OUTBOX_BENCH_DATABASE_URL": "x",  # a deployment's own: far from every setting
            "OUTBOX_TEST_AMQP_URL": "x",
            "PATH": "/bin",
        }
    )
    assert lines == [
        "OUTBOX_DATABSE_URL is not a setting and is ignored: did you mean OUTBOX_DATABASE_URL?",
        "OUTBOX_DISPATCHER_BATCH_SIZE is not a setting and is ignored: "
        "did you mean OUTBOX_DISPATCHER__BATCH_SIZE?",
        "outbox_exchang is not a setting and is ignored: did you mean OUTBOX_EXCHANGE?",
    ]
