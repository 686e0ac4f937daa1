"""Which snapshots expire_snapshots may remove without losing a job's progress (pure, no Spark).

The streaming jobs commit their progress in snapshot summaries (keys starting with `lakehouse.`,
e.g. `lakehouse.kafka.offsets`, `lakehouse.cdc.position`, `lakehouse.views.click-offsets`) and read it
back from the newest current ancestor that carries the key (`snapshot_progress.read_progress`).
expire_snapshots removes every snapshot strictly older than `older_than`, whatever `retain_last`
says, so `older_than` is capped at the oldest of those snapshots: none of them can go. A key that
another, newer one supersedes (`progress_keys.SUPERSEDED_BY`: a CDC table's finished snapshot) is not
kept: it would pin every later snapshot of the table for good.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from jobs.common import progress_keys

PROGRESS_PREFIX = progress_keys.PREFIX  # every key in jobs/common/progress_keys.py


@dataclass(frozen=True)
class SnapshotInfo:
    snapshot_id: int
    committed_ms: int
    is_current_ancestor: bool
    made_current_ms: int | None
    summary_keys: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ExpiryPlan:
    older_than_ms: int
    protected: dict[str, SnapshotInfo]  # progress key -> the snapshot `read_progress` returns
    capped: bool  # older_than is earlier than the retention alone would put it


def snapshots_from_metadata(metadata: dict) -> list[SnapshotInfo]:
    """The table's snapshots from its metadata JSON (Iceberg's table metadata file format), as the
    `snapshots` metadata table left-joined with `history` lists them: one row per entry of the
    snapshot log (each time it was made current), one with no such time for a snapshot not in it,
    and `is_current_ancestor` for a logged snapshot on the current snapshot's parent chain."""
    snapshots = {s["snapshot-id"]: s for s in metadata.get("snapshots", [])}
    ancestors, current = set(), metadata.get("current-snapshot-id")
    while current in snapshots and current not in ancestors:
        ancestors.add(current)
        current = snapshots[current].get("parent-snapshot-id")
    made_current: dict[int, list[int]] = {}
    for entry in metadata.get("snapshot-log", []):
        made_current.setdefault(entry["snapshot-id"], []).append(entry["timestamp-ms"])
    found = []
    for snapshot_id, snapshot in snapshots.items():
        keys = frozenset(k for k in snapshot.get("summary", {}) if k.startswith(PROGRESS_PREFIX))
        committed_ms = snapshot["timestamp-ms"]
        for made_ms in made_current.get(snapshot_id, [None]):
            is_ancestor = made_ms is not None and snapshot_id in ancestors
            found.append(SnapshotInfo(snapshot_id, committed_ms, is_ancestor, made_ms, keys))
    return found


def progress_snapshots(
    snapshots: Iterable[SnapshotInfo], prefix: str = PROGRESS_PREFIX
) -> dict[str, SnapshotInfo]:
    """Per summary key starting with `prefix`: the newest current ancestor carrying it, in the order
    `read_progress` uses (made current, then committed)."""
    newest: dict[str, SnapshotInfo] = {}

    def order(snap: SnapshotInfo) -> tuple[int, int]:
        return (snap.made_current_ms or 0, snap.committed_ms)

    for snap in snapshots:
        if not snap.is_current_ancestor:
            continue
        for key in snap.summary_keys:
            best = newest.get(key)
            if key.startswith(prefix) and (best is None or order(snap) > order(best)):
                newest[key] = snap
    # A finished CDC snapshot's progress, superseded by the table's own position: nothing reads it.
    for key, successor in progress_keys.SUPERSEDED_BY.items():
        if key in newest and successor in newest and order(newest[successor]) >= order(newest[key]):
            del newest[key]
    return newest


def expiry_plan(snapshots: Iterable[SnapshotInfo], now_ms: int, retain_hours: float) -> ExpiryPlan:
    """`older_than` for expire_snapshots: now minus the retention, capped at the commit time of the
    oldest progress snapshot."""
    retention_cutoff = now_ms - int(retain_hours * 3_600_000)
    protected = progress_snapshots(snapshots)
    cutoff = min([retention_cutoff, *(s.committed_ms for s in protected.values())])
    return ExpiryPlan(cutoff, protected, cutoff < retention_cutoff)
