"""MySQL -> dimension tables: the lake equals the source, on a live source, without false alarms.

For each CDC table:
1. Pin the lake table's current snapshot and the binlog position P stored with it.
2. Read the source table in primary-key chunks (the snapshot's lock-free reads, converted to the
   lake's types the way the snapshot converts them), then the binlog end E.
3. Compare the two as multisets of rows over the columns both have (`exceptAll` both ways).
4. A key that differs may only be in flight: changed in the source after P, so the lake (at P) and
   the read (somewhere before E) may see different versions. The binlog between P and E is read for
   that table; a differing key changed there is explained, not a mismatch. What remains is real and
   listed by key: rows that differ, rows the lake lacks, rows only the lake has (or has twice).

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

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.cdc import source_db, target_table
from jobs.cdc.binlog_reader import BinlogPosition, BinlogReader, DdlEvent
from jobs.cdc.snapshot import WHOLE_TABLE, piece_frames, rows_frame
from jobs.cdc.source_db import SourceTable
from jobs.cdc.target_table import POSITION_KEY
from jobs.common.snapshot_progress import main_snapshot, progress_as_of
from jobs.common.sql_text import identifier
from jobs.verify.findings import EXAMPLES, CheckResult, Finding
from jobs.verify.repair import MAX_REPAIR_KEYS, DimensionRepair, plan_repair

CHUNK_ROWS = 10_000
FRAME_ROWS = 200_000  # source rows per DataFrame handed to Spark
BINLOG_TIMEOUT_SECONDS = 120.0


class CannotCompare(RuntimeError):
    """The check cannot reach a verdict (source gone, binlog purged, schema changing)."""


def source_frame(
    spark, conn, source: SourceTable, chunk_rows: int = CHUNK_ROWS, connection_settings: dict | None = None
) -> DataFrame:
    """Every source row, read in key order a chunk at a time (no lock, no long read view): by the
    snapshot's reader process when `connection_settings` are given (faster), else by `conn`. Every
    row is in the JVM when this returns: a position read afterwards is past all the reads."""
    pieces = piece_frames(spark, conn, source, WHOLE_TABLE, chunk_rows, FRAME_ROWS, connection_settings)
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
                continue
            for change in item.changes.get(table, ()):
                keys.add(tuple(canonical(v) for v in change.key))
    finally:
        reader.stop()


def _keys(frame: DataFrame, key: tuple[str, ...]) -> list[tuple[tuple[str, ...], tuple]]:
    """(key text, key values) of every row of `frame` (a key twice, twice)."""
    raw = [F.col(identifier(k)).alias(f"_lakehouse_raw{i}") for i, k in enumerate(key)]
    rows = frame.select(*key_columns(frame, key), *raw).collect()
    return [(key_text(r, key), tuple(r[len(key) :])) for r in rows]


def _compared(source: SourceTable, src: DataFrame, lake: DataFrame, result: CheckResult):
    """The source's columns the lake has, both sides in the source's types and names."""
    lake_names = {name.lower(): name for name in lake.columns}
    src_types = {f.name: f.dataType for f in src.schema.fields}
    both = [c.name for c in source.columns if c.name.lower() in lake_names]
    only_source = [c.name for c in source.columns if c.name.lower() not in lake_names]
    only_lake = sorted(set(lake_names) - {c.name.lower() for c in source.columns})
    if only_source:
        result.notes.append(f"source columns the lake does not have, not compared: {', '.join(only_source)}")
    if only_lake:
        result.notes.append(
            "lake columns the source no longer has (kept by --schema-changes), not compared: "
            + ", ".join(only_lake)
        )
    return (
        src.select(*both),
        lake.select(*(F.col(identifier(lake_names[n.lower()])).cast(src_types[n]).alias(n) for n in both)),
    )


def check_dimension(
    spark,
    conn,
    target: str,
    source_name: tuple[str, str],
    connection_settings: dict,
    server_id: int,
    is_mariadb: bool,
    repairs: list[DimensionRepair] | None = None,
) -> CheckResult:
    """The check; with `repairs`, also the repair of its real mismatches is appended there."""
    result = CheckResult("mysql -> dimension", ".".join(target.split(".")[-2:]))
    qualified = ".".join(source_name)
    src = None
    try:
        snapshot = main_snapshot(spark, target)
        stored = progress_as_of(spark, target, snapshot, POSITION_KEY) if snapshot is not None else None
        if stored is None:
            raise CannotCompare("the lake table has no stored binlog position: CDC never synced it")
        position = BinlogPosition.from_json(stored)
        try:
            source = source_db.describe_table(conn, *source_name)
        except source_db.MissingTable:
            # A table CDC saw dropped is not a failure: the lake keeps its rows on purpose.
            dropped = target_table.source_dropped(spark, target)
            if dropped is None:  # renamed, a wrong source database, or a DROP CDC has not read yet
                raise CannotCompare(
                    f"the source table {qualified} does not exist (dropped, renamed?) and CDC has not marked "
                    "the lake table dropped: run CDC, or check the source database"
                ) from None
            result.notes.append(
                f"not compared: the source table {qualified} was dropped {dropped}; the lake table keeps its "
                f"rows (`lakehouse run cdc --drop-orphaned {result.table}` removes it)"
            )
            return result
        except source_db.NoPrimaryKey:
            raise CannotCompare(f"the source table {qualified} has no primary key any more") from None
        src = source_frame(spark, conn, source, connection_settings=connection_settings).cache()
        end = BinlogPosition(*source_db.master_position(conn))
        lake = spark.sql(f"SELECT * FROM {target} VERSION AS OF {snapshot}")
        left, right = _compared(source, src, lake, result)
        result.compared = src.count()
        key = source.key
        only_source, only_lake = left.exceptAll(right), right.exceptAll(left)
        source_keys, lake_keys = dict(_keys(only_source, key)), _keys(only_lake, key)
        source_side = set(source_keys)
        lake_side = Counter(text for text, _ in lake_keys)
        differing = source_side | set(lake_side)
        in_flight = (
            changed_keys(connection_settings, server_id, source_name, source.key, position, end, is_mariadb)
            if differing
            else set()
        )
        real = differing - in_flight
        if repairs is not None and real:
            if len(real) > MAX_REPAIR_KEYS:
                result.notes.append(
                    f"not repaired: {len(real):,} keys differ (more than {MAX_REPAIR_KEYS:,}): re-snapshot it"
                )
            else:
                lake_values = dict(lake_keys)
                values = {k: lake_values.get(k, source_keys.get(k)) for k in real}
                lake_columns = {name.lower(): name for name in lake.columns}
                repairs.append(plan_repair(target, source, left, lake_columns, values, key_columns, end))
    except CannotCompare as exc:
        result.error = str(exc)
        return result
    except Exception as exc:  # noqa: BLE001 - this check cannot run; the others still do
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return result
    finally:
        if src is not None:
            src.unpersist()
    if differing & in_flight:
        result.notes.append(
            f"{len(differing & in_flight)} differing keys changed in the source after the lake's position "
            f"{position}: in flight, not counted"
        )
    hint = f"re-snapshot the table: `lakehouse run cdc --resync {qualified}`"
    kinds = (
        ("rows that differ", real & source_side & set(lake_side)),
        ("rows the lake lacks", (real & source_side) - set(lake_side)),
        ("rows only the lake has (or has twice)", (real & set(lake_side)) - source_side),
    )
    for kind, keys in kinds:
        if keys:
            examples = tuple("key " + ", ".join(k) for k in sorted(keys)[:EXAMPLES])
            result.findings.append(Finding(kind, len(keys), examples, hint, row_values=True))
    return result
