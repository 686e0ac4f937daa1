"""Real-time product views: `lakehouse run views`; the same module is what the EMR step runs."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from jobs.common.job_args import (
    JobArgumentParser,
    add_environment_args,
    config_from_args,
    reports_config_errors,
)
from jobs.common.lake_tables import FACT_TABLE, VIEWS_TABLE
from jobs.common.metrics import metrics_sink_for
from jobs.common.run_modes import RunMode, StopRequest, add_run_mode_args, run_batches
from jobs.common.snapshot_progress import (
    CONCURRENT_WRITER_EXIT,
    ConcurrentWriterError,
)
from jobs.common.spark_session import build_spark, stop_spark
from jobs.config import LakehouseConfig
from jobs.views.job import ClickOffsetsRegressed, ProductViews, ViewsSettings, log


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = JobArgumentParser(
        prog="lakehouse run views",
        description="Maintain ads_behavior.product_views incrementally from the click table.",
    )
    add_environment_args(parser)
    add_run_mode_args(parser)
    parser.add_argument("--clicks-table", help="default lakehouse.ods_behavior.clickevent")
    parser.add_argument("--views-table", help="default lakehouse.ads_behavior.product_views")
    return parser.parse_args(list(argv))


def settings_from_args(args: argparse.Namespace, config: LakehouseConfig) -> ViewsSettings:
    return ViewsSettings(
        clicks_table=args.clicks_table or config.table(*FACT_TABLE),
        views_table=args.views_table or config.table(*VIEWS_TABLE),
    )


@reports_config_errors
def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config = config_from_args(args)
    stop = StopRequest().install()
    spark = build_spark(config, "product_views")
    metrics = metrics_sink_for(config)
    try:
        views = ProductViews(spark, settings_from_args(args, config), metrics)
        views.prepare()
        total = run_batches(views.run_batch, RunMode.from_args(args), stop)
        log.info("stopped after %d batches, %d views counted", views.batches, total)
    except ConcurrentWriterError as exc:
        log.error("%s", exc)
        return CONCURRENT_WRITER_EXIT
    except ClickOffsetsRegressed as exc:
        log.error("%s", exc)
        return 1
    finally:
        metrics.close()
        stop_spark(spark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
