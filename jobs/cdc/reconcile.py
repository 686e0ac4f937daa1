"""A CDC table against its source table, on a live source, without false alarms.

Used by `lakehouse verify` (jobs/verify/dimensions.py) for every dimension, and by CDC itself for a
copy it re-snapshotted beside the stream, before swapping it in (`resync.py`):

1. Pin the lake table's snapshot and the binlog position P stored with it.
2. Read the source table in primary-key chunks (the snapshot's lock-free reads, converted to the
   lake's types the way the snapshot converts them), then the binlog end E.
3. Compare the two as multisets of rows over the columns both have (`exceptAll` both ways).
4. A key that differs may only be in flight: changed in the source after P, so the lake (at P) and
   the read (somewhere before E) may see different versions. The binlog between P and E is read for
   that table; a differing key changed there is explained, not a mismatch. What remains is real.

The source is read row by row rather than checksummed in MySQL (pt-table-checksum's way): a
checksum computed by MySQL and one computed by Spark would have to render every type alike, which
is the conversion the snapshot already does and tests (`tests/test_cdc_sync.py`, type parity).
"""

from __future__ import annotations

import contextlib
import datetime
import queue
import time
from collections import Counter
from collections.abc import Iterator
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
) -> DataFrame:
    """Every source row, read in key order a chunk at a time (no lock, no long read view): by the
    snapshot's reader process when `connection_settings` are given (faster), else by `conn`. Every
    row is in the JVM when this returns: a position read afterwards is past all the reads."""
    pieces = piece_frames(
        spark, conn, source, WHOLE_TABLE, chunk_rows, FRAME_ROWS, connection_settings, niceness
    )
    with contextlib.closing(pieces):
        frames = [frame for frame, _, _ in pieces]
    if not frames:
        return rows_frame(spark, source, [])
    frame = frames[0]
    for more in frames[1:]:
        frame = frame.unionByName(more)
    return frame


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


def _keys(frame: DataFrame, key: tuple[str, ...]) -> list[tuple[tuple[str, ...], tuple]]:
    """(key text, key values) of every row of `frame` (a key twice, twice)."""
    raw = [F.col(identifier(k)).alias(f"_lakehouse_raw{i}") for i, k in enumerate(key)]
    rows = frame.select(*key_columns(frame, key), *raw).collect()
    return [(key_text(r, key), tuple(r[len(key) :])) for r in rows]


@dataclass
class Comparison:
    """The lake table at `position` against the source read before `end`. `source_rows` (the source's
    rows over the columns both sides have) is cached only while the `compare` block runs."""

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


@contextlib.contextmanager
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
) -> Iterator[Comparison]:
    """Compare `table` as of `snapshot` (which stores `position`) with the source table `source`;
    `niceness`: the source reader process's."""
    src = source_frame(spark, conn, source, connection_settings=connection_settings, niceness=niceness)
    src = src.cache()
    try:
        end = BinlogPosition(*source_db.master_position(conn))
        lake = spark.sql(f"SELECT * FROM {table} VERSION AS OF {snapshot}")
        notes: list[str] = []
        left, right = _compared(source, src, lake, notes)
        compared = src.count()
        key = source.key
        only_source, only_lake = left.exceptAll(right), right.exceptAll(left)
        source_keys, lake_keys = dict(_keys(only_source, key)), _keys(only_lake, key)
        differing = set(source_keys) | {text for text, _ in lake_keys}
        qualified = (source.schema, source.name)
        in_flight = (
            changed_keys(connection_settings, server_id, qualified, key, position, end, is_mariadb)
            if differing
            else set()
        )
        lake_columns = {name.lower(): name for name in lake.columns}
        yield Comparison(
            source, position, end, compared, left, lake_columns, source_keys, lake_keys, in_flight, notes
        )
    finally:
        src.unpersist()
