"""Real-time product views: `lakehouse run views`; the same module is what the EMR step runs.

Keeps `lakehouse.ads_behavior.product_views` equal to the source system's statistic
`SELECT productId, name, product_price, count(uid) FROM clickevent GROUP BY productId, name,
product_price`, by reading only the click rows it has not counted yet.

Progress is a per-Kafka-partition offset watermark over the click table's lineage columns, keyed
by the topic the ingest reads and stored in the summary of the same commit that adds the
counts (`lakehouse.views.click-offsets`). The ingest commits each partition's offsets in order and
exactly once, so "offset >= watermark" is exactly the uncounted rows. Unlike an incremental
snapshot scan, this survives the click table's compaction (rewrite snapshots carry the same rows)
and snapshot expiry (no snapshot id to lose). If the click table's offsets ever go back below the
watermark (a recreated topic, a restored table) or switch topic, new rows would hide below it: the
job stops with an error instead of silently counting nothing.

Rows a replay of rejects (`jobs/replay`) lands are at offsets the watermark may have passed, and a
repair (`lakehouse verify --repair`) adds or removes rows there. Each commit also stores the click
snapshot it counted through (`lakehouse.views.clicks-snapshot`); the next batch reads what every
replay commit between that snapshot and the new one appended (an incremental read of that one
commit), and what every repair commit changed in the offset ranges it names (its rows there minus
its parent's), and counts the rows below the watermark (those above it the offset rule counts). If
that part of the click table's history is gone (expired while the job was stopped), it says so:
`lakehouse verify` then tells whether the view is off.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, LongType, StringType, StructField, StructType, TimestampType

from jobs.common import progress_keys
from jobs.common.arrow_frames import arrow_frame
from jobs.common.lake_tables import (
    FACT_TABLE,
    OFFSETS_KEY,
    REPAIR_KEY,
    REPLAY_KEY,
    VIEWS_TABLE,
    in_offset_ranges,
    load_iceberg_table,
    offsets_at_or_after,
)
from jobs.common.metrics import NO_METRICS, BatchMetrics, MetricsSink, guarded
from jobs.common.snapshot_progress import (
    COMMIT_ID_KEY,
    ConcurrentWriterError,
    exclusive_append_options,
    find_commit,
    main_snapshot,
    progress_as_of,
    progress_summary_as_of,
    retry_commit,
    writer_options,
)
from jobs.common.streaming_job import StreamingJob
from jobs.common.views_counting import COUNTS, COUNTS_KEY
from jobs.config import LakehouseConfig

log = logging.getLogger("product_views")

PROGRESS_KEY = progress_keys.VIEWS_CLICK_OFFSETS
COUNTED_SNAPSHOT_KEY = progress_keys.VIEWS_CLICKS_SNAPSHOT
GROUP_COLUMNS = ("productId", "name", "product_price")
# +1 for a click to count, -1 for one a repair removed below the watermark (counted before).
WEIGHT = "_lakehouse_weight"

Watermark = dict[int, int]  # kafka partition -> next click offset not yet counted
# The topic of clicks written without the ingest's offsets (by hand, in tests), and of a watermark
# stored before topics were kept: it matches whatever topic the ingest reads.
ANY_TOPIC = "*"


class ClickOffsetsRegressed(RuntimeError):
    """The click table's offsets went below what was counted, or changed topic: new rows would hide
    below the watermark. Nothing is committed."""


def views_table_ddl(table: str) -> str:
    # Copy-on-write (the Iceberg default): ~20 rows per price version, so rewriting the one small
    # file per MERGE is cheap and readers never merge delete files.
    return f"""CREATE TABLE IF NOT EXISTS {table} (
                 productId string, name string, product_price decimal(10,4),
                 views bigint, updated_at timestamp)
               USING iceberg
               TBLPROPERTIES ('format-version'='2', 'commit.retry.num-retries'='20',
                              'write.metadata.delete-after-commit.enabled'='true',
                              'write.metadata.previous-versions-max'='50')"""


def watermark_from_summary(value: str | None) -> tuple[str, Watermark]:
    """(topic, watermark); the flat form of earlier versions is ANY_TOPIC's."""
    parsed = json.loads(value) if value else {}
    if parsed and not isinstance(next(iter(parsed.values())), dict):
        parsed = {ANY_TOPIC: parsed}
    topic, offsets = next(iter(parsed.items()), (ANY_TOPIC, {}))
    return topic, {int(p): int(o) for p, o in offsets.items()}


