"""Job progress stored in Iceberg snapshot summaries: committed atomically with the data.

A job that consumes a source (Kafka offsets, a binlog position, a click-table snapshot) writes its
position into the summary of the same snapshot that holds the rows. On start it walks the table's
current snapshot ancestry back to the newest snapshot that carries its key, so snapshots made by
others (compaction, expiry, another writer) in between do not hide it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    before_sleep_log,
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from jobs.common import progress_keys
from jobs.common.lake_tables import load_iceberg_table
from jobs.common.streaming_job import NeedsOperator

log = logging.getLogger(__name__)
T = TypeVar("T")


def read_progress(spark, table: str, key: str) -> str | None:
    """The newest value of summary[`key`] along `table`'s current ancestry (None if never set)."""
    rows = spark.sql(
        f"""SELECT s.summary['{key}'] AS value
            FROM {table}.history h JOIN {table}.snapshots s ON h.snapshot_id = s.snapshot_id
            WHERE h.is_current_ancestor AND s.summary['{key}'] IS NOT NULL
            ORDER BY h.made_current_at DESC, s.committed_at DESC
            LIMIT 1"""
    ).collect()
    return rows[0]["value"] if rows else None


# Every progress commit also carries a unique id, so a writer can tell whether a commit whose
# outcome it never learned (a timeout, CommitStateUnknownException) landed after all.
COMMIT_ID_KEY = progress_keys.COMMIT_ID


class ConcurrentWriterError(NeedsOperator):
    """Another writer committed progress to the table since this job's last commit: the job stops
    without committing (two instances of one job would apply the same input twice)."""


# The exit code of a job stopped by ConcurrentWriterError: not a crash to restart beside the live job.
CONCURRENT_WRITER_EXIT = 3


@dataclass(frozen=True)
class StoredProgress:
    value: str | None
    snapshot_id: int | None  # the snapshot that stored `value`: the writer's next commit validates from it


def read_stored_progress(spark, table: str, key: str) -> StoredProgress:
    """Like `read_progress`, with the id of the snapshot that holds the value."""
    rows = spark.sql(
        f"""SELECT s.summary['{key}'] AS value, s.snapshot_id
            FROM {table}.history h JOIN {table}.snapshots s ON h.snapshot_id = s.snapshot_id
            WHERE h.is_current_ancestor AND s.summary['{key}'] IS NOT NULL
            ORDER BY h.made_current_at DESC, s.committed_at DESC
            LIMIT 1"""
    ).collect()
    return StoredProgress(rows[0]["value"], rows[0]["snapshot_id"]) if rows else StoredProgress(None, None)


def _ancestors(spark, table: str, from_snapshot: int | None = None, max_depth: int | None = None):
    """Snapshots from `from_snapshot` (default: the current one) back through their parents, read
    from the table's fresh metadata (the catalog cache is off)."""
    table_ref = load_iceberg_table(spark, table)
    snapshot = table_ref.currentSnapshot() if from_snapshot is None else table_ref.snapshot(from_snapshot)
    depth = 0
    while snapshot is not None and (max_depth is None or depth < max_depth):
        depth += 1
        yield snapshot
        parent = snapshot.parentId()
        snapshot = table_ref.snapshot(parent) if parent is not None else None


def find_commit(spark, table: str, commit_id: str) -> int | None:
    """The id of the current-ancestor snapshot whose summary carries `commit_id`, or None (a few
    snapshots deep at most in practice: a compaction may have committed after it)."""
    for snapshot in _ancestors(spark, table, max_depth=200):
        if snapshot.summary().get(COMMIT_ID_KEY) == commit_id:
            return snapshot.snapshotId()
    return None


def find_lineage(spark, table: str, key: str, lineage_id: str, max_depth: int = 200) -> int | None:
    """The id of the current-ancestor snapshot whose summary[`key`] is the JSON of a commit with
    this `id` (a replay's, a repair's), or None."""
    for snapshot in _ancestors(spark, table, max_depth=max_depth):
        if json.loads(snapshot.summary().get(key) or "{}").get("id") == lineage_id:
            return snapshot.snapshotId()
    return None


def main_snapshot(spark, table: str) -> int | None:
    """The id of `table`'s current snapshot (its `main` branch); None for a table with none yet.
    Read from the table's fresh metadata in the driver: a query of `{table}.refs` would be a Spark
    job, which views paid twice per batch."""
    current = load_iceberg_table(spark, table).currentSnapshot()
    return None if current is None else current.snapshotId()


def progress_as_of(spark, table: str, snapshot_id: int | None, key: str) -> str | None:
    """summary[`key`] of the newest snapshot carrying it at or before `snapshot_id` (its ancestry;
    None: the current snapshot's). Walks the loaded metadata in the driver: no Spark job, unlike
    `read_progress`, which is why the per-commit checks use it."""
    for snapshot in _ancestors(spark, table, snapshot_id):
        value = snapshot.summary().get(key)
        if value is not None:
            return value
    return None


def progress_summary_as_of(spark, table: str, snapshot_id: int | None, key: str) -> dict[str, str] | None:
    """The whole summary of the snapshot `progress_as_of` reads `key` from: keys a job commits
    together are read from one commit, never from two."""
    for snapshot in _ancestors(spark, table, snapshot_id):
        summary = dict(snapshot.summary())
        if key in summary:
            return summary
    return None


