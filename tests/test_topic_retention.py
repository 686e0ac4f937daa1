"""The local topic's retention (lakehouse/local/topic_retention.py): which batches may go, on an S3
bucket laid out as tansu lays it out (moto), with the lake's read offsets given. The same code
against the real broker, ingest and catalog: tests/test_topic_retention_stack.py."""

from __future__ import annotations

import json
import logging
import threading

import boto3
import pytest
from moto import mock_aws

from lakehouse.local.broker import records_prefix, watermark_key
from lakehouse.local.topic_retention import (
    RetentionSettings,
    TopicRetention,
    base_offset,
    expired_batches,
    lake_read_offsets,
    retention_state,
)

TOPIC = "clicktopic"
BUCKET = "tansu"


def _keys(*bases: int, partition: int = 0) -> list[str]:
    return [f"{records_prefix(TOPIC, partition)}{base:020d}.batch" for base in bases]


def _bases(keys) -> list[int]:
    return [base_offset(key) for key in keys]


def test_a_batch_goes_only_when_every_record_of_it_was_read():
    # Batches start at 0, 1, 2, 4, 6, 7, 9: the one at 4 holds offsets 4 and 5.
    keys = _keys(0, 1, 2, 4, 6, 7, 9)
    assert _bases(expired_batches(keys, read_up_to=6, keep=0)) == [0, 1, 2, 4]
    assert _bases(expired_batches(keys, read_up_to=5, keep=0)) == [0, 1, 2]  # offset 5 is unread
    assert expired_batches(keys, read_up_to=0, keep=0) == []
    # The newest batch never goes: where it ends is unknown until the next one exists.
    assert _bases(expired_batches(keys, read_up_to=1_000, keep=0)) == [0, 1, 2, 4, 6, 7]


def test_the_newest_batches_stay_even_when_read():
    keys = _keys(0, 1, 2, 4, 6, 7, 9)
    assert _bases(expired_batches(keys, read_up_to=1_000, keep=4)) == [0, 1, 2]
    assert expired_batches(keys, read_up_to=1_000, keep=7) == []
    assert expired_batches(keys, read_up_to=1_000, keep=50) == []


def test_batches_are_ordered_by_offset_not_by_listing_order():
    keys = _keys(9, 0, 4, 1)
    assert _bases(expired_batches(keys, read_up_to=9, keep=0)) == [0, 1, 4]


def test_what_the_lake_has_read_is_the_lowest_of_its_tables():
    facts, rejects = {0: 10, 1: 5, 2: 8}, {0: 7, 1: 9}
    # Partition 2 has no rejects offsets yet: the rejects of it may not be read, so nothing goes.
    assert lake_read_offsets([facts, rejects]) == {0: 7, 1: 5}
    assert lake_read_offsets([facts, {}]) == {}
    assert lake_read_offsets([]) == {}


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def _store(s3, partition: int, bases: list[int], high: int) -> None:
    for key in _keys(*bases, partition=partition):
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"batch")
    s3.put_object(
        Bucket=BUCKET,
        Key=watermark_key(TOPIC, partition),
        Body=json.dumps({"low": None, "high": high, "timestamps": None}).encode(),
    )


def _stored(s3, partition: int) -> list[int]:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=records_prefix(TOPIC, partition)).get("Contents", [])
    return sorted(base_offset(item["Key"]) for item in listed)


def _retention(s3, read: dict[int, int], keep: int = 0) -> TopicRetention:
    return TopicRetention(s3, BUCKET, lambda: dict(read), RetentionSettings(topic=TOPIC, keep_batches=keep))


def test_a_pass_deletes_what_was_read_and_leaves_the_rest(s3):
    _store(s3, 0, list(range(0, 3000, 10)), high=3000)  # 300 batches of 10: several S3 pages
    _store(s3, 1, [0, 5, 9], high=12)
    read = {0: 2_505, 1: 0}
    retention = _retention(s3, read, keep=20)
    assert retention.run_once() == {0: 250}  # 0..2490 hold only offsets below 2,505
    assert _stored(s3, 0) == list(range(2500, 3000, 10))
    assert _stored(s3, 1) == [0, 5, 9]
    # Watermark and metadata objects are the broker's: never touched.
    assert s3.get_object(Bucket=BUCKET, Key=watermark_key(TOPIC, 0))["Body"].read()


def test_keep_counts_across_the_whole_partition(s3):
    _store(s3, 0, list(range(100)), high=100)
    assert _retention(s3, {0: 100}, keep=30).run_once() == {0: 70}
    assert _stored(s3, 0) == list(range(70, 100))


