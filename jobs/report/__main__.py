"""Job `report`: the daily click report per member level -> `ads_behavior.member_daily_report`."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from datetime import UTC, date, datetime

from jobs.common.job_args import (
    JobArgumentParser,
    add_environment_args,
    config_from_args,
    reports_config_errors,
)
from jobs.common.lake_tables import FACT_TABLE, MEMBERS_TABLE, PRODUCTS_TABLE, REPORT_TABLE
from jobs.common.spark_session import build_spark, stop_spark
from jobs.config import LakehouseConfig
from jobs.report.job import (
    MissingSourceTable,
    ReportSettings,
    log,
    print_report,
    run_report,
)


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
