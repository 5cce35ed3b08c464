"""The verdict on recorded series of a real outbox: right, and steady once said.

``trend_series/*.csv`` were recorded by ``trend_series/record.py``: the example orders
app on SQLite, sampled once a second for two minutes (the console's refresh), its
dispatcher paced to keep up, fall behind, drain a backlog, stop, or empty bursts. The
demo's failures are in them: dead letters, and the events held behind them.
"""

from __future__ import annotations

import csv
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engine.operating.trends import Sample, Trends, Verdict, rate_text

SERIES = Path(__file__).parent / "trend_series"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def replay(name: str) -> list[Verdict]:
    """The verdict after each sample of the recorded series ``name``."""
    found = Trends()
    verdicts = []
    with (SERIES / f"{name}.csv").open() as rows:
        for row in csv.DictReader(rows):
            age = row["oldest_pending_age"]
            found.add(
                Sample(
                    T0 + timedelta(seconds=float(row["seconds"])),
                    int(row["backlog"]),
                    float(age) if age else None,
                    int(row["published_total"]),
                    int(row["held"]),
                )
            )
            verdicts.append(found.verdict())
    return verdicts


def said(verdicts: list[Verdict]) -> list[Verdict]:
    """The verdicts from the first that is not "not enough data yet"."""
    first = next(i for i, v in enumerate(verdicts) if v.kind != "measuring")
    return verdicts[first:]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("steady", "steady"),
        ("growing", "growing"),
        ("draining", "draining"),
        ("stalled", "stalled"),
        ("bursty", "steady"),
    ],
)
def test_a_recorded_series_gets_one_verdict_that_does_not_flip(name: str, kind: str):
    verdicts = replay(name)
    # Half a minute of "not enough data yet", then the verdict, kept to the end.
    assert all(v.kind == "measuring" for v in verdicts[:25])
    assert verdicts[0].text == "not enough data yet"
    shown = said(verdicts)
    assert len(shown) > 80
    assert [v.kind for v in shown] == [kind] * len(shown), {v.text for v in shown}


@pytest.mark.parametrize("name", ["steady", "growing", "draining", "stalled", "bursty"])
def test_the_rates_quoted_are_the_rates_beside_the_sparklines(name: str):
    """What the line says is computed from ``published_rate`` and ``arriving_rate``,
    which the console shows beside the published and arriving sparklines."""
    for verdict in said(replay(name)):
        published, arriving = verdict.published_rate, verdict.arriving_rate
        assert published is not None and arriving is not None
        if verdict.kind == "growing":
            assert verdict.net_rate == pytest.approx(arriving - published)
            assert verdict.text.startswith(f"growing by {rate_text(arriving - published)}")
        if verdict.text.startswith(("steady: ", "keeping up: ")) and published:
            assert f"{rate_text(published)} published" in verdict.text
        if verdict.kind == "draining":
            assert verdict.eta_seconds is not None and verdict.net_rate is not None
            assert verdict.net_rate < 0


def test_the_eta_of_a_drain_comes_down_with_the_backlog():
    etas = [v.eta_seconds for v in said(replay("draining"))]
    assert all(eta is not None for eta in etas)
    assert etas[-1] < etas[0] / 2  # type: ignore[operator]
