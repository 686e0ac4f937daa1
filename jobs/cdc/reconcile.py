"""A CDC table against its source table, on a live source, without false alarms.

Used by `lakehouse verify` (jobs/verify/dimensions.py) for every dimension, and by CDC itself for a
copy it re-snapshotted beside the stream, before swapping it in (`resync.py`):

1. Pin the lake table's snapshot and the binlog position P stored with it.
2. Read the source table in primary-key chunks (the snapshot's lock-free reads, converted to the
   lake's types the way the snapshot converts them), then the binlog end E.
3. Compare the two as multisets of rows over the columns both have (`exceptAll` both ways): first
   each side's row count and row-hash sum per bucket of keys (`BucketSums`: the lake's, and each
   source piece's as it is read), then the rows of the buckets that differ, value by value
   (`_in_buckets`).
4. A key that differs may only be in flight: changed in the source after P, so the lake (at P) and
   the read (somewhere before E) may see different versions. The binlog between P and E is read for
   that table; a differing key changed there is explained, not a mismatch. What remains is real.

The source is read row by row rather than checksummed in MySQL (pt-table-checksum's way): a
checksum computed by MySQL and one computed by Spark would have to render every type alike, which
is the conversion the snapshot already does and tests (`tests/test_cdc_sync.py`, type parity). The
bucket checksums of step 3 are both Spark's, over the same columns in the same types.
"""

from __future__ import annotations

import contextlib
import datetime
import queue
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.cdc import source_db
from jobs.cdc.binlog_reader import BinlogPosition, BinlogReader, DdlEvent
from jobs.cdc.chunk_reader import FULL_SPEED, Pace
from jobs.cdc.snapshot import WHOLE_TABLE, piece_frames, rows_frame
from jobs.cdc.source_db import SourceTable
from jobs.common.lake_tables import load_iceberg_table
from jobs.common.sql_text import identifier

CHUNK_ROWS = 10_000
FRAME_ROWS = 200_000  # source rows per DataFrame handed to Spark
TASK_ROWS = 100_000  # rows (both sides) per task of the comparison's shuffle
BUCKET_ROWS = 1_000  # source rows per bucket of keys in the comparison's first pass
MAX_BUCKETS = 1 << 16  # ... at most: the first pass collects a row per bucket, per side and piece
BINLOG_TIMEOUT_SECONDS = 120.0


class CannotCompare(RuntimeError):
    """The comparison cannot reach a verdict (source gone, binlog purged, schema changing)."""


def source_frame(
    spark,
    conn,
    source: SourceTable,
    chunk_rows: int | None = None,
    connection_settings: dict | None = None,
    pace: Pace = FULL_SPEED,
    on_piece: Callable[[DataFrame], None] = lambda frame: None,
) -> tuple[DataFrame, int]:
    """Every source row, read in key order a chunk at a time (no lock, no long read view): by the
    snapshot's reader process when `connection_settings` are given (faster), else by `conn`; and
    how many. Every row is in the JVM when this returns (no need to cache it): a position read
    afterwards is past all the reads. `on_piece(frame)` is called with each piece as it comes,
    while the reader reads the next."""
    pieces = piece_frames(
        spark, conn, source, WHOLE_TABLE, chunk_rows or CHUNK_ROWS, FRAME_ROWS, connection_settings, pace
    )
    read = []
    with contextlib.closing(pieces):
        for frame, piece, _ in pieces:
            on_piece(frame)
            read.append((frame, piece.rows))
    if not read:
        return rows_frame(spark, source, []), 0
    frame = read[0][0]
    for more, _ in read[1:]:
        frame = frame.unionByName(more)
    return frame, sum(rows for _, rows in read)


def canonical(value) -> str:
    """One text per key value, whichever side it comes from: the binlog's Python values, or Spark's
    rows (binary as bytearray; timestamps selected as UTC text by `key_columns`)."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, datetime.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    return str(value)


def key_columns(frame: DataFrame, key: tuple[str, ...]) -> list:
    """The key columns to collect: a timestamp as text in the session's time zone (UTC), since
    PySpark hands timestamps over in the driver's local time zone."""
    kinds = {f.name: f.dataType for f in frame.schema.fields}
    return [
        F.date_format(F.col(k), "yyyy-MM-dd HH:mm:ss.SSSSSS").alias(k)
        if isinstance(kinds[k], T.TimestampType | T.TimestampNTZType)
        else F.col(k)
        for k in key
    ]


