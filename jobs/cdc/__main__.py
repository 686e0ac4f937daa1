"""CDC job: MySQL/MariaDB binlog -> Iceberg dimension tables with MERGE, exactly once."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from jobs.cdc.schema_policy import DEFAULT_POLICY, POLICIES
from jobs.cdc.snapshot import CHUNK_ROWS, COMMIT_ROWS, READERS
from jobs.cdc.sync import PROGRESS_SECONDS, REQUEST_POLL_SECONDS, CdcSync, run_sync
from jobs.cdc.table_selection import DEFAULT_NAMESPACE, TableSelection
from jobs.common.job_args import (
    JobArgumentParser,
    add_environment_args,
    config_from_args,
    reports_config_errors,
)
from jobs.common.metrics import metrics_sink_for
from jobs.common.run_modes import RunMode, StopRequest, add_run_mode_args


@dataclass(frozen=True)
class CdcArgs:
    tables: tuple[str, ...]
    includes: tuple[str, ...]
    excludes: tuple[str, ...]
    namespace: str
    resync: tuple[str, ...]
    server_id: int | None
    mode: RunMode
    progress_seconds: float = PROGRESS_SECONDS
    snapshot_chunk_rows: int = CHUNK_ROWS
    snapshot_commit_rows: int = COMMIT_ROWS
    schema_changes: str = DEFAULT_POLICY
    snapshot_readers: int = READERS


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, CdcArgs]:
    parser = JobArgumentParser(prog="lakehouse run cdc", description=__doc__.strip())
    add_environment_args(parser)
    add_run_mode_args(parser)
    parser.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATTERN",
        help="sync the source tables matching this SCHEMA.TABLE glob, each to NAMESPACE.<table>, "
        "also those created while the job runs (repeatable; default without --table: user_db.*)",
    )
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="leave out the tables matching this SCHEMA.TABLE glob (repeatable)",
    )
    parser.add_argument(
        "--namespace",
        default=DEFAULT_NAMESPACE,
        help=f"the Iceberg namespace of tables --include selects (default {DEFAULT_NAMESPACE})",
    )
    parser.add_argument(
        "--table",
        action="append",
        default=[],
        metavar="SOURCE=TARGET",
        help="a source table and its Iceberg table, e.g. user_db.products=dim_db.products "
        "(repeatable; without --include, only these tables are synced)",
    )
    parser.add_argument(
        "--resync",
        action="append",
        default=[],
        metavar="TABLE",
        help="re-snapshot TABLE (e.g. user_db.products)",
    )
    parser.add_argument(
        "--drop-orphaned",
        action="append",
        default=[],
        metavar="LAKE_TABLE",
        help="drop a lake table whose source table was dropped (marked lakehouse.cdc.source-dropped), "
        "files and all, then exit; refuses a table that is not marked (repeatable)",
    )
    parser.add_argument(
        "--request-resync",
        action="append",
        default=[],
        metavar="LAKE_TABLE",
        help="ask the running CDC job to re-snapshot LAKE_TABLE beside the stream (a table property it "
        f"looks for every {REQUEST_POLL_SECONDS:.0f} s; a job not running takes it at its start), "
        "then exit (repeatable)",
    )
    parser.add_argument("--server-id", type=int, help="replication client id (unique per reader)")
    parser.add_argument(
        "--progress-seconds",
        type=float,
        default=PROGRESS_SECONDS,
        help="at most this often, store the binlog position of tables without changes "
        f"(default {PROGRESS_SECONDS:.0f})",
    )
    parser.add_argument(
        "--snapshot-chunk-rows",
        type=int,
        default=CHUNK_ROWS,
        metavar="N",
        help=f"rows per SELECT of a snapshot (default {CHUNK_ROWS:,}; each is its own short read)",
    )
    parser.add_argument(
        "--snapshot-commit-rows",
        type=int,
        default=COMMIT_ROWS,
        metavar="N",
        help=f"rows per progress commit of a snapshot: at most what a killed snapshot reads again "
        f"(default {COMMIT_ROWS:,})",
    )
    parser.add_argument(
        "--snapshot-readers",
        type=int,
        default=READERS,
        metavar="N",
        help="reader processes per snapshot, each over a range of keys, for a table whose key is one "
        f"integer column and that has --snapshot-commit-rows rows per reader (default {READERS})",
    )
    parser.add_argument(
        "--schema-changes",
        choices=POLICIES,
        default=DEFAULT_POLICY,
        help="what a source column change does to the lake table: evolve (follow ADD/DROP/RENAME and "
        "widening type changes), strict (stop the table), ignore (keep the lake schema); default "
        f"{DEFAULT_POLICY}",
    )
    args = parser.parse_args(list(argv))
    if min(args.snapshot_chunk_rows, args.snapshot_commit_rows, args.snapshot_readers) < 1:
        parser.error("--snapshot-chunk-rows, --snapshot-commit-rows and --snapshot-readers must be >= 1")
    return args, CdcArgs(
        tuple(args.table),
        tuple(args.include),
        tuple(args.exclude),
        args.namespace,
        tuple(args.resync),
        args.server_id,
        RunMode.from_args(args),
        args.progress_seconds,
        args.snapshot_chunk_rows,
        args.snapshot_commit_rows,
        args.schema_changes,
        args.snapshot_readers,
    )


def existing_lake_tables(spark, config, tables: Sequence[str], hint: str = "") -> list[str] | None:
    """The lake tables named, with the catalog's name; None (said on stderr) if one does not exist."""
    from jobs.cdc import target_table

    qualified = [t if t.count(".") >= 2 else f"{config.catalog.name}.{t}" for t in tables]
    for table in qualified:
        if not target_table.table_exists(spark, table):
            print(f"error: {table} does not exist{f' ({hint})' if hint else ''}", file=sys.stderr)
            return None
    return qualified


