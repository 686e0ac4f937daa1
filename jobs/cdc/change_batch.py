"""Pure reduction of a micro-batch of row changes to the last change per primary key."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

UPSERT = "U"
DELETE = "D"


@dataclass(frozen=True)
class RowChange:
    """One row image from the binlog: an upsert carries the full after-image, a delete the key."""

    op: str  # UPSERT or DELETE
    key: tuple
    row: dict
    before: dict | None = None  # an update's before-image (foreign-key cascades read it)


def row_changes(kind: str, rows: list[dict], key_columns: tuple[str, ...]) -> list[RowChange]:
    """Binlog rows of one event -> RowChanges in order. kind: insert | update | delete.

    An update that changes the primary key becomes a delete of the old key and an upsert of the new.
    """
    out: list[RowChange] = []
    for row in rows:
        if kind == "insert":
            values = row["values"]
            out.append(RowChange(UPSERT, tuple(values[c] for c in key_columns), values))
        elif kind == "delete":
            values = row["values"]
            out.append(RowChange(DELETE, tuple(values[c] for c in key_columns), values))
        else:
            before, after = row["before_values"], row["after_values"]
            old_key = tuple(before[c] for c in key_columns)
            new_key = tuple(after[c] for c in key_columns)
            if old_key != new_key:  # the upsert keeps the before-image too (cascades read old and new)
                out.append(RowChange(DELETE, old_key, before))
            out.append(RowChange(UPSERT, new_key, after, before))
    return out


def last_change_per_key(changes: Iterable[RowChange]) -> list[RowChange]:
    """Keep each key's last change in binlog order (changes arrive in that order).

    Done in Python before Spark sees the batch: it is O(n), and the DataFrame that goes into the
    MERGE then holds one row per key (MERGE rejects several source rows matching one target row).
    """
    latest: dict[tuple, RowChange] = {}
    for change in changes:
        latest.pop(change.key, None)  # re-insert so the dict keeps last-change order
        latest[change.key] = change
    return list(latest.values())
