"""`lakehouse verify` on a private local stack (issue 28): how long the reconciliation takes for
BENCH_VERIFY_CLICKS (1,000,000) clicks and a BENCH_VERIFY_ROWS (1,000,000)-row dimension.

The dimension is a real CDC table (filled in MariaDB, snapshotted by CDC). The clicks are written
straight into the click table with their lineage and stored offsets, as the ingest would leave them
(producing and ingesting a million clicks here takes minutes and measures the ingest, not verify);
the topic itself is empty, so every offset from 0 up to the stored ones is checked. Then the same
checks after one click is deleted and another written twice, to show the cost of finding them.
"""

from __future__ import annotations

import os
import time

from bench.cdc_snapshot_bench import TABLE, fill_source
from bench.private_stack import private_stack, row

PARTITIONS = 3


def run() -> list[dict]:
    clicks = int(os.environ.get("BENCH_VERIFY_CLICKS", 1_000_000))
    rows = int(os.environ.get("BENCH_VERIFY_ROWS", 1_000_000))
    with private_stack("verify") as stack:
        return _measure(stack, clicks, rows)


def _write_clicks(spark, config, clicks: int) -> None:
    """`clicks` rows over PARTITIONS partitions, offsets 0.. in each, with the stored offsets."""
    from pyspark.sql import functions as F

    from jobs.common.lake_tables import (
        FACT_TABLE,
        OFFSETS_KEY,
        REJECTS_TABLE,
        fact_table_ddl,
        offsets_summary,
        rejects_table_ddl,
    )
    from jobs.common.snapshot_progress import writer_options

    fact, rejects = config.table(*FACT_TABLE), config.table(*REJECTS_TABLE)
    for statement in (*fact_table_ddl(fact), *rejects_table_ddl(rejects)):
        spark.sql(statement)
    ends = {p: clicks // PARTITIONS + (1 if p < clicks % PARTITIONS else 0) for p in range(PARTITIONS)}
    summary = offsets_summary(config.kafka.topic, ends)
    frame = spark.range(clicks).select(
        (F.col("id") % 50).cast("int").alias("webpageId"),
        F.concat(F.lit("u"), (F.col("id") % 5000).cast("string")).alias("uid"),
        (F.col("id") % 20 + 1).cast("string").alias("productId"),
        F.lit("c").alias("cookieId"),
        F.lit(3).alias("expendTime"),
        F.current_timestamp().alias("eventTime"),
        F.lit("p").alias("name"),
        F.lit(1.5).cast("decimal(10,4)").alias("product_price"),
        F.date_format(F.current_timestamp(), "yyyyMMdd").alias("dt"),
        (F.col("id") % PARTITIONS).cast("int").alias("kafka_partition"),
        (F.col("id") / PARTITIONS).cast("long").alias("kafka_offset"),
        F.current_timestamp().alias("ingested_at"),
    )
    frame.writeTo(fact).options(**writer_options({OFFSETS_KEY: summary})).append()
    empty = spark.table(rejects).where(F.lit(False))
    empty.writeTo(rejects).options(**writer_options({OFFSETS_KEY: summary})).append()


def _measure(stack, clicks: int, rows: int) -> list[dict]:
    from jobs.cdc.sync import CdcSync
    from jobs.cdc.table_selection import TableSpec
    from jobs.common.spark_session import build_spark, stop_spark
    from jobs.config import LakehouseConfig
    from jobs.verify.__main__ import run_checks
    from lakehouse.local.mariadb import APP_USER
    from lakehouse.local.settings import load_or_create_secrets

    config = LakehouseConfig.local(stack.settings.home)
    conn = stack.mariadb.connect(APP_USER, load_or_create_secrets(stack.settings)["mysql_app_password"])
    fill_source(conn, rows)
    conn.close()
    spark = build_spark(config, "verify_bench", {"spark.sql.shuffle.partitions": "4"})
    dimension = f"dim_db.{TABLE}"
    tables = ["ods_behavior.clickevent", dimension]
    try:
        spec = TableSpec.parse(f"user_db.{TABLE}={dimension}", config)
        CdcSync(spark, config, [spec], server_id=4311).start().close()
        _write_clicks(spark, config, clicks)
        clean = {r.table: r for r in run_checks(spark, config, tables, 4312)}
        fact = config.table("ods_behavior", "clickevent")
        spark.sql(f"DELETE FROM {fact} WHERE kafka_partition = 1 AND kafka_offset = 1000")
        spark.sql(f"INSERT INTO {fact} SELECT * FROM {fact} WHERE kafka_partition = 2 AND kafka_offset = 7")
        began = time.monotonic()
        damaged = {r.table: r for r in run_checks(spark, config, ["ods_behavior.clickevent"], 4313)}
        damaged_seconds = time.monotonic() - began
    finally:
        stop_spark(spark)
    click_check, dim_check = clean["ods_behavior.clickevent"], clean[dimension]
    found = {f.kind: f.examples for f in damaged["ods_behavior.clickevent"].findings}
    return [
        row(
            f"kafka -> clicks, {click_check.compared:,} offsets (clean)",
            f"{click_check.seconds:.1f}s ({click_check.compared / click_check.seconds:,.0f} offsets/s)",
            "clean",
            click_check.status == "ok" and click_check.compared == clicks,
        ),
        row(
            f"mysql -> dimension, {dim_check.compared:,} rows (clean)",
            f"{dim_check.seconds:.1f}s ({dim_check.compared / dim_check.seconds:,.0f} rows/s)",
            "clean",
            dim_check.status == "ok" and dim_check.compared == rows,
        ),
        row(
            "kafka -> clicks after one click deleted and one written twice",
            f"{damaged_seconds:.1f}s; found {found}",
            "both found",
            found == {"missing offsets": ("partition 1: 1000",), "duplicate offsets": ("partition 2: 7",)},
        ),
    ]