def test_nothing_is_deleted_when_the_lake_claims_more_than_the_topic_holds(s3):
    # The lake read 500 records of an earlier topic of this name; this one has 40, all unread.
    _store(s3, 0, list(range(0, 40, 4)), high=40)
    assert _retention(s3, {0: 500}).run_once() == {}
    assert _stored(s3, 0) == list(range(0, 40, 4))


def test_a_partition_without_lake_offsets_keeps_everything(s3):
    _store(s3, 0, list(range(10)), high=10)
    _store(s3, 1, list(range(10)), high=10)
    assert _retention(s3, {1: 10}).run_once() == {1: 9}
    assert _stored(s3, 0) == list(range(10))


def test_a_later_pass_continues_from_the_new_bound(s3):
    _store(s3, 0, list(range(10)), high=10)
    read = {0: 4}
    retention = TopicRetention(s3, BUCKET, lambda: dict(read), RetentionSettings(topic=TOPIC, keep_batches=0))
    assert retention.run_once() == {0: 4}
    assert retention.run_once() == {}
    read[0] = 8
    assert retention.run_once() == {0: 4}
    assert _stored(s3, 0) == [8, 9]


def test_a_failed_pass_is_logged_once_and_the_next_one_deletes(s3, caplog):
    _store(s3, 0, list(range(10)), high=10)
    stop, passes = threading.Event(), []

    def read() -> dict[int, int]:
        passes.append(1)
        if len(passes) <= 3:
            raise OSError("database is locked")  # the catalog busy, or the store down
        stop.set()  # this pass still runs to its end
        return {0: 10}

    settings = RetentionSettings(topic=TOPIC, keep_batches=0, interval_seconds=0.01)
    with caplog.at_level(logging.INFO, logger="topic_retention"):
        TopicRetention(s3, BUCKET, read, settings).run_until(stop)
    assert _stored(s3, 0) == [9]
    assert [r.levelname for r in caplog.records if "failed" in r.getMessage()] == ["ERROR"]
    assert any("succeed again" in r.getMessage() for r in caplog.records)


def test_status_tells_a_working_retention_from_a_stuck_one():
    assert retention_state(running=False, since_pass=1.0, since_start=1.0) == "off"
    assert retention_state(running=True, since_pass=2.0, since_start=500.0) == "up"
    assert retention_state(running=True, since_pass=None, since_start=5.0) == "up"  # first pass pending
    assert retention_state(running=True, since_pass=None, since_start=45.0) == "failing"
    assert retention_state(running=True, since_pass=120.0, since_start=500.0) == "failing"


def test_each_completed_pass_is_reported(s3):
    _store(s3, 0, list(range(5)), high=5)
    stop, reported = threading.Event(), []

    def read() -> dict[int, int]:
        if len(reported) == 2:
            stop.set()
        return {0: 5}

    settings = RetentionSettings(topic=TOPIC, keep_batches=0, interval_seconds=0.01)
    TopicRetention(s3, BUCKET, read, settings).run_until(stop, on_pass=lambda: reported.append(1))
    assert len(reported) == 3


def test_a_partition_whose_watermark_is_missing_keeps_everything(s3):
    """No watermark object (a partition the broker never wrote one for): the high watermark is
    unknown, so nothing of it is deleted whatever the lake claims."""
    _store(s3, 0, list(range(10)), high=10)
    s3.delete_object(Bucket=BUCKET, Key=watermark_key(TOPIC, 0))
    assert _retention(s3, {0: 5}).run_once() == {}
    assert _stored(s3, 0) == list(range(10))


def test_objects_the_store_refused_to_delete_fail_the_pass(s3):
    """DeleteObjects answers 200 with per-key Errors: ignoring them would count batches as deleted
    that are still there (and the pass would not be retried)."""
    _store(s3, 0, list(range(10)), high=10)
    retention = _retention(s3, {0: 6})

    def refusing(**kwargs):  # deletes nothing, as a store refusing every key would
        first = kwargs["Delete"]["Objects"][0]["Key"]
        return {"Errors": [{"Key": first, "Code": "AccessDenied", "Message": "Access Denied"}]}

    retention.s3 = type(
        "Refusing",
        (),
        {"__getattr__": lambda self, n: getattr(s3, n), "delete_objects": staticmethod(refusing)},
    )()
    with pytest.raises(RuntimeError, match="could not delete .*: Access Denied"):
        retention.run_once()
    assert _stored(s3, 0) == list(range(10))
    retention.s3 = s3
    assert retention.run_once() == {0: 6}  # not marked done: the next pass deletes them
    assert _stored(s3, 0) == list(range(6, 10))
