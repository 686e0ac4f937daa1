"""Iceberg maintenance procedures (`CALL lakehouse.system.*`) and the metadata tables they are
judged by. Each call is one step; a step that loses a commit race to a streaming job is retried."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from tenacity import RetryCallState, retry, retry_if_exception, stop_after_attempt, wait_exponential

from jobs.common.lake_tables import load_iceberg_table
from jobs.common.snapshot_progress import is_commit_conflict
from jobs.maintain.retention import ExpiryPlan, SnapshotInfo, expiry_plan, snapshots_from_metadata

log = logging.getLogger("maintain")
T = TypeVar("T")

# Tables whose compaction sort is fixed here rather than taken from the table's write order: a
# one-product one-day query on the clicks then reads one or a few files of that day.
SORT_ORDERS = {"ods_behavior.clickevent": "productId ASC NULLS FIRST, eventTime ASC NULLS FIRST"}
# Partial progress: file groups commit on their own, so a group that loses a race with a streaming
# commit is skipped (and compacted next run) instead of failing the whole rewrite.
REWRITE_OPTIONS = {
    "partial-progress.enabled": "true",
    "partial-progress.max-commits": "10",
    "max-concurrent-file-group-rewrites": "4",
}
# A rewrite of fewer data manifests than this buys a query nothing measurable, and on a table a streaming
# job commits to every second it is the step that loses races: on the local stack the rewrite of
# product_views' 2 manifests into 1 lost to the views job 3 times in a row (6.5 s of a 29 s run).
MIN_MANIFESTS_TO_REWRITE = 10
# Beyond `is_commit_conflict`: lost to a concurrent MERGE or rewrite of the same files or manifests
# (Iceberg fails these validations instead of retrying them).
_MAINTENANCE_CONFLICTS = (
    "could not be found in the latest snapshot",  # rewrite_manifests: a manifest was replaced
    "Missing required files to delete",
    "Cannot commit, missing data files",
)


# ---- retries -------------------------------------------------------------------------------------------


def is_maintenance_conflict(exc: BaseException) -> bool:
    return is_commit_conflict(exc) or any(marker in str(exc) for marker in _MAINTENANCE_CONFLICTS)


def error_summary(exc: BaseException | None) -> str:
    """The line of a (Py4J) error that names the cause, e.g. `...ValidationException: Missing ...`."""
    lines = [line.strip(" :") for line in str(exc).splitlines() if line.strip(" :")]
    cause = next((line for line in lines if "Exception: " in line), lines[0] if lines else repr(exc))
    return cause[:300]


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    wait = state.next_action.sleep if state.next_action else 0.0
    log.warning("commit conflict (%s); retrying the step in %.1f s", error_summary(exc), wait)


def retry_step(attempts: int = 5) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Retry a step that lost a commit race to another writer (after Iceberg's own retries)."""
    return retry(
        retry=retry_if_exception(is_maintenance_conflict),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=0.5, max=10),
        before_sleep=_log_retry,
        reraise=True,
    )


# ---- metadata tables -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableStats:
    data_files: int
    data_bytes: int
    snapshots: int
    delete_files: int


def table_stats(spark, ident: str) -> TableStats:
    """Live data files and their bytes, delete files (current snapshot) and all snapshots.

    Read from the table's metadata in the driver: the current snapshot's summary carries the totals
    (Iceberg writes them on every commit). A table with delete files, or a summary without them, is
    counted with a Spark job over its metadata tables, which costs the jobs beside a local run
    task slots twice per table and run."""
    table = load_iceberg_table(spark, ident)
    current = table.currentSnapshot()
    snapshots = _iterables(spark).size(table.snapshots())
    if current is None:
        return TableStats(0, 0, snapshots, 0)
    summary = current.summary()
    totals = [summary.get(key) for key in ("total-data-files", "total-files-size", "total-delete-files")]
    # `total-files-size` counts delete files too: exact for data bytes only when there are none.
    if None not in totals and totals[2] == "0":
        return TableStats(int(totals[0]), int(totals[1]), snapshots, 0)
    row = spark.sql(
        f"""SELECT (SELECT count(*) FROM {ident}.data_files) AS data_files,
                   (SELECT coalesce(sum(file_size_in_bytes), 0) FROM {ident}.data_files) AS data_bytes,
                   (SELECT count(*) FROM {ident}.snapshots) AS snapshots,
                   (SELECT count(*) FROM {ident}.delete_files) AS delete_files"""
    ).first()
    return TableStats(row["data_files"], row["data_bytes"], row["snapshots"], row["delete_files"])