def watermark_summary(topic: str, watermark: Watermark) -> str:
    return json.dumps({topic: {str(p): watermark[p] for p in sorted(watermark)}}, separators=(",", ":"))


def checked_topic(topic: str, watermark: Watermark, ingest_offsets: dict[str, Watermark]) -> str:
    """The topic the watermark counts from now on, given the ingest's stored offsets on the click
    snapshot being read ({} if the rows were not written by the ingest). Raises
    ClickOffsetsRegressed if the click table switched topic or its offsets went below the watermark."""
    if not ingest_offsets:
        return topic
    (ingest_topic, offsets), *others = ingest_offsets.items()
    if others or (topic not in (ANY_TOPIC, ingest_topic) and watermark):
        raise ClickOffsetsRegressed(
            f"the click table now holds topic {ingest_topic!r}, but product_views counted {topic!r}: "
            "the same Kafka offsets may repeat. Rebuild the view: drop its table and rerun"
        )
    behind = {
        p: (offsets.get(p, 0), counted) for p, counted in watermark.items() if offsets.get(p, 0) < counted
    }
    if behind:
        detail = ", ".join(
            f"partition {p}: {stored} < {counted}" for p, (stored, counted) in sorted(behind.items())
        )
        raise ClickOffsetsRegressed(
            f"the click table's offsets for topic {ingest_topic!r} went below what product_views has "
            f"counted ({detail}): was the topic recreated or the table restored? New clicks would "
            "never be counted; rebuild the view (drop its table and rerun)"
        )
    return ingest_topic


# ---- transforms ------------------------------------------------------------------------------------


def uncounted_clicks(clicks: DataFrame, watermark: Watermark) -> DataFrame:
    """Click rows at or after the watermark; partitions the watermark has not seen yet count fully."""
    known = list(watermark)
    new_partition = ~F.col("kafka_partition").isin(known) if known else F.lit(True)
    return clicks.where(offsets_at_or_after(watermark) | new_partition).withColumn(WEIGHT, F.lit(1))


def late_clicks(replayed: DataFrame, watermark: Watermark, weight: int = 1) -> DataFrame:
    """Rows a replay appended (or a repair changed) that the offset rule does not count: below the
    watermark, each with `weight`."""
    known = list(watermark)
    if not known:
        return replayed.where(F.lit(False)).withColumn(WEIGHT, F.lit(weight))
    late = replayed.where(F.col("kafka_partition").isin(known) & ~offsets_at_or_after(watermark))
    return late.withColumn(WEIGHT, F.lit(weight))


def repair_ranges(summary_value: str) -> list[tuple[int, int, int]]:
    """A click repair commit's `ranges` ({"<partition>": [[first, last], ...]}) as (partition,
    first, last)."""
    ranges = json.loads(summary_value).get("ranges", {})
    return [(int(p), int(first), int(last)) for p, pieces in ranges.items() for first, last in pieces]


def views_delta(uncounted: DataFrame) -> DataFrame:
    """Per group and Kafka partition: views to add (weighted: a removed row counts -1) and the
    highest offset read. One small scan yields both the counts and the next watermark."""
    counted = F.when(F.col("uid").isNotNull(), F.col(WEIGHT)).otherwise(0)
    return uncounted.groupBy(*GROUP_COLUMNS, "kafka_partition").agg(
        F.sum(counted).alias("views"),
        F.max("kafka_offset").alias("last_offset"),
        F.max("eventTime").alias("newest_event"),
    )


@dataclass(frozen=True)
class Delta:
    counts: dict[tuple, int]
    watermark: Watermark
    newest_event: datetime | None = None  # the newest event time counted (the view's lag)

    @property
    def views(self) -> int:
        return sum(self.counts.values())

    @property
    def counted(self) -> int:
        """The size of this delta's change: per group, how many clicks it adds or (a repair) takes
        off, summed; a batch's work as far as the view is concerned (what cancels out within a
        group does not count)."""
        return sum(abs(n) for n in self.counts.values())


