"""docs/RELIABILITY.md says which commit each record tested when they come from several runs."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.reliability.report import render
from tests.reliability.results import ScenarioResult

WHEN = datetime(2026, 12, 7, tzinfo=UTC)


def test_one_run_is_one_line_and_several_runs_name_each_rows_commit():
    one = [ScenarioResult("crash", "sqlite", 1, 10, commit="abc1234", soak=True)]
    text = render(one, commit="abc1234", when=WHEN)
    assert "- Run: 2026-12-07T00:00:00+00:00, commit `abc1234`, soak sizes (--soak)." in text
    assert "tested at" not in text

    mixed = [*one, ScenarioResult("two services", "postgresql→sqlite", 1, 600)]
    text = render(mixed, commit="def5678", when=WHEN)
    assert "from the records of more than one run" in text
    assert "| tested at |" in text
    rows = [
        line for line in text.splitlines() if line.startswith("| crash") or "two services" in line
    ]
    assert rows[0].endswith("`abc1234` soak |")
    assert rows[1].endswith("`?` CI |")