def exclusive_append_options(validate_from_snapshot: int | None) -> dict[str, str]:
    """DataFrameWriterV2 options that, with `.overwrite(lit(False))`, make an append that fails if any
    other commit added data since `validate_from_snapshot` (None: since the table began).

    Overwriting nothing with serializable isolation makes Iceberg check every data file added since
    that snapshot (its conflict filter becomes "everything"); the snapshot's operation is still
    `append`. Compaction (`replace`) snapshots are not additions, so maintenance never conflicts.
    This is the atomic form of "stored progress still equals this batch's start".
    """
    options = {"isolation-level": "serializable"}
    if validate_from_snapshot is not None:
        options["validate-from-snapshot-id"] = str(validate_from_snapshot)
    return options


_CONCURRENT_APPEND = ("Found conflicting files", "Cannot determine history between starting snapshot")


def is_concurrent_append(exc: BaseException) -> bool:
    """An exclusive append lost: another writer added data since its starting snapshot."""
    return any(marker in str(exc) for marker in _CONCURRENT_APPEND)


REBASES = 20  # commits of other jobs one exclusive append may validate past before it gives up


def adds_no_data(summary: Mapping[str, str]) -> bool:
    """A snapshot that adds no data file (a delete, a metadata-only commit)."""
    return summary.get("added-data-files", "0") == "0" and summary.get("added-delete-files", "0") == "0"


def exclusive_append_past(
    spark,
    table: str,
    write: Callable[[dict[str, str]], None],
    options: dict[str, str],
    passable,
    rebases: int = REBASES,
) -> bool:
    """`write(options)`, an exclusive append (`exclusive_append_options` in `options`). When it
    loses because others appended since the snapshot it validates from, and `passable(summary)` holds
    for every snapshot committed since, validate from the newest and write again: those writers'
    rows cannot overlap this one's (a replay of rejects below an ingest's offsets). Returns False,
    having written nothing, when a snapshot that is not passable is among them (the caller stops,
    or plans again)."""
    for _ in range(rebases):
        try:
            write(options)
            return True
        except Exception as exc:
            if not is_concurrent_append(exc):
                raise
            since = options.get("validate-from-snapshot-id")
            rebased = _newest_if_all(spark, table, int(since) if since else None, passable)
            if rebased is None:
                return False
            log.info("%s: validating past appends that cannot overlap this one's", table)
            options.update(exclusive_append_options(rebased))
    raise RuntimeError(f"{table}: other jobs kept appending; {rebases} attempts lost the race")


def _newest_if_all(spark, table: str, since: int | None, passable) -> int | None:
    """The current snapshot's id if every snapshot after `since` (None: since the table began) along
    the current ancestry is a rewrite (compaction: the same rows, which Iceberg's own validation
    ignores) or `passable(summary)`, else None."""
    current = None
    for snapshot in _ancestors(spark, table, max_depth=1000):
        current = snapshot.snapshotId() if current is None else current
        if snapshot.snapshotId() == since:
            return current
        if snapshot.operation() != "replace" and not passable(dict(snapshot.summary())):
            return None
    return current if since is None else None


def writer_options(properties: Mapping[str, str]) -> dict[str, str]:
    """DataFrameWriterV2 options that put `properties` into the commit's snapshot summary."""
    return {f"snapshot-property.{k}": v for k, v in properties.items()}


class _SqlCallable:
    """A java.util.concurrent.Callable implemented in Python (py4j callback)."""

    def __init__(self, action: Callable[[], object]) -> None:
        self._action = action

    def call(self) -> None:
        self._action()

    class Java:
        implements = ["java.util.concurrent.Callable"]


def with_snapshot_properties(spark, properties: Mapping[str, str], action: Callable[[], object]) -> None:
    """Run SQL writes in `action` so that their commit carries `properties` (e.g. a MERGE).

    Uses Iceberg's CommitMetadata; py4j's pinned threads keep its thread-local intact.
    """
    gateway = spark.sparkContext._gateway
    if gateway._callback_server is None:
        gateway.start_callback_server()
    jvm = spark.sparkContext._jvm
    props = jvm.java.util.HashMap()
    for key, value in properties.items():
        props.put(key, value)
    error_class = jvm.java.lang.Class.forName("java.lang.RuntimeException")
    jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(props, _SqlCallable(action), error_class)


_RETRYABLE = (
    "CommitFailedException",
    "CommitStateUnknownException",
    "database is locked",
    "ValidationException: Found conflicting files",
    "Cannot commit, found new",
    # A copy-on-write MERGE that overlapped a compaction of the same files, or whose runtime
    # filter saw another process's commit: re-planning the MERGE is the fix.
    "Missing required files to delete",
    "Runtime file filtering is not possible",
)


def is_commit_conflict(exc: BaseException) -> bool:
    text = str(exc)
    return any(marker in text for marker in _RETRYABLE)


def retry_commit(attempts: int = 8) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Retry a whole read-transform-commit step when another writer won the race."""
    return retry(
        retry=retry_if_exception(is_commit_conflict),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=0.2, max=5),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )
