"""No payload can stop the ingest: every record becomes a fact row or a reject with a reason, once,
and the verdict depends on the record alone (its Kafka timestamp), never on the reader's clock."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ingest_case import Case

from jobs.ingest.kafka_source import _arrow_batch
from jobs.ingest.validation import MAX_FUTURE_MS, ClickEvent, Rejected, classify_payload

RECORD_MS = 1_763_700_000_000
GOOD = {
    "webpageId": 1,
    "uid": "u",
    "productId": "3",
    "cookieId": "c",
    "expendTime": 2,
    "updateTime": RECORD_MS,
}


@dataclass
class Message:
    """What confluent-kafka hands the fetch: value, offset, (timestamp type, timestamp)."""

    raw: bytes | None
    at: int
    ms: int = RECORD_MS

    def value(self):
        return self.raw

    def offset(self):
        return self.at

    def timestamp(self):
        return (1, self.ms) if self.ms >= 0 else (0, -1)


def good(**changes) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


NASTY = [
    good(cookieId="ab\ud83d"),  # a lone surrogate: what JSON.stringify sends for half an emoji
    b'{"webpageId":1,"uid":"u","productId":"3","cookieId":"ab\\ud83d","expendTime":2,"updateTime":'
    + str(RECORD_MS).encode()
    + b"}",
    good(uid="\udfff\ud800"),
    good(uid="\u0000nul"),
    good(productId="\U0001f600 emoji is fine"),
    b'{"uid":"a","uid":"b","webpageId":1,"productId":"3","cookieId":"c","expendTime":2,"updateTime":'
    + str(RECORD_MS).encode()
    + b"}",  # duplicate key: which uid is meant?
    b'{"u\\u0069d":"a","uid":"b","webpageId":1,"productId":"3","cookieId":"c","expendTime":2,"updateTime":1}',
    # nesting deeper than the parser's recursion limit, within the size limit (so it reaches the parser)
    b"[" * 30_000 + b"]" * 30_000,
    good(webpageId=2**64),
    good(expendTime=-(2**31) - 1),
    good(updateTime=10**30),
    good(updateTime=1e20),
    b'{"webpageId":NaN,"uid":"u","productId":"3","cookieId":"c","expendTime":2,"updateTime":1}',
    b'{"webpageId":1e999}',
    b"null",
    b"123",
    b'"string"',
    b"",
    None,
    b"\xff\xfe\x00",
    good(pad="x" * 70_000),
    good(),
]


def _verdicts(batch) -> list[str | None]:
    return batch.column("reject_reason").to_pylist()


def test_no_payload_stops_the_batch_and_each_gets_one_verdict():
    messages = [Message(raw, offset) for offset, raw in enumerate(NASTY)]
    batch = _arrow_batch(0, messages)
    assert batch.num_rows == len(NASTY)
    assert batch.column("kafka_offset").to_pylist() == list(range(len(NASTY)))
    reasons = _verdicts(batch)
    uids = batch.column("uid").to_pylist()
    for raw, reason, uid in zip(NASTY, reasons, uids, strict=True):
        assert (reason is None) == (uid is not None), (raw[:80] if raw else raw, reason)
    by_payload = dict(zip((m.raw for m in messages), reasons, strict=True))
    assert by_payload[good(cookieId="ab\ud83d")].startswith("invalid_unicode: cookieId")
    assert by_payload[b"[" * 30_000 + b"]" * 30_000] == "not_json"  # RecursionError caught, not raised
    assert by_payload[NASTY[5]] == "duplicate_key: uid"
    assert by_payload[NASTY[6]] == "duplicate_key: uid"
    assert by_payload[good(productId="\U0001f600 emoji is fine")] is None
    assert by_payload[good()] is None
    assert Counter(r is None for r in reasons) == Counter({False: len(NASTY) - 3, True: 3})


def test_the_verdict_depends_on_the_records_timestamp_not_on_the_readers_clock(monkeypatch):
    """A record just past 24 h ahead of its own Kafka timestamp is rejected, one just inside is kept,
    whatever the clock of the executor that reads it (re-reads after a kill must agree)."""
    late, inside = (
        good(updateTime=RECORD_MS + MAX_FUTURE_MS + 5),
        good(updateTime=RECORD_MS + MAX_FUTURE_MS - 5),
    )
    verdicts = []
    for clock in (RECORD_MS / 1000 - 86_400 * 3, RECORD_MS / 1000, RECORD_MS / 1000 + 86_400 * 3):
        monkeypatch.setattr(time, "time", lambda clock=clock: clock)
        verdicts.append(_verdicts(_arrow_batch(0, [Message(late, 0), Message(inside, 1)])))
    assert verdicts == [["update_time_out_of_range", None]] * 3
    assert isinstance(classify_payload(late, RECORD_MS), Rejected)
    assert isinstance(classify_payload(inside, RECORD_MS), ClickEvent)


def test_a_record_without_a_timestamp_gets_only_the_absolute_upper_bound():
    batch = _arrow_batch(
        0, [Message(good(updateTime=RECORD_MS * 2), 0, ms=-1), Message(good(updateTime=2**62), 1, -1)]
    )
    assert _verdicts(batch) == [None, "update_time_out_of_range"]  # past year 9999: no timestamp holds it


def test_a_value_arrow_refuses_after_every_check_becomes_an_unconvertible_reject(monkeypatch):
    """The fallback for drift between the checks and the Arrow schema: found record by record."""
    import jobs.ingest.kafka_source as kafka_source

    checked = kafka_source.valid_event_values

    def drifted(payload, record_time_ms):
        values = checked(payload, record_time_ms)
        return (2**40, *values[1:]) if values and json.loads(payload)["uid"] == "bad" else values

    monkeypatch.setattr(kafka_source, "valid_event_values", drifted)
    batch = _arrow_batch(0, [Message(good(uid="ok"), 0), Message(good(uid="bad"), 1)])
    reasons = _verdicts(batch)
    assert reasons[0] is None and reasons[1].startswith("unconvertible: webpageId")
    assert batch.column("uid").to_pylist() == ["ok", None]
    assert batch.column("raw_payload").to_pylist()[1] == good(uid="bad").decode()


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(st.characters(codec=None)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
_fields = st.fixed_dictionaries(
    {},
    optional={
        "webpageId": _json_values | st.integers(),
        "uid": _json_values | st.text(st.characters(codec=None)),
        "productId": st.text(),
        "cookieId": st.text(st.characters(codec=None)),
        "expendTime": st.integers(),
        "updateTime": st.integers(),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_fields.map(lambda d: json.dumps(d).encode()) | st.binary(max_size=64), min_size=1, max_size=8)
)
def test_fuzzed_payloads_never_stop_the_batch(payloads):
    batch = _arrow_batch(2, [Message(raw, offset) for offset, raw in enumerate(payloads)])
    assert batch.num_rows == len(payloads)
    for reason, uid in zip(_verdicts(batch), batch.column("uid").to_pylist(), strict=True):
        assert (reason is None) == (uid is not None)


@pytest.mark.stack
def test_a_poison_click_lands_in_rejects_and_the_clicks_around_it_in_facts(
    spark, lake_config, pyiceberg_catalog
):
    catalog = pyiceberg_catalog
    case = Case(lake_config, "poison")
    now = int(time.time() * 1000)
    clicks = [json.dumps({**GOOD, "uid": f"u{i}", "updateTime": now}).encode() for i in range(20)]
    poison = json.dumps({**GOOD, "cookieId": "ab\ud83d", "updateTime": now}).encode()
    delivered = case.produce([*clicks[:10], poison, *clicks[10:]])
    case.ingest_in_process(spark)

    facts, rejects = case.rows(case.fact, catalog), case.rows(case.rejects, catalog)
    sent = {(p, o): raw for p, o, raw in delivered}
    assert Counter(r["uid"] for r in facts) == Counter(json.loads(raw)["uid"] for raw in clicks)
    assert Counter((r["kafka_partition"], r["kafka_offset"]) for r in facts + rejects) == Counter(sent.keys())
    (reject,) = rejects
    assert reject["reason"].startswith("invalid_unicode: cookieId")
    assert sent[(reject["kafka_partition"], reject["kafka_offset"])] == poison
    assert reject["raw_payload"].encode() == poison
