"""Job `report`: the daily click report per member level -> `ads_behavior.member_daily_report`.

For one UTC day it joins that day's clicks (`ods_behavior.clickevent`, read by an `eventTime` range so
Iceberg prunes to the `days(eventTime)` partition) with the *current* state of the dimensions
(`dim_db.user_member` on uid = userid, `dim_db.products` on productId) and writes one row per
memberLevel: events, distinct users and cookies, total and average expendTime, and a value figure
(the day's views times each product's current price).

- Clicks of users missing from `user_member` (or members without a level) are reported under a null
  memberLevel, never dropped.
- Clicks of products missing from `products` (or without a price) add nothing to `view_value`; they
  are counted in `unpriced_events` so the gap is visible. A level whose clicks are all unpriced has a
  `view_value` of 0.
- A run replaces that day's rows in one commit (`overwrite` on `report_date`), so re-running a day is
  idempotent and also removes levels that no longer occur. Other days are never touched.

Run as `lakehouse run report [--date YYYY-MM-DD]` (default: today in UTC); the same module is the EMR
step.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType

from jobs.common.snapshot_progress import retry_commit

log = logging.getLogger("batch_report")


# sum() of decimal(10,4) prices: 10 more digits of headroom, as Spark itself widens a decimal sum.
VIEW_VALUE_TYPE = DecimalType(20, 4)

REPORT_COLUMNS = (
    "report_date",
    "memberLevel",
    "events",
    "distinct_users",
    "distinct_cookies",
    "total_expend_time",
    "avg_expend_time",
    "view_value",
    "unpriced_events",
    "generated_at",
)


class MissingSourceTable(RuntimeError):
    """A source table does not exist yet; the message names the job that creates it."""


@dataclass(frozen=True)
class ReportSettings:
    day: date
    clicks_table: str
    members_table: str
    products_table: str
    report_table: str


@dataclass(frozen=True)
class ReportResult:
    rows: list[Row]
    seconds: float


# ---- the transform (pure) -----------------------------------------------------------------------------


def utc_day_bounds(day: date) -> tuple[datetime, datetime]:
    """[start, end) of `day` in UTC, as aware datetimes (independent of any session time zone)."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return start, start + timedelta(days=1)


def current_by_key(frame: DataFrame, key: str, value: str) -> DataFrame:
    """One row per `key` with its newest `value` by update_time.

    The dimensions are keyed tables kept by MERGE, so this is normally a no-op; it guarantees that a
    stray duplicate key can never multiply the day's clicks in the join.
    """
    newest = F.max(F.struct(F.col("update_time"), F.col(value))).getField(value)
    return frame.groupBy(key).agg(newest.alias(value))


def member_daily_report(
    clicks_df: DataFrame, members_df: DataFrame, products_df: DataFrame, day: date
) -> DataFrame:
    """One row per memberLevel (null = unknown user or no level) for the clicks of UTC `day`."""
    start, end = utc_day_bounds(day)
    # A range on eventTime itself (not on `dt` or a cast) lets Iceberg prune to the day partition.
    day_clicks = clicks_df.where((F.col("eventTime") >= F.lit(start)) & (F.col("eventTime") < F.lit(end)))
    levels = current_by_key(members_df.withColumnRenamed("userid", "uid"), "uid", "memberLevel")
    prices = current_by_key(products_df, "productId", "product_price")
    enriched = (
        day_clicks.select("uid", "cookieId", "productId", "expendTime")
        .join(levels, "uid", "left")
        .join(prices, "productId", "left")
    )
    return (
        enriched.groupBy("memberLevel")
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.countDistinct("uid").alias("distinct_users"),
            F.countDistinct("cookieId").alias("distinct_cookies"),
            F.sum("expendTime").cast("bigint").alias("total_expend_time"),
            F.avg("expendTime").cast("double").alias("avg_expend_time"),
            F.coalesce(F.sum("product_price"), F.lit(0)).cast(VIEW_VALUE_TYPE).alias("view_value"),
            F.count(F.when(F.col("product_price").isNull(), 1)).alias("unpriced_events"),
        )
        .select(
            F.lit(day).alias("report_date"),
            F.col("memberLevel").cast("int").alias("memberLevel"),
            "events",
            "distinct_users",
            "distinct_cookies",
            "total_expend_time",
            "avg_expend_time",
            "view_value",
            "unpriced_events",
            F.current_timestamp().alias("generated_at"),
        )
    )


