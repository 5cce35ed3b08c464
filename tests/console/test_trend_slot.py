"""The overview keeps a hidden slot for the trend verdict (filled by a later change)."""

from __future__ import annotations

from outbox_tui.widgets.trend import TrendLine, one_row_sparkline

from .conftest import SIZE, console, started


def test_one_row_sparkline_scales_to_the_peak():
    assert one_row_sparkline([0, 5, 10], 3).plain == "▁▅█"
    assert one_row_sparkline([1, 2, 3, 4], 2).plain == "▆█"  # newest on the right
    assert one_row_sparkline([], 5).plain == ""


async def test_the_slot_is_hidden_until_a_verdict_comes(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        slot = app.main.query_one("#trend", TrendLine)
        assert not slot.display
        slot.show("draining, empty in about 3m", [5, 4, 3])
        assert slot.display and "draining" in str(slot.render())
        slot.show(None)
        assert not slot.display
