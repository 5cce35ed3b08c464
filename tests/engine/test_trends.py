"""Trends and the one-line verdict, from synthetic samples (no clock, no sleeping)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from engine.errors import ConfigurationError
from engine.operating.trends import Sample, Trends

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def trends(*points: tuple[float, int, int], age: float | None = 5.0, capacity=120) -> Trends:
    """Samples from (seconds after T0, backlog, published total)."""
    found = Trends(capacity)
    for at, backlog, published in points:
        found.add(Sample(T0 + timedelta(seconds=at), backlog, age if backlog else None, published))
    return found


def test_a_shrinking_backlog_drains_with_an_eta():
    # 1,800 waiting, 10 a second fewer each second: empty in about 3 minutes.
    found = trends(*((s, 2_000 - 10 * s, 1_000 + 30 * s) for s in range(0, 21, 2)))
    verdict = found.verdict()
    assert verdict.kind == "draining" and verdict.text == "draining, empty in about 3m"
    assert verdict.net_rate == pytest.approx(-10) and verdict.eta_seconds == pytest.approx(180)
    assert found.drain_series() == [pytest.approx(30)] * 10
    assert found.inflow_series() == [pytest.approx(20)] * 10


def test_a_growing_backlog_says_by_how_much():
    found = trends(*((s, 500 + 120 * s, 10 * s) for s in range(10)))
    assert found.verdict().text == "growing by 120/s"
    slow = trends((0, 10, 0), (60, 40, 60))
    assert slow.verdict().text == "growing by 30/min"


def test_nothing_published_while_events_wait_is_a_stall_with_its_duration():
    found = trends((0, 50, 100), (10, 60, 110), *((10 + 10 * i, 60, 110) for i in range(1, 13)))
    assert found.verdict().text == "stalled: nothing published in 2m"
    # Too short a silence is not a stall yet: the backlog is steady.
    short = trends((0, 60, 100), (10, 60, 110), (20, 60, 110))
    assert short.verdict().text == "steady: 30/min published, 60 waiting"
    never = trends((0, 60, 100), (20, 60, 100))
    assert never.verdict(stall_after_seconds=30).text == "steady: 60 waiting"
    assert never.verdict(stall_after_seconds=20).text == "stalled: nothing published in 20s"


def test_no_backlog_is_idle_or_keeping_up():
    assert trends((0, 0, 100), (5, 0, 100)).verdict().text == "idle"
    busy = trends((0, 0, 100), (5, 0, 700))
    assert busy.verdict().text == "keeping up: 120/s published, none waiting"


def test_a_single_sample_is_still_measuring():
    assert trends().verdict().kind == "measuring"
    assert trends((0, 10, 0)).verdict().text == "measuring…"


def test_a_purge_of_published_rows_is_an_unknown_interval_not_negative_drain():
    found = trends((0, 100, 1_000), (10, 80, 500), (20, 60, 520))
    assert found.drain_series() == [None, pytest.approx(2)]
    assert found.inflow_series() == [None, pytest.approx(0)]
    assert found.verdict().kind == "draining"


def test_the_ring_keeps_the_newest_samples_in_time_order():
    found = trends(*((s, s, s) for s in range(10)), capacity=4)
    assert found.backlog_series() == [6, 7, 8, 9]
    found.add(Sample(T0 + timedelta(seconds=3), 999, None, 0))  # older than the newest: dropped
    assert found.backlog_series() == [6, 7, 8, 9]
    assert trends((0, 5, 0), (1, 0, 5)).oldest_age_series() == [5.0, 0.0]
    with pytest.raises(ConfigurationError, match="capacity must be at least 2"):
        Trends(1)


def test_the_verdict_looks_at_its_window_only():
    # Grew an hour ago, draining over the last minute.
    points = [
        (0, 100, 0),
        (10, 5_000, 0),
        *((3_600 + s, 5_000 - 50 * s, 50 * s) for s in range(0, 61, 10)),
    ]
    assert trends(*points).verdict(window_seconds=60).kind == "draining"
    assert trends(*points).verdict(window_seconds=7_200).kind == "growing"


def test_a_sample_is_made_from_an_overview():
    snap = SimpleNamespace(
        taken_at=T0,
        counts={"pending": 7, "failed": 3, "published": 90, "dead_letter": 4},
        oldest_pending_age_seconds=12.5,
        held_by_dead_letters=2,
    )
    assert Sample.from_overview(snap) == Sample(T0, 10, 12.5, 90, held=2)  # type: ignore[arg-type]


def held(*points: tuple[float, int, int, int]) -> Trends:
    """Samples from (seconds after T0, backlog, published total, held behind dead letters)."""
    found = Trends()
    for at, backlog, published, behind in points:
        found.add(Sample(T0 + timedelta(seconds=at), backlog, 5.0, published, held=behind))
    return found


def test_events_held_behind_dead_letters_are_left_out_of_the_eta_and_named():
    # 40 of the backlog sit behind dead letters; the other 60 drain at 1/s.
    draining = held(*((s, 100 - s, s, 40) for s in range(0, 21, 2)))
    verdict = draining.verdict()
    assert verdict.kind == "draining"
    assert verdict.text == "draining, empty in about 40s (40 held by dead letters)"
    assert verdict.eta_seconds == pytest.approx(40)
    # More dead letters each second: the backlog holds still, yet the rest is draining.
    moving = held(*((s, 100, s, 40 + s) for s in range(0, 21, 2)))
    assert moving.verdict().kind == "draining"


def test_a_backlog_held_whole_by_dead_letters_asks_for_an_operator_not_for_patience():
    verdict = held((0, 40, 10, 40), (60, 40, 10, 40)).verdict()
    assert verdict.kind == "held"  # not "stalled": nothing will publish them
    assert verdict.text == "held: 40 wait behind dead letters (replay or skip their heads)"


def test_other_verdicts_say_how_many_are_held():
    assert (
        held((0, 50, 0, 5), (10, 70, 10, 5)).verdict().text
        == "growing by 2.0/s (5 held by dead letters)"
    )
    assert (
        held((0, 50, 0, 5), (200, 50, 0, 5)).verdict().text
        == "stalled: nothing published in 3m (5 held by dead letters)"
    )
