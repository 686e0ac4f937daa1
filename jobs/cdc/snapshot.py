"""Initial snapshot (and `--resync`): chunked, lock-free, resumable; the same path on RDS and locally.

**Position.** The snapshot's position B is the binlog end read *before* a barrier: one committed
write of CDC's own row (`source_db.write_barrier`). Commits become visible in binlog order (MySQL's
`binlog_order_commits`, checked at start; MariaDB always), so once the barrier's commit returns,
every transaction written to the binlog before it - all of those up to B - is visible to any read
that starts later. No lock, no RELOAD, no long transaction: the CDC user needs SELECT and the
barrier row, exactly what RDS grants it (`infra/seed_data.py`).

**Chunks.** The rows are read in primary-key order, a chunk at a time (`source_db.read_chunk`: one
autocommit statement each, so no read view outlives a chunk and the source keeps no undo for the
snapshot). Each chunk sees the source at some moment after B. The table's stored position is B,
so the tail replays every change after B, each key taking its last change (full row images): a key
changed after B ends as its last change, a key not changed after B was read as it is at B. So the
table converges to the source however the chunks and the writes interleave.

**Ranges.** A key of one integer column may be cut into ranges read side by side (`readers`):
(None, p1], (p1, p2], …, (pn, None). They are disjoint and each is read in increasing key order,
so a key is read at most once; the open first and last ranges take keys written outside MIN..MAX
during the snapshot. The argument above holds for every chunk of every range.

**Resume.** Chunks are appended to a staging table (`<target>__cdc_snapshot_<id>`), each commit
carrying B, each range's last key committed (and whether it is done) and the counts
(`lakehouse.cdc.snapshot`). A job killed mid-snapshot resumes each range after its last committed
key with the same B (if the source still has B's binlog; otherwise it starts over). The rows are
read and converted to Arrow by a process per range (`chunk_reader`) while the driver commits the
previous ones: they never wait on one Python lock.

**Publish.** A target that does not exist yet becomes the staging table, renamed (no copy), then
stores B in a commit of its own. An existing target (a `--resync`) gets the staging table's rows in
one overwrite commit that stores B (readers see the old table until then); the staging table is
dropped. Each staging table has a name (and so a directory) of its own, so a later one never shares
the directory of a table it became.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.cdc import position_commit, source_db, target_table
from jobs.cdc.binlog_reader import BinlogPosition
from jobs.cdc.chunk_reader import (
    FULL_SPEED,
    ChunkReader,
    Pace,
    Piece,
    keys_from_json,
    keys_to_json,
    read_pieces,
    rows_table,
)
from jobs.cdc.schema_mapping import spark_schema
from jobs.cdc.source_db import SourceTable
from jobs.cdc.table_selection import STAGING_SUFFIX
from jobs.cdc.target_table import POSITION_KEY, TABLE_PROPERTIES
from jobs.common import progress_keys
from jobs.common.arrow_frames import arrow_file_frame, arrow_frame
from jobs.common.fault_injection import crash_point
from jobs.common.lake_tables import load_iceberg_table
from jobs.common.metrics import NO_METRICS, BatchMetrics, MetricsSink
from jobs.common.snapshot_progress import (
    COMMIT_ID_KEY,
    find_commit,
    read_progress,
    retry_commit,
    writer_options,
)

log = logging.getLogger("cdc_snapshot")

PROGRESS_KEY = progress_keys.CDC_SNAPSHOT
CHUNK_ROWS = 10_000  # one SELECT; small enough that its read view is short on any table
COMMIT_ROWS = 200_000  # rows per staging commit: what a kill -9 can cost to read again
TASK_ROWS = 50_000  # at least, per Spark task writing a piece (and so per data file it adds)
READERS = 2  # reader processes side by side: 1.2-1.3x one, on 2 cores (`python -m bench cdc_snapshot`)
DESCRIBE_ATTEMPTS = 5  # describing again while a migration keeps changing the columns


@dataclass(frozen=True)
class KeyRange:
    """The keys one reader reads: after key `after`, up to key `upto` included (None: unbounded).
    In a snapshot's progress, `after` is the last key committed and `done` says nothing is left."""

    after: tuple | None = None
    upto: tuple | None = None
    done: bool = False

    def to_json(self) -> dict:
        return {"after": keys_to_json(self.after), "upto": keys_to_json(self.upto), "done": self.done}

    @classmethod
    def from_json(cls, data: dict) -> KeyRange:
        return cls(keys_from_json(data["after"]), keys_from_json(data.get("upto")), data.get("done", False))


