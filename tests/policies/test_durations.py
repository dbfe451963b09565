from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.durations import format_duration, parse_duration


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("10m", 600), ("1h30m", 5400), ("7d", 604800),
                                          ("250ms", 0.25), ("0s", 0), (15, 15), ("1.5h", 5400)])
def test_parse(text, seconds):
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("bad", ["soon", "10", "m10", "10 minutes", "", "-5s", -1, True, None, "5s5"])
def test_rejects(bad):
    with pytest.raises(ValueError, match="duration like 10m|negative"):
        parse_duration(bad)


@given(st.integers(min_value=0, max_value=10**10))
def test_round_trip(ms):
    d = timedelta(milliseconds=ms)
    assert parse_duration(format_duration(d)) == d
