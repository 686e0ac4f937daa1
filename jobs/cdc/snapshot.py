"""Initial snapshot (and `--resync`): read the source in a consistent snapshot, load, commit with
the binlog position of exactly that snapshot (see `source_db.consistent_snapshot`).

Taking the position separately from the read would leave a gap: a transaction already in the binlog
before the position but not yet visible to the read would be in neither.
"""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.cdc import source_db, target_table
from jobs.cdc.binlog_reader import BinlogPosition
from jobs.cdc.schema_mapping import spark_schema, to_spark_value
from jobs.cdc.source_db import SourceTable
from jobs.cdc.target_table import POSITION_KEY, TABLE_PROPERTIES
from jobs.common.snapshot_progress import retry_commit, writer_options


def schema_matches(spark, target: str, source: SourceTable) -> bool:
    have = [(n.lower(), t) for n, t in target_table.target_columns(spark, target)]
    want = [(c.name.lower(), c.spark_type) for c in source.columns]
    return sorted(have) == sorted(want)


def snapshot_table(spark, conn, source_schema: str, source_name: str, target: str) -> BinlogPosition:
    """Load the source table into `target` and return the position stored with it."""
    with source_db.consistent_snapshot(conn) as (file, pos, gtid):
        position = BinlogPosition(file, pos, gtid)
        source = source_db.describe_table(conn, source_schema, source_name)
        columns = [(c.name, c.spark_type) for c in source.columns]  # UnsupportedType before any write
        rows = [
            tuple(to_spark_value(v, t) for v, (_, t) in zip(row, columns, strict=True))
            for row in source_db.read_rows(conn, source)
        ]
    target_table.create_table(spark, target, source.columns, source.key)
    replace = not schema_matches(spark, target, source)
    schema = T.StructType(
        [T.StructField(f.name, f.dataType, f.name not in source.key) for f in spark_schema(columns).fields]
    )
    frame = spark.createDataFrame(rows, schema, verifySchema=False)
    options = writer_options({POSITION_KEY: position.to_json()})

    @retry_commit()
    def commit() -> None:
        writer = frame.writeTo(target).options(**options)
        if replace:
            # Source shape changed (resync after DROP/RENAME/type change): replace the table
            # atomically; readers see the old version until the new one is committed.
            writer = writer.using("iceberg")
            for k, v in TABLE_PROPERTIES.items():
                writer = writer.tableProperty(k, v)
            writer.createOrReplace()
        else:
            writer.overwrite(F.lit(True))

    commit()
    target_table.configure_table(spark, target, source.key)
    return position
