"""Re-snapshot one table beside the stream: the other tables' batches never wait for it.

A `--resync`, a table created (or replaced) in the source while the job runs, or a column change
the source applied without row events: the table's new copy is built in a thread of its own while
the driver goes on with the batches (`sync.py` calls `step` between two of them):

1. **build**: the snapshot's chunked, lock-free read into a staging table beside the live one
   (`snapshot.build_staging`), position B. Meanwhile each batch *holds* the table's changes, in
   binlog order; the live table goes on receiving them too, unless its rows are no longer the
   source's (a replaced table, a stopped one: `applies_live=False`).
2. **catch up** (driver): the held changes after B, each key's last one, are merged into the staging
   table, which then stores the position the driver has read to (`seen_until`).
3. **verify** (thread): the staging table against the source, as `lakehouse verify` compares
   (`reconcile.py`: keys changed in the binlog since count as in flight).
4. **swap** (driver, `sync.py`): caught up once more, the staging table's rows replace the live
   table's in one commit that stores the position (`snapshot.publish`: an overwrite, or a replace
   keeping the table's identity when the columns changed; readers see the old rows until then).

A copy that does not verify is built again (`ATTEMPTS` in all), then the table stops with the
mismatch. A DDL on the table after B calls the build off and starts it again (the staging table's
columns are B's); a DROP ends it. One resync runs at a time, in request order: each has reader
processes and Spark jobs of its own on a box the stream shares.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from jobs.cdc import apply_changes, position_commit, target_table
from jobs.cdc.binlog_reader import BinlogPosition
from jobs.cdc.change_batch import RowChange, last_change_per_key
from jobs.cdc.snapshot import BuiltSnapshot, SnapshotCancelled

log = logging.getLogger("cdc_resync")

ATTEMPTS = 3  # builds of a copy that does not verify, before the table stops
SPARK_POOL = "cdc-resync"  # its Spark jobs' FAIR pool: the batches' jobs are not queued behind them


class Phase(enum.StrEnum):
    QUEUED = "queued"  # waits for the resync before it (one at a time)
    BUILDING = "building"
    BUILT = "built"  # for the driver to catch up, then verify
    VERIFYING = "verifying"
    VERIFIED = "verified"  # for the driver to swap in (or build again)
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Verdict:
    """What the comparison of the staging table with the source found: mismatching keys by kind."""

    compared: int
    mismatches: tuple[tuple[str, int, tuple[str, ...]], ...]  # (kind, count, example keys)
    in_flight: int

    @property
    def clean(self) -> bool:
        return not self.mismatches

    def describe(self) -> str:
        return "; ".join(f"{count} {kind} (e.g. {', '.join(ex)})" for kind, count, ex in self.mismatches)


class BesideStream:
    """One table's re-snapshot beside the stream (see the module's docstring)."""

    def __init__(
        self,
        spark,
        target: str,
        why: str,
        build: Callable[[threading.Event, Callable[[BinlogPosition], None], bool], BuiltSnapshot],
        verify: Callable[[BesideStream], Verdict],
        applies_live: bool,
        floor: BinlogPosition,
        lake_position: BinlogPosition | None,
        hold_from: BinlogPosition | None = None,
        resume: bool = False,
        attempt: int = 1,
        began: float | None = None,
    ) -> None:
        self.spark, self.target, self.why = spark, target, why
        self._build_fn, self._verify_fn = build, verify
        # An interrupted staging table may be resumed: only when the binlog reader started before its B.
        self.resume = resume
        self.applies_live = applies_live  # the live table goes on receiving the changes meanwhile
        # The source's binlog end when the resync was asked for: a DDL up to it is in the copy (a
        # column change makes an interrupted copy not resumable: built afresh, after it).
        self.floor = floor
        # At or before B: `floor`, or the B of the interrupted copy it may resume. Changes after it
        # are held until B is known.
        self.hold_from = hold_from or floor
        # The lake table's stored position the swap expects while it is not applied to (what this
        # job stored last; None: no table, or none stored).
        self.lake_position = lake_position
        self.attempt = attempt
        self.phase = Phase.QUEUED
        self.position: BinlogPosition | None = None  # B, once the build knows it
        self.built: BuiltSnapshot | None = None
        self.staging_position: BinlogPosition | None = None  # the staging table is caught up to it
        self.seen_until: BinlogPosition | None = None  # every batch up to here is held
        self.verdict: Verdict | None = None
        self.error: str | None = None
        self.began = began if began is not None else time.monotonic()  # requested
        # Its place in the queue (copies start in this order): when requested, or later when sent
        # behind another (a parent's copy its rows depend on).
        self.queued_at = self.began
        self._held: list[tuple[BinlogPosition, list[RowChange]]] = []
        # While it is built: the parents' referenced values whose changes cascaded (no row events) to
        # rows a chunk may have read before; found in the built copy (`sync.py`), then emptied.
        # (batch end, foreign key, old values, new values)
        self.cascade_seeds: list[tuple[BinlogPosition, object, set[tuple], set[tuple]]] = []
        self._cancelled = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the thread ------------------------------------------------------------------------

    def start(self) -> None:
        self.phase = Phase.BUILDING
        self._run(self._build)

    def _run(self, work: Callable[[], None]) -> None:
        def body() -> None:
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", SPARK_POOL)
            try:
                work()
            except SnapshotCancelled:
                self.phase = Phase.CANCELLED
            except Exception as exc:  # noqa: BLE001 - the driver stops the table with it
                log.exception("%s: re-snapshot failed", self.target)
                self.error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
                self.phase = Phase.FAILED

        self._thread = threading.Thread(target=body, name=f"resync {self.target}", daemon=True)
        self._thread.start()

    def again(self) -> BesideStream:
        """The next attempt: a copy built afresh."""
        attempt = BesideStream(
            self.spark, self.target, self.why, self._build_fn, self._verify_fn, self.applies_live,
            self.floor, self.lake_position, resume=False, attempt=self.attempt + 1, began=self.began,
            # hold_from: the fresh copy's B is after `floor`
        )  # fmt: skip
        attempt.queued_at = self.queued_at
        return attempt

    def _build(self) -> None:
        built = self._build_fn(self._cancelled, self._learn_position, self.resume)
        self.built, self.position = built, built.progress.position
        self.phase = Phase.BUILT

    def _learn_position(self, position: BinlogPosition) -> None:
        self.position = position

    def _verify(self) -> None:
        self.verdict = self._verify_fn(self)
        self.phase = Phase.VERIFIED

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def cancel(self) -> None:
        """Call the build off at its next piece; its staging table is dropped by the next build."""
        self._cancelled.set()

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- the driver's side ------------------------------------------------------------------

    @property
    def held_after(self) -> BinlogPosition:
        """A transaction ending after this has its changes held (B, or `hold_from` until B is known)."""
        return self.position or self.hold_from

    def hold(self, end: BinlogPosition, changes: list[RowChange]) -> None:
        """The table's changes of the transactions after `held_after` in a batch ending at `end`
        (or none: the batch was read to `end`). A fresh copy still queued keeps none: its B is read
        when it starts, after them (holding them would only grow with the copies before it)."""
        if self.phase is Phase.QUEUED and not self.resume:
            changes = []
        if changes:
            self._held.append((end, changes))
        if self.seen_until is None or end.order > self.seen_until.order:
            self.seen_until = end

    def changed_after(self, position: BinlogPosition) -> bool:
        """A DDL at `position` is not in the copy: after `floor` and after B."""
        after = (
            self.floor if self.position is None or self.position.order < self.floor.order else self.position
        )
        return position.order > after.order

    def unmerged(self) -> list[RowChange]:
        """The held changes the copy does not have yet (a cascade may have reached their rows)."""
        since = self.staging_position or self.held_after
        return [c for end, batch in self._held if end.order > since.order for c in batch]

    def catch_up(self) -> int:
        """Merge the held changes after the staging table's position into it (each key's last one)
        and move its stored position to `seen_until`; returns the changes merged."""
        built = self.built
        start = self.staging_position
        if start is None:  # its first position: B, as the snapshot's progress has it
            self._move(None, built.progress.position)
            start = self.staging_position = built.progress.position
        end = self.seen_until if self.seen_until and self.seen_until.order > start.order else start
        changes = [c for held_end, batch in self._held if held_end.order > start.order for c in batch]
        self._held = [(e, batch) for e, batch in self._held if e.order > end.order]
        if end == start:
            return 0
        latest = last_change_per_key(changes)
        if latest:
            columns = target_table.target_columns(self.spark, built.staging)
            apply_changes.apply_changes(
                self.spark, built.staging, columns, built.source.key, latest, start, end
            )
        else:
            self._move(start, end)
        self.staging_position = end
        return len(latest)

    def _move(self, start: BinlogPosition | None, end: BinlogPosition) -> None:
        """A commit moving the staging table's stored position from `start` to `end`, no rows."""
        staging = self.built.staging
        position_commit.commit_position(
            self.spark, staging, start, end,
            lambda properties: position_commit.commit_progress_only(self.spark, staging, properties),
        )  # fmt: skip

    def start_verify(self) -> None:
        self.phase = Phase.VERIFYING
        self._run(self._verify)