def _iterables(spark):
    """Guava's Iterables as the Iceberg runtime ships it (to count a Java Iterable in one call)."""
    return spark.sparkContext._jvm.org.apache.iceberg.relocated.com.google.common.collect.Iterables


def table_metadata(spark, ident: str, table=None) -> dict:
    """The table's current metadata (snapshots, their summaries and parents, the snapshot log) as
    its metadata JSON: one call into the driver's JVM, no Spark job. `table`: the Iceberg Java
    table `ident`, if already loaded."""
    metadata = (table or load_iceberg_table(spark, ident)).operations().current()
    return json.loads(spark.sparkContext._jvm.org.apache.iceberg.TableMetadataParser.toJson(metadata))


def read_snapshots(spark, ident: str) -> list[SnapshotInfo]:
    """What the expiry plans from; read from the table's metadata in the driver. (A query of the
    `snapshots` and `history` metadata tables was a Spark job per table and run.)"""
    return snapshots_from_metadata(table_metadata(spark, ident))


def write_order(spark, ident: str) -> str | None:
    """The table's sort order as Iceberg describes it (`SHOW TBLPROPERTIES` key `sort-order`)."""
    return dict(spark.sql(f"SHOW TBLPROPERTIES {ident}").collect()).get("sort-order")


# ---- procedures ----------------------------------------------------------------------------------------