def key_text(row, key: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(canonical(row[k]) for k in key)


def changed_keys(
    connection_settings: dict,
    server_id: int,
    table: tuple[str, str],
    key: tuple[str, ...],
    start: BinlogPosition,
    end: BinlogPosition,
    is_mariadb: bool,
    timeout: float = BINLOG_TIMEOUT_SECONDS,
) -> set[tuple[str, ...]]:
    """Keys of `table` changed in the binlog after `start` up to (at least) `end`."""
    reader = BinlogReader(connection_settings, server_id, start, {table: key}, is_mariadb=is_mariadb).start()
    keys: set[tuple[str, ...]] = set()
    deadline = time.monotonic() + timeout
    try:
        while True:
            if reader.fatal is not None:
                raise CannotCompare(f"the binlog after the lake's position {start}: {reader.fatal}")
            try:
                item = reader.items.get(timeout=0.2)
            except queue.Empty:
                if reader.position.order >= end.order:
                    return keys
                if time.monotonic() > deadline:
                    raise CannotCompare(
                        f"the binlog from {start} to {end} was not read within {timeout:.0f} s"
                    ) from None
                continue
            if isinstance(item, DdlEvent):
                if item.end.order <= end.order:
                    raise CannotCompare(
                        f"the table's schema changed at {item.end}, after the lake's position: run verify "
                        "again once CDC has followed it"
                    )
                return keys
            for change in item.changes.get(table, ()):
                keys.add(tuple(canonical(v) for v in change.key))
            # Past `end` on a source that never pauses: its queue is never empty for long.
            if item.end.order >= end.order:
                return keys
    finally:
        reader.stop()


def _differences(
    left: DataFrame, right: DataFrame, key: tuple[str, ...], rows: int, max_tasks: int | None = None
) -> tuple[list[tuple[tuple[str, ...], tuple]], list[tuple[tuple[str, ...], tuple]]]:
    """`left.exceptAll(right)` and `right.exceptAll(left)` (multisets: a row twice on one side and
    once on the other is one row of the difference), as (key text, key values) of each row; at most
    `max_tasks` tasks in each stage (default: about TASK_ROWS rows per task).

    Two passes: each side's `BucketSums`, then the rows of the buckets that differ only, compared
    value by value (`_in_buckets`). A clean table costs the first pass alone: 1M rows a side in
    about a third of the CPU of the value-by-value comparison."""
    sums = BucketSums(key, bucket_count(rows), left, right, max_tasks)
    differing = sums.differing(sums.of(left), sums.of(right))
    return _in_buckets(left, right, sums, differing, rows, max_tasks)


def bucket_count(rows: int) -> int:
    return min(MAX_BUCKETS, max(1, -(-rows // BUCKET_ROWS)))


Sums = dict[int, tuple[int, int, int]]  # bucket -> (rows, low halves' sum, high halves' sum)


class BucketSums:
    """Per bucket of keys, a frame's row count and its 64-bit row hashes' sum (as two 32-bit
    halves: no overflow). Equal multisets have equal sums; unequal ones, only if the hashes of their
    differing rows sum alike (about 2^-64 per bucket). The hash skips a NULL, so a column that may
    be NULL on either side has its NULL-ness hashed too: (NULL, 1) is not (1, NULL). Both sides have
    the same columns and types (`_compared`), hence the same hashes. Sums of pieces add up."""

    def __init__(
        self, key: tuple[str, ...], buckets: int, left: DataFrame, right: DataFrame, max_tasks: int | None
    ) -> None:
        self.key, self.buckets, self.max_tasks = key, buckets, max_tasks
        nullable = {f.name for f in [*left.schema.fields, *right.schema.fields] if f.nullable}
        values = []
        for name in left.columns:
            column = F.col(identifier(name))
            values += [column, column.isNull()] if name in nullable else [column]
        self._hash = F.xxhash64(*values)

    def bucket(self) -> Column:
        return F.pmod(F.xxhash64(*(F.col(identifier(k)) for k in self.key)), F.lit(self.buckets))

    def of(self, frame: DataFrame) -> Sums:
        if self.max_tasks is not None:  # the reading stage in `max_tasks` tasks at most
            frame = frame.coalesce(self.max_tasks)
        low, high = self._hash.bitwiseAND(F.lit(0xFFFFFFFF)), F.shiftrightunsigned(self._hash, 32)
        sums = frame.groupBy(self.bucket().alias("bucket")).agg(F.count(F.lit(1)), F.sum(low), F.sum(high))
        if self.max_tasks is not None:
            sums = sums.coalesce(self.max_tasks)
        return {r[0]: (r[1], r[2], r[3]) for r in sums.collect()}

    @staticmethod
    def add(total: Sums, more: Sums) -> None:
        for bucket, (rows, low, high) in more.items():
            was = total.get(bucket, (0, 0, 0))
            total[bucket] = (was[0] + rows, was[1] + low, was[2] + high)

    @staticmethod
    def differing(left: Sums, right: Sums) -> list[int]:
        return sorted(b for b in left.keys() | right.keys() if left.get(b) != right.get(b))


def _in_buckets(
    left: DataFrame,
    right: DataFrame,
    sums: BucketSums,
    differing: list[int],
    rows: int,
    max_tasks: int | None,
) -> tuple[list[tuple[tuple[str, ...], tuple]], list[tuple[tuple[str, ...], tuple]]]:
    """`_row_differences` of the rows in the `differing` buckets."""
    if not differing:
        return [], []
    if len(differing) <= sums.buckets // 2:  # (more: one literal per bucket would cost more than it saves)
        bucket = sums.bucket()
        left, right = left.where(bucket.isin(differing)), right.where(bucket.isin(differing))
        rows = -(-rows * len(differing) // sums.buckets)
    return _row_differences(left, right, sums.key, rows, max_tasks)


def _row_differences(
    left: DataFrame, right: DataFrame, key: tuple[str, ...], rows: int, max_tasks: int | None
) -> tuple[list[tuple[tuple[str, ...], tuple]], list[tuple[tuple[str, ...], tuple]]]:
    """`_differences` value by value: both sides tagged +1/-1 and grouped by every column (Spark's
    own rewrite of `exceptAll`), in one aggregation.

    Beside the stream (a copy's verification) the slots the comparison leaves are the batches':
    two `exceptAll`s on every slot made the other tables' commits 3-4x slower while they ran."""
    side = "_lakehouse_side"
    columns = [F.col(identifier(c)) for c in left.columns]
    tagged = left.withColumn(side, F.lit(1)).unionByName(right.withColumn(side, F.lit(-1)))
    if max_tasks is not None:
        # The reading stage in `max_tasks` tasks, and the aggregating one too (the last coalesce
        # merges its shuffle partitions); with one, no shuffle at all (a single partition is
        # clustered by any columns). Not `repartition(k)` on top: the optimizer drops a coalesce
        # under a repartition, and the reading stage would take every slot again.
        grouped = tagged.coalesce(max_tasks)
    else:  # a number of partitions, not the session's: adaptive execution does not coalesce these
        parallelism = left.sparkSession.sparkContext.defaultParallelism
        grouped = tagged.repartition(max(parallelism, -(-2 * rows // TASK_ROWS)), *columns)
    surplus = grouped.groupBy(*columns).agg(F.sum(side).alias(side)).where(F.col(side) != 0)
    if max_tasks is not None:
        surplus = surplus.coalesce(max_tasks)
    raw = [F.col(identifier(k)).alias(f"_lakehouse_raw{i}") for i, k in enumerate(key)]
    only_left, only_right = [], []
    for r in surplus.select(*key_columns(surplus, key), *raw, side).collect():
        row = (key_text(r, key), tuple(r[len(key) : 2 * len(key)]))
        (only_left if r[side] > 0 else only_right).extend([row] * abs(r[side]))
    return only_left, only_right


@dataclass
class Comparison:
    """The lake table at `position` against the source read before `end`. `source_rows`: the source's
    rows over the columns both sides have, held in the JVM (as read, not cached)."""

    source: SourceTable
    position: BinlogPosition
    end: BinlogPosition
    compared: int
    source_rows: DataFrame
    lake_columns: dict[str, str]  # lower-case name -> the lake's name
    source_keys: dict[tuple[str, ...], tuple]  # key text -> key values, of source rows the lake lacks
    lake_keys: list[tuple[tuple[str, ...], tuple]]  # of lake rows the source lacks (twice: twice)
    in_flight: set[tuple[str, ...]]
    notes: list[str] = field(default_factory=list)

    @property
    def lake_side(self) -> Counter:
        return Counter(text for text, _ in self.lake_keys)

    @property
    def differing(self) -> set[tuple[str, ...]]:
        return set(self.source_keys) | set(self.lake_side)

    @property
    def real(self) -> set[tuple[str, ...]]:
        """The differing keys the binlog does not explain: mismatches."""
        return self.differing - self.in_flight

    def kinds(self) -> list[tuple[str, set[tuple[str, ...]]]]:
        real, source_side, lake_side = self.real, set(self.source_keys), set(self.lake_side)
        return [
            (kind, keys)
            for kind, keys in (
                ("rows that differ", real & source_side & lake_side),
                ("rows the lake lacks", (real & source_side) - lake_side),
                ("rows only the lake has (or has twice)", (real & lake_side) - source_side),
            )
            if keys
        ]


def _compared(source: SourceTable, src: DataFrame, lake: DataFrame, notes: list[str]):
    """The source's columns the lake has, both sides in the source's types and names."""
    lake_names = {name.lower(): name for name in lake.columns}
    src_types = {f.name: f.dataType for f in src.schema.fields}
    both = [c.name for c in source.columns if c.name.lower() in lake_names]
    only_source = [c.name for c in source.columns if c.name.lower() not in lake_names]
    only_lake = sorted(set(lake_names) - {c.name.lower() for c in source.columns})
    if only_source:
        notes.append(f"source columns the lake does not have, not compared: {', '.join(only_source)}")
    if only_lake:
        notes.append(
            "lake columns the source no longer has (kept by --schema-changes), not compared: "
            + ", ".join(only_lake)
        )
    return (
        src.select(*both),
        lake.select(*(F.col(identifier(lake_names[n.lower()])).cast(src_types[n]).alias(n) for n in both)),
    )


def _lake_rows(spark, table: str, snapshot: int) -> int:
    """The rows `table` held at `snapshot`, from its summary (free)."""
    found = load_iceberg_table(spark, table).snapshot(snapshot)
    return int(found.summary().get("total-records") or 0) if found is not None else 0


def compare(
    spark,
    conn,
    table: str,
    snapshot: int,
    position: BinlogPosition,
    source: SourceTable,
    connection_settings: dict,
    server_id: int,
    is_mariadb: bool,
    pace: Pace = FULL_SPEED,
    max_tasks: int | None = None,
) -> Comparison:
    """Compare `table` as of `snapshot` (which stores `position`) with the source table `source`;
    `pace`: the source reader process's; `max_tasks`: Spark tasks the comparison runs at once
    (default: as many as there are slots)."""
    lake = spark.sql(f"SELECT * FROM {table} VERSION AS OF {snapshot}")
    notes: list[str] = []
    shape, right = _compared(source, rows_frame(spark, source, []), lake, notes)
    key = source.key
    # InnoDB's estimate may be days old (MySQL 8 caches it) and the table new: the lake's count too.
    rows = max(source_db.estimated_rows(conn, source), _lake_rows(spark, table, snapshot))
    sums = BucketSums(key, bucket_count(rows), shape, right, max_tasks)
    source_sums: Sums = {}
    lake_sums: list[Sums] = []

    def on_piece(frame: DataFrame) -> None:
        # The first pass, while the reader reads the next piece: the box's CPU is not all taken then.
        if not lake_sums:
            lake_sums.append(sums.of(right))
        BucketSums.add(source_sums, sums.of(frame.select(*shape.columns)))

    src, compared = source_frame(
        spark, conn, source, connection_settings=connection_settings, pace=pace, on_piece=on_piece
    )
    end = BinlogPosition(*source_db.master_position(conn))
    if not lake_sums:  # no source rows
        lake_sums.append(sums.of(right))
    left = src.select(*shape.columns)
    buckets = sums.differing(source_sums, lake_sums[0])
    only_source, only_lake = _in_buckets(left, right, sums, buckets, compared, max_tasks)
    source_keys, lake_keys = dict(only_source), only_lake
    differing = set(source_keys) | {text for text, _ in lake_keys}
    qualified = (source.schema, source.name)
    in_flight = (
        changed_keys(connection_settings, server_id, qualified, key, position, end, is_mariadb)
        if differing
        else set()
    )
    lake_columns = {name.lower(): name for name in lake.columns}
    return Comparison(
        source, position, end, compared, left, lake_columns, source_keys, lake_keys, in_flight, notes
    )
