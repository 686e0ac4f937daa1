"""Job `maintain`: compaction, snapshot expiry, orphan cleanup and manifest rewrite for lake tables.

Run as `lakehouse run maintain` locally; the same module is the EMR step. For each table (default:
every Iceberg table in dim_db, ods_behavior and ads_behavior), in this order:

1. `rewrite_data_files`: `ods_behavior.clickevent` is sorted by productId then eventTime (a
   one-product one-day query then reads one or a few files); another table is sorted by its own
   write order if it has one, else bin-packed. Partial progress: each file group commits on its own,
   so a group that loses a race with a streaming commit is skipped, never the whole run. The
   streaming application's runs bin-pack the files under `compact_below_bytes` only.
2. `rewrite_manifests`: few, well-clustered manifests after many tiny appends (from 10 data
   manifests; not in the streaming application's runs).
3. `expire_snapshots`: older than `--retain-hours`, keeping `--retain-last`, and never the snapshot
   a job resumes from. The streaming jobs keep their progress in snapshot summaries (keys starting
   with `lakehouse.`) and read it back from the newest current ancestor carrying the key, so
   `older_than` is capped at the oldest such snapshot (expiry removes strictly older snapshots).
   The streaming application's in-app runs expire with Iceberg's core API in the driver
   (`MaintainSettings.expire_in_driver`); the step uses the Spark action, which scales on a cluster.
4. `remove_orphan_files`: only files older than `--orphan-min-age-hours`, because files of a commit
   in flight look orphaned until it lands.

Every step runs beside the ingest, CDC and views jobs: Iceberg retries conflicting commits and the
job retries a step that still lost the race. Prints a before/after table of the tables' files.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rich.filesize import decimal
from rich.table import Table

from jobs.config import NAMESPACES, LakehouseConfig
from jobs.maintain import procedures
from jobs.maintain.procedures import TableStats, error_summary, table_stats

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
    expire_in_driver: bool = False  # procedures.expire_snapshots: the streaming application's runs
    # Compact only data files smaller than this (None: Iceberg's default, 75% of the target size, so
    # locally every file). The streaming application's runs set it, so a run rewrites what was
    # committed since the last one, not the whole day's partition again.
    compact_below_bytes: int | None = None
    # False: bin-pack every table (one Spark stage; the sort's sample and shuffle cost a cold run 1.4 s
    # more beside the streaming jobs) and leave manifests to the compactions, which rewrite the ones
    # holding the files they replace. The streaming application's runs; `maintain` sorts.
    sort_and_rewrite_manifests: bool = True


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
    _run_step(
        report,
        procedures.rewrite_data_files,
        spark,
        catalog,
        table,
        report.before,
        settings.compact_below_bytes,
        settings.sort_and_rewrite_manifests,
    )
    # Before the expiry, so the manifests these two rewrites replace are deleted in this same run.
    if settings.sort_and_rewrite_manifests:
        _run_step(report, procedures.rewrite_manifests, spark, catalog, table)
    _run_step(
        report,
        procedures.expire_snapshots,
        spark,
        catalog,
        table,
        settings.retain_hours,
        settings.retain_last,
        settings.expire_in_driver,
    )
    if not settings.skip_orphans:
        _run_step(
            report, procedures.remove_orphan_files, spark, catalog, table, settings.orphan_min_age_hours
        )
    report.after = table_stats(spark, f"{catalog}.{table}")
    return report


def maintain_tables(
    spark,
    config: LakehouseConfig,
    tables: Sequence[str],
    settings: MaintainSettings,
    should_stop: Callable[[], bool] = lambda: False,
) -> list[TableReport]:
    """Maintain each table; a failing table is reported and the others still run. `should_stop` is
    asked before each table (a table's steps are never interrupted)."""
    reports = []
    for index, table in enumerate(tables, 1):
        if should_stop():
            log.info("stopping before %s (%d of %d tables maintained)", table, index - 1, len(tables))
            break
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
