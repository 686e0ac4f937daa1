"""CDC's MERGE into a large table, copy-on-write vs merge-on-read (issue 49), on a private local stack.

For each size in BENCH_WRITE_MODE_ROWS (1,000,000 and 10,000,000 rows: id, and three value columns)
and each mode, the table is written once, then BENCH_WRITE_MODE_BATCHES (3) batches of 1,000 changes
(updates spread over all keys, as a busy source's are: 900 updates, 50 deletes, 50 inserts) go
through CDC's own MERGE (`jobs/cdc/apply_changes.py`); each batch's wall time is measured, and then a
full read of the table (what the ingest's join does with its dimension, here a checksum over every
row) with the delete files the batches left. The last row per size checks that both modes hold the
same rows. jobs/cdc/target_table.py chooses the mode from these figures.
"""

from __future__ import annotations

import os
import random
import time

from bench.private_stack import row

COLUMNS = [("id", "bigint"), ("qty", "int"), ("price", "double"), ("note", "string")]


def _changes(rows: int, batch: int):
    from jobs.cdc.change_batch import DELETE, UPSERT, RowChange

    rng = random.Random(batch)
    keys = rng.sample(range(rows), 950)
    changes = [
        RowChange(UPSERT, (k,), {"id": k, "qty": batch, "price": k / 3, "note": f"update {batch}"})
        for k in keys[:900]
    ]
    changes += [
        RowChange(DELETE, (k,), {"id": k, "qty": None, "price": None, "note": None}) for k in keys[900:]
    ]
    changes += [
        RowChange(
            UPSERT,
            (rows + batch * 50 + i,),
            {"id": rows + batch * 50 + i, "qty": 1, "price": 1.0, "note": "new"},
        )
        for i in range(50)
    ]
    return changes


def _checksum(spark, table: str) -> tuple[int, int, float]:
    from pyspark.sql import functions as F

    started = time.monotonic()
    result = spark.table(table).agg(F.count("*"), F.sum(F.xxhash64(*[c for c, _ in COLUMNS]))).first()
    return result[0], result[1], time.monotonic() - started


def _measure(spark, table: str, rows: int, mode: str, batches: int) -> dict:
    from jobs.cdc.apply_changes import apply_changes
    from jobs.cdc.binlog_reader import BinlogPosition
    from jobs.cdc.target_table import WRITE_MODE_KEYS, create_iceberg_table
    from jobs.common.sql_text import properties
    from jobs.maintain.procedures import table_stats

    spark.sql(f"DROP TABLE IF EXISTS {table} PURGE")
    create_iceberg_table(spark, table, COLUMNS, ("id",))
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({properties(dict.fromkeys(WRITE_MODE_KEYS, mode))})")
    began = time.monotonic()
    spark.range(0, rows, 1, 4).selectExpr(
        "id", "CAST(id % 1000 AS INT) AS qty", "id / 7.0 AS price", "concat('row ', id) AS note"
    ).writeTo(table).append()
    load = time.monotonic() - began
    merges = []
    for batch in range(1, batches + 1):
        changes = _changes(rows, batch)
        began = time.monotonic()
        start = BinlogPosition("bench", batch - 1) if batch > 1 else None
        apply_changes(spark, table, COLUMNS, ("id",), changes, start, BinlogPosition("bench", batch))
        merges.append(time.monotonic() - began)
    count, checksum, read = _checksum(spark, table)
    stats = table_stats(spark, table)
    return {
        "load": load,
        "merges": merges,
        "read": read,
        "count": count,
        "checksum": checksum,
        "stats": stats,
    }


def run() -> list[dict]:
    from bench.private_stack import private_stack

    sizes = [int(n) for n in os.environ.get("BENCH_WRITE_MODE_ROWS", "1000000,10000000").split(",")]
    batches = int(os.environ.get("BENCH_WRITE_MODE_BATCHES", "3"))
    with private_stack("write-mode", topic_retention=False) as stack:
        from jobs.common.spark_session import build_spark, stop_spark
        from jobs.config import LakehouseConfig

        config = LakehouseConfig.local(stack.settings.home)
        spark = build_spark(config, "write-mode-bench", {"spark.sql.shuffle.partitions": "4"})
        try:
            rows_out = _compare(spark, sizes, batches)
        finally:
            stop_spark(spark)  # and py4j's callback server (CDC's MERGE commits through it)
    return rows_out


def _compare(spark, sizes: list[int], batches: int) -> list[dict]:
    rows_out = []
    for rows in sizes:
        results = {}
        for mode in ("copy-on-write", "merge-on-read"):
            table = f"lakehouse.dim_db.bench_{mode.replace('-', '_')}_{rows}"
            results[mode] = result = _measure(spark, table, rows, mode, batches)
            spark.sql(f"DROP TABLE IF EXISTS {table} PURGE")
            merges = ", ".join(f"{m:.1f}" for m in result["merges"])
            print(f"{rows:,} rows {mode}: merges {merges} s, read {result['read']:.1f} s", flush=True)
            stats = result["stats"]
            rows_out.append(
                row(
                    f"{rows:,} rows, {mode}: MERGE of 1,000 changes, each of {batches} batches",
                    f"{merges} s ({stats.data_files} data / {stats.delete_files} delete files after)",
                )
            )
            rows_out.append(
                row(
                    f"{rows:,} rows, {mode}: full read after them (the ingest's join reads it so)",
                    f"{result['read']:.1f} s",
                )
            )
        cow, mor = results["copy-on-write"], results["merge-on-read"]
        cow_merge, mor_merge = sum(cow["merges"]) / batches, sum(mor["merges"]) / batches
        rows_out.append(
            row(
                f"{rows:,} rows: mean MERGE, copy-on-write / merge-on-read",
                f"{cow_merge:.1f} / {mor_merge:.1f} s ({cow_merge / mor_merge:.1f}x)",
            )
        )
        same = (cow["count"], cow["checksum"]) == (mor["count"], mor["checksum"])
        rows_out.append(row(f"{rows:,} rows: both modes hold the same rows", str(same), "True", same))
    return rows_out
