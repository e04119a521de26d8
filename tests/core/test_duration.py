"""``core.duration``: a work's time estimated before it starts, refused past the limit in one
line naming its option, its estimate told past the notice."""

from __future__ import annotations

import logging

import pytest

from implicitlm.core.duration import MAX_SECONDS, NOTICE_SECONDS, readable_seconds, require_time, seconds_of
from implicitlm.core.errors import OptionError


def test_a_work_past_the_limit_is_refused_naming_its_estimate_and_option():
    with pytest.raises(OptionError, match=r"^9 words would take at least 2\.0 days here, past the limit of 1\.0 days; "
                                          r"fewer$") as refused:
        require_time("9 words", 2 * 86400, arguments=("count",), hint="; fewer")
    assert refused.value.arguments == ("count",)


def test_a_long_work_within_the_limit_is_told_its_estimate_and_a_short_one_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="implicitlm"):
        require_time("9 words", NOTICE_SECONDS / 2)
        assert caplog.messages == []
        require_time("9 words", MAX_SECONDS)
    assert caplog.messages == ["9 words will take at least 1.0 days"]


def test_durations_read_in_their_largest_unit_and_a_run_is_timed():
    assert [readable_seconds(s) for s in (3.25, 90, 7200, 3 * 86400, 800 * 86400)] == [
        "3.2 seconds", "1.5 minutes", "2.0 hours", "3.0 days", "2.2 years"]
    assert 0 <= seconds_of(lambda: None) < 1
