"""Job progress stored in Iceberg snapshot summaries: committed atomically with the data.

A job that consumes a source (Kafka offsets, a binlog position, a click-table snapshot) writes its
position into the summary of the same snapshot that holds the rows. On start it walks the table's
current snapshot ancestry back to the newest snapshot that carries its key, so snapshots made by
others (compaction, expiry, another writer) in between do not hide it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

from tenacity import (
    before_sleep_log,
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

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
