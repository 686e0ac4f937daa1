"""Compaction benchmark on a private local stack (own home and ports).

Builds a click table (the ingest's DDL) from many micro-appends, the way the streaming ingest leaves
it: each append holds a few minutes of events over all 20 products, the appends move through several
days. Then runs the `maintain` job on it and measures data files before/after and the data files that
Iceberg's scan planning (pyiceberg `plan_files`) keeps for a one-product one-day query before/after.
Sizes: BENCH_COMPACTION_APPENDS (default 200), BENCH_COMPACTION_ROWS per append (default 500).
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

from bench.private_stack import private_stack, row

TARGET_FILE_RATIO = 10.0
TARGET_SCAN_RATIO = 5.0
TABLE = "ods_behavior.bench_compaction_clicks"
DAYS = 5
PRODUCTS = 20
DAY0 = 1_714_521_600  # 2024-05-01 00:00:00 UTC
QUERY_PRODUCT = "3"
QUERY_DAY = 2  # 2024-05-03


def click_batch(spark, batch: int, rows: int, appends: int):
    """One micro-batch: `rows` events in the batch's slice of DAYS days, products 1..20."""
    from pyspark.sql import functions as F

    window = DAYS * 86_400 // appends  # seconds of event time per append
    first = batch * rows
    event_time = F.timestamp_seconds(F.lit(DAY0 + batch * window) + F.floor(F.col("id") * window / rows))
    return spark.range(0, rows, 1, 2).select(
        (F.col("id") % 7 + 1).cast("int").alias("webpageId"),
        F.concat(F.lit("u"), (F.col("id") % 97).cast("string")).alias("uid"),
        ((F.col("id") * 7 + batch) % PRODUCTS + 1).cast("string").alias("productId"),
        F.concat(F.lit("c"), (F.lit(first) + F.col("id")).cast("string")).alias("cookieId"),
        (F.col("id") % 100).cast("int").alias("expendTime"),
        event_time.alias("eventTime"),
        F.lit(None).cast("string").alias("name"),
        F.lit(None).cast("decimal(10,4)").alias("product_price"),
        F.date_format(event_time, "yyyyMMdd").alias("dt"),
        (F.col("id") % 3).cast("int").alias("kafka_partition"),
        (F.lit(first) + F.col("id")).alias("kafka_offset"),
        F.current_timestamp().alias("ingested_at"),
    )


def build_table(spark, ident: str, appends: int, rows: int) -> None:
    from jobs.common.lake_tables import OFFSETS_KEY, fact_table_ddl, offsets_summary
    from jobs.common.snapshot_progress import writer_options

    for statement in fact_table_ddl(ident):
        spark.sql(statement)
    for batch in range(appends):
        summary = {OFFSETS_KEY: offsets_summary("clicktopic", {0: (batch + 1) * rows})}
        click_batch(spark, batch, rows, appends).writeTo(ident).options(**writer_options(summary)).append()


def one_product_day_files(catalog) -> int:
    """Data files the scan of `productId = '3'` on one day plans (partition + min/max pruning)."""
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan

    day = datetime.fromtimestamp(DAY0, UTC) + timedelta(days=QUERY_DAY)
    row_filter = And(
        EqualTo("productId", QUERY_PRODUCT),
        And(
            GreaterThanOrEqual("eventTime", day.isoformat()),
            LessThan("eventTime", (day + timedelta(days=1)).isoformat()),
        ),
    )
    return len(list(catalog.load_table(TABLE).scan(row_filter=row_filter).plan_files()))


def query_rows(spark, ident: str) -> int:
    start = DAY0 + QUERY_DAY * 86_400
    return spark.sql(
        f"SELECT count(*) FROM {ident} WHERE productId = '{QUERY_PRODUCT}' "
        f"AND eventTime >= timestamp_seconds({start}) AND eventTime < timestamp_seconds({start + 86_400})"
    ).first()[0]


def run() -> list[dict]:
    appends = int(os.environ.get("BENCH_COMPACTION_APPENDS", "200"))
    rows = int(os.environ.get("BENCH_COMPACTION_ROWS", "500"))
    with private_stack("compaction") as stack:
        from jobs.common.spark_session import build_spark, stop_spark
        from jobs.config import LakehouseConfig
        from jobs.maintain.job import MaintainSettings, maintain_table
        from lakehouse.local.catalog import pyiceberg_catalog

        config = LakehouseConfig.local(stack.settings.home)
        catalog = pyiceberg_catalog(stack.settings.catalog_path, stack.settings.warehouse)
        spark = build_spark(config, "compaction-bench")
        try:
            ident = config.table(*TABLE.split("."))
            began = time.monotonic()
            build_table(spark, ident, appends, rows)
            build_seconds = time.monotonic() - began
            scanned_before = one_product_day_files(catalog)
            matches_before = query_rows(spark, ident)
            total_before = spark.table(ident).count()
            began = time.monotonic()
            report = maintain_table(spark, config, TABLE, MaintainSettings())
            maintain_seconds = time.monotonic() - began
            scanned_after = one_product_day_files(catalog)
            matches_after = query_rows(spark, ident)
            total_after = spark.table(ident).count()
        finally:
            stop_spark(spark)
    files_before, files_after = report.before.data_files, report.after.data_files
    file_ratio = files_before / max(files_after, 1)
    scan_ratio = scanned_before / max(scanned_after, 1)
    return [
        row(f"setup: {appends} appends x {rows} rows over {DAYS} days", f"{build_seconds:.1f} s"),
        row(
            "data files before -> after compaction",
            f"{files_before} -> {files_after} ({file_ratio:.0f}x fewer)",
            f">= {TARGET_FILE_RATIO:.0f}x fewer",
            file_ratio >= TARGET_FILE_RATIO,
        ),
        row(
            f"files planned for productId={QUERY_PRODUCT} on one day, before -> after",
            f"{scanned_before} -> {scanned_after} ({scan_ratio:.0f}x fewer)",
            f">= {TARGET_SCAN_RATIO:.0f}x fewer",
            scan_ratio >= TARGET_SCAN_RATIO,
        ),
        row(
            "rows unchanged (table; one-product one-day query)",
            f"{total_before} -> {total_after}; {matches_before} -> {matches_after}",
            "equal",
            total_before == total_after and matches_before == matches_after,
        ),
        row("maintain run, all steps", f"{maintain_seconds:.1f} s"),
        row(
            "snapshots before -> after (default retention: the last hour stays)",
            f"{report.before.snapshots} -> {report.after.snapshots}",
        ),
    ]
