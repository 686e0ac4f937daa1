"""The ingest driver's broker questions (partitions, watermarks) against the real local broker."""

from __future__ import annotations

import socket
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from jobs.ingest.kafka_source import BrokerUnavailable, TopicMetadata

pytestmark = pytest.mark.stack


def _topic_with_records(bootstrap: str, per_partition: dict[int, int]) -> str:
    topic = f"metadata_{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, count in per_partition.items():
        for i in range(count):
            producer.produce(topic, value=b"x%d" % i, partition=partition)
            if i % 7 == 0:
                producer.flush(10)  # several produce batches: the local broker's watermark lags them
    assert producer.flush(30) == 0
    return topic


def test_high_watermarks_are_lower_bounds_of_what_each_partition_holds(local_stack):
    bootstrap = local_stack.broker.bootstrap
    topic = _topic_with_records(bootstrap, {1: 25, 2: 3})  # partition 0 stays empty
    metadata = TopicMetadata(lambda: {"bootstrap.servers": bootstrap})
    try:
        assert metadata.partitions(topic) == [0, 1, 2]
        found = metadata.high_watermarks(topic, [0, 1, 2])
        earliest = [metadata.earliest_offset(topic, p) for p in range(3)]
    finally:
        metadata.close()
    # The local broker reports the start of the last produced batch + 1; MSK the exact end.
    assert found[0] == 0 and 1 <= found[1] <= 25 and 1 <= found[2] <= 3
    assert earliest == [0, 0, 0]


def test_high_watermarks_of_an_unreachable_broker_raise_broker_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    metadata = TopicMetadata(lambda: {"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 2}, timeout=1.0)
    try:
        with pytest.raises(BrokerUnavailable):
            metadata.high_watermarks("clicktopic", [0, 1])
    finally:
        metadata.close()
