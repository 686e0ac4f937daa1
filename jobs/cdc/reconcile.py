"""A CDC table against its source table, on a live source, without false alarms.

Used by `lakehouse verify` (jobs/verify/dimensions.py) for every dimension, and by CDC itself for a
copy it re-snapshotted beside the stream, before swapping it in (`resync.py`):

1. Pin the lake table's snapshot and the binlog position P stored with it.
2. Read the source table in primary-key chunks (the snapshot's lock-free reads, converted to the
   lake's types the way the snapshot converts them), then the binlog end E.
3. Compare the two as multisets of rows over the columns both have (`exceptAll` both ways:
   `_differences`): first each side's row count and row-hash sum per bucket of keys, then the rows
   of the buckets that differ, value by value.
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
import functools
import operator
import queue
import time
from collections import Counter
from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.cdc import source_db
from jobs.cdc.binlog_reader import BinlogPosition, BinlogReader, DdlEvent
from jobs.cdc.snapshot import WHOLE_TABLE, piece_frames, rows_frame
from jobs.cdc.source_db import SourceTable
from jobs.common.sql_text import identifier

CHUNK_ROWS = 10_000
FRAME_ROWS = 200_000  # source rows per DataFrame handed to Spark
TASK_ROWS = 100_000  # rows (both sides) per task of the comparison's shuffle
BUCKET_ROWS = 1_000  # source rows per bucket of keys in the comparison's first pass
MAX_BUCKETS = 1 << 16  # ... at most: the first pass collects one row per bucket that differs
BINLOG_TIMEOUT_SECONDS = 120.0


class CannotCompare(RuntimeError):
    """The comparison cannot reach a verdict (source gone, binlog purged, schema changing)."""


def source_frame(
    spark,
    conn,
    source: SourceTable,
    chunk_rows: int = CHUNK_ROWS,
    connection_settings: dict | None = None,
    niceness: int = 0,
) -> tuple[DataFrame, int]:
    """Every source row, read in key order a chunk at a time (no lock, no long read view): by the
    snapshot's reader process when `connection_settings` are given (faster), else by `conn`; and
    how many. Every row is in the JVM when this returns (no need to cache it): a position read
    afterwards is past all the reads."""
    pieces = piece_frames(
        spark, conn, source, WHOLE_TABLE, chunk_rows, FRAME_ROWS, connection_settings, niceness
    )
    with contextlib.closing(pieces):
        read = [(frame, piece.rows) for frame, piece, _ in pieces]
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

    Two passes: each side's row count and row-hash sum per bucket of keys (`_differing_buckets`, a
    pass over each side with a tiny aggregation), then the rows of the buckets that differ only,
    compared value by value (`_row_differences`). A clean table costs the first pass alone: 1M rows
    a side in about a third of the CPU of the value-by-value comparison (`python -m bench
    cdc_resync`, whose other table's commits slowed while it ran)."""
    buckets = min(MAX_BUCKETS, max(1, -(-rows // BUCKET_ROWS)))
    differing = _differing_buckets(left, right, key, buckets, max_tasks)
    if not differing:
        return [], []
    if len(differing) < buckets:
        bucket = _bucket(key, buckets)
        left, right = left.where(bucket.isin(differing)), right.where(bucket.isin(differing))
        rows = -(-rows * len(differing) // buckets)
    return _row_differences(left, right, key, rows, max_tasks)


def _bucket(key: tuple[str, ...], buckets: int):
    return F.pmod(F.xxhash64(*(F.col(identifier(k)) for k in key)), F.lit(buckets))


def _differing_buckets(
    left: DataFrame, right: DataFrame, key: tuple[str, ...], buckets: int, max_tasks: int | None
) -> list[int]:
    """The buckets of keys whose rows may differ: where the two sides' row counts, or sums of 64-bit
    row hashes (as two 32-bit halves, no overflow), differ. Equal multisets always agree; unequal
    ones agree only if the hashes of their differing rows sum alike (about 2^-64 per bucket). The
    hash skips a NULL, so each nullable column's NULL-ness is hashed too: (NULL, 1) is not (1, NULL).
    Both sides have the same columns and types (`_compared`), hence the same hashes."""
    side = "_lakehouse_side"
    nullable = {f.name for f in [*left.schema.fields, *right.schema.fields] if f.nullable}
    values = []
    for name in left.columns:
        column = F.col(identifier(name))
        values += [column, column.isNull()] if name in nullable else [column]
    row_hash = F.xxhash64(*values)
    low, high = row_hash.bitwiseAND(F.lit(0xFFFFFFFF)), F.shiftrightunsigned(row_hash, 32)
    tagged = left.withColumn(side, F.lit(1)).unionByName(right.withColumn(side, F.lit(-1)))
    if max_tasks is not None:  # the reading stage in `max_tasks` tasks at most
        tagged = tagged.coalesce(max_tasks)
    parts = {"_lakehouse_rows": F.lit(1), "_lakehouse_low": low, "_lakehouse_high": high}
    sums = [F.sum(F.col(side) * part).alias(name) for name, part in parts.items()]
    per_bucket = tagged.groupBy(_bucket(key, buckets).alias("bucket")).agg(*sums)
    differ = per_bucket.where(functools.reduce(operator.or_, (F.col(name) != 0 for name in parts)))
    if max_tasks is not None:
        differ = differ.coalesce(max_tasks)
    return sorted(r[0] for r in differ.select("bucket").collect())


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
    niceness: int = 0,
    max_tasks: int | None = None,
) -> Comparison:
    """Compare `table` as of `snapshot` (which stores `position`) with the source table `source`;
    `niceness`: the source reader process's; `max_tasks`: Spark tasks the comparison runs at once
    (default: as many as there are slots)."""
    src, compared = source_frame(
        spark, conn, source, connection_settings=connection_settings, niceness=niceness
    )
    end = BinlogPosition(*source_db.master_position(conn))
    lake = spark.sql(f"SELECT * FROM {table} VERSION AS OF {snapshot}")
    notes: list[str] = []
    left, right = _compared(source, src, lake, notes)
    key = source.key
    only_source, only_lake = _differences(left, right, key, compared, max_tasks)
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
