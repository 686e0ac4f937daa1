"""Job `ingest`: Kafka `clicktopic` -> `ods_behavior.clickevent` (+ rejects), exactly once."""

from __future__ import annotations

import argparse
import logging
import sys

from jobs.common.job_args import (
    JobArgumentParser,
    add_environment_args,
    config_from_args,
    reports_config_errors,
)
from jobs.common.kafka_client import kafka_client_config
from jobs.common.lake_tables import (
    FACT_TABLE,
    PRODUCTS_TABLE,
    REJECTS_TABLE,
)
from jobs.common.metrics import metrics_sink_for
from jobs.common.run_modes import RunMode, StopRequest, add_run_mode_args, run_batches
from jobs.common.snapshot_progress import (
    CONCURRENT_WRITER_EXIT,
    ConcurrentWriterError,
)
from jobs.common.spark_session import build_spark, stop_spark
from jobs.config import LakehouseConfig
from jobs.ingest.job import ClickstreamIngest, IngestSettings, job_spark_conf, log
from jobs.ingest.kafka_source import (
    FetchSettings,
    check_topic,
)
from jobs.ingest.offsets import OffsetsRegressed


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = JobArgumentParser(
        prog="lakehouse run ingest",
        description="Exactly-once ingest of ClickEvents from Kafka into Iceberg (fact + rejects).",
    )
    add_environment_args(parser)
    add_run_mode_args(parser, default_trigger=1.0)
    group = parser.add_argument_group("ingest")
    group.add_argument("--topic", help="Kafka topic (default from config: clicktopic)")
    group.add_argument("--fact-table", help="default lakehouse.ods_behavior.clickevent")
    group.add_argument("--rejects-table", help="default lakehouse.ods_behavior.clickevent_rejects")
    group.add_argument("--products-table", help="default lakehouse.dim_db.products")
    group.add_argument(
        "--max-records-per-partition",
        type=int,
        default=FetchSettings.max_records_per_partition,
        help="cap per partition per micro-batch",
    )
    group.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace, config: LakehouseConfig) -> IngestSettings:
    return IngestSettings(
        topic=args.topic or config.kafka.topic,
        fact_table=args.fact_table or config.table(*FACT_TABLE),
        rejects_table=args.rejects_table or config.table(*REJECTS_TABLE),
        products_table=args.products_table or config.table(*PRODUCTS_TABLE),
        fetch=FetchSettings(max_records_per_partition=args.max_records_per_partition),
    )


@reports_config_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    config = config_from_args(args)
    settings = settings_from_args(args, config)
    check_topic(kafka_client_config(config.kafka), settings.topic)  # before any table is created
    stop = StopRequest().install()
    spark = build_spark(config, "clickstream_ingest", job_spark_conf())
    metrics = metrics_sink_for(config)
    try:
        ingest = ClickstreamIngest(spark, config, settings, stop, metrics)
        ingest.prepare()
        total = run_batches(ingest.run_batch, RunMode.from_args(args), stop)
        ingest.finish()
        log.info("stopped after %d batches, %d records", ingest.batches, total)
    except ConcurrentWriterError as exc:
        log.error("%s", exc)
        return CONCURRENT_WRITER_EXIT
    except OffsetsRegressed as exc:
        log.error("%s", exc)
        return 1
    finally:
        metrics.close()
        stop_spark(spark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