def fold_delta(rows: Sequence, watermark: Watermark) -> Delta:
    counts: dict[tuple, int] = defaultdict(int)
    advanced = dict(watermark)
    newest = None
    for row in rows:
        counts[tuple(row[c] for c in GROUP_COLUMNS)] += row["views"]
        partition = row["kafka_partition"]
        advanced[partition] = max(advanced.get(partition, 0), row["last_offset"] + 1)
        event = row["newest_event"]
        newest = event if newest is None or (event is not None and event > newest) else newest
    return Delta(dict(counts), advanced, newest)


VIEWS_SCHEMA = StructType(
    [
        StructField("productId", StringType()),
        StructField("name", StringType()),
        StructField("product_price", DecimalType(10, 4)),
        StructField("views", LongType()),
        StructField("updated_at", TimestampType()),
    ]
)
VIEWS_COLUMNS = tuple(VIEWS_SCHEMA.names)


def with_delta(base: Sequence, delta: Delta, now: datetime) -> list[tuple]:
    """The whole view after adding `delta` to `base` (its rows as of this job's last commit).
    Groups are keyed null-safely: clicks of unknown products (null name and price) form one group."""
    rows = {tuple(row[c] for c in GROUP_COLUMNS): (row["views"], row["updated_at"]) for row in base}
    gone = set()
    for group, views in delta.counts.items():
        before, _ = rows.get(group, (0, None))
        rows[group] = (before + views, now)
        if views < 0 and before + views <= 0:  # a repair removed every click of it
            gone.add(group)
    return [(*group, views, updated_at) for group, (views, updated_at) in rows.items() if group not in gone]


def views_frame(spark: SparkSession, rows: Sequence[tuple]) -> DataFrame:
    """The view's rows (VIEWS_COLUMNS) as a DataFrame sent to the JVM as Arrow. `createDataFrame` of
    a list would pickle them through a Python worker: the write task of each commit waited ~450 ms
    for it in a fresh application's first minute on the 2-core box (~45 ms as Arrow)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(VIEWS_SCHEMA)
    columns = [list(column) for column in zip(*rows, strict=True)] or [[] for _ in VIEWS_COLUMNS]
    # Times read back from the table are naive local times (PySpark's convention): make them UTC.
    updated_at = VIEWS_COLUMNS.index("updated_at")
    columns[updated_at] = [
        t if t is None or t.tzinfo is not None else t.astimezone(UTC) for t in columns[updated_at]
    ]
    arrays = [pa.array(column, type=field.type) for column, field in zip(columns, schema, strict=True)]
    return arrow_frame(spark, pa.Table.from_arrays(arrays, schema=schema), VIEWS_SCHEMA)


# ---- the job -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ViewsSettings:
    clicks_table: str
    views_table: str

    @classmethod
    def default(cls, config: LakehouseConfig) -> ViewsSettings:
        return cls(clicks_table=config.table(*FACT_TABLE), views_table=config.table(*VIEWS_TABLE))


class ProductViews(StreamingJob):
    """Holds the watermark between batches; `run_batch` is one incremental update."""

    def __init__(
        self, spark: SparkSession, settings: ViewsSettings, metrics: MetricsSink = NO_METRICS
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.metrics = guarded(metrics)
        self.topic = ANY_TOPIC
        self.watermark: Watermark = {}
        self.counted_snapshot: int | None = None  # the click snapshot the view counted through
        self.batches = 0
        self._last_clicks_snapshot: int | None = None
        self.last_lag_seconds: float | None = None  # now - the newest event time counted, at commit
        self.on_commit = None  # optional callback(delta, clicks_snapshot_id) for benchmarks
        # The view's rows as this job last committed them (None: read them from the table). Only
        # this job writes the table (every commit checks), and maintenance keeps rows as they are,
        # so the next commit need not read them back: a Spark job less per batch.
        self._rows: list[dict] | None = None

    def prepare(self) -> None:
        self.spark.sql(views_table_ddl(self.settings.views_table))
        stored = progress_summary_as_of(self.spark, self.settings.views_table, None, PROGRESS_KEY) or {}
        self.topic, self.watermark = watermark_from_summary(stored.get(PROGRESS_KEY))
        # From the commit that holds the watermark: a views job of an earlier release stores none.
        counted = stored.get(COUNTED_SNAPSHOT_KEY)
        self.counted_snapshot = int(counted) if counted else None
        self._rows = None
        log.info("resuming %s from %s offsets %s", self.settings.views_table, self.topic, self.watermark)

    def finish(self) -> None:
        pass  # every batch commits what it counted

    def close(self) -> None:
        pass  # holds no client

    def lag_seconds(self) -> float | None:
        return self.last_lag_seconds

    def _clicks_snapshot(self) -> int | None:
        return main_snapshot(self.spark, self.settings.clicks_table)

    def run_batch(self) -> int:
        batch_began = time.monotonic()
        if not self.spark.catalog.tableExists(self.settings.clicks_table):
            return 0  # the ingest has not created it yet
        snapshot = self._clicks_snapshot()
        if snapshot is None or snapshot == self._last_clicks_snapshot:
            return 0
        ingest_offsets = json.loads(
            progress_as_of(self.spark, self.settings.clicks_table, snapshot, OFFSETS_KEY) or "{}"
        )
        topic = checked_topic(
            self.topic,
            self.watermark,
            {t: {int(p): o for p, o in offsets.items()} for t, offsets in ingest_offsets.items()},
        )
        # Read one snapshot so the counts and the watermark describe the same rows.
        clicks = (
            self.spark.read.format("iceberg").option("snapshot-id", snapshot).load(self.settings.clicks_table)
        )
        uncounted = uncounted_clicks(clicks, self.watermark)
        for correction in self._corrections_since(snapshot):
            uncounted = uncounted.unionByName(self._late_rows(correction))
        delta = fold_delta(views_delta(uncounted).collect(), self.watermark)
        self._last_clicks_snapshot = snapshot
        if not delta.counts:
            return 0  # e.g. a compaction snapshot: same rows, nothing new
        began = time.monotonic()
        self._commit(topic, delta, snapshot)
        self.topic, self.watermark, self.counted_snapshot = topic, delta.watermark, snapshot
        self.batches += 1
        if delta.newest_event is not None:
            # PySpark returns naive local-time datetimes; .timestamp() reads them back the same way.
            self.last_lag_seconds = max(0.0, time.time() - delta.newest_event.timestamp())
        log.info(
            "batch %d: views=%d groups=%d click_offsets=%s clicks_snapshot=%d commit_ms=%.0f",
            self.batches,
            delta.views,
            len(delta.counts),
            watermark_summary(topic, delta.watermark),
            snapshot,
            (time.monotonic() - began) * 1000,
        )
        self.metrics.record(
            BatchMetrics(
                job="views",
                table=self.settings.views_table.split(".", 1)[-1],
                records_in=delta.counted,
                batch_seconds=time.monotonic() - batch_began,
                commit_seconds=time.monotonic() - began,
                lag_seconds=self.last_lag_seconds,
            )
        )
        if self.on_commit:
            self.on_commit(delta, snapshot)
        return delta.counted

    def _late_rows(self, correction) -> DataFrame:
        """What a replay or repair commit changed below the watermark, as weighted click rows."""
        read = self.spark.read.format("iceberg")
        table = self.settings.clicks_table
        summary = correction.summary()
        if summary.get(REPLAY_KEY) is not None:  # an append: what it added
            appended = (
                read.option("start-snapshot-id", correction.parentId())
                .option("end-snapshot-id", correction.snapshotId())
                .load(table)
            )
            return late_clicks(appended, self.watermark)
        # A repair adds and removes rows: its rows in the ranges it names minus its parent's there.
        ranges = repair_ranges(summary.get(REPAIR_KEY))
        after = read.option("snapshot-id", correction.snapshotId()).load(table)
        before = self.spark.read.format("iceberg").option("snapshot-id", correction.parentId()).load(table)
        return late_clicks(in_offset_ranges(after, ranges), self.watermark).unionByName(
            late_clicks(in_offset_ranges(before, ranges), self.watermark, weight=-1)
        )

    def _corrections_since(self, snapshot: int) -> list:
        """The replay and click-repair commits after the snapshot last counted, up to `snapshot`,
        oldest first."""
        if self.counted_snapshot is None:
            return []  # a new view counts every row; a view of an earlier version saw no replay
        table = load_iceberg_table(self.spark, self.settings.clicks_table)
        replays, current = [], table.snapshot(snapshot)
        while current is not None and current.snapshotId() != self.counted_snapshot:
            summary = current.summary()
            if summary.get(REPLAY_KEY) is not None or summary.get(REPAIR_KEY) is not None:
                replays.append(current)
            parent = current.parentId()
            current = table.snapshot(parent) if parent is not None else None
        if current is None:
            log.warning(
                "the click table's history since snapshot %s (the last counted) is gone (expired?): "
                "rows replayed or repaired in it cannot be told apart; `lakehouse verify` says if the "
                "view is off",
                self.counted_snapshot,
            )
            return []
        return replays[::-1]

    def _table_rows(self, snapshot: int | None) -> list:
        if snapshot is None:
            return []
        return (
            self.spark.read.format("iceberg")
            .option("snapshot-id", snapshot)
            .load(self.settings.views_table)
            .collect()
        )

    def _commit(self, topic: str, delta: Delta, clicks_snapshot: int) -> None:
        """Rewrite the (small) view as its state at the snapshot that holds this job's watermark plus
        `delta`, in one exclusive overwrite validated from that snapshot: if anyone else committed
        data since, Iceberg rejects the commit, so a second writer can never double-count."""
        table = self.settings.views_table
        # The commit id tells this job's own landed attempt from another job's commit of the same
        # watermark (two jobs resuming from one point count the same clicks).
        commit_id = uuid.uuid4().hex
        summary = writer_options(
            {
                PROGRESS_KEY: watermark_summary(topic, delta.watermark),
                COUNTED_SNAPSHOT_KEY: str(clicks_snapshot),
                COMMIT_ID_KEY: commit_id,
                COUNTS_KEY: COUNTS,
            }
        )
        now = datetime.now(UTC)  # one value for every attempt: an attempt that landed wrote it

        @retry_commit()
        def commit() -> None:
            base_snapshot = main_snapshot(self.spark, table)
            stored_summary = {}
            if base_snapshot is not None:
                stored_summary = progress_summary_as_of(self.spark, table, base_snapshot, PROGRESS_KEY) or {}
            stored = watermark_from_summary(stored_summary.get(PROGRESS_KEY))
            # A commit whose outcome was unknown may have landed: then the table already holds it.
            if stored == (topic, delta.watermark) and find_commit(self.spark, table, commit_id) is not None:
                return
            # The click snapshot counted through tells another job's batch that counted only a replay
            # or a repair (the watermark unchanged) from none.
            counted = str(self.counted_snapshot) if self.counted_snapshot is not None else None
            if stored != (self.topic, self.watermark) or stored_summary.get(COUNTED_SNAPSHOT_KEY) != counted:
                mine = watermark_summary(self.topic, self.watermark)
                raise ConcurrentWriterError(
                    f"another product_views job committed to {table} (its offsets "
                    f"{watermark_summary(*stored)}, this one's {mine}): only one may run per view "
                    "table; stopping without committing this batch"
                )
            base = self._rows
            if base is None:
                base = self._table_rows(base_snapshot)
            written = with_delta(base, delta, now)
            rows = views_frame(self.spark, written)
            options = {**summary, **exclusive_append_options(base_snapshot)}
            self._rows = None  # until this write is known to have landed
            try:
                rows.coalesce(1).writeTo(table).options(**options).overwrite(F.lit(True))
                self._rows = [dict(zip(VIEWS_COLUMNS, row, strict=True)) for row in written]
            except Exception as exc:  # noqa: BLE001 - py4j wraps Iceberg's ValidationException
                if "Found conflicting" not in str(exc):
                    raise
                # Someone committed since the base snapshot (compaction or another writer): retry,
                # and the check above tells which.
                raise RuntimeError(f"CommitFailedException: {table} changed during the commit") from exc

        commit()
