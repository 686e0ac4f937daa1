"""Validation of raw Kafka records and the pure DataFrame transforms that shape the two tables.

`classify_payload` runs inside the executor tasks that fetch from Kafka (one pass per record, no
Spark round trip); everything after it is a `DataFrame -> DataFrame` transform.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

MAX_PAYLOAD_BYTES = 64 * 1024
MIN_UPDATE_TIME_MS = 946_684_800_000  # 2000-01-01T00:00:00Z
# Whatever the record's timestamp says: past 9999-12-31 no timestamp column can hold the event time.
MAX_UPDATE_TIME_MS = 253_402_300_799_999
MAX_FUTURE_MS = 24 * 3600 * 1000

INT32_RANGE = (-(2**31), 2**31 - 1)
INT64_RANGE = (-(2**63), 2**63 - 1)
# ClickEvent fields and their JSON types; all are required and non-null.
REQUIRED_FIELDS: dict[str, type] = {
    "webpageId": int,
    "uid": str,
    "productId": str,
    "cookieId": str,
    "expendTime": int,
    "updateTime": int,
}
_INT_RANGES = {"webpageId": INT32_RANGE, "expendTime": INT32_RANGE, "updateTime": INT64_RANGE}


class RejectReason:
    """Reason prefixes in the rejects table (`reason` is `<kind>` or `<kind>: <detail>`)."""

    NOT_JSON = "not_json"
    NOT_OBJECT = "not_object"
    MISSING_FIELD = "missing_field"
    NULL_FIELD = "null_field"
    WRONG_TYPE = "wrong_type"
    TOO_LARGE = "payload_too_large"
    NOT_UTF8 = "not_utf8"
    UPDATE_TIME_OUT_OF_RANGE = "update_time_out_of_range"
    # A \u escape of half a UTF-16 pair (what JSON.stringify sends for an emoji cut in half): the
    # JSON parses, but the string cannot be stored as UTF-8.
    INVALID_UNICODE = "invalid_unicode"
    DUPLICATE_KEY = "duplicate_key"  # which of the two values is meant is anyone's guess
    UNCONVERTIBLE = "unconvertible"  # passed every check, yet the columnar conversion refused it


@dataclass(frozen=True)
class ClickEvent:
    webpageId: int  # noqa: N815 - the source's field names
    uid: str
    productId: str  # noqa: N815
    cookieId: str  # noqa: N815
    expendTime: int  # noqa: N815
    updateTime: int  # noqa: N815


@dataclass(frozen=True)
class Rejected:
    reason: str
    raw_payload: str
    payload_is_base64: bool


def raw_payload_text(payload: bytes) -> tuple[str, bool]:
    """The payload as text when it is UTF-8, else base64 (second value says which)."""
    try:
        return payload.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(payload).decode("ascii"), True


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    """json's object hook: a ClickEvent field written twice in one object is ambiguous (json.loads
    would silently keep the last); other keys are not ours to judge."""
    document: dict = {}
    for key, value in pairs:
        if key in document and key in REQUIRED_FIELDS:
            raise _DuplicateKey(key)
        document[key] = value
    return document


def _storable(text: str) -> bool:
    """False for a string holding a lone surrogate (it has no UTF-8 form)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _field_problem(name: str, value: object) -> str | None:
    expected = REQUIRED_FIELDS[name]
    if value is None:
        return f"{RejectReason.NULL_FIELD}: {name}"
    # bool is an int subclass in Python; JSON true/false is the wrong type for a number.
    if not isinstance(value, expected) or isinstance(value, bool):
        return f"{RejectReason.WRONG_TYPE}: {name} is {type(value).__name__}, not {expected.__name__}"
    if name in _INT_RANGES:
        low, high = _INT_RANGES[name]
        if not low <= value <= high:
            return f"{RejectReason.WRONG_TYPE}: {name} out of range"
    if isinstance(value, str) and not _storable(value):
        return f"{RejectReason.INVALID_UNICODE}: {name} holds a lone UTF-16 surrogate (half a character)"
    return None


def _future_limit(record_time_ms: int | None) -> int | None:
    """The latest acceptable updateTime: 24 h after the record's own Kafka timestamp. The verdict
    never depends on the clock of whoever reads the record, so every re-read agrees with the first
    (a record without a timestamp gets no upper bound)."""
    return record_time_ms + MAX_FUTURE_MS if record_time_ms is not None and record_time_ms >= 0 else None


