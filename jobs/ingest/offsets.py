"""Kafka offsets per table: pure rules for moving a table's stored offsets with a batch.

Each table (fact, rejects) stores the next offset to read per partition. A batch reads from the
lower of the two, so it may end below one table's stored offset (a restart whose first read is
short, a capped read): that table then has nothing to store, and its offsets must never go back.
"""

from __future__ import annotations

from collections.abc import Callable

from jobs.common.streaming_job import NeedsOperator

Offsets = dict[int, int]  # partition -> next offset to read


def advance(stored: Offsets, batch_ends: Offsets) -> Offsets:
    """`stored` moved on to the batch's end offsets, never backwards."""
    moved = dict(stored)
    for partition, end in batch_ends.items():
        moved[partition] = max(stored.get(partition, 0), end)
    return moved


def passes(starts: Offsets, batch_ends: Offsets) -> bool:
    """Whether the batch read past a table's start anywhere, i.e. has anything for it to store."""
    return any(end > starts.get(partition, 0) for partition, end in batch_ends.items())


class OffsetsRegressed(NeedsOperator):
    """The broker served offsets below what the tables store: the topic was recreated or truncated."""


def check_read_start(
    topic: str, partition: int, start: int, first_read: int | None, earliest: Callable[[], int]
) -> int:
    """How many records were skipped between a range's start and the first one read: 0 normally,
    or the count that expired unread (retention deleted them before the ingest got there; the
    consumer then resets to the earliest offset). Raises OffsetsRegressed if the first offset read
    lies below the start. `earliest` asks the broker only when there is a gap to explain, since
    transaction markers also leave gaps."""
    if first_read is None or first_read == start:
        return 0
    if first_read < start:
        raise OffsetsRegressed(
            f"{topic}[{partition}] served offset {first_read}, below the stored {start}: the topic was "
            "recreated or truncated, and its new records reuse offsets the lake already holds. Nothing "
            "was written. Point the ingest at new tables (--fact-table/--rejects-table) for the new topic"
        )
    return max(0, min(earliest(), first_read) - start)