WHOLE_TABLE = (KeyRange(),)


def key_ranges(points: list[tuple]) -> tuple[KeyRange, ...]:
    """The ranges that `points` (ascending keys) cut the table into: (None, p1], (p1, p2], …"""
    bounds = [None, *points, None]
    return tuple(KeyRange(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1))


@dataclass(frozen=True)
class SnapshotProgress:
    position: BinlogPosition  # B: the table is stored at it once the snapshot is done
    ranges: tuple[KeyRange, ...]  # each reader's range, after its last key committed to staging
    rows: int
    chunks: int
    # Stored by a version before ranges, whose last key may compare out of the key's order (an ENUM
    # or SET as text, a FLOAT rounded, a decimal as text): such a snapshot starts over.
    earlier_version: bool = False

    def advanced(self, index: int, piece: Piece) -> SnapshotProgress:
        """This progress once `piece` of range `index` is committed."""
        ranges = list(self.ranges)
        ranges[index] = replace(ranges[index], after=piece.after, done=piece.done)
        rows, chunks = self.rows + piece.rows, self.chunks + piece.chunks
        return SnapshotProgress(self.position, tuple(ranges), rows, chunks, self.earlier_version)

    def to_json(self) -> str:
        data = {
            "position": json.loads(self.position.to_json()),
            "ranges": [r.to_json() for r in self.ranges],
            "rows": self.rows,
            "chunks": self.chunks,
        }
        if len(self.ranges) == 1 and self.ranges[0].upto is None:
            # One range, the whole table: an earlier version (rolled back to) resumes it as well.
            # Several ranges it cannot: without `after` it stops with an error, not wrongly.
            data["after"] = keys_to_json(self.ranges[0].after)
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> SnapshotProgress:
        data = json.loads(text)
        # An earlier version stored one last key (`after`): one range, the whole table.
        ranges = data["ranges"] if "ranges" in data else [{"after": data["after"]}]
        return cls(
            BinlogPosition.from_json(json.dumps(data["position"])),
            tuple(KeyRange.from_json(r) for r in ranges),
            data["rows"],
            data["chunks"],
            earlier_version="ranges" not in data,
        )


def new_staging_table(target: str) -> str:
    return f"{target}{STAGING_SUFFIX}_{uuid.uuid4().hex[:8]}"


def staging_tables(spark, target: str) -> list[str]:
    """The staging tables of `target`'s snapshots (normally none, or one being filled)."""
    catalog_namespace, _, name = target.rpartition(".")
    prefix = f"{name}{STAGING_SUFFIX}_".lower()
    if not spark.catalog.databaseExists(catalog_namespace):
        return []
    rows = spark.sql(f"SHOW TABLES IN {catalog_namespace}").collect()
    return sorted(
        f"{catalog_namespace}.{r['tableName']}" for r in rows if r["tableName"].lower().startswith(prefix)
    )


def schema_matches(spark, target: str, source: SourceTable) -> bool:
    have = [(n.lower(), t) for n, t in target_table.target_columns(spark, target)]
    want = [(c.name.lower(), c.spark_type) for c in source.columns]
    return sorted(have) == sorted(want)


def rows_frame(spark, source: SourceTable, rows: list[tuple]):
    """Source rows (as `source_db.read_chunk` returns them) as the DataFrame a snapshot writes."""
    return arrow_frame(spark, rows_table(source, rows), frame_schema(source))


def frame_schema(source: SourceTable) -> T.StructType:
    columns = [(c.name, c.spark_type) for c in source.columns]
    return T.StructType(
        [T.StructField(f.name, f.dataType, f.name not in source.key) for f in spark_schema(columns).fields]
    )


def _stored_progress(spark, staging: str) -> SnapshotProgress | None:
    stored = read_progress(spark, staging, PROGRESS_KEY)
    return SnapshotProgress.from_json(stored) if stored is not None else None


