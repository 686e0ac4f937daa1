"""Apply one reduced micro-batch to an Iceberg table: one MERGE (update, insert, delete) per table."""

from __future__ import annotations

import re

from jobs.cdc import position_commit
from jobs.cdc.binlog_reader import BinlogPosition
from jobs.cdc.change_batch import DELETE, RowChange
from jobs.cdc.schema_mapping import spark_schema, to_spark_value
from jobs.common.arrow_frames import arrow_frame
from jobs.common.snapshot_progress import with_snapshot_properties
from jobs.common.sql_text import identifier

OP_COLUMN = "_cdc_op"


def change_table(columns: list[tuple[str, str]], changes: list[RowChange]):
    """The changes as an Arrow table, column by column, typed from the target's schema: target
    columns in order (missing -> null), then the op. Each column is converted by Arrow in one call;
    only a column holding values Arrow cannot take as they are (a SET, a TIME, BIT as an integer,
    bytes for text) goes through `to_spark_value` value by value."""
    import pyarrow as pa

    arrays = [arrow_column([change.row.get(name) for change in changes], kind) for name, kind in columns]
    arrays.append(pa.array([change.op for change in changes], pa.string()))
    return pa.Table.from_arrays(arrays, names=[*(name for name, _ in columns), OP_COLUMN])


def arrow_type(kind: str):
    """The Arrow type Spark reads as the Iceberg (Spark SQL) type `kind` (Spark's own mapping:
    timestamps in microseconds, UTC; naive values are UTC wall time, as the server runs in UTC)."""
    import pyarrow as pa

    decimal = re.fullmatch(r"decimal\((\d+),(\d+)\)", kind)
    if decimal:
        return pa.decimal128(int(decimal.group(1)), int(decimal.group(2)))
    return {
        "int": pa.int32(),
        "bigint": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "boolean": pa.bool_(),
        "string": pa.string(),
        "binary": pa.binary(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }[kind]


def arrow_column(values: list, kind: str):
    import pyarrow as pa

    arrow = arrow_type(kind)
    try:
        return pa.array(values, arrow)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    if kind in ("timestamp", "date"):
        # MySQL's text, as the snapshot's reader leaves it (`chunk_reader`): Arrow parses the
        # column at once (UTC wall time, as the server runs in UTC). A zero date fails it; year 0
        # ('0000-01-01') Arrow would take, but it is no day in Python and NULL from the binlog.
        import pyarrow.compute as pc

        naive = pa.timestamp("us") if kind == "timestamp" else arrow
        try:
            text = pa.array(values, pa.string())
            if not pc.any(pc.starts_with(text, "0000-")).as_py():
                return text.cast(naive).cast(arrow)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass
    return pa.array([to_spark_value(value, kind) for value in values], arrow)


def changes_frame(spark, columns: list[tuple[str, str]], changes: list[RowChange]):
    schema = spark_schema([*columns, (OP_COLUMN, "string")])
    return arrow_frame(spark, change_table(columns, changes), schema)


def merge_statement(
    target: str, source_view: str, columns: list[tuple[str, str]], key: tuple[str, ...]
) -> str:
    on = " AND ".join(f"t.{identifier(k)} = s.{identifier(k)}" for k in key)
    names = [identifier(name) for name, _ in columns]
    updates = ", ".join(f"t.{n} = s.{n}" for n in names if n not in {identifier(k) for k in key})
    inserts = ", ".join(f"s.{n}" for n in names)
    update_clause = f"WHEN MATCHED THEN UPDATE SET {updates}" if updates else ""
    return (
        f"MERGE INTO {target} t USING {source_view} s ON {on} "
        f"WHEN MATCHED AND s.{OP_COLUMN} = '{DELETE}' THEN DELETE "
        f"{update_clause} "
        f"WHEN NOT MATCHED AND s.{OP_COLUMN} <> '{DELETE}' "
        f"THEN INSERT ({', '.join(names)}) VALUES ({inserts})"
    )


def apply_changes(
    spark,
    target: str,
    columns: list[tuple[str, str]],
    key: tuple[str, ...],
    changes: list[RowChange],
    start: BinlogPosition | None,
    end: BinlogPosition,
) -> bool:
    """MERGE `changes` (one per key) into `target`, taking its stored position from `start` to `end`
    (see `position_commit`). Returns False if an earlier attempt had already landed."""
    view = "cdc_changes_" + re.sub(r"\W", "_", target)
    changes_frame(spark, columns, changes).createOrReplaceTempView(view)
    statement = merge_statement(target, view, columns, key)

    def merge(properties) -> None:
        # Looked up at call time so tests can inject an unknown commit outcome.
        with_snapshot_properties(spark, properties, lambda: spark.sql(statement))

    try:
        return position_commit.commit_position(spark, target, start, end, merge)
    finally:
        spark.catalog.dropTempView(view)
