"""Apply one reduced micro-batch to an Iceberg table: one MERGE (update, insert, delete) per table."""

from __future__ import annotations

import re

from jobs.cdc import position_commit
from jobs.cdc.binlog_reader import BinlogPosition
from jobs.cdc.change_batch import DELETE, RowChange
from jobs.cdc.schema_mapping import spark_schema, to_spark_value
from jobs.common.snapshot_progress import with_snapshot_properties

OP_COLUMN = "_cdc_op"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def change_rows(columns: list[tuple[str, str]], changes: list[RowChange]) -> list[tuple]:
    """Rows for the changes DataFrame: target columns in order (missing -> null), then the op."""
    return [
        tuple(to_spark_value(change.row.get(name), kind) for name, kind in columns) + (change.op,)
        for change in changes
    ]


def changes_frame(spark, columns: list[tuple[str, str]], changes: list[RowChange]):
    schema = spark_schema([*columns, (OP_COLUMN, "string")])
    return spark.createDataFrame(change_rows(columns, changes), schema, verifySchema=False)


def merge_statement(
    target: str, source_view: str, columns: list[tuple[str, str]], key: tuple[str, ...]
) -> str:
    on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in key)
    names = [_quote(name) for name, _ in columns]
    updates = ", ".join(f"t.{n} = s.{n}" for n in names if n not in {_quote(k) for k in key})
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
