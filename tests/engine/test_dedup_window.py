"""Replay safety: how many events of a replay are older than the consumers' dedup window."""

from __future__ import annotations

from datetime import timedelta

import pytest

from engine.errors import ConfigurationError
from engine.operating.replay import check_dedup_window
from engine.settings import load_settings

from .seeding import event_row, insert_events


async def test_events_created_before_the_window_are_counted(db, clock):
    now = clock.now
    ages = (timedelta(days=40), timedelta(days=8), timedelta(days=6), timedelta(minutes=1))
    ids = await insert_events(
        db, *(event_row(status="dead_letter", created_at=now - age) for age in ages)
    )
    check = await check_dedup_window(db, [*ids, ids[0], "no-such-id"], now=now)
    assert (check.checked, check.outside) == (5, 2)
    assert check.oldest_created_at == now - timedelta(days=40)
    assert not check.safe
    assert check.warning() == (
        "2 of 5 event(s) are older than the consumers' 7-day dedup window: "
        "consumers may process them twice"
    )
    narrow = await check_dedup_window(db, ids, window=timedelta(hours=36), now=now)
    assert narrow.outside == 3 and "36-hour dedup window" in (narrow.warning() or "")
    recent = await check_dedup_window(db, ids[2:], now=now)
    assert recent.safe and recent.warning() is None and recent.oldest_created_at is None
    # A safe replay says so in one short line (issue 43); an unsafe one does not.
    assert recent.assurance() == "inside the consumers' 7-day dedup window: safe to replay"
    assert check.assurance() is None


async def test_many_ids_are_checked_in_chunks(db, clock):
    old = clock.now - timedelta(days=30)
    ids = await insert_events(
        db, *(event_row(status="dead_letter", created_at=old) for _ in range(1201))
    )
    assert (await check_dedup_window(db, ids, now=clock.now)).outside == 1201


async def test_a_window_must_be_positive(db):
    with pytest.raises(ConfigurationError, match="dedup window must be positive"):
        await check_dedup_window(db, ["x"], window=timedelta(0))


def test_the_dedup_window_setting_defaults_to_seven_days_and_reads_the_environment(monkeypatch):
    assert load_settings().dedup_window_seconds == 7 * 86_400
    monkeypatch.setenv("OUTBOX_DEDUP_WINDOW_SECONDS", "3600")
    assert load_settings().dedup_window_seconds == 3600
    monkeypatch.setenv("OUTBOX_DEDUP_WINDOW_SECONDS", "0")
    with pytest.raises(ConfigurationError, match="OUTBOX_DEDUP_WINDOW_SECONDS"):
        load_settings()
