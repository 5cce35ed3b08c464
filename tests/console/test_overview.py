"""The overview's incident parts: the trend verdict and sparklines, the active pauses, and
the types with the most undelivered events (issue 12, parts 2, 4 and 5)."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from engine import create_engine
from engine.clock import utc_now
from engine.operating.insights import OutboxInsights, TypeCounts
from engine.operating.pauses import Pause, PausedBacklog, paused_backlog
from engine.operating.trends import DRAINING, Verdict
from engine.service import pause_type, resume_type
from engine.storage.schema import DEAD_LETTER, FAILED, PENDING, PUBLISHED, PUBLISHING, outbox_events
from outbox_tui.widgets.pauses import PausesLine, pause_lines, pause_text
from outbox_tui.widgets.top_types import (
    TopTypesLine,
    TopTypesPanel,
    top_types_line,
    top_types_table,
)
from outbox_tui.widgets.trend import (
    TrendLine,
    TrendsPanel,
    TrendView,
    one_row_sparkline,
    trend_line,
    trend_rows,
)

from .conftest import SIZE, console, refreshed, started, until

NOW = datetime(2026, 3, 14, 9, 15, tzinfo=UTC)
SMALL = (80, 24)


class Clock:
    def __init__(self) -> None:
        self.now = utc_now()

    def __call__(self) -> datetime:
        return self.now


def _text(widget: object) -> str:
    return str(widget.render())  # type: ignore[attr-defined]


# -- the pure parts: never a cut number -----------------------------------------------------


def test_one_row_sparkline_scales_to_the_peak():
    assert one_row_sparkline([0, 5, 10], 3).plain == "▁▅█"
    assert one_row_sparkline([1, 2, 3, 4], 2).plain == "▆█"  # newest on the right
    assert one_row_sparkline([], 5).plain == ""
    assert one_row_sparkline([None, 8], 2, peak=16).plain == " ▅"  # unknown: a gap


def test_the_trend_line_fits_and_keeps_its_numbers_whole():
    view = TrendView(
        Verdict("growing", "growing by 1,234/s", 1234.0, None, 12.5, 1246.5, 60.0),
        backlog=[1_000_000.0, 1_234_567.0],
        oldest_age=[60.0, 3_725.0],
        drain=[12.5],
        inflow=[1_246.5],
    )
    for width in range(20, 170, 7):
        line = trend_line(view, width).plain
        assert line.startswith("growing by 1,234/s")
        assert len(line) <= width or line == "growing by 1,234/s"
        if "backlog" in line:
            assert "backlog ▇█ 1.2M" in line
        if "oldest" in line:
            assert line.split("oldest ")[1].split("  ")[0].endswith("1h 02m")
    assert "out/in" in trend_line(view, 160).plain
    rows = trend_rows(view, 80).plain.splitlines()
    assert rows[0] == "growing by 1,234/s"
    assert [r.split()[-1] for r in rows[1:]] == ["1.2M", "02m", "12/s", "1,246/s"]
    assert all(len(r) <= 80 for r in rows)


def _held(waiting: int, tenant: str | None = None, kind: str = "orders.placed") -> PausedBacklog:
    pause = Pause(kind, tenant, "vendor down (INC-7)", "alice", NOW - timedelta(minutes=3))
    return PausedBacklog(pause, waiting)


def test_a_pause_line_says_scope_age_and_waiting_count_and_never_cuts_it():
    line = pause_text(_held(12), NOW, 120).plain
    assert line == (
        "⏸ orders.placed · every tenant · paused 3m ago · 12 waiting"
        " · by alice: vendor down (INC-7)"
    )
    assert "tenant acme" in pause_text(_held(1, "acme"), NOW, 120).plain
    assert pause_text(_held(12), NOW, 60).plain == (
        "⏸ orders.placed · every tenant · paused 3m ago · 12 waiting"
    )
    assert pause_text(_held(12), NOW, 60, more=1).plain == (
        "⏸ orders.placed · all tenants · 3m · 12 waiting · +1 more"
    )
    tight = pause_text(_held(1_234_567, kind="billing.invoice-issued-to-customer"), NOW, 40).plain
    assert len(tight) <= 40 and tight.endswith(" · 1.2M waiting") and "…" in tight
    two = pause_lines([_held(12), _held(3, "acme")], NOW, 100, rows=1).plain
    assert two.count("\n") == 0 and "+1 more paused" in two
    assert pause_lines([_held(12), _held(3, "acme")], NOW, 100, rows=3).plain.count("\n") == 1


def _types() -> list[TypeCounts]:
    return [
        TypeCounts("orders.placed", {PENDING: 10, "publishing": 1, FAILED: 11, "dead_letter": 10}),
        TypeCounts("orders.cancelled", {PENDING: 1_234_567, "publishing": 0, FAILED: 0}),
    ]


def test_top_types_fit_the_line_and_the_table_keeps_whole_numbers():
    line = top_types_line(_types(), 160).plain
    assert line.startswith("top types  orders.placed 32 (10 pending, 1 publishing, 11 failed")
    assert "orders.cancelled 1.2M (1.2M pending)" in line
    assert top_types_line(_types(), 76).plain == (
        "top types  orders.placed 32 (10 pending, 1 publishing, 11 failed, 10 dead)"
    )
    narrow = top_types_line(_types(), 20).plain
    assert len(narrow) <= 20 and narrow.endswith(" 32")
    assert top_types_line([], 80).plain == "top types  nothing undelivered"
    table = top_types_table(_types(), 66, rows=4).plain.splitlines()
    assert table[0].split() == ["type", "pending", "publishing", "failed", "dead", "total"]
    assert table[2].split() == ["orders.cancelled", "1.2M", "0", "0", "0", "1.2M"]
    assert all(len(row) <= 66 for row in table)


# -- on screen ----------------------------------------------------------------------------


async def _publish(url: str, n: int, at: datetime) -> None:
    """Deliver ``n`` waiting events, as a dispatcher would (pending or failed to published):
    unordered ones, or the first undelivered event of its ordering key."""
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            t = outbox_events
            earlier = t.alias("earlier")
            behind = (
                select(earlier.c.id)
                .where(
                    earlier.c.ordering_key == t.c.ordering_key,
                    earlier.c.seq < t.c.seq,
                    earlier.c.status.in_((PENDING, PUBLISHING, FAILED, DEAD_LETTER)),
                )
                .exists()
            )
            ids = (
                await conn.execute(
                    select(t.c.id)
                    .where(t.c.status.in_((PENDING, FAILED)), ~behind)
                    .order_by(t.c.seq)
                )
            ).scalars()
            chosen = list(ids)[:n]
            await conn.execute(
                update(t)
                .where(t.c.id.in_(chosen))
                .values(status=PUBLISHED, published_at=at, locked_by=None, locked_until=None)
            )
    finally:
        await engine.dispose()


async def test_a_draining_backlog_says_when_it_will_be_empty(sqlite_seeded, orders_registry):
    clock = Clock()
    app = console(sqlite_seeded, orders_registry, clock=clock)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        main = app.main
        assert main.trend is not None and main.trend.verdict.kind == "measuring"
        for _ in range(5):  # 2 events every 6 seconds, for half a minute
            clock.now += timedelta(seconds=6)
            await _publish(sqlite_seeded, 2, clock.now)
            await refreshed(pilot)
        assert main.trend is not None
        verdict = main.trend.verdict
        backlog = int(main.trend.backlog[-1])
        assert backlog > 0
        assert verdict.kind == DRAINING and verdict.net_rate == pytest.approx(-1 / 3)
        # Events behind a dead-lettered head wait for an operator: not in the ETA.
        held = main.last_snapshot.held_by_dead_letters
        assert verdict.eta_seconds == pytest.approx((backlog - held) * 3)
        assert verdict.text.startswith("draining, empty in about ")
        panel = main.query_one(TrendsPanel)
        text = _text(panel)
        assert text.startswith(verdict.text)
        assert "backlog" in text and "published" in text and "arriving" in text
        # The rates beside the sparklines are the verdict's: 20/min published.
        assert re.search(r"published +[▁-█ ]+ 20/min$", text, re.M)
        assert panel.border_title == "trend · one sample per refresh · rates over the last 30s"
        await pilot.resize_terminal(*SMALL)
        trend = main.query_one(TrendLine)
        # Hidden until the resize: read it once it has been laid out at the new width.
        await until(
            pilot,
            lambda: trend.display and 0 < trend.content_size.width <= SMALL[0],
            "the one-line trend",
        )
        line = _text(trend)
        assert line.startswith(verdict.text)
        # A series that does not fit beside the verdict is left out whole (the seeded dead
        # letters lengthen the verdict); the oldest pending age is on the line above.
        assert re.search(rf"backlog [▁-█]{{5,}} {backlog}(  ·  oldest [▁-█]{{5,}} \d+s)?$", line)
        assert not main.query_one("#overview-more").display


async def _paused_waiting(url: str) -> int:
    engine = create_engine(url)
    try:
        return (await paused_backlog(engine))[0].waiting
    finally:
        await engine.dispose()


async def test_a_paused_type_shows_with_its_waiting_count_until_resumed(
    sqlite_seeded, orders_registry
):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        line = app.main.query_one(PausesLine)
        assert not line.display
        engine = create_engine(sqlite_seeded)
        try:
            await pause_type(engine, "orders.placed", None, reason="vendor down", operator="bob")
            waiting = await _paused_waiting(sqlite_seeded)
            assert waiting > 0
            await refreshed(pilot)
            assert line.display
            # The line was hidden until this refresh: read it once it has been laid out.
            await until(pilot, lambda: line.content_size.width > SMALL[0], "the line's layout")
            text = _text(line)
            scope = "⏸ orders.placed · every tenant · paused"
            assert re.search(rf"^{scope} \d+s ago · {waiting} waiting", text)
            assert "by bob: vendor down" in text  # wide: who and why
            await pilot.resize_terminal(*SMALL)
            await until(pilot, lambda: 0 < line.content_size.width <= SMALL[0], "the resize")
            small = _text(line)
            assert f"{waiting} waiting" in small and len(small) <= SMALL[0]
            await resume_type(engine, "orders.placed", None, operator="bob")
        finally:
            await engine.dispose()
        await refreshed(pilot)
        assert not line.display


async def test_top_types_lead_with_the_type_with_most_undelivered_events(
    sqlite_seeded, orders_registry
):
    engine = create_engine(sqlite_seeded)
    try:
        expected = await OutboxInsights(engine).top_types()
    finally:
        await engine.dispose()
    first = expected[0]
    assert first.undelivered > expected[1].undelivered
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        panel = app.main.query_one(TopTypesPanel)
        await until(pilot, lambda: panel.content_size.width > 0, "the top types' layout")
        table = _text(panel).splitlines()
        assert table[1].split()[0] == first.event_type
        assert table[1].split()[-1] == f"{first.undelivered:,}"
        await pilot.resize_terminal(*SMALL)
        line = app.main.query_one(TopTypesLine)
        # Hidden until the resize: read it once it has been laid out at the new width.
        await until(
            pilot,
            lambda: line.display and 0 < line.content_size.width <= SMALL[0],
            "the one-line top types",
        )
        assert _text(line).startswith(f"top types  {first.event_type} {first.undelivered}")


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_the_two_dead_figures_cannot_be_read_as_one_count(
    sqlite_seeded, orders_registry, size
):
    """Issue 43: the dispatcher row's ``dead 9`` (what it dead-lettered since it started)
    stood beside the tile's ``10`` (dead letters now) under the same word."""
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=size) as pilot:
        await started(pilot)
        await pilot.press("s")  # the console's own dispatcher: a heartbeat with totals
        for _ in range(50):
            await refreshed(pilot)
            if app.main.last_snapshot.heartbeats:
                break
            await pilot.pause(0.1)
        assert app.main.last_snapshot.heartbeats
        svg = html.unescape(app.export_screenshot()).replace("\xa0", " ")
        screen = re.sub(r"<[^>]+>", "", svg)
        assert "totals since each started" in screen
        assert "dead now" in screen or "dead letters now" in screen
        if size[0] >= 110:  # the wide dispatcher table
            assert "dead-lettered" in screen
