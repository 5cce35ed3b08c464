"""Trends and the one-line verdict, from synthetic samples (no clock, no sleeping).

The recorded series of a real outbox are in ``test_trend_series.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from engine.errors import ConfigurationError
from engine.operating.trends import Sample, Trends

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def trends(
    *points: tuple[float, int, int], age: float | None = 5.0, capacity=120, **config
) -> Trends:
    """Samples from (seconds after T0, backlog, published total)."""
    found = Trends(capacity, **config)
    for at, backlog, published in points:
        found.add(Sample(T0 + timedelta(seconds=at), backlog, age if backlog else None, published))
    return found


def test_a_shrinking_backlog_drains_with_an_eta():
    # 1,700 waiting after 30s, 10 a second fewer each second: empty in about 3 minutes.
    found = trends(*((s, 2_000 - 10 * s, 1_000 + 30 * s) for s in range(0, 31, 2)))
    verdict = found.verdict()
    assert verdict.kind == "draining" and verdict.text == "draining, empty in about 3m"
    assert verdict.net_rate == pytest.approx(-10) and verdict.eta_seconds == pytest.approx(170)
    assert verdict.published_rate == pytest.approx(30)
    assert verdict.arriving_rate == pytest.approx(20)
    assert found.drain_series() == [pytest.approx(30)] * 15
    assert found.inflow_series() == [pytest.approx(20)] * 15


def test_a_growing_backlog_says_by_how_much_and_it_is_arriving_minus_published():
    found = trends(*((s, 500 + 120 * s, 10 * s) for s in range(0, 31, 2)))
    verdict = found.verdict()
    assert verdict.text == "growing by 120/s"
    assert verdict.arriving_rate - verdict.published_rate == pytest.approx(120)  # type: ignore[operator]
    slow = trends(*((s, 10 + s // 2, s) for s in range(0, 61, 5)))
    assert slow.verdict().text == "growing by 30/min"


def test_nothing_published_while_events_wait_is_a_stall_with_its_duration():
    found = trends((0, 50, 100), (10, 60, 110), *((10 + 10 * i, 60, 110) for i in range(1, 13)))
    assert found.verdict().text == "stalled: nothing published in 2m"
    # Too short a silence is not a stall yet: the backlog is steady.
    short = trends(*((s, 60, 100 + s // 2) for s in range(0, 21, 5)), (25, 60, 110), (30, 60, 110))
    assert short.verdict().text == "steady: 20/min published, 60 waiting"
    never = trends(*((s, 60, 100) for s in range(0, 31, 5)))
    assert never.verdict().text == "stalled: nothing published in 30s"
    assert trends(
        *((s, 60, 100) for s in range(0, 31, 5)), stall_after_seconds=40
    ).verdict().text == ("steady: 60 waiting")


def test_no_backlog_is_idle_or_keeping_up_at_the_rate_it_averaged():
    assert trends(*((s, 0, 100) for s in range(0, 31, 5))).verdict().text == "idle: none waiting"
    busy = trends(*((s, 0, 100 + 120 * s) for s in range(0, 31, 5)))
    assert busy.verdict().text == "keeping up: 120/s published, none waiting"
    # A drain that ended a while ago is idle now, whatever the minute's average says.
    drained = trends(*((s, 0, 100 + 1_000 * min(s, 15)) for s in range(0, 31, 5)))
    assert drained.verdict().text == "idle: none waiting"


def test_until_the_window_is_long_enough_there_is_not_enough_data():
    assert trends().verdict().kind == "measuring"
    assert trends((0, 10, 0)).verdict().text == "not enough data yet"
    # 20 seconds of a steep drain: not yet a verdict.
    early = trends(*((s, 1_000 - 20 * s, 20 * s) for s in range(0, 21, 2)))
    assert early.verdict().kind == "measuring"
    assert early.verdict().text == "not enough data yet (20s of 30s)"
    # Long but too few samples (a slow refresh): not yet either; from the fifth on, the
    # window reaches back as far as it takes.
    sparse = trends(*((s, 1_000 - 10 * s, 10 * s) for s in range(0, 41, 20)))
    assert sparse.verdict().kind == "measuring"
    slow = trends(*((s, 1_000 - 10 * s, 10 * s) for s in range(0, 81, 20)))
    assert slow.verdict().kind == "draining"


def test_a_purge_of_published_rows_is_an_unknown_interval_not_negative_drain():
    points = [
        (0, 100, 1_000),
        (10, 80, 500),
        *((10 + 5 * i, 80 - 10 * i, 500 + 10 * i) for i in range(1, 7)),
    ]
    found = trends(*points)
    assert found.drain_series()[:2] == [None, pytest.approx(2)]
    assert found.inflow_series()[:2] == [None, pytest.approx(0)]
    verdict = found.verdict()
    assert verdict.kind == "draining"
    assert verdict.published_rate == pytest.approx(2)  # the purged interval left out


def test_the_ring_keeps_the_newest_samples_in_time_order():
    found = trends(*((s, s, s) for s in range(10)), capacity=4)
    assert found.backlog_series() == [6, 7, 8, 9]
    found.add(Sample(T0 + timedelta(seconds=3), 999, None, 0))  # older than the newest: dropped
    assert found.backlog_series() == [6, 7, 8, 9]
    assert trends((0, 5, 0), (1, 0, 5)).oldest_age_series() == [5.0, 0.0]
    with pytest.raises(ConfigurationError, match="capacity must be at least 2"):
        Trends(1)
    with pytest.raises(ConfigurationError, match="minimum window"):
        Trends(window_seconds=10, min_window_seconds=30)


def test_the_verdict_looks_at_its_window_only():
    # Grew an hour ago, draining over the last minute.
    points = [
        (0, 100, 0),
        (10, 5_000, 0),
        *((3_600 + s, 5_000 - 50 * s, 50 * s) for s in range(0, 61, 10)),
    ]
    assert trends(*points).verdict().kind == "draining"
    # Over two hours it rose 100 to 2,000 with a jump and a fall: no draining there.
    long = trends(*points, window_seconds=7_200, min_window_seconds=30)
    assert long.verdict().kind == "steady"


def test_noise_around_a_flat_backlog_is_steady_and_a_trend_does_not_flip_on_it():
    """±4 events of jitter around 15 waiting, 2 a second through: steady, every sample."""
    jitter = (0, 3, -2, 4, -4, 1, -3, 2, 0, -1)
    kinds = []
    found = Trends()
    for s in range(0, 180):
        found.add(Sample(T0 + timedelta(seconds=s), 15 + jitter[s % 10], 5.0, 2 * s))
        kinds.append(found.verdict().kind)
    assert set(kinds[30:]) == {"steady"}
    # A slow real drain with the same jitter: once said, it holds to the end.
    kinds = []
    found = Trends()
    for s in range(0, 180):
        found.add(Sample(T0 + timedelta(seconds=s), 400 - 2 * s + jitter[s % 10], 5.0, 3 * s))
        kinds.append(found.verdict().kind)
    assert set(kinds[30:]) == {"draining"}


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
    draining = held(*((s, 100 - s, s, 40) for s in range(0, 31, 2)))
    verdict = draining.verdict()
    assert verdict.kind == "draining"
    assert verdict.text == "draining, empty in about 30s (40 held by dead letters)"
    assert verdict.eta_seconds == pytest.approx(30)


def test_more_dead_letters_while_the_backlog_holds_still_is_not_draining():
    """The issue's "draining, empty in about 3s" while the backlog rose: held grew, and
    the verdict judged the drainable part. It judges the backlog on the screen now."""
    moving = held(*((s, 100 + s // 10, s, 40 + s) for s in range(0, 41, 2)))
    assert moving.verdict().kind == "steady"
    assert moving.verdict().text == "steady: 1.0/s published, 104 waiting (80 held by dead letters)"


def test_a_backlog_held_whole_by_dead_letters_asks_for_an_operator_not_for_patience():
    verdict = held(*((s, 40, 10, 40) for s in range(0, 61, 10))).verdict()
    assert verdict.kind == "held"  # not "stalled": nothing will publish them
    assert verdict.text == "held: 40 wait behind dead letters (replay or skip their heads)"
    # While the rest is still being published, it is keeping up.
    busy = held(*((s, 40, 10 + 2 * s, 40) for s in range(0, 61, 10))).verdict()
    assert busy.text == "keeping up: 2.0/s published (40 held by dead letters)"


def test_other_verdicts_say_how_many_are_held():
    assert (
        held(*((s, 50 + 2 * s, s, 5) for s in range(0, 31, 5))).verdict().text
        == "growing by 2.0/s (5 held by dead letters)"
    )
    assert (
        held(*((s, 50, 0, 5) for s in range(0, 201, 20))).verdict().text
        == "stalled: nothing published in 3m (5 held by dead letters)"
    )
