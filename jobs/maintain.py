"""Job `maintain`: compaction, snapshot expiry, orphan cleanup and manifest rewrite for lake tables.

Run as `lakehouse run maintain` locally; the same module is the EMR step. For each table (default:
every Iceberg table in dim_db, ods_behavior and ads_behavior), in this order:

1. `rewrite_data_files`: `ods_behavior.clickevent` is sorted by productId then eventTime (a
   one-product one-day query then reads one or a few files); another table is sorted by its own
   write order if it has one, else bin-packed. Partial progress: each file group commits on its own,
   so a group that loses a race with a streaming commit is skipped, never the whole run.
2. `rewrite_manifests`: few, well-clustered manifests after many tiny appends.
3. `expire_snapshots`: older than `--retain-hours`, keeping `--retain-last`, and never the snapshot
   a job resumes from. The streaming jobs keep their progress in snapshot summaries (keys starting
   with `lakehouse.`) and read it back from the newest current ancestor carrying the key, so
   `older_than` is capped at the oldest such snapshot (expiry removes strictly older snapshots).
4. `remove_orphan_files`: only files older than `--orphan-min-age-hours`, because files of a commit
   in flight look orphaned until it lands.

Every step runs beside the ingest, CDC and views jobs: Iceberg retries conflicting commits and the
job retries a step that still lost the race. Prints a before/after table of the tables' files.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.filesize import decimal
from rich.table import Table

from jobs.common.job_args import (
    JobArgumentParser,
    add_environment_args,
    config_from_args,
    reports_config_errors,
)
from jobs.config import NAMESPACES, LakehouseConfig
from jobs.maintenance import procedures
from jobs.maintenance.procedures import TableStats, error_summary, table_stats
from jobs.spark_session import build_spark, stop_spark

log = logging.getLogger("maintain")

# The streaming tables commit up to once a second and every retained snapshot is rewritten into
# each new metadata.json, so keep one hour of time travel (and at least 5 snapshots) by default.
DEFAULT_RETAIN_HOURS = 1.0
DEFAULT_RETAIN_LAST = 5
# Files of an in-flight commit are unreferenced until it lands; only much older ones are orphans.
DEFAULT_ORPHAN_MIN_AGE_HOURS = 72.0
MIN_ORPHAN_MIN_AGE_HOURS = 1.0


class UnknownTableError(ValueError):
    """A `--table` that is not in the catalog; the message lists what is."""


@dataclass(frozen=True)
class MaintainSettings:
    retain_hours: float = DEFAULT_RETAIN_HOURS
    retain_last: int = DEFAULT_RETAIN_LAST
    orphan_min_age_hours: float = DEFAULT_ORPHAN_MIN_AGE_HOURS
    skip_orphans: bool = False


@dataclass
class TableReport:
    table: str
    before: TableStats
    after: TableStats | None = None
    error: str | None = None
    steps: dict[str, str] = field(default_factory=dict)


# ---- which tables --------------------------------------------------------------------------------------


def short_name(name: str, catalog: str) -> str:
    """`namespace.name` from `name`, `catalog.namespace.name` or a quoted identifier."""
    parts = name.replace("`", "").split(".")
    if len(parts) == 3 and parts[0] == catalog:
        parts = parts[1:]
    if len(parts) != 2 or not all(parts):
        raise UnknownTableError(f"--table {name!r}: use NAMESPACE.NAME, e.g. ods_behavior.clickevent")
    return ".".join(parts)


def lake_tables(spark, catalog: str, namespaces: Sequence[str] = NAMESPACES) -> list[str]:
    """`namespace.name` of every table in `namespaces` (a namespace that does not exist is skipped)."""
    names: list[str] = []
    for namespace in namespaces:
        if not spark.catalog.databaseExists(f"{catalog}.{namespace}"):
            log.warning("namespace %s.%s does not exist; skipped", catalog, namespace)
            continue
        names += [
            f"{namespace}.{r['tableName']}"
            for r in spark.sql(f"SHOW TABLES IN {catalog}.{namespace}").collect()
        ]
    return sorted(names)


def resolve_tables(spark, catalog: str, requested: Sequence[str]) -> list[str]:
    """The tables to maintain: `requested` (checked to exist), else every lake table."""
    if not requested:
        return lake_tables(spark, catalog)
    names = list(dict.fromkeys(short_name(name, catalog) for name in requested))
    missing = [name for name in names if not spark.catalog.tableExists(f"{catalog}.{name}")]
    if missing:
        known = ", ".join(lake_tables(spark, catalog)) or "none"
        raise UnknownTableError(
            f"no such table in catalog {catalog}: {', '.join(missing)}. Lake tables: {known}. "
            "Pass --table NAMESPACE.NAME, or no --table for all of them."
        )
    return names


# ---- the job -----------------------------------------------------------------------------------------


def _run_step(report: TableReport, step: Callable[..., str], *args: object) -> None:
    began = time.monotonic()
    report.steps[step.__name__] = step(*args)
    log.info(
        "%s: %s %s (%.1f s)",
        report.table,
        step.__name__,
        report.steps[step.__name__],
        time.monotonic() - began,
    )


def maintain_table(spark, config: LakehouseConfig, table: str, settings: MaintainSettings) -> TableReport:
    """Run every step on one table (`namespace.name`); one log line per step."""
    catalog = config.catalog.name
    report = TableReport(table, table_stats(spark, f"{catalog}.{table}"))
    _run_step(report, procedures.rewrite_data_files, spark, catalog, table, report.before.delete_files > 0)
    # Before the expiry, so the manifests these two rewrites replace are deleted in this same run.
    _run_step(report, procedures.rewrite_manifests, spark, catalog, table)
    _run_step(
        report,
        procedures.expire_snapshots,
        spark,
        catalog,
        table,
        settings.retain_hours,
        settings.retain_last,
    )
    if not settings.skip_orphans:
        _run_step(
            report, procedures.remove_orphan_files, spark, catalog, table, settings.orphan_min_age_hours
        )
    report.after = table_stats(spark, f"{catalog}.{table}")
    return report


def maintain_tables(
    spark, config: LakehouseConfig, tables: Sequence[str], settings: MaintainSettings
) -> list[TableReport]:
    """Maintain each table; a failing table is reported and the others still run."""
    reports = []
    for index, table in enumerate(tables, 1):
        log.info("[%d/%d] %s", index, len(tables), table)
        try:
            reports.append(maintain_table(spark, config, table, settings))
        except Exception as exc:  # noqa: BLE001 - report it, go on with the next table
            message = error_summary(exc)
            log.error("%s: maintenance failed: %s", table, message)
            reports.append(TableReport(table, TableStats(0, 0, 0, 0), error=message))
    return reports


def report_table(reports: Sequence[TableReport]) -> Table:
    table = Table(title="table maintenance (before -> after)")
    for column in ("table", "data files", "data bytes", "snapshots", "delete files"):
        table.add_column(column, justify="left" if column == "table" else "right", no_wrap=True)
    for r in reports:
        if r.after is None:
            table.add_row(r.table, f"[red]failed: {r.error}[/]", "", "", "")
            continue
        b, a = r.before, r.after
        table.add_row(
            r.table,
            f"{b.data_files} -> {a.data_files}",
            f"{decimal(b.data_bytes)} -> {decimal(a.data_bytes)}",
            f"{b.snapshots} -> {a.snapshots}",
            f"{b.delete_files} -> {a.delete_files}",
        )
    return table


# ---- entry point ---------------------------------------------------------------------------------------


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