def classify_payload(payload: bytes | None, record_time_ms: int | None) -> ClickEvent | Rejected:
    """Parse one Kafka value into a ClickEvent, or say why it is rejected. Never raises.

    `record_time_ms`: the record's Kafka timestamp (None or negative: it has none)."""
    payload = payload or b""
    if len(payload) > MAX_PAYLOAD_BYTES:
        text, is_b64 = raw_payload_text(payload)
        return Rejected(RejectReason.TOO_LARGE, text, is_b64)
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return Rejected(RejectReason.NOT_UTF8, base64.b64encode(payload).decode("ascii"), True)
    try:
        document = json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except _DuplicateKey as duplicate:
        return Rejected(f"{RejectReason.DUPLICATE_KEY}: {duplicate.key}", text, False)
    except (ValueError, RecursionError):
        return Rejected(RejectReason.NOT_JSON, text, False)
    if not isinstance(document, dict):
        return Rejected(f"{RejectReason.NOT_OBJECT}: {type(document).__name__}", text, False)
    for name in REQUIRED_FIELDS:
        if name not in document:
            return Rejected(f"{RejectReason.MISSING_FIELD}: {name}", text, False)
        problem = _field_problem(name, document[name])
        if problem:
            return Rejected(problem, text, False)
    update_time, latest = document["updateTime"], _future_limit(record_time_ms)
    too_late = update_time > MAX_UPDATE_TIME_MS or (latest is not None and update_time > latest)
    if update_time < MIN_UPDATE_TIME_MS or too_late:
        return Rejected(RejectReason.UPDATE_TIME_OUT_OF_RANGE, text, False)
    return ClickEvent(**{name: document[name] for name in REQUIRED_FIELDS})


_INT32_LOW, _INT32_HIGH = INT32_RANGE


_QUOTED_FIELDS = tuple(f'"{name}"'.encode() for name in REQUIRED_FIELDS)


def valid_event_values(payload: bytes | None, record_time_ms: int | None) -> tuple | None:
    """The common case, fast: a valid ClickEvent's values in `REQUIRED_FIELDS` order, else None.

    Accepts only what `classify_payload` accepts (None means "ask it"), with a few C-level
    checks per record instead of its step-by-step diagnosis; the executor runs it on every record.
    A payload with a \\u escape (a lone surrogate, or a key spelled with escapes) or a field name
    written twice goes the careful way.
    """
    if not payload or len(payload) > MAX_PAYLOAD_BYTES or b"\\u" in payload:
        return None
    for quoted in _QUOTED_FIELDS:
        if payload.count(quoted) != 1:
            return None
    try:
        document = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if type(document) is not dict:
        return None
    get = document.get
    webpage, uid, product, cookie = get("webpageId"), get("uid"), get("productId"), get("cookieId")
    expend, update = get("expendTime"), get("updateTime")
    # `type(x) is int` also rules out bool; None (missing or null) fails every check.
    if (
        type(webpage) is int
        and type(uid) is str
        and type(product) is str
        and type(cookie) is str
        and type(expend) is int
        and type(update) is int
        and _INT32_LOW <= webpage <= _INT32_HIGH
        and _INT32_LOW <= expend <= _INT32_HIGH
        and MIN_UPDATE_TIME_MS <= update <= MAX_UPDATE_TIME_MS
        and (record_time_ms is None or record_time_ms < 0 or update <= record_time_ms + MAX_FUTURE_MS)
    ):
        return (webpage, uid, product, cookie, expend, update)
    return None


# ---- DataFrame transforms ------------------------------------------------------------------------


def valid_click_events(fetched: DataFrame) -> DataFrame:
    return fetched.where(F.col("reject_reason").isNull())


def rejected_records(fetched: DataFrame) -> DataFrame:
    return fetched.where(F.col("reject_reason").isNotNull())


def to_click_events(valid: DataFrame, products: DataFrame, ingested_at: Column) -> DataFrame:
    """Valid records -> fact rows: event time from updateTime (UTC), left join with the dimension."""
    dimension = products.select("productId", "name", "product_price")
    event_time = F.timestamp_millis(F.col("updateTime"))
    return valid.join(F.broadcast(dimension), on="productId", how="left").select(
        F.col("webpageId"),
        F.col("uid"),
        F.col("productId"),
        F.col("cookieId"),
        F.col("expendTime"),
        event_time.alias("eventTime"),
        F.col("name"),
        F.col("product_price").cast("decimal(10,4)").alias("product_price"),
        # The session time zone is UTC (spark_session), so this is the UTC calendar day.
        F.date_format(event_time, "yyyyMMdd").alias("dt"),
        F.col("kafka_partition"),
        F.col("kafka_offset"),
        ingested_at.alias("ingested_at"),
    )


def to_rejects(rejected: DataFrame, ingested_at: Column) -> DataFrame:
    return rejected.select(
        F.col("raw_payload"),
        F.col("payload_is_base64"),
        F.col("reject_reason").alias("reason"),
        F.col("kafka_partition"),
        F.col("kafka_offset"),
        ingested_at.alias("ingested_at"),
    )