# ---- I/O ----------------------------------------------------------------------------------------------


def report_table_ddl(table: str) -> str:
    # Note: one small partition per day; a re-run replaces whole files of its day (metadata-only delete).
    return f"""CREATE TABLE IF NOT EXISTS {table} (
                 report_date date, memberLevel int, events bigint, distinct_users bigint,
                 distinct_cookies bigint, total_expend_time bigint, avg_expend_time double,
                 view_value decimal(20,4), unpriced_events bigint, generated_at timestamp)
               USING iceberg
               PARTITIONED BY (report_date)
               TBLPROPERTIES ('format-version'='2',
                              'write.metadata.delete-after-commit.enabled'='true',
                              'write.metadata.previous-versions-max'='50')"""


def read_sources(spark: SparkSession, settings: ReportSettings) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Clicks, members, products as of now (the catalog cache is off: always the latest snapshot)."""
    sources = (
        (settings.clicks_table, "lakehouse run ingest"),
        (settings.members_table, "lakehouse run cdc"),
        (settings.products_table, "lakehouse run cdc"),
    )
    missing = [(table, job) for table, job in sources if not spark.catalog.tableExists(table)]
    if missing:
        raise MissingSourceTable(
            "; ".join(f"source table {table} does not exist: run `{job}` first" for table, job in missing)
        )
    return (
        spark.table(settings.clicks_table),
        spark.table(settings.members_table),
        spark.table(settings.products_table),
    )


def write_report(spark: SparkSession, report: DataFrame, table: str, day: date) -> None:
    """Replace `day` in `table` with `report` in one commit (an empty report clears the day)."""
    spark.sql(report_table_ddl(table))

    @retry_commit()
    def overwrite() -> None:
        report.select(*REPORT_COLUMNS).writeTo(table).overwrite(F.col("report_date") == F.lit(day))

    overwrite()


def run_report(spark: SparkSession, settings: ReportSettings) -> ReportResult:
    """Compute the day's report, write it, return the rows written (ordered by level, null last)."""
    began = time.monotonic()
    clicks, members, products = read_sources(spark, settings)
    # Materialized once (one row per level): the rows printed are exactly the rows written, and a
    # retried commit writes the same rows again.
    report = member_daily_report(clicks, members, products, settings.day).localCheckpoint(eager=True)
    write_report(spark, report, settings.report_table, settings.day)
    rows = report.orderBy(F.col("memberLevel").asc_nulls_last()).collect()
    return ReportResult(rows, time.monotonic() - began)


def print_report(rows: list[Row], settings: ReportSettings) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"member daily report {settings.day.isoformat()} -> {settings.report_table}")
    labels = ("level", "events", "users", "cookies", "expend total", "expend avg", "view value", "unpriced")
    for label in labels:
        table.add_column(label, justify="left" if label == "level" else "right")
    for r in rows:
        table.add_row(
            "null" if r["memberLevel"] is None else str(r["memberLevel"]),
            str(r["events"]),
            str(r["distinct_users"]),
            str(r["distinct_cookies"]),
            str(r["total_expend_time"]),
            f"{r['avg_expend_time']:.2f}",
            str(r["view_value"]),
            str(r["unpriced_events"]),
        )
    if not rows:
        table.caption = "no clicks on this day: the day's rows were cleared"
    Console().print(table)
