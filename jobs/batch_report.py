"""Job `batch_report`: the daily click report per member level -> `ads_behavior.member_daily_report`.

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

import argparse
import logging
import re
import sys
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType

from jobs.clickstream.schema import FACT_TABLE, PRODUCTS_TABLE
from jobs.common.job_args import (
    JobArgumentParser,
    add_environment_args,
    config_from_args,
    reports_config_errors,
)
from jobs.common.snapshot_progress import retry_commit
from jobs.config import LakehouseConfig
from jobs.spark_session import build_spark, stop_spark

log = logging.getLogger("batch_report")

MEMBERS_TABLE = ("dim_db", "user_member")
REPORT_TABLE = ("ads_behavior", "member_daily_report")

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


# ---- entry point ----------------------------------------------------------------------------------------


def report_date(value: str) -> date:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a date in the form YYYY-MM-DD, e.g. 2024-05-01")
    try:
        return date.fromisoformat(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not a valid date: {exc}") from exc


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = JobArgumentParser(
        prog="lakehouse run report",
        description="Daily click report per member level into lakehouse.ads_behavior.member_daily_report.",
    )
    add_environment_args(parser)
    group = parser.add_argument_group("report")
    group.add_argument(
        "--date",
        type=report_date,
        metavar="YYYY-MM-DD",
        help="UTC day to report (default: today in UTC); a re-run replaces that day",
    )
    group.add_argument("--clicks-table", help="default lakehouse.ods_behavior.clickevent")
    group.add_argument("--members-table", help="default lakehouse.dim_db.user_member")
    group.add_argument("--products-table", help="default lakehouse.dim_db.products")
    group.add_argument("--report-table", help="default lakehouse.ads_behavior.member_daily_report")
    group.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace, config: LakehouseConfig) -> ReportSettings:
    return ReportSettings(
        day=args.date or datetime.now(UTC).date(),
        clicks_table=args.clicks_table or config.table(*FACT_TABLE),
        members_table=args.members_table or config.table(*MEMBERS_TABLE),
        products_table=args.products_table or config.table(*PRODUCTS_TABLE),
        report_table=args.report_table or config.table(*REPORT_TABLE),
    )


@reports_config_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    config = config_from_args(args)
    settings = settings_from_args(args, config)
    spark = build_spark(config, "batch_report")
    try:
        result = run_report(spark, settings)
    except MissingSourceTable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        stop_spark(spark)
    print_report(result.rows, settings)
    log.info(
        "report %s: wrote %d rows (%d events) to %s in %.1fs",
        settings.day.isoformat(),
        len(result.rows),
        sum(r["events"] for r in result.rows),
        settings.report_table,
        result.seconds,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
