"""Unit tests of the pure parts of the ingest: record classification and the DataFrame transforms."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from jobs.ingest.validation import (
    MAX_PAYLOAD_BYTES,
    REQUIRED_FIELDS,
    ClickEvent,
    Rejected,
    classify_payload,
    valid_event_values,
)

NOW_MS = 1_763_700_000_000  # 2025-11-21
EVENT = {
    "webpageId": 12,
    "uid": "513248",
    "productId": "3",
    "cookieId": "abcdefghijklmno",
    "expendTime": 7,
    "updateTime": NOW_MS - 1000,
}


def payload(**changes) -> bytes:
    return json.dumps({**EVENT, **changes}).encode()


def test_valid_event_is_parsed_with_its_values():
    assert classify_payload(payload(), NOW_MS) == ClickEvent(**EVENT)


MALFORMED = [
    (b"{not json", "not_json"),
    (b"", "not_json"),
    (None, "not_json"),
    (b"[1, 2]", "not_object: list"),
    (b'"click"', "not_object: str"),
    (json.dumps({k: v for k, v in EVENT.items() if k != "uid"}).encode(), "missing_field: uid"),
    (payload(productId=None), "null_field: productId"),
    (payload(webpageId="12"), "wrong_type: webpageId is str, not int"),
    (payload(uid=513248), "wrong_type: uid is int, not str"),
    (payload(expendTime=True), "wrong_type: expendTime is bool, not int"),
    (payload(expendTime=1.5), "wrong_type: expendTime is float, not int"),
    (payload(webpageId=2**40), "wrong_type: webpageId out of range"),
    (payload(updateTime=946_684_799_999), "update_time_out_of_range"),
    (payload(updateTime=NOW_MS + 24 * 3600 * 1000 + 1), "update_time_out_of_range"),
    (payload(padding="x" * MAX_PAYLOAD_BYTES), "payload_too_large"),
    (b'{"uid": "\xff\xfe"}', "not_utf8"),
    (payload(updateTime=2**63), "wrong_type: updateTime out of range"),
    (payload(cookieId=["a"]), "wrong_type: cookieId is list, not str"),
]


@pytest.mark.parametrize(("raw", "reason"), MALFORMED)
def test_each_malformed_kind_has_its_reason(raw, reason):
    result = classify_payload(raw, NOW_MS)
    assert isinstance(result, Rejected)
    assert result.reason == reason


@pytest.mark.parametrize(
    "raw",
    [
        payload(),
        payload(updateTime=946_684_800_000),
        payload(updateTime=NOW_MS + 24 * 3600 * 1000),
        payload(webpageId=-(2**31), expendTime=2**31 - 1, uid="", extra={"nested": [1]}),
        b'{"uid":"1","webpageId":1,"productId":"p","cookieId":"c","expendTime":0,"updateTime":'
        + str(NOW_MS).encode()
        + b',"uid":"2"}',  # a field written twice: rejected by both (json.loads would keep the last)
        *(raw for raw, _ in MALFORMED),
    ],
)
def test_fast_path_accepts_exactly_what_classify_payload_accepts(raw):
    verdict = classify_payload(raw, NOW_MS)
    expected = (
        tuple(getattr(verdict, f) for f in REQUIRED_FIELDS) if isinstance(verdict, ClickEvent) else None
    )
    assert valid_event_values(raw, NOW_MS) == expected


def test_edges_of_the_update_time_window_are_accepted():
    assert isinstance(classify_payload(payload(updateTime=946_684_800_000), NOW_MS), ClickEvent)
    assert isinstance(classify_payload(payload(updateTime=NOW_MS + 24 * 3600 * 1000), NOW_MS), ClickEvent)


def test_non_utf8_payload_is_kept_as_base64():
    raw = b'{"uid": "\xff\xfe"}'
    result = classify_payload(raw, NOW_MS)
    assert result.reason == "not_utf8" and result.payload_is_base64
    import base64

    assert base64.b64decode(result.raw_payload) == raw


def test_text_payload_is_kept_verbatim():
    result = classify_payload(b"[1, 2]", NOW_MS)
    assert (result.raw_payload, result.payload_is_base64) == ("[1, 2]", False)


@pytest.mark.stack
def test_to_click_events_sets_event_time_day_and_left_joins_products(spark):
    from chispa import assert_df_equality
    from pyspark.sql import functions as F

    from jobs.ingest.kafka_source import FETCHED_RECORD
    from jobs.ingest.validation import to_click_events, valid_click_events

    late_ms = 1_763_596_799_999  # 2025-11-19T23:59:59.999Z
    fetched = spark.createDataFrame(
        [
            (0, 5, NOW_MS, None, None, None, 12, "513248", "3", "c" * 15, 7, late_ms),
            (1, 9, NOW_MS, None, None, None, 13, "10952", "99", "d" * 15, 1, NOW_MS),
            (2, 1, NOW_MS, "not_json", "{", False, None, None, None, None, None, None),
        ],
        FETCHED_RECORD,
    )
    products = spark.createDataFrame(
        [("3", "test03", "drill bits", Decimal("11.1100"), None)],
        "productId string, name string, description string, product_price decimal(10,4), "
        "update_time timestamp",
    )
    ingested = datetime(2025, 11, 21, tzinfo=UTC)
    actual = to_click_events(valid_click_events(fetched), products, F.lit(ingested))
    expected = spark.createDataFrame(
        [
            (
                12,
                "513248",
                "3",
                "c" * 15,
                7,
                datetime(2025, 11, 19, 23, 59, 59, 999000, tzinfo=UTC),
                "test03",
                Decimal("11.1100"),
                "20251119",
                0,
                5,
                ingested,
            ),
            (
                13,
                "10952",
                "99",
                "d" * 15,
                1,
                datetime(2025, 11, 21, 4, 40, tzinfo=UTC),
                None,
                None,
                "20251121",
                1,
                9,
                ingested,
            ),
        ],
        actual.schema,
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
