"""Kafka as a micro-batch source: the driver plans per-partition ranges, executor tasks fetch them.

A range has a start, a cap and a minimum end, not an end. The minimum end is the partition's high
watermark when the batch was planned (capped): every record below it exists, so a task never ends
the range before it, whatever a poll returns; that makes a busy moment of the fetcher (short polls)
cost time, not a batch. The watermark is a lower bound only: on MSK it is exact, and the local
broker under-reports it (the start of the last produced batch + 1), so past it the task takes
what its consumer has already buffered (polls that do not wait) until one comes back short, or
`max_records` were read. Without a watermark a range ends on an empty poll, or a short one after a
minimum read time. The
batch's end offsets are then taken from the records actually read (max offset + 1 per partition),
observed while the batch is materialized.

Executors keep one consumer per partition between batches (like Spark's own Kafka source), so a
batch's task finds the records already prefetched; validation builds Arrow columns directly, with a
fast path for valid events.

A small batch (at most `FetchSettings.driver_max_records` below the watermarks) is read by the
driver instead (`read_here`), with the same readers and the same rules, straight into a DataFrame:
no Spark job, so no task scheduling, Python worker round trip or checkpoint per micro-batch, which
on a busy 2-core box cost 0.5-1.3 s of each batch while the reading itself took 1-12 ms (issue
26). The driver's readers also give the next planning its watermarks from their last fetch
response (`cached_high_watermarks`), without asking the broker.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from functools import cache

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, IntegerType, LongType, StringType, StructField, StructType

from jobs.config import ConfigError
from jobs.ingest.validation import (
    REQUIRED_FIELDS,
    ClickEvent,
    RejectReason,
    classify_payload,
    raw_payload_text,
    valid_event_values,
)

log = logging.getLogger(__name__)

# What an executor task returns per Kafka record: lineage, and either the parsed fields (valid)
# or the reason plus the raw payload (reject).
FETCHED_RECORD = StructType(
    [
        StructField("kafka_partition", IntegerType(), False),
        StructField("kafka_offset", LongType(), False),
        StructField("kafka_timestamp_ms", LongType(), True),
        StructField("reject_reason", StringType(), True),
        StructField("raw_payload", StringType(), True),
        StructField("payload_is_base64", BooleanType(), True),
        StructField("webpageId", IntegerType(), True),
        StructField("uid", StringType(), True),
        StructField("productId", StringType(), True),
        StructField("cookieId", StringType(), True),
        StructField("expendTime", IntegerType(), True),
        StructField("updateTime", LongType(), True),
    ]
)

# The consumer never joins this group (partitions are assigned); librdkafka just wants an id.
FETCH_GROUP_ID = "lakehouse-clickstream-ingest"


class BrokerUnavailable(RuntimeError):
    """The broker could not be reached (metadata or fetch)."""


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    max_records: int
    min_end: int = 0  # read at least up to here (exclusive): the high watermark at planning time
    # >0: a piece of a split partition (`split_ranges`): read exactly up to here (exclusive), never
    # past it, and fail rather than stop short (the next piece starts here: a short read is a hole).
    end: int = 0


@dataclass(frozen=True)
class FetchSettings:
    max_records_per_partition: int = 200_000
    first_poll_seconds: float = 1.0  # a new assignment waits this long for records to flow
    warm_first_poll_seconds: float = 0.25  # a kept one (its fetches are already running) this long
    idle_poll_seconds: float = 0.1  # then an empty poll means "caught up"...
    min_fetch_seconds: float = 0.3  # ...and so does a short one after reading this long
    max_fetch_seconds: float = 10.0  # a range never takes longer than this to read
    poll_batch: int = 10_000
    # A batch with at most this many records below its ranges' minimum ends is read by the driver
    # (a steady stream's batches: hundreds to a few thousand); a backlog is read by tasks, in
    # parallel. A range without a known watermark makes the batch's size unknown: tasks read it.
    driver_max_records: int = 20_000
    # A backlog read by tasks on fewer busy partitions than cores: each partition's known backlog
    # is split into pieces of at least this many records, one task each (Spark's Kafka source does
    # the same with `minPartitions`), so one hot partition does not cap the batch at one core.
    min_split_records: int = 50_000


def plan_ranges(
    topic: str,
    partitions: list[int],
    starts: dict[int, int],
    max_records: int,
    high_watermarks: dict[int, int] | None = None,
) -> list[OffsetRange]:
    """One range per partition; its minimum end is the high watermark, capped at `max_records`."""
    ranges = []
    for p in sorted(partitions):
        start, high = starts.get(p, 0), (high_watermarks or {}).get(p)
        # 0: unknown (no watermark); otherwise never below the start (nothing new to wait for).
        min_end = 0 if high is None else max(min(high, start + max_records), start)
        ranges.append(OffsetRange(topic, p, start, max_records, min_end))
    return ranges


def split_ranges(
    ranges: list[OffsetRange], high_watermarks: dict[int, int], tasks: int, min_piece: int
) -> list[OffsetRange]:
    """`ranges` with the known backlog (start..min_end) of busy partitions cut into exact pieces, so
    the batch has about `tasks` ranges when fewer partitions than that have records. Each partition
    gets pieces in proportion to its backlog, none smaller than `min_piece`; its last piece keeps the
    range's open end (what arrives past the watermark, up to max_records). Pieces are contiguous:
    together they read exactly what the unsplit range would have read up to its minimum end."""
    backlog = {r.partition: r.min_end - r.start for r in ranges if r.min_end > r.start}
    unknown = [r for r in ranges if r.partition not in high_watermarks]  # size unknown: left whole
    if len(backlog) + len(unknown) >= tasks or not backlog or min_piece <= 0:
        return ranges
    total = sum(backlog.values())
    split = []
    for r in ranges:
        size = backlog.get(r.partition, 0)
        pieces = max(1, min(-(-size * tasks // total), size // min_piece))
        if pieces == 1:
            split.append(r)
            continue
        step = -(-size // pieces)
        starts = [r.start + i * step for i in range(pieces) if i * step < size]
        for a, b in itertools.pairwise(starts):
            split.append(OffsetRange(r.topic, r.partition, a, b - a, b, end=b))
        last = starts[-1]
        split.append(replace(r, start=last, max_records=r.max_records - (last - r.start)))
    return split


def planned_records(ranges: list[OffsetRange], high_watermarks: dict[int, int]) -> int | None:
    """Records known to be there: below the ranges' minimum ends; None if a partition's watermark
    is unknown (an empty partition's is 0, which is known)."""
    if any(r.partition not in high_watermarks for r in ranges):
        return None
    return sum(max(0, r.min_end - r.start) for r in ranges)


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


def check_topic(client_config: dict[str, object], topic: str, timeout: float = 10.0) -> None:
    """Before a job starts: raises ConfigError naming the broker and the cause when `topic` cannot
    be read (broker unreachable, authentication refused, topic missing)."""
    # Quiet client: the cause is in the error; librdkafka would log each reconnect attempt.
    metadata = TopicMetadata(lambda: {**client_config, "log_level": 2}, timeout)
    try:
        metadata.partitions(topic)
    except BrokerUnavailable as exc:
        raise ConfigError(
            f"Kafka at {client_config['bootstrap.servers']} cannot serve topic {topic!r} ({exc}); is the "
            "broker up (locally: `lakehouse local status`) and the topic created? Nothing was written."
        ) from None
    finally:
        metadata.close()


class TopicMetadata:
    """Driver side: a topic's partitions and watermarks, asked of the broker every batch over one
    kept connection.

    Asking every batch notices new partitions and an unreachable broker; keeping the client saves
    a connect (and, on MSK, an IAM handshake) per batch. Every question raises BrokerUnavailable
    when the broker cannot answer, creating the client included (with IAM, it waits for its first
    token). (One ListOffsets request for all partitions through confluent-kafka 2.16's AdminClient
    was ~50 ms faster per batch on the local broker, but the streaming application once died of a
    segmentation fault at its first batch with it (a NULL mutex in libc): not worth 50 ms.)
    """

    def __init__(self, client_config_factory: Callable[[], dict[str, object]], timeout: float = 5.0) -> None:
        self._client_config_factory = client_config_factory
        self._timeout = timeout
        self._client: Consumer | None = None

    def _consumer(self) -> Consumer:
        if self._client is None:
            self._client = _consumer(self._client_config_factory())
        return self._client

    def partitions(self, topic: str) -> list[int]:
        """Partition ids of `topic`."""
        try:
            metadata = self._consumer().list_topics(topic, timeout=self._timeout)
        except KafkaException as exc:
            raise BrokerUnavailable(str(exc)) from exc
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise BrokerUnavailable(f"topic {topic!r} not available: {found.error if found else 'missing'}")
        return sorted(found.partitions)

    def high_watermarks(self, topic: str, partitions: list[int]) -> dict[int, int]:
        """Each partition's high watermark (a lower bound of its end on the local broker); a
        partition the broker does not answer for is left out (its range then has no minimum end)."""
        found = {}
        for partition in partitions:
            _, high = self._watermarks(topic, partition)
            if high >= 0:
                found[partition] = high
        return found

    def earliest_offset(self, topic: str, partition: int) -> int:
        """The partition's earliest offset still held by the broker (older ones expired)."""
        low, _ = self._watermarks(topic, partition)
        return low

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        try:
            return self._consumer().get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self._timeout, cached=False
            )
        except KafkaException as exc:
            raise BrokerUnavailable(str(exc)) from exc

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