def _resumable(spark, target: str, source: SourceTable, binlog_alive) -> tuple[str, SnapshotProgress] | None:
    """The staging table and progress of an interrupted snapshot of `target`, if one can go on (the
    newest, if a crash left several); every other staging table is dropped."""
    candidates = []
    for staging in staging_tables(spark, target):
        progress = _stored_progress(spark, staging)
        problem = (
            "it stored no progress"
            if progress is None
            else "it was built and caught up already (a copy made beside the stream)"
            if read_progress(spark, staging, POSITION_KEY) is not None
            else "the source table's columns changed since"
            if not schema_matches(spark, staging, source)
            else "an earlier version stored it, with a last key MySQL may compare out of the key's order"
            if progress.earlier_version
            else binlog_alive(progress.position)
        )
        if problem is None:
            candidates.append((progress.position.order, staging, progress))
        else:
            log.warning("%s: an interrupted snapshot cannot be resumed (%s); dropped", staging, problem)
            drop_staging(spark, staging, target)
    candidates.sort(key=lambda c: c[0])
    for _, older, _ in candidates[:-1]:
        drop_staging(spark, older, target)
    return (candidates[-1][1], candidates[-1][2]) if candidates else None


@dataclass(frozen=True)
class SnapshotResult:
    position: BinlogPosition  # B, stored with the table
    source: SourceTable  # the source table as described for the snapshot
    described_before_position: bool  # `source` is the shape at B (False for a resumed snapshot)


def snapshot_table(
    spark, conn, source_schema: str, source_name: str, target: str, **options
) -> SnapshotResult:
    """Load the source table into `target` (`build_staging`, then `publish`); returns the position
    stored with it (B)."""
    built = build_staging(spark, conn, source_schema, source_name, target, **options)
    publish(spark, built, target)
    return built.result


class SnapshotCancelled(RuntimeError):
    """A snapshot built beside the stream was called off (its table changed, the job stops)."""


@dataclass(frozen=True)
class BuiltSnapshot:
    """A staging table holding every source row as of `progress.position` (B), not yet published."""

    staging: str
    progress: SnapshotProgress
    source: SourceTable
    described_before_position: bool

    @property
    def result(self) -> SnapshotResult:
        return SnapshotResult(self.progress.position, self.source, self.described_before_position)


