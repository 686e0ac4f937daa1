"""Kafka as a micro-batch source: the driver plans per-partition ranges, executor tasks fetch them.

The broker's high watermark cannot be trusted (see docs), so a range has a start and a cap, not an
end: a task reads from `start` until a poll comes back empty or `max_records` were read. The batch's
end offsets are then taken from the records actually read (max offset + 1 per partition).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from jobs.clickstream.schema import FETCHED_RECORD
from jobs.clickstream.validation import ClickEvent, classify_payload

log = logging.getLogger(__name__)

# The consumer never joins this group (partitions are assigned); librdkafka just wants an id.
FETCH_GROUP_ID = "lakehouse-clickstream-ingest"
_PLAN_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("start", LongType(), False),
        StructField("max_records", LongType(), False),
    ]
)


class BrokerUnavailable(RuntimeError):
    """The broker could not be reached (metadata or fetch)."""


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    max_records: int


@dataclass(frozen=True)
class FetchSettings:
    max_records_per_partition: int = 200_000
    first_poll_seconds: float = 1.0  # wait this long for the first record of a range
    idle_poll_seconds: float = 0.1  # then a poll that comes back short means "caught up"
    max_fetch_seconds: float = 10.0  # a range never takes longer than this to read
    poll_batch: int = 10_000


def plan_ranges(
    topic: str, partitions: list[int], starts: dict[int, int], max_records: int
) -> list[OffsetRange]:
    return [OffsetRange(topic, p, starts.get(p, 0), max_records) for p in sorted(partitions)]


def _consumer(client_config: dict[str, object]) -> Consumer:
    return Consumer(
        {
            **client_config,
            "group.id": FETCH_GROUP_ID,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 50,
            "socket.timeout.ms": 10_000,
        }
    )


def topic_partitions(client_config: dict[str, object], topic: str, timeout: float = 5.0) -> list[int]:
    """Partition ids of `topic` (driver side). Raises BrokerUnavailable when it cannot tell."""
    consumer = _consumer(client_config)
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
    except KafkaException as exc:
        raise BrokerUnavailable(str(exc)) from exc
    finally:
        consumer.close()
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise BrokerUnavailable(f"topic {topic!r} not available: {found.error if found else 'missing'}")
    return sorted(found.partitions)


class _Columns:
    """Column buffers for one Arrow batch of fetched records."""

    def __init__(self) -> None:
        self.values: dict[str, list] = {field.name: [] for field in FETCHED_RECORD.fields}

    def add(self, partition: int, offset: int, timestamp_ms: int | None, parsed) -> None:
        v = self.values
        v["kafka_partition"].append(partition)
        v["kafka_offset"].append(offset)
        v["kafka_timestamp_ms"].append(timestamp_ms)
        if isinstance(parsed, ClickEvent):
            v["reject_reason"].append(None)
            v["raw_payload"].append(None)
            v["payload_is_base64"].append(None)
            for name in ("webpageId", "uid", "productId", "cookieId", "expendTime", "updateTime"):
                v[name].append(getattr(parsed, name))
        else:
            v["reject_reason"].append(parsed.reason)
            v["raw_payload"].append(parsed.raw_payload)
            v["payload_is_base64"].append(parsed.payload_is_base64)
            for name in ("webpageId", "uid", "productId", "cookieId", "expendTime", "updateTime"):
                v[name].append(None)

    def __len__(self) -> int:
        return len(self.values["kafka_offset"])

    def to_arrow(self):
        import pyarrow as pa

        return pa.RecordBatch.from_pydict(self.values, schema=_fetched_arrow_schema())


@cache
def _fetched_arrow_schema():
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(FETCHED_RECORD)


_BROKER_DOWN_CODES = {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE}


def fetch_range(client_config: dict[str, object], plan: OffsetRange, settings: FetchSettings) -> Iterator:
    """Executor side: read `plan` and yield Arrow batches of classified records."""
    errors: list[KafkaError] = []
    consumer = _consumer({**client_config, "error_cb": errors.append})
    try:
        consumer.assign([TopicPartition(plan.topic, plan.partition, plan.start)])
        read = 0
        began = time.monotonic()
        timeout = settings.first_poll_seconds
        while read < plan.max_records:
            requested = min(settings.poll_batch, plan.max_records - read)
            messages = consumer.consume(requested, timeout=timeout)
            if not messages:
                break
            timeout = settings.idle_poll_seconds
            now_ms = int(time.time() * 1000)
            columns = _Columns()
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise BrokerUnavailable(f"fetch {plan.topic}[{plan.partition}] failed: {error}")
                _, timestamp_ms = message.timestamp()
                columns.add(
                    message.partition(),
                    message.offset(),
                    timestamp_ms,
                    classify_payload(message.value(), now_ms),
                )
            read += len(messages)
            if len(columns):
                yield columns.to_arrow()
            # A short poll means the fetch drained what the broker had (the "caught up" signal we
            # use instead of the watermark); under a steady stream it ends the range promptly.
            if len(messages) < requested or time.monotonic() - began >= settings.max_fetch_seconds:
                break
        if read == 0 and any(e.code() in _BROKER_DOWN_CODES for e in errors):
            raise BrokerUnavailable(
                f"broker unreachable while fetching {plan.topic}[{plan.partition}]: {errors[-1]}"
            )
    finally:
        consumer.close()


def fetch_ranges(
    spark: SparkSession,
    client_config_factory: Callable[[], dict[str, object]],
    ranges: list[OffsetRange],
    settings: FetchSettings,
) -> DataFrame:
    """One Spark task per range; the tasks (on executors) connect to Kafka themselves."""
    rows = [(r.topic, r.partition, r.start, r.max_records) for r in ranges]
    plan = spark.createDataFrame(spark.sparkContext.parallelize(rows, max(1, len(rows))), _PLAN_SCHEMA)

    def fetch(plan_batches):
        client_config = client_config_factory()
        for batch in plan_batches:
            for row in batch.to_pylist():
                yield from fetch_range(client_config, OffsetRange(**row), settings)

    return plan.mapInArrow(fetch, FETCHED_RECORD)