_EVENT_FIELDS = tuple(REQUIRED_FIELDS)  # the order `valid_event_values` returns them in
_REJECT_FIELDS = ("reject_reason", "raw_payload", "payload_is_base64")


def _record_time_ms(message) -> int | None:
    """The record's Kafka timestamp (producer or broker time), None when it carries none."""
    kind, ms = message.timestamp()
    return ms if kind != TIMESTAMP_NOT_AVAILABLE and ms >= 0 else None


def _arrow_batch(partition: int, messages: list):
    """One Arrow batch (FETCHED_RECORD) of classified records, built column-wise.

    Valid events take `valid_event_values` (a few C-level checks); only the others go through
    `classify_payload` to learn why they are rejected. A record becomes a fact row or a reject,
    never an exception: a value the checks let through that Arrow still refuses is found record by
    record and rejected as `unconvertible` (the batch, and the job, go on).
    """
    values = [message.value() for message in messages]
    times = [_record_time_ms(message) for message in messages]
    parsed = [valid_event_values(value, ms) for value, ms in zip(values, times, strict=True)]
    n = len(messages)
    rejects: list[tuple | None] = [None] * n
    for i, value in enumerate(values):
        if parsed[i] is not None:
            continue
        verdict = classify_payload(value, times[i])
        if isinstance(verdict, ClickEvent):  # the two agree (tested); this only guards drift
            parsed[i] = tuple(getattr(verdict, name) for name in _EVENT_FIELDS)
        else:
            rejects[i] = (verdict.reason, verdict.raw_payload, verdict.payload_is_base64)
    try:
        return _to_record_batch(partition, messages, parsed, rejects)
    except Exception:  # noqa: BLE001 - which record? ask each one (rare: every check passed)
        for i in range(n):
            if parsed[i] is not None and (problem := _unconvertible(parsed[i])) is not None:
                text, is_base64 = raw_payload_text(values[i] or b"")
                parsed[i], rejects[i] = None, (f"{RejectReason.UNCONVERTIBLE}: {problem}", text, is_base64)
        return _to_record_batch(partition, messages, parsed, rejects)