def build_staging(
    spark,
    conn,
    source_schema: str,
    source_name: str,
    target: str,
    binlog_alive=lambda position: None,
    chunk_rows: int = CHUNK_ROWS,
    commit_rows: int = COMMIT_ROWS,
    resume: bool = True,
    reader_connection: dict | None = None,
    metrics: MetricsSink = NO_METRICS,
    readers: int = READERS,
    cancelled: threading.Event | None = None,
    on_position=lambda position: None,
    pace: Pace = FULL_SPEED,
    max_tasks: int | None = None,
) -> BuiltSnapshot:
    """Read the source table into a staging table beside `target`; returns it with its position B.

    `binlog_alive(position)` says why the source can no longer replay from `position` (None: it can);
    an interrupted snapshot resumes only from a position the source still has. `resume=False` (a
    re-snapshot while the binlog reader is already past older positions) always starts afresh.
    `reader_connection`: the source's connection settings, for reading in processes of their own.
    `readers`: ranges of keys read side by side, when the key is one integer column
    (`source_db.split_points`) and the table has a commit's rows per range (InnoDB's estimate); a
    resumed snapshot keeps the ranges it had. `metrics` gets each commit's rows and seconds (job
    `cdc-snapshot`): a long snapshot's rate on the dashboard, not only in the log. `cancelled`, once
    set, stops the copy at the next piece (`SnapshotCancelled`; the staging table stays, for the next
    start's clean-up). `on_position(B)` is called as soon as B is known, before the copy. `pace`:
    the reader processes'; `max_tasks`: Spark tasks writing a piece (default: one per slot; a piece
    of more rows than `commit_rows` may take one more)."""
    source = source_db.describe_table(conn, source_schema, source_name)
    columns = [(c.name, c.spark_type) for c in source.columns]  # UnsupportedType before any write
    if not resume:
        for stale in staging_tables(spark, target):
            drop_staging(spark, stale, target)
    resumable = _resumable(spark, target, source, binlog_alive)
    estimate = source_db.estimated_rows(conn, source)  # InnoDB's: for the ranges and the progress
    if resumable is not None:
        staging, progress = resumable
        log.info(
            "snapshot %s: resuming after %d rows in %d chunks (position %s)",
            source.qualified, progress.rows, progress.chunks, progress.position,
        )  # fmt: skip
    else:
        for _ in range(DESCRIBE_ATTEMPTS):
            position = BinlogPosition(*source_db.master_position(conn))
            source_db.write_barrier(conn)  # everything up to `position` is now visible to the reads
            # An ALTER committed between the description and `position` is before the position (never
            # replayed) and its columns are not in the description (never read): describe again.
            again = source_db.describe_table(conn, source_schema, source_name)
            if again == source:
                break
            log.info("snapshot %s: its columns changed as it started; described again", source.qualified)
            source, columns = again, [(c.name, c.spark_type) for c in again.columns]
        else:
            raise RuntimeError(
                f"snapshot {source.qualified}: its columns changed {DESCRIBE_ATTEMPTS} times as it started; "
                "run it again when no migration runs"
            )
        staging = new_staging_table(target)
        # A reader per range, and at least a commit's rows per range (a small table: one reader).
        parts = min(readers, estimate // commit_rows)
        progress = SnapshotProgress(position, key_ranges(source_db.split_points(conn, source, parts)), 0, 0)
    on_position(progress.position)
    began = time.monotonic()
    # Reader processes start reading at once: a new staging table is created meanwhile.
    pieces = piece_frames(
        spark, conn, source, progress.ranges, chunk_rows, commit_rows, reader_connection, pace, max_tasks
    )
    with contextlib.closing(pieces):
        if resumable is None:
            target_table.create_iceberg_table(spark, staging, columns, source.key)
        progress = _copy_chunks(source, staging, progress, pieces, estimate, metrics, target, cancelled)
    # The reader process read with a connection of its own: this one sat idle for the whole copy,
    # maybe past the server's wait_timeout.
    conn.ping(reconnect=True)
    log.info(
        "snapshot %s -> %s: %s rows in %d chunks at %s (%.1f s)",
        source.qualified, staging, f"{progress.rows:,}", progress.chunks, progress.position,
        time.monotonic() - began,
    )  # fmt: skip
    return BuiltSnapshot(staging, progress, source, described_before_position=resumable is None)


def staging_positions(spark, target: str) -> list[BinlogPosition]:
    """The positions (B) of `target`'s interrupted snapshots: where one that is resumed reads from."""
    found = (
        _stored_progress(spark, staging)
        for staging in staging_tables(spark, target)
        if read_progress(spark, staging, POSITION_KEY) is None  # caught up already: not resumed
    )
    return [progress.position for progress in found if progress is not None]


def drop_finished_staging(spark, target: str, stored: BinlogPosition) -> None:
    """A staging table left by a snapshot that was published (a kill -9 before the drop) goes; one
    of an interrupted `--resync` stays, for the next `--resync` to resume."""
    for staging in staging_tables(spark, target):
        progress = _stored_progress(spark, staging)
        if progress is None or progress.position.order <= stored.order:
            drop_staging(spark, staging, target)
            log.info("%s: dropped the staging table of a finished snapshot", staging)
        elif read_progress(spark, staging, POSITION_KEY) is not None:  # caught up: built afresh
            log.warning(
                "%s: an interrupted re-snapshot of %s had caught up; `--resync` builds it afresh",
                staging, target,
            )  # fmt: skip
        else:
            log.warning(
                "%s: an interrupted re-snapshot of %s is waiting; `--resync` resumes it", staging, target
            )


def _copy_chunks(
    source: SourceTable,
    staging: str,
    progress: SnapshotProgress,
    pieces: Iterator[tuple[DataFrame, Piece, int]],
    estimated_rows: int,
    metrics: MetricsSink,
    target: str,
    cancelled: threading.Event | None = None,
) -> SnapshotProgress:
    """Append the rest of the table (`pieces` of `progress.ranges`, from `piece_frames`) to
    `staging`, one commit per piece, each storing every range's last key."""
    estimate = max(estimated_rows, progress.rows)
    began, rows_at_start = time.monotonic(), progress.rows
    waited = time.monotonic()
    for frame, piece, index in pieces:
        if cancelled is not None and cancelled.is_set():
            raise SnapshotCancelled(f"snapshot {source.qualified} called off after {progress.rows:,} rows")
        progress = progress.advanced(index, piece)
        appending = time.monotonic()
        _append(staging, frame, progress)
        crash_point("cdc.snapshot-commit")
        committed = time.monotonic()
        metrics.record(
            BatchMetrics(
                job="cdc-snapshot",
                table=target.split(".", 1)[-1],
                records_in=piece.rows,
                batch_seconds=committed - waited,
                commit_seconds=committed - appending,
            )
        )
        log.debug(
            "snapshot %s: waited %.2f s for %d rows (its reader rested %.2f s), committed them in %.2f s",
            source.qualified, appending - waited, piece.rows, piece.rested, committed - appending,
        )  # fmt: skip
        done = all(r.done for r in progress.ranges)
        _log_progress(source, progress, estimate, began, rows_at_start, done)
        waited = time.monotonic()
    return progress


def piece_frames(
    spark,
    conn,
    source: SourceTable,
    ranges: Sequence[KeyRange],
    chunk_rows: int,
    piece_rows: int,
    reader_connection: dict | None,
    pace: Pace = FULL_SPEED,
    max_tasks: int | None = None,
) -> Iterator[tuple[DataFrame, Piece, int]]:
    """The rows of the key `ranges` not done, as (DataFrame, piece, index of its range): one
    DataFrame per piece of about `piece_rows` rows, each already in the JVM, a range's pieces in key
    order. With `reader_connection` (connection settings) a process per range (`chunk_reader`),
    started at once, reads and converts the next pieces while the caller uses this one, pieces
    coming as they are ready; without, `conn` reads the ranges in turn. Empty pieces are skipped.
    Close the iterator (`contextlib.closing`): that stops the readers, also before the first piece.
    `pace`: the reader processes' (`ChunkReader`); `max_tasks`: Spark tasks per piece of
    `piece_rows` (one more for a piece that ends past it, in a chunk)."""
    todo = [(index, key_range) for index, key_range in enumerate(ranges) if not key_range.done]
    if reader_connection is None:
        return _pieces_in_turn(spark, conn, source, todo, chunk_rows, piece_rows, pace.rest_ratio)
    # A piece is one task per Arrow batch: as many tasks as cores (or `max_tasks`), but no tiny files.
    tasks = min(spark.sparkContext.defaultParallelism, max_tasks or spark.sparkContext.defaultParallelism)
    batch_rows = max(TASK_ROWS, -(-piece_rows // tasks))
    temp_dir, schema = spark.sparkContext._temp_dir, frame_schema(source)
    readers: list[tuple[int, ChunkReader]] = []
    try:
        for index, key_range in todo:
            reader = ChunkReader(
                reader_connection, source, key_range.after, chunk_rows, piece_rows, temp_dir, batch_rows,
                key_range.upto, pace,
            )  # fmt: skip
            readers.append((index, reader))
        return _ReaderPieces(spark, readers, schema)
    except BaseException:
        _close_all(reader for _, reader in readers)
        raise


def _close_all(readers) -> None:
    """Close every reader, even when closing one fails (its error is raised after)."""
    with contextlib.ExitStack() as stack:
        for reader in readers:
            stack.callback(reader.close)


def _pieces_in_turn(spark, conn, source: SourceTable, todo, chunk_rows: int, piece_rows: int, rest: float):
    for index, key_range in todo:
        pieces = read_pieces(conn, source, key_range.after, chunk_rows, piece_rows, key_range.upto, rest)
        for rows, last_key, chunks, done, rested in pieces:
            if rows:
                piece = Piece("", last_key, len(rows), chunks, done, rested)
                yield rows_frame(spark, source, rows), piece, index


class _ReaderPieces:
    """`piece_frames` from reader processes, a thread each passing its pieces on as they come (a
    class, not a generator: `close` must stop the processes even when no piece was taken, and a
    generator not started runs no `finally`)."""

    def __init__(self, spark, readers: list[tuple[int, ChunkReader]], schema: T.StructType) -> None:
        self._spark, self._schema = spark, schema
        self._readers = [reader for _, reader in readers]
        self._arrived: queue.Queue = queue.Queue()
        self._reading = len(readers)
        for index, reader in readers:
            threading.Thread(target=self._pass_on, args=(index, reader), daemon=True).start()

    def _pass_on(self, index: int, reader: ChunkReader) -> None:
        try:
            for piece in reader:
                self._arrived.put((index, piece, None))
        except BaseException as exc:  # noqa: BLE001 - raised in the driver's thread
            self._arrived.put((index, None, exc))
        else:
            self._arrived.put((index, None, None))  # the range is read

    def __iter__(self) -> _ReaderPieces:
        return self

    def __next__(self) -> tuple[DataFrame, Piece, int]:
        while self._reading:
            index, piece, error = self._arrived.get()
            if error is not None:
                raise error
            if piece is None:
                self._reading -= 1
                continue
            if not piece.rows:
                os.unlink(piece.path)
                continue
            frame = arrow_file_frame(self._spark, piece.path, self._schema, in_tasks=True)
            os.unlink(piece.path)  # in the JVM now; its reader may write the next one
            return frame, piece, index
        raise StopIteration

    def close(self) -> None:
        _close_all(self._readers)


def _append(staging: str, frame, progress: SnapshotProgress) -> None:
    spark = frame.sparkSession
    options = writer_options({PROGRESS_KEY: progress.to_json()})
    attempts = 0

    @retry_commit()
    def commit() -> None:
        nonlocal attempts
        # A retry after an unknown outcome: the commit is recognised by the progress it stored.
        # (Not read before the first attempt: 0.2 s per commit, and no earlier one can hold it.)
        if attempts and read_progress(spark, staging, PROGRESS_KEY) == progress.to_json():
            return
        attempts += 1
        frame.writeTo(staging).options(**options).append()

    commit()


def _log_progress(
    source: SourceTable,
    progress: SnapshotProgress,
    estimate: int,
    began: float,
    rows_at_start: int,
    done: bool,
) -> None:
    seconds = max(time.monotonic() - began, 1e-6)
    rate = (progress.rows - rows_at_start) / seconds
    total = max(estimate, progress.rows)
    left = "" if done or rate <= 0 else f", ~{(total - progress.rows) / rate:.0f} s left"
    log.info(
        "snapshot %s: %s rows in %d chunks%s (%.0f rows/s%s)",
        source.qualified,
        f"{progress.rows:,}",
        progress.chunks,
        "" if done else f" of ~{total:,} ({100 * progress.rows / max(total, 1):.0f}%)",
        rate,
        left,
    )


def publish(spark, built: BuiltSnapshot, target: str, position: BinlogPosition | None = None) -> None:
    """Make the staging table's rows the target's, storing `position` (default B) with them; the
    staging table goes. Readers see the old rows until the one commit that replaces them."""
    source, staging = built.source, built.staging
    position = position or built.progress.position
    if not target_table.table_exists(spark, target):
        # Nothing to replace: the staging table becomes the target (no copy), then stores B.
        # The new name is within the same catalog: `namespace.table` (a catalog part would be read
        # as a namespace).
        spark.sql(f"ALTER TABLE {staging} RENAME TO {target.split('.', 1)[1]}")
        crash_point("cdc.snapshot-renamed")
        position_commit.commit_progress_only(spark, target, {POSITION_KEY: position.to_json()})
        target_table.configure_table(spark, target, source.key, source.qualified)
        return
    if _swap_files(spark, staging, target, {POSITION_KEY: position.to_json()}):
        crash_point("cdc.snapshot-published")
        drop_staging(spark, staging, target, took_files=True)  # its data files are the target's now
        target_table.configure_table(spark, target, source.key, source.qualified)
        return
    replace = not schema_matches(spark, target, source)
    # A replaced table keeps its write mode (target_table.write_mode: merge-on-read stays so).
    kept = dict(spark.sql(f"SHOW TBLPROPERTIES {target}").collect()) if replace else {}
    modes = {k: kept[k] for k in target_table.WRITE_MODE_KEYS if k in kept}
    frame = spark.table(staging)
    options = writer_options({POSITION_KEY: position.to_json()})

    @retry_commit()
    def commit() -> None:
        writer = frame.writeTo(target).options(**options)
        if replace:
            # Source shape changed (resync after DROP/RENAME/type change): replace the table
            # atomically; readers see the old version until the new one is committed.
            writer = writer.using("iceberg")
            for k, v in {**TABLE_PROPERTIES, **modes}.items():
                writer = writer.tableProperty(k, v)
            writer.createOrReplace()
        else:
            writer.overwrite(F.lit(True))

    commit()
    crash_point("cdc.snapshot-published")
    drop_staging(spark, staging, target, took_files=False)  # its rows were copied
    target_table.configure_table(spark, target, source.key, source.qualified)


def _live_files(table) -> list | None:
    """The data files of `table`'s current snapshot (org.apache.iceberg.DataFile); None when one has
    delete files."""
    files, seen = [], set()
    tasks = table.newScan().planFiles()
    try:
        iterator = tasks.iterator()
        while iterator.hasNext():
            task = iterator.next()
            if task.deletes().size():
                return None
            data = task.file()
            if data.location() not in seen:
                seen.add(data.location())
                files.append(data)
    finally:
        tasks.close()
    return files


def drop_staging(spark, staging: str, target: str, took_files: bool | None = None) -> None:
    """Drop a staging table of `target`'s: with its files (PURGE), unless `target` took them in a
    swap (`_swap_files`; a crash can leave the staging table behind): then only its metadata goes.
    `took_files`: known to the caller (the swap, a copy of the rows); None: looked up."""
    if not target_table.table_exists(spark, staging):
        return
    table = load_iceberg_table(spark, staging)
    shared = took_files if took_files is not None else _target_took_files(spark, staging, target)
    if not shared:
        spark.sql(f"DROP TABLE IF EXISTS {staging} PURGE")
        return
    spark.sql(f"DROP TABLE IF EXISTS {staging}")
    _delete_metadata(spark, table)


def _target_took_files(spark, staging: str, target: str) -> bool:
    """Whether `target` holds any of the staging table's data files (a swap added them as they are).
    By the files themselves, not by the staging table's location as a text prefix: `file:///w/…`
    has data files `file:/w/…` (the rehearsal's warehouse), and a prefix that never matched PURGEd
    the files the target had taken. When this cannot be told (unreadable metadata), the files stay:
    litter, where a wrong PURGE would lose the target's rows."""
    if not target_table.table_exists(spark, target):
        return False
    try:
        paths = [r.file_path for r in spark.sql(f"SELECT file_path FROM {staging}.files").collect()]
        if not paths:
            return False
        listed = ", ".join("'" + path.replace("'", "''") + "'" for path in paths)
        return bool(
            spark.sql(
                f"SELECT 1 FROM {target}.all_data_files WHERE file_path IN ({listed}) LIMIT 1"
            ).collect()
        )
    except Exception as exc:  # noqa: BLE001 - kept, not purged
        log.warning("%s: cannot tell whether %s took its files (%s); its files stay", staging, target, exc)
        return True


def _delete_metadata(spark, table) -> None:
    """A dropped staging table's metadata folder (its data files are another table's now)."""
    folder = table.location().rstrip("/") + "/metadata/"
    prefixes = spark.sparkContext._jvm.java.lang.Class.forName(
        "org.apache.iceberg.io.SupportsPrefixOperations"
    )
    try:
        if prefixes.isInstance(table.io()):
            table.io().deletePrefix(folder)
    except Exception as exc:  # noqa: BLE001 - litter, not a failure: a few small files stay
        log.warning("%s: could not delete the dropped staging table's metadata (%s)", folder, exc)


def _swap_files(spark, staging: str, target: str, properties: dict[str, str]) -> bool:
    """The staging table's data files replace the target's in one commit carrying `properties`: no
    row is copied (a 1M-row table's overwrite holds the stream's batches up for seconds). Only when
    both are unpartitioned and have the same schema, field ids included (the files are read by
    id), and the staging table has no delete files; returns False otherwise, nothing written."""
    source, lake = load_iceberg_table(spark, staging), load_iceberg_table(spark, target)
    # The columns, ids, types and nullability (not the identifier fields: the target's stay its own).
    if not (lake.schema().asStruct().equals(source.schema().asStruct()) and lake.spec().isUnpartitioned()
            and source.spec().isUnpartitioned()):  # fmt: skip
        return False
    added = _live_files(source)
    if added is None:
        return False
    commit_id = uuid.uuid4().hex
    attempts = 0

    @retry_commit()
    def commit() -> None:
        nonlocal attempts
        if attempts and find_commit(spark, target, commit_id) is not None:
            return  # an attempt whose outcome was unknown landed
        attempts += 1
        # Every row live at commit time goes (a compaction racing the swap included): not a list of
        # files planned before, whose rewritten replacements would stay beside the copy.
        everything = spark.sparkContext._jvm.org.apache.iceberg.expressions.Expressions.alwaysTrue()
        overwrite = load_iceberg_table(spark, target).newOverwrite().overwriteByRowFilter(everything)
        for data in added:
            overwrite = overwrite.addFile(data)
        for key, value in {**properties, COMMIT_ID_KEY: commit_id}.items():
            overwrite = overwrite.set(key, value)
        overwrite.commit()

    commit()
    return True
