"""Job `replay` (`lakehouse replay-rejects`): rejects that pass today's validation -> the fact table.

Prints, per reason, how many rejects were not replayed yet, how many pass now and were replayed
(all in one commit), and what stays rejected. Exit 0 (also when nothing passes), 2 on bad
arguments or missing tables.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from jobs.common.job_args import (
    JobArgumentParser,
    add_environment_args,
    config_from_args,
    reports_config_errors,
)
from jobs.common.lake_tables import FACT_TABLE, PRODUCTS_TABLE, REJECTS_TABLE, VIEWS_TABLE
from jobs.config import ConfigError
from jobs.replay.job import ReplayResult, ReplaySettings, by_kind, replay_rejects


def since_time(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a time: use YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS] (UTC)"
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = JobArgumentParser(prog="lakehouse replay-rejects", description=__doc__.strip().splitlines()[0])
    add_environment_args(parser)
    group = parser.add_argument_group("replay")
    group.add_argument(
        "--reason",
        action="append",
        default=[],
        metavar="REASON",
        help="only rejects of this reason kind (e.g. wrong_type, or `wrong_type: uid`); repeatable. "
        "Default: all but update_time_out_of_range (its bound needs the record's Kafka timestamp, "
        "which rejects do not keep)",
    )
    group.add_argument("--since", type=since_time, help="only rejects ingested at or after this UTC time")
    group.add_argument("--dry-run", action="store_true", help="count what would pass; write nothing")
    group.add_argument("--fact-table", help="default lakehouse.ods_behavior.clickevent")
    group.add_argument("--rejects-table", help="default lakehouse.ods_behavior.clickevent_rejects")
    group.add_argument("--products-table", help="default lakehouse.dim_db.products")
    group.add_argument("--views-table", help="default lakehouse.ads_behavior.product_views")
    group.add_argument("--topic", help="the ingest's topic (default from config: clicktopic)")
    return parser.parse_args(list(argv))


def print_result(result: ReplayResult, dry_run: bool) -> None:
    if not result.considered:
        print("replay: no rejects left to replay")
        return
    verb = "would replay" if dry_run else "replayed"
    # A reason's kind and field only: an `unconvertible` reason's detail can quote the value.
    considered, passing = by_kind(result.considered), by_kind(result.passing)
    for reason in sorted(considered):
        print(f"replay: {reason}: {considered[reason]} not replayed before, {passing[reason]} pass now")
    where = f" (snapshot {result.snapshot_id})" if result.snapshot_id else ""
    print(f"replay: {verb} {sum(result.passing.values())} of {sum(result.considered.values())}{where}")


@reports_config_errors
def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config = config_from_args(args)
    settings = ReplaySettings(
        fact_table=args.fact_table or config.table(*FACT_TABLE),
        rejects_table=args.rejects_table or config.table(*REJECTS_TABLE),
        products_table=args.products_table or config.table(*PRODUCTS_TABLE),
        topic=args.topic or config.kafka.topic,
        views_table=args.views_table or config.table(*VIEWS_TABLE),
        reasons=tuple(args.reason),
        since=args.since,
        dry_run=args.dry_run,
    )
    from jobs.common.spark_session import build_spark, stop_spark

    spark = build_spark(config, "replay")
    try:
        for table in (settings.fact_table, settings.rejects_table, settings.products_table):
            if not spark.catalog.tableExists(table):
                raise ConfigError(f"{table} does not exist: run the ingest (and CDC) first")
        result = replay_rejects(spark, settings)
    finally:
        stop_spark(spark)
    print_result(result, args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
