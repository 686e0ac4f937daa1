"""Commits that move a table's stored binlog position: exactly once, one writer.

Every commit (a MERGE, a progress-only commit) is optimistic: inside the retried commit the table's
stored position must still equal the batch's start. If it already equals the batch's end and carries
this commit's id, an earlier attempt whose outcome was unknown landed: nothing more is written.
Anything else means another CDC job committed to the table, and this one stops. After the commit, the
snapshot it replaced must still hold the start position (closes the window between check and commit).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

from jobs.cdc.binlog_reader import BinlogPosition
from jobs.cdc.target_table import POSITION_KEY
from jobs.common.lake_tables import load_iceberg_table
from jobs.common.snapshot_progress import (
    COMMIT_ID_KEY,
    ConcurrentWriterError,
    find_commit,
    progress_as_of,
    retry_commit,
)


def stored_position(spark, target: str) -> BinlogPosition | None:
    value = progress_as_of(spark, target, None, POSITION_KEY)
    return BinlogPosition.from_json(value) if value is not None else None


def other_writer(
    target: str, stored: BinlogPosition | None, start: BinlogPosition | None
) -> ConcurrentWriterError:
    return ConcurrentWriterError(
        f"{target}: another CDC job committed to this table (stored binlog position {stored}, this "
        f"job's batch starts at {start}); this job stops without committing: run one CDC job per table"
    )


def _parent_id(spark, target: str, snapshot_id: int) -> int | None:
    return load_iceberg_table(spark, target).snapshot(snapshot_id).parentId()


def commit_position(
    spark,
    target: str,
    start: BinlogPosition | None,
    end: BinlogPosition,
    write: Callable[[Mapping[str, str]], None],
) -> bool:
    """Run `write(summary properties)` as the commit taking `target` from `start` to `end`.

    Returns False if nothing was written because this commit had already landed.
    """
    commit_id = uuid.uuid4().hex
    properties = {POSITION_KEY: end.to_json(), COMMIT_ID_KEY: commit_id}

    @retry_commit()
    def attempt() -> bool:
        stored = stored_position(spark, target)
        if stored == end and find_commit(spark, target, commit_id) is not None:
            return False  # an attempt reported as failed/unknown did land
        if stored != start:
            raise other_writer(target, stored, start)
        write(properties)
        return True

    written = attempt()
    landed = find_commit(spark, target, commit_id)
    parent = _parent_id(spark, target, landed) if landed is not None else None
    before = progress_as_of(spark, target, parent, POSITION_KEY) if parent is not None else None
    if (BinlogPosition.from_json(before) if before else None) != start:
        raise other_writer(target, BinlogPosition.from_json(before) if before else None, start)
    return written


def commit_progress_only(spark, target: str, properties: Mapping[str, str]) -> None:
    """An empty append whose snapshot summary carries `properties` (no data files change)."""
    append = load_iceberg_table(spark, target).newAppend()
    for key, value in properties.items():
        append = append.set(key, value)
    append.commit()
