"""Job `maintain`: compaction, snapshot expiry, orphan cleanup and manifest rewrite for lake tables."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from rich.console import Console

from jobs.common.job_args import (
    JobArgumentParser,
    add_environment_args,
    config_from_args,
    reports_config_errors,
)
from jobs.common.spark_session import build_spark, stop_spark
from jobs.config import NAMESPACES
from jobs.maintain.job import (
    DEFAULT_ORPHAN_MIN_AGE_HOURS,
    DEFAULT_RETAIN_HOURS,
    DEFAULT_RETAIN_LAST,
    MIN_ORPHAN_MIN_AGE_HOURS,
    MaintainSettings,
    UnknownTableError,
    log,
    maintain_tables,
    report_table,
    resolve_tables,
)


def orphan_min_age(text: str) -> float:
    hours = float(text)
    if hours < MIN_ORPHAN_MIN_AGE_HOURS:
        raise argparse.ArgumentTypeError(
            f"{hours:g} h is too young: files of commits still in flight look orphaned and would be "
            f"deleted. Use at least {MIN_ORPHAN_MIN_AGE_HOURS:g} (default {DEFAULT_ORPHAN_MIN_AGE_HOURS:g})."
        )
    return hours


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = JobArgumentParser(
        prog="lakehouse run maintain",
        description="Compact, expire snapshots, remove orphan files and rewrite manifests of lake tables.",
    )
    add_environment_args(parser)
    group = parser.add_argument_group("maintenance")
    group.add_argument(
        "--table",
        action="append",
        default=[],
        metavar="NS.NAME",
        help="table to maintain (repeatable; default: every table in " + ", ".join(NAMESPACES) + ")",
    )
    group.add_argument(
        "--retain-hours",
        type=float,
        metavar="H",
        default=DEFAULT_RETAIN_HOURS,
        help=f"expire snapshots older than this (default {DEFAULT_RETAIN_HOURS:g}); the snapshots that "
        "hold the jobs' progress are always kept",
    )
    group.add_argument(
        "--retain-last",
        type=int,
        metavar="N",
        default=DEFAULT_RETAIN_LAST,
        help=f"keep at least this many recent snapshots (default {DEFAULT_RETAIN_LAST})",
    )
    group.add_argument(
        "--orphan-min-age-hours",
        type=orphan_min_age,
        metavar="H",
        default=DEFAULT_ORPHAN_MIN_AGE_HOURS,
        help=f"only remove unreferenced files older than this (default {DEFAULT_ORPHAN_MIN_AGE_HOURS:g}, "
        f"at least {MIN_ORPHAN_MIN_AGE_HOURS:g})",
    )
    group.add_argument("--skip-orphans", action="store_true", help="do not run remove_orphan_files")
    group.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.retain_hours < 0:
        parser.error("--retain-hours must be >= 0")
    if args.retain_last < 1:
        parser.error("--retain-last must be >= 1 (Iceberg always keeps the current snapshot)")
    return args


def settings_from_args(args: argparse.Namespace) -> MaintainSettings:
    return MaintainSettings(args.retain_hours, args.retain_last, args.orphan_min_age_hours, args.skip_orphans)


@reports_config_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    config = config_from_args(args)
    settings = settings_from_args(args)
    spark = build_spark(config, "maintain")
    try:
        try:
            tables = resolve_tables(spark, config.catalog.name, args.table)
        except UnknownTableError as exc:
            log.error("%s", exc)
            return 2
        began = time.monotonic()
        reports = maintain_tables(spark, config, tables, settings)
        console = Console()
        # Step logs (EMR, CI) are not terminals: print the table at full width there.
        (console if console.is_terminal else Console(width=200)).print(report_table(reports))
        failed = [r.table for r in reports if r.error]
        log.info(
            "maintained %d tables in %.0f s%s",
            len(reports) - len(failed),
            time.monotonic() - began,
            f"; failed: {', '.join(failed)}" if failed else "",
        )
        return 1 if failed else 0
    finally:
        stop_spark(spark)


if __name__ == "__main__":
    sys.exit(main())
