"""Numbers are abbreviated, never cut (issue 12, part 6): ``compact`` and ``fitted``."""

from __future__ import annotations

import pytest

from outbox_tui.widgets.format import compact, fitted


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "—"),
        (0, "0"),
        (999, "999"),
        (9_999, "9,999"),
        (10_000, "10.0k"),
        (12_345, "12.3k"),
        (99_949, "99.9k"),
        (99_950, "100k"),
        (456_789, "457k"),
        (999_499, "999k"),
        (999_500, "1.0M"),  # not "1000k"
        (1_000_000, "1.0M"),
        (12_340_000, "12.3M"),
        (999_999_999, "1.0B"),
        (2_500_000_000_000, "2.5T"),
        (-12_345, "-12.3k"),
    ],
)
def test_compact_abbreviates_in_five_characters(value, text):
    assert compact(value) == text


def test_compact_is_never_longer_than_five_characters_below_a_thousand_trillion():
    for digits in range(1, 16):
        for lead in (1, 5, 9):
            value = int(str(lead) * digits)
            assert len(compact(value)) <= 5, value


def test_fitted_keeps_the_exact_number_when_it_fits():
    assert fitted(1_000_000, 9) == "1,000,000"
    assert fitted(1_000_000, 8) == "1.0M"  # never "1,000" or "1,000,0…"
    assert fitted(42, 1) == "42"  # a count below 10,000 is never abbreviated