def _unconvertible(row: tuple) -> str | None:
    import pyarrow as pa

    schema = _fetched_arrow_schema()
    for name, value in zip(_EVENT_FIELDS, row, strict=True):
        try:
            pa.array([value], schema.field(name).type)
        except Exception as exc:  # noqa: BLE001 - the reason is recorded with the reject
            return f"{name}: {type(exc).__name__}: {str(exc)[:200]}"
    return None


def _to_record_batch(partition: int, messages: list, parsed: list, rejects: list):
    import pyarrow as pa

    schema = _fetched_arrow_schema()
    n = len(messages)
    empty_event, empty_reject = (None,) * len(_EVENT_FIELDS), (None,) * len(_REJECT_FIELDS)
    event_columns = list(zip(*(row or empty_event for row in parsed), strict=True)) or [()] * len(
        _EVENT_FIELDS
    )
    if any(r is not None for r in rejects):
        reject_columns = list(zip(*(r or empty_reject for r in rejects), strict=True))
        reject_arrays = [
            pa.array(column, schema.field(name).type)
            for name, column in zip(_REJECT_FIELDS, reject_columns, strict=True)
        ]
    else:
        reject_arrays = [pa.nulls(n, schema.field(name).type) for name in _REJECT_FIELDS]
    arrays = [
        pa.array([partition] * n, pa.int32()),
        pa.array([message.offset() for message in messages], pa.int64()),
        pa.array([message.timestamp()[1] for message in messages], pa.int64()),
        *reject_arrays,
        *(
            pa.array(column, schema.field(name).type)
            for name, column in zip(_EVENT_FIELDS, event_columns, strict=True)
        ),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@cache
def _fetched_arrow_schema():
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(FETCHED_RECORD)


_BROKER_DOWN_CODES = {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE}


class _PartitionReader:
    """A consumer assigned to one partition, kept in the executor's Python worker between batches.

    Like Spark's own Kafka source (its executor-side consumer cache): the consumer keeps its
    connection and keeps prefetching while the driver commits, so the next batch's task finds the
    records already queued instead of paying a connect and a first fetch. `position` is the offset
    the next `consume` returns; a task that starts anywhere else re-assigns (e.g. after a failed
    batch), so what is read never depends on what an earlier task did.
    """

    def __init__(self, client_config: dict[str, object], topic: str, partition: int) -> None:
        self.errors: list[KafkaError] = []
        self.consumer = _consumer({**client_config, "error_cb": self.errors.append})
        self.topic = topic
        self.partition = partition
        self.position: int | None = None
        self.warm = False  # already positioned at the task's start, fetching in the background
        self.assigned_at = time.monotonic()
        self.last_used = time.monotonic()

    def start_at(self, offset: int) -> None:
        self.errors.clear()
        self.last_used = time.monotonic()
        if self.position is not None and self.position < offset:
            self._skip_to(offset)
        self.warm = self.position == offset
        if not self.warm:
            self.consumer.assign([TopicPartition(self.topic, self.partition, offset)])
            self.position = offset
            self.assigned_at = time.monotonic()

    def _skip_to(self, offset: int) -> None:
        """Move on to `offset` through records already prefetched (another worker read them since);
        anything else (not prefetched yet, or a gap in the offsets) leaves a re-assign to do."""
        while self.position is not None and self.position < offset:
            messages = self.consumer.consume(min(offset - self.position, 10_000), timeout=0)
            if not messages:
                return
            for message in messages:
                if message.error() is None:
                    self.position = message.offset() + 1
        if self.position != offset:
            self.position = None  # went past it: re-assign

    def past(self, offset: int) -> bool:
        """Whether the consumer's own position reached `offset`: it moves past control records
        (transaction markers), which `consume` never returns."""
        try:
            (at,) = self.consumer.position([TopicPartition(self.topic, self.partition)])
        except KafkaException:
            return False
        return at.offset >= offset

    def consume(self, count: int, timeout: float) -> list:
        messages = self.consumer.consume(count, timeout=timeout)
        for message in messages:
            if message.error() is None:
                self.position = message.offset() + 1
        return messages

    def close(self) -> None:
        try:
            self.consumer.close()
        except (KafkaException, RuntimeError):  # already closed or broker gone: nothing to release
            pass


_READERS: dict[tuple, _PartitionReader] = {}
READER_IDLE_SECONDS = 120.0  # a reader unused this long is closed (partition moved elsewhere)


def _reader_key(client_config: dict[str, object], topic: str, partition: int) -> tuple:
    # Callables (the MSK token callback) are new objects per task: key on the plain settings only.
    plain = tuple(sorted((k, v) for k, v in client_config.items() if isinstance(v, str | int | float | bool)))
    return plain, topic, partition


def _reader(client_config: dict[str, object], plan: OffsetRange) -> _PartitionReader:
    now = time.monotonic()
    for key, idle in list(_READERS.items()):
        if now - idle.last_used > READER_IDLE_SECONDS:
            _READERS.pop(key).close()
    key = _reader_key(client_config, plan.topic, plan.partition)
    reader = _READERS.get(key)
    if reader is None:
        reader = _READERS[key] = _PartitionReader(client_config, plan.topic, plan.partition)
    reader.start_at(plan.start)
    return reader


def fetch_range(client_config: dict[str, object], plan: OffsetRange, settings: FetchSettings) -> Iterator:
    """Executor side: read `plan` and yield Arrow batches of classified records."""
    reader = _reader(client_config, plan)
    try:
        yield from _read_range(reader, plan, settings)
    except BaseException:
        # Unknown state (an error mid-range, or the task was cancelled): start clean next time.
        _READERS.pop(_reader_key(client_config, plan.topic, plan.partition), None)
        reader.close()
        raise


def cached_high_watermarks(
    client_config: dict[str, object], topic: str, partitions: list[int]
) -> dict[int, int]:
    """Each partition's high watermark as the last fetch response of this process's kept reader gave
    it (no request; a lower bound of the end, like the broker's answer); a partition without a
    reader here, or whose reader has no fetch response yet, is left out."""
    found = {}
    for partition in partitions:
        reader = _READERS.get(_reader_key(client_config, topic, partition))
        if reader is None:
            continue
        try:
            _, high = reader.consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        except KafkaException:
            continue  # the broker is asked instead
        if high >= 0:
            found[partition] = high
    return found


def close_readers(client_config: dict[str, object], topic: str) -> None:
    """Close this process's kept readers of `topic` (the driver's, when tasks read a backlog instead
    or the job closes: an idle reader would go on prefetching into memory)."""
    settings_and_topic = _reader_key(client_config, topic, 0)[:2]
    for key in [k for k in _READERS if k[:2] == settings_and_topic]:
        _READERS.pop(key).close()


def close_all_readers() -> None:
    """Close every reader this process keeps (before its broker goes away: a test session's end)."""
    while _READERS:
        _READERS.popitem()[1].close()


def read_here(
    spark: SparkSession,
    client_config: dict[str, object],
    ranges: list[OffsetRange],
    settings: FetchSettings,
) -> tuple[DataFrame, dict[int, PartitionStats]]:
    """Read the ranges in this process (the driver), one after the other, with the readers and rules
    the tasks use; the records become a DataFrame held in the plan (deterministic: both tables are
    written from the same rows without a checkpoint) and their stats are counted on the way."""
    import pyarrow as pa

    from jobs.common.arrow_frames import arrow_frame

    batches, stats = [], {}
    for plan in ranges:
        # Past its minimum end a range takes what keeps arriving: bounded here as the batch is.
        capped = replace(plan, max_records=min(plan.max_records, settings.driver_max_records))
        read = list(fetch_range(client_config, capped, settings))
        stats[plan.partition] = _arrow_stats(read)
        batches += read
    table = pa.Table.from_batches(batches, schema=_fetched_arrow_schema())
    # One partition: the batch is small, and each partition of it would be a data file per commit.
    return arrow_frame(spark, table, FETCHED_RECORD).coalesce(1), stats


def _arrow_stats(batches: list) -> PartitionStats:
    """The stats `materialize_with_stats` observes, of one range's Arrow batches."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not batches or not (records := sum(b.num_rows for b in batches)):
        return PartitionStats(records=0, rejects=0, first_offset=None, last_offset=None, newest_ms=None)
    table = pa.Table.from_batches(batches)
    offsets = pc.min_max(table["kafka_offset"]).as_py()
    return PartitionStats(
        records=records,
        rejects=records - table["reject_reason"].null_count,
        first_offset=offsets["min"],
        last_offset=offsets["max"],
        newest_ms=pc.max(table["kafka_timestamp_ms"]).as_py(),
    )


def _read_range(reader: _PartitionReader, plan: OffsetRange, settings: FetchSettings) -> Iterator:
    read = 0
    began = time.monotonic()
    # Wait for the first record only as long as it takes to arrive (consume returns once it has
    # `count` records or the timeout passed, so ask for one), then in polls of up to poll_batch.
    first_poll = settings.warm_first_poll_seconds if reader.warm else settings.first_poll_seconds
    if 0 < plan.min_end <= plan.start:
        # The watermark says nothing new was there at planning: a short look is enough.
        first_poll = settings.idle_poll_seconds
    messages = reader.consume(1, first_poll)
    asked, past_min_end = 1, False
    last_progress = time.monotonic()
    # A consumer just (re)assigned has no prefetched records yet and fetches in small steps at
    # first: a short poll then says nothing about being caught up, so until `first_poll_seconds`
    # after the assign a poll may wait that long to fill up.
    ramped_up_at = reader.assigned_at + settings.first_poll_seconds
    while True:
        records = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise BrokerUnavailable(f"fetch {plan.topic}[{plan.partition}] failed: {error}")
            if plan.end:
                if message.offset() >= plan.end:
                    continue  # the next piece's (prefetched past this piece's end)
                if message.offset() < plan.start:
                    # The consumer went elsewhere (an offset reset): the previous piece's records.
                    raise BrokerUnavailable(
                        f"{plan.topic}[{plan.partition}] piece {plan.start}..{plan.end} got offset "
                        f"{message.offset()}"
                    )
            records.append(message)
        read += len(messages)
        if records:
            yield _arrow_batch(plan.partition, records)
            last_progress = time.monotonic()
        if plan.end:
            if reader.position is not None and reader.position >= plan.end:
                return
            if reader.past(plan.end):
                return  # the rest of the piece is control records (transaction markers)
            if time.monotonic() - last_progress >= settings.max_fetch_seconds:
                # The batch fails (and is retried) rather than commit a hole before the next piece.
                raise BrokerUnavailable(
                    f"{plan.topic}[{plan.partition}] piece {plan.start}..{plan.end} stopped at "
                    f"{reader.position} for {settings.max_fetch_seconds:.0f} s"
                )
            requested = min(settings.poll_batch, plan.end - (reader.position or plan.start))
            messages = reader.consume(max(requested, 1), settings.idle_poll_seconds)
            continue
        # Below the minimum end every record exists: keep reading whatever a poll returns, asking
        # for no more than are left below it (a poll returns once it has what it asked for, so
        # reaching the end costs no wait). Past it, take what is already buffered, without
        # waiting; a short poll there means caught up. Without a planned end (the broker gave no
        # watermark) only an empty poll, or a short one after min_fetch_seconds, does: librdkafka
        # refills its buffer in fetch-sized chunks, so a short poll on a busy box says little.
        elapsed = time.monotonic() - began
        if read >= plan.max_records or elapsed >= settings.max_fetch_seconds:
            break
        requested = min(settings.poll_batch, plan.max_records - read)
        wait = max(settings.idle_poll_seconds, ramped_up_at - time.monotonic())
        if reader.position is not None and reader.position < plan.min_end:
            requested = min(requested, plan.min_end - reader.position)
        elif plan.min_end > 0:
            if past_min_end and len(messages) < asked:
                break
            past_min_end, wait = True, 0.0
        elif len(messages) < asked and (not messages or elapsed >= settings.min_fetch_seconds):
            break
        asked = requested
        messages = reader.consume(requested, wait)
    if read == 0 and any(e.code() in _BROKER_DOWN_CODES for e in reader.errors):
        raise BrokerUnavailable(
            f"broker unreachable while fetching {plan.topic}[{plan.partition}]: {reader.errors[-1]}"
        )


def fetch_ranges(
    spark: SparkSession,
    client_config_factory: Callable[[], dict[str, object]],
    ranges: list[OffsetRange],
    settings: FetchSettings,
) -> DataFrame:
    """Spark tasks read the ranges (on executors; they connect to Kafka themselves).

    At most one task per core, so a batch is one wave of tasks: a task with several ranges reads
    them one after the other, while the readers of the later ones keep prefetching. The plan rows
    come from `spark.range` (JVM only), so the only Python a task runs is the fetch itself.
    """
    plan = plan_frame(spark, ranges)

    def fetch(plan_batches):
        client_config = client_config_factory()
        for batch in plan_batches:
            for row in batch.to_pylist():
                yield from fetch_range(client_config, OffsetRange(**row), settings)

    return plan.mapInArrow(fetch, FETCHED_RECORD)


# OffsetRange's field annotations (strings: `from __future__ import annotations`) -> Spark types.
_SPARK_TYPES = {"str": "string", "int": "bigint"}


def task_slots(spark: SparkSession) -> int:
    """How many tasks a batch may run at once: under dynamic allocation (EMR's default) the cores the
    application may grow to, since it starts with few executors and adds them only for pending
    tasks (sized by the cores it has, a batch would never ask for more); else the cores it has."""
    conf = spark.sparkContext.getConf()
    slots = spark.sparkContext.defaultParallelism
    if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        executors = conf.get("spark.dynamicAllocation.maxExecutors", "")
        cores = conf.get("spark.executor.cores", "1")
        if executors.isdigit() and cores.isdigit():
            slots = max(slots, int(executors) * int(cores))
    return slots


def plan_frame(spark: SparkSession, ranges: list[OffsetRange]) -> DataFrame:
    """One row per range, every OffsetRange field a column; at most one partition per task slot, so
    a batch is one wave of tasks."""
    tasks = max(1, min(len(ranges), task_slots(spark)))
    index = F.col("id").cast("int") + 1
    columns = []
    for spec in fields(OffsetRange):
        values = [F.lit(getattr(r, spec.name)).cast(_SPARK_TYPES[spec.type]) for r in ranges]
        columns.append(F.element_at(F.array(*values), index).alias(spec.name))
    return spark.range(0, len(ranges), 1, tasks).select(*columns)


@dataclass(frozen=True)
class PartitionStats:
    records: int
    rejects: int
    first_offset: int | None  # None when nothing was read
    last_offset: int | None
    newest_ms: int | None  # newest Kafka timestamp read


_observations = itertools.count()


def materialize_with_stats(
    fetched: DataFrame, partitions: list[int]
) -> tuple[DataFrame, dict[int, PartitionStats]]:
    """Run the fetch once (local checkpoint) and observe per-partition stats in the same pass.

    The stats are what the end offsets are built from, so they must describe exactly the records
    that were materialized: an Observation reports the metrics of that very execution.
    """
    from pyspark.sql import Observation

    columns = []
    for p in partitions:
        hit = F.col("kafka_partition") == p
        columns += [
            F.count(F.when(hit, 1)).alias(f"records_{p}"),
            F.count(F.when(hit, F.col("reject_reason"))).alias(f"rejects_{p}"),
            F.min(F.when(hit, F.col("kafka_offset"))).alias(f"first_offset_{p}"),
            F.max(F.when(hit, F.col("kafka_offset"))).alias(f"last_offset_{p}"),
            F.max(F.when(hit, F.col("kafka_timestamp_ms"))).alias(f"newest_ms_{p}"),
        ]
    observation = Observation(f"clickstream_fetch_{next(_observations)}")
    batch = fetched.observe(observation, *columns).localCheckpoint(eager=True)
    metrics = observation.get
    stats = {
        p: PartitionStats(
            records=metrics[f"records_{p}"] or 0,
            rejects=metrics[f"rejects_{p}"] or 0,
            first_offset=metrics[f"first_offset_{p}"],
            last_offset=metrics[f"last_offset_{p}"],
            newest_ms=metrics[f"newest_ms_{p}"],
        )
        for p in partitions
    }
    return batch, stats
