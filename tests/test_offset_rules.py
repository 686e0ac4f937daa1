"""The pure rules of the ingest and of product_views (no Spark, no broker)."""

from __future__ import annotations

import pytest

from jobs.ingest.offsets import OffsetsRegressed, advance, check_read_start, passes
from jobs.views.job import (
    ANY_TOPIC,
    ClickOffsetsRegressed,
    Delta,
    checked_topic,
    watermark_from_summary,
    with_delta,
)


def test_stored_offsets_never_move_back_when_a_batch_ends_below_them():
    # The restart read from the rejects table's older offsets and stopped below the fact table's.
    assert advance({0: 600, 1: 600}, {0: 200, 1: 800}) == {0: 600, 1: 800}
    assert advance({}, {2: 5}) == {2: 5}


def test_a_table_commits_only_for_a_batch_that_read_past_its_start():
    assert not passes({0: 600, 1: 600}, {0: 200, 1: 600})
    assert passes({0: 600, 1: 600}, {0: 200, 1: 601})
    assert passes({}, {3: 1})  # a partition the table has never seen


def never_asked() -> int:
    raise AssertionError("the broker was asked without a gap to explain")


def test_a_range_that_starts_where_it_should_asks_the_broker_nothing():
    assert check_read_start("t", 0, 100, 100, never_asked) == 0
    assert check_read_start("t", 0, 100, None, never_asked) == 0


def test_records_below_the_stored_offset_mean_a_recreated_topic():
    with pytest.raises(OffsetsRegressed, match=r"t\[2\] served offset 0, below the stored 500"):
        check_read_start("t", 2, 500, 0, never_asked)


def test_a_gap_is_counted_as_lost_only_when_the_broker_no_longer_holds_it():
    assert check_read_start("t", 0, 100, 250, lambda: 250) == 150  # retention deleted 100..249
    assert check_read_start("t", 0, 100, 250, lambda: 400) == 150  # and more since
    assert check_read_start("t", 0, 100, 102, lambda: 0) == 0  # transaction markers, nothing lost


def test_views_watermark_reads_both_summary_forms():
    assert watermark_from_summary(None) == (ANY_TOPIC, {})
    assert watermark_from_summary('{"0":5,"1":7}') == (ANY_TOPIC, {0: 5, 1: 7})  # before topics
    assert watermark_from_summary('{"clicktopic":{"0":5}}') == ("clicktopic", {0: 5})


def test_views_follow_the_ingest_topic_and_refuse_regressions_and_switches():
    assert checked_topic(ANY_TOPIC, {0: 5}, {"clicktopic": {0: 9}}) == "clicktopic"
    assert checked_topic("clicktopic", {0: 5}, {}) == "clicktopic"  # rows written by hand
    assert checked_topic("clicktopic", {0: 5}, {"clicktopic": {0: 5}}) == "clicktopic"
    with pytest.raises(ClickOffsetsRegressed, match="partition 0: 3 < 5"):
        checked_topic("clicktopic", {0: 5, 1: 2}, {"clicktopic": {0: 3, 1: 2}})
    with pytest.raises(ClickOffsetsRegressed, match="now holds topic 'other'"):
        checked_topic("clicktopic", {0: 5}, {"other": {0: 9}})
    assert checked_topic("clicktopic", {}, {"other": {0: 9}}) == "other"  # nothing counted yet


def test_views_add_a_delta_to_the_view_as_of_their_last_commit():
    from datetime import UTC, datetime
    from decimal import Decimal

    earlier, now = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC)
    base = [
        {"productId": "1", "name": "a", "product_price": Decimal("1.5"), "views": 10, "updated_at": earlier},
        {"productId": "9", "name": None, "product_price": None, "views": 4, "updated_at": earlier},
    ]
    delta = Delta(
        {("1", "a", Decimal("1.5")): 3, (None, None, None): 2, ("2", "b", Decimal("8.1")): 1}, {0: 9}
    )
    rows = sorted(with_delta(base, delta, now), key=repr)
    assert rows == sorted(
        [
            ("1", "a", Decimal("1.5"), 13, now),
            ("9", None, None, 4, earlier),  # untouched groups keep their count and time
            (None, None, None, 2, now),  # null keys are a group of their own
            ("2", "b", Decimal("8.1"), 1, now),
        ],
        key=repr,
    )


def test_a_repair_that_removes_clicks_takes_them_off_the_view_and_a_group_it_empties_goes():
    from datetime import UTC, datetime
    from decimal import Decimal

    earlier, now = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC)
    base = [
        {"productId": "1", "name": "a", "product_price": Decimal("1.5"), "views": 10, "updated_at": earlier},
        {"productId": "2", "name": "b", "product_price": Decimal("2.0"), "views": 3, "updated_at": earlier},
        {"productId": "3", "name": None, "product_price": None, "views": 0, "updated_at": earlier},
    ]
    delta = Delta({("1", "a", Decimal("1.5")): -4, ("2", "b", Decimal("2.0")): -3}, {0: 9})
    rows = sorted(with_delta(base, delta, now), key=repr)
    # A group of clicks without a uid (count 0, as the source's GROUP BY has it) stays.
    assert rows == sorted([("1", "a", Decimal("1.5"), 6, now), ("3", None, None, 0, earlier)], key=repr)


def test_a_repair_commit_names_the_offsets_it_touched_as_ranges():
    from jobs.verify.clicks_repair import as_ranges

    assert as_ranges({1: [5, 3, 4, 9], 0: [7], 2: []}) == {"0": [[7, 7]], "1": [[3, 5], [9, 9]]}