def utc_text(epoch_ms: int) -> str:
    """`2024-05-01 12:00:00.123Z` for an epoch millisecond."""
    moment = datetime.fromtimestamp(epoch_ms // 1000, tz=UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S}.{epoch_ms % 1000:03d}Z"


def timestamp_literal(epoch_ms: int) -> str:
    """A Spark TIMESTAMP literal for an epoch millisecond, whatever the session time zone."""
    return f"TIMESTAMP '{utc_text(epoch_ms)}'"


def call(spark, catalog: str, procedure: str, **args: str) -> list:
    """`CALL catalog.system.procedure(name => value, ...)`; values are SQL literals."""
    arguments = ", ".join(f"{name} => {value}" for name, value in args.items())
    return spark.sql(f"CALL {catalog}.system.{procedure}({arguments})").collect()


def rewrite_strategy(table: str, table_write_order: str | None) -> tuple[str, str | None]:
    """(strategy, sort order) for rewrite_data_files; `table` is `namespace.name`."""
    if table in SORT_ORDERS:
        return "sort", SORT_ORDERS[table]
    if table_write_order:
        return "sort", table_write_order
    return "binpack", None


def rewrite_data_files(
    spark,
    catalog: str,
    table: str,
    stats: TableStats,
    compact_below_bytes: int | None = None,
    sort: bool = True,
) -> str:
    """Compact `table` (`namespace.name`), whose current counts are `stats`. `compact_below_bytes`:
    rewrite only data files smaller than this (the ones commits since the last run added). `sort`
    False: bin-pack, whatever order the table has."""
    if stats.data_files <= 1 and stats.delete_files == 0:
        return f"{stats.data_files} data files: nothing to compact"  # product_views, small dimensions
    strategy, order = (
        rewrite_strategy(table, write_order(spark, f"{catalog}.{table}")) if sort else ("binpack", None)
    )
    options = dict(REWRITE_OPTIONS)
    if stats.delete_files:
        options["remove-dangling-deletes"] = "true"
        # A merge-on-read table (jobs/cdc/target_table.py): every data file with a delete is
        # rewritten with its deletes applied, whatever its size, so readers never apply more than
        # one maintenance period's delete files.
        options["delete-file-threshold"] = "1"
    if compact_below_bytes is not None:
        options["min-file-size-bytes"] = str(compact_below_bytes)
    args = {
        "table": f"'{table}'",
        "strategy": f"'{strategy}'",
        "options": "map(" + ", ".join(f"'{k}', '{v}'" for k, v in options.items()) + ")",
    }
    if order:
        args["sort_order"] = f"'{order}'"
    result = retry_step()(call)(spark, catalog, "rewrite_data_files", **args)[0].asDict()
    deletes = ""
    if stats.delete_files:
        # The position deletes the rewrite applied now point at files no snapshot reads: rewriting
        # every position delete file drops those (and compacts what a concurrent MERGE added).
        rewritten = retry_step()(call)(
            spark,
            catalog,
            "rewrite_position_delete_files",
            table=f"'{table}'",
            options="map('rewrite-all', 'true')",
        )[0].asDict()
        deletes = (
            f"; position delete files {rewritten['rewritten_delete_files_count']} -> "
            f"{rewritten['added_delete_files_count']}"
        )
    failed = result.get("failed_data_files_count") or 0
    return (
        f"{f'sort by {order}' if order else 'binpack'}"
        + (f" (files under {compact_below_bytes / 2**20:g} MiB)" if compact_below_bytes is not None else "")
        + f": {result['rewritten_data_files_count']} files -> {result['added_data_files_count']}"
        + (f", {failed} left for the next run after commit conflicts" if failed else "")
        + deletes
    )


def manifest_count(spark, ident: str) -> int:
    """Data manifests of the table's current snapshot (what `rewrite_manifests` rewrites), from its
    metadata in the driver (no Spark job)."""
    table = load_iceberg_table(spark, ident)
    current = table.currentSnapshot()
    return 0 if current is None else current.dataManifests(table.io()).size()


def rewrite_manifests(spark, catalog: str, table: str) -> str:
    manifests = manifest_count(spark, f"{catalog}.{table}")
    if manifests < MIN_MANIFESTS_TO_REWRITE:
        return f"{manifests} manifests: fewer than {MIN_MANIFESTS_TO_REWRITE}, left as they are"
    rows = retry_step()(call)(spark, catalog, "rewrite_manifests", table=f"'{table}'")
    result = rows[0].asDict() if rows else {"rewritten_manifests_count": 0, "added_manifests_count": 0}
    return f"{result['rewritten_manifests_count']} manifests -> {result['added_manifests_count']}"


def expire_snapshots(
    spark, catalog: str, table: str, retain_hours: float, retain_last: int, in_driver: bool = False
) -> str:
    """Expire as planned by `retention.expiry_plan`. `in_driver`: with Iceberg's core API, whose
    incremental cleanup (a linear history) reads the manifest lists and only the manifests with
    entries the expired snapshots deleted, instead of the Spark action, which lists every file the
    table's snapshots reach with Spark jobs. On a cluster the action scales; beside the jobs of a
    two-core local stack it took 11 of a 24 s run. (The incremental cleanup can leave files the
    action would find: `lakehouse run maintain` removes orphans.)"""

    @retry_step()
    def expire() -> tuple[ExpiryPlan, str]:
        # Planned per attempt, so a retry also protects progress committed in the meantime.
        snapshots = read_snapshots(spark, f"{catalog}.{table}")
        plan = expiry_plan(snapshots, int(time.time() * 1000), retain_hours)
        if in_driver:
            expired = _expire_in_driver(spark, f"{catalog}.{table}", plan.older_than_ms, retain_last)
            return plan, f"expired {expired} snapshots and the files only they referenced"
        rows = call(
            spark,
            catalog,
            "expire_snapshots",
            table=f"'{table}'",
            older_than=timestamp_literal(plan.older_than_ms),
            retain_last=str(retain_last),
            stream_results="true",
        )
        result = rows[0].asDict()
        files, lists = (
            result.get("deleted_data_files_count", 0),
            result.get("deleted_manifest_lists_count", 0),
        )
        return plan, f"deleted {files} data files, {lists} manifest lists"

    plan, outcome = expire()
    detail = f"older than {utc_text(plan.older_than_ms)}"
    if plan.capped:
        kept = ", ".join(f"{key}@{snap.snapshot_id}" for key, snap in sorted(plan.protected.items()))
        detail += f" (capped to keep the progress snapshots {kept})"
    return f"{detail}: {outcome}"


def _expire_in_driver(spark, ident: str, older_than_ms: int, retain_last: int) -> int:
    """Expire with `Table.expireSnapshots()` (files deleted by the driver); returns how many went."""
    table = load_iceberg_table(spark, ident)
    before = _snapshot_ids(table_metadata(spark, ident, table))
    table.expireSnapshots().expireOlderThan(older_than_ms).retainLast(retain_last).commit()
    return len(before - _snapshot_ids(table_metadata(spark, ident)))  # jobs may commit meanwhile


def _snapshot_ids(metadata: dict) -> set[int]:
    return {snapshot["snapshot-id"] for snapshot in metadata.get("snapshots", [])}


def remove_orphan_files(spark, catalog: str, table: str, min_age_hours: float) -> str:
    older_than = int((time.time() - min_age_hours * 3600) * 1000)
    rows = retry_step()(call)(
        spark, catalog, "remove_orphan_files", table=f"'{table}'", older_than=timestamp_literal(older_than)
    )
    return f"older than {min_age_hours:g} h: removed {len(rows)} files"
