"""`lakehouse run streaming`: CDC, ingest and product views in one Spark application."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from jobs.common.job_args import (
    JobArgumentParser,
    add_environment_args,
    config_from_args,
    reports_config_errors,
)
from jobs.common.metrics import metrics_sink_for
from jobs.common.run_modes import RunMode, StopRequest, add_run_mode_args
from jobs.streaming.application import (
    JOB_NAMES,
    StreamingApplication,
    StreamingOptions,
    default_factories,
    job_spark_conf,
)
from jobs.streaming.maintenance import PeriodicMaintenance


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = JobArgumentParser(
        prog="lakehouse run streaming",
        description="CDC, ingest and product views in one Spark application (one thread and FAIR pool each).",
    )
    add_environment_args(parser)
    add_run_mode_args(parser)
    parser.add_argument(
        "--jobs",
        default=",".join(JOB_NAMES),
        help=f"comma-separated subset of {','.join(JOB_NAMES)} (default: all)",
    )
    parser.add_argument(
        "--max-failures",
        type=int,
        default=StreamingOptions.max_failures,
        help="a job failing more often than this within an hour stops the application (default 5)",
    )
    parser.add_argument("--status-file", type=Path, help="write the jobs' state here as JSON every second")
    parser.add_argument(
        "--maintain-every-minutes",
        type=float,
        metavar="M",
        help="run table maintenance (compaction, snapshot expiry) beside the jobs every M minutes; 0: never "
        "(default from the environment: local 5, AWS 0, where the hourly maintain step runs it)",
    )
    parser.add_argument(
        "--wait-for-readers-minutes",
        type=float,
        default=StreamingOptions.wait_for_readers_seconds / 60,
        metavar="M",
        help="at start, wait up to M minutes for another binlog reader of the CDC user (another "
        "application, e.g. a replaced cluster's) to go before the jobs start; then exit 3 (default 30)",
    )
    args = parser.parse_args(list(argv))
    if args.wait_for_readers_minutes < 0:
        parser.error("--wait-for-readers-minutes must be >= 0")
    jobs = tuple(j.strip() for j in args.jobs.split(",") if j.strip())
    unknown = sorted(set(jobs) - set(JOB_NAMES))
    if unknown or not jobs:
        parser.error(f"--jobs {args.jobs!r}: choose from {', '.join(JOB_NAMES)}")
    if args.maintain_every_minutes is not None and args.maintain_every_minutes < 0:
        parser.error("--maintain-every-minutes must be >= 0")
    args.jobs = tuple(j for j in JOB_NAMES if j in jobs)  # upstream first
    return args


def other_binlog_readers(config) -> Callable[[], list[str]]:
    """The binlog readers connected as the CDC user, described (this application has none yet)."""

    def describe() -> list[str]:
        from jobs.cdc import source_db

        credentials = source_db.cdc_credentials(config)
        conn = source_db.connect(config, credentials)
        try:
            found = source_db.binlog_readers(conn, credentials.user)
        finally:
            conn.close()
        return [f"thread {thread} from {host}, {seconds} s" for thread, host, seconds in found]

    return describe


@reports_config_errors
def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config = config_from_args(args)
    options = StreamingOptions(
        jobs=args.jobs,
        mode=RunMode.from_args(args),
        max_failures=args.max_failures,
        status_file=args.status_file,
        wait_for_readers_seconds=args.wait_for_readers_minutes * 60,
    )
    from jobs.common.spark_session import build_spark, stop_spark

    stop = StopRequest().install()
    spark = build_spark(config, "streaming", job_spark_conf())
    metrics = metrics_sink_for(config)
    minutes = (
        config.streaming_maintenance_minutes
        if args.maintain_every_minutes is None
        else args.maintain_every_minutes
    )
    # A run --until-idle ends when the sources are drained: no time for maintenance.
    maintenance = (
        PeriodicMaintenance(spark, config, minutes * 60, stop)  # SIGTERM: no new run, no next table
        if minutes > 0 and not options.mode.until_idle
        else None
    )
    try:
        factories = default_factories(spark, config, options.mode, metrics)
        readers = other_binlog_readers(config) if "cdc" in options.jobs else None
        return StreamingApplication(spark, options, factories, stop, maintenance, readers).run()
    finally:
        metrics.close()
        stop_spark(spark)


if __name__ == "__main__":
    sys.exit(main())