def drop_orphaned(spark, config, tables: Sequence[str]) -> int:
    """Drop the lake tables named whose source table was dropped (their rows, files and history);
    exit 2 without dropping anything if one of them is missing or not marked."""
    from jobs.cdc import target_table

    qualified = existing_lake_tables(spark, config, tables)
    if qualified is None:
        return 2
    for table in qualified:
        if target_table.source_dropped(spark, table) is None:
            print(
                f"error: {table} is not marked {target_table.DROPPED_PROPERTY}: its source table was not "
                "dropped (as far as CDC has read); nothing dropped",
                file=sys.stderr,
            )
            return 2
    for table in qualified:
        where = target_table.source_dropped(spark, table)
        spark.sql(f"DROP TABLE {table} PURGE")
        print(f"dropped {table} (its source table was dropped {where})")
    return 0


def request_resync(spark, config, tables: Sequence[str]) -> int:
    """Mark the lake tables named for a re-snapshot by the running job (`_take_resync_requests`);
    exit 2 without marking anything if one of them is missing or not synced by CDC."""
    import uuid
    from datetime import UTC, datetime

    from jobs.cdc import target_table

    qualified = existing_lake_tables(
        spark, config, tables, "a table CDC has not copied yet: `--resync` it at a start"
    )
    if qualified is None:
        return 2
    for table in qualified:
        if target_table.synced_source(spark, table, config.mysql.database) is None:
            print(f"error: {table} is not a table CDC syncs; nothing requested", file=sys.stderr)
            return 2
    when = datetime.now(UTC).strftime("at %Y-%m-%dT%H:%M:%SZ") + f" ({uuid.uuid4().hex[:8]})"  # unique
    for table in qualified:
        target_table.request_resync(spark, table, when)
        print(
            f"requested a re-snapshot of {table} {when}: a running CDC job that syncs it takes it within "
            f"about {REQUEST_POLL_SECONDS:.0f} s and copies it beside the stream, after any copy before it "
            f"(its log names the request); a job not running takes it at its start"
        )
    return 0


@reports_config_errors
def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    env_args, args = parse_args(sys.argv[1:] if argv is None else argv)
    config = config_from_args(env_args)
    selection = TableSelection.from_args(config, args.tables, args.includes, args.excludes, args.namespace)

    if env_args.drop_orphaned and env_args.request_resync:
        print("error: --drop-orphaned and --request-resync: one at a time", file=sys.stderr)
        return 2
    from jobs.common.spark_session import build_spark, stop_spark

    # FAIR: a re-snapshot beside the stream (its own pool, resync.py) never queues the batches' jobs.
    spark = build_spark(config, "cdc_sync", {"spark.scheduler.mode": "FAIR"})
    if env_args.drop_orphaned or env_args.request_resync:
        try:
            if env_args.drop_orphaned:
                return drop_orphaned(spark, config, env_args.drop_orphaned)
            return request_resync(spark, config, env_args.request_resync)
        finally:
            stop_spark(spark)
    stop = StopRequest().install()
    sync = CdcSync(
        spark,
        config,
        selection,
        resync=args.resync,
        server_id=args.server_id,
        progress_seconds=args.progress_seconds,
        metrics=metrics_sink_for(config),
        warm_up=True,
        change_wait_seconds=args.mode.trigger_seconds,
        snapshot_chunk_rows=args.snapshot_chunk_rows,
        snapshot_commit_rows=args.snapshot_commit_rows,
        schema_changes=args.schema_changes,
        snapshot_readers=args.snapshot_readers,
    )
    try:
        return run_sync(sync, args.mode, stop)
    finally:
        sync.metrics.close()
        stop_spark(spark)


if __name__ == "__main__":
    sys.exit(main())
