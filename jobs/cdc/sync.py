"""CDC job: MySQL/MariaDB binlog -> Iceberg dimension tables with MERGE, exactly once.

`lakehouse run cdc` locally; the same module is what the EMR step runs.

* A table with no stored position gets an initial snapshot (`snapshot.py`: chunked, lock-free,
  resumable; stored with a binlog position every chunk's read is past). `--resync TABLE` does the
  same on purpose.
* Then the binlog is tailed from the oldest stored position (by GTID on MariaDB). Each micro-batch
  is reduced per primary key to its last change and applied with one MERGE per table whose commit
  summary carries the binlog position after the batch (`lakehouse.cdc.position`). A transaction at
  or before a table's stored position is skipped for that table, so a restart neither loses nor
  re-applies changes. A table with no changes gets a progress-only commit (at most every
  --progress-seconds) so its position keeps up with the binlog.
* Every commit checks that the stored position is still the batch's start: a second CDC job on the
  same table stops with an error (exit 3) instead of committing.
* Column changes (ADD, DROP, RENAME, type changes) are followed per `--schema-changes`
  (`schema_policy.py`); TRUNCATE empties the lake table at the same position; DROP or RENAME TABLE
  keeps the lake table, marked dropped; other DDL (a key change), or a column type with no Iceberg
  mapping, stops that table's sync with an error naming the statement and the fix.
"""

from __future__ import annotations

import logging
import queue
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pymysql
from tenacity import before_sleep_log, retry, retry_if_exception_type, stop_after_delay, wait_exponential

from jobs.cdc import (
    apply_changes,
    foreign_keys,
    merge_warm_up,
    position_commit,
    reconcile,
    schema_policy,
    snapshot,
    source_db,
    target_table,
)
from jobs.cdc.binlog_reader import BinlogPosition, BinlogReader, DdlEvent, Transaction
from jobs.cdc.change_batch import DELETE, UPSERT, RowChange, last_change_per_key
from jobs.cdc.chunk_reader import Pace
from jobs.cdc.position_check import position_problem
from jobs.cdc.resync import ATTEMPTS, BesideStream, Phase, Verdict
from jobs.cdc.schema_mapping import SourceColumn, UnsupportedType
from jobs.cdc.table_selection import TableSelection, TableSpec, UnusableName
from jobs.common.metrics import NO_METRICS, BatchMetrics, MetricsSink, guarded
from jobs.common.run_modes import RunMode, StopRequest, run_batches
from jobs.common.snapshot_progress import (
    CONCURRENT_WRITER_EXIT,
    ConcurrentWriterError,
    main_snapshot,
    with_snapshot_properties,
)
from jobs.common.sql_text import identifier
from jobs.common.streaming_job import StreamingJob
from jobs.config import ConfigError, LakehouseConfig

log = logging.getLogger("cdc_sync")

MAX_BATCH_CHANGES = 300_000  # bounds memory while catching up
DRAIN_SECONDS = 0.5
# While the reader is this far behind the source (catching up on a backlog), a batch drains up to
# CATCH_UP_DRAIN_SECONDS: a copy-on-write MERGE costs about the same for 20k changes as for 200k.
CATCH_UP_LAG_SECONDS = 5
CATCH_UP_DRAIN_SECONDS = 10.0
CATCH_UP_GAP_SECONDS = 0.5
# A quiet table's stored position follows the binlog at most this often: far below the source's
# binlog retention (24 h on RDS), and a restart re-reads at most this much of the binlog.
PROGRESS_SECONDS = 60.0
# How often a running job looks for resyncs requested of it (`--request-resync`, a table property).
REQUEST_POLL_SECONDS = 30.0
PROBLEM_SHOWN_SECONDS = 30.0  # a binlog reconnect this recent is still shown as the job's problem
# The binlog reader with which a re-snapshot beside the stream checks its copy (`resync.py`) is a
# replication client of its own: this far from the job's server id (4201 + 90 = 4291; verify's 4290).
RESYNC_VERIFY_SERVER_ID_OFFSET = 90
# A re-snapshot beside the stream leaves the box to the batches where it can: one reader process, at
# a lower CPU priority and resting as long as it reads (and so reading the source at half speed at
# most); its Spark jobs in a FAIR pool with no guaranteed slot; its build's and its verification's
# tasks on half the slots at most (`python -m bench cdc_resync`: on every slot, the other tables'
# commits took 3-4x longer while the verification ran).
RESYNC_READERS = 1
RESYNC_PACE = Pace(niceness=10, rest_ratio=1.0)
RESYNC_SLOT_SHARE = 0.5
RESYNC_STOP_SECONDS = 30.0  # a stopping job waits this long for a resync's thread to call its build off


@dataclass
class TableState:
    spec: TableSpec
    key: tuple[str, ...]
    columns: list[tuple[str, str]]
    position: BinlogPosition
    error: str | None = None
    last_commit: float = field(default_factory=time.monotonic)
    # The source's columns (lower-case name -> column): what a type change is from. `exact`: they
    # are as of `position` (described before a snapshot's position), not read later.
    source_columns: dict[str, SourceColumn] = field(default_factory=dict)
    columns_exact: bool = False
    awaits_key: bool = False  # stopped for want of a primary key: synced once the source has one
    unsyncable: bool = False  # its name, or its target, cannot be synced (`_unsyncable`); for good
    # The source table was dropped (where in the binlog, or "while the job was stopped"): the lake
    # table keeps its rows, marked; not an error, nothing more to sync.
    dropped: str | None = None
    # Lake columns (lower case) not written (`--schema-changes ignore`: a new source column took the
    # name); kept in the table property UNSYNCED_PROPERTY across restarts.
    unsynced: frozenset[str] = frozenset()
    # Being re-snapshotted beside the stream (`resync.py`); its changes are held for the new copy.
    resync: BesideStream | None = None
    # Its source table was gone when the job started: followed up to its DROP, which is before this.
    gone_by: BinlogPosition | None = None

    def row_for_lake(self, change: RowChange) -> RowChange:
        if not self.unsynced:
            return change
        row = {k: v for k, v in change.row.items() if k.lower() not in self.unsynced}
        return RowChange(change.op, change.key, row, change.before)

    @property
    def live(self) -> bool:
        """Still synced: neither stopped by an error nor dropped in the source."""
        return self.error is None and self.dropped is None

    @property
    def applies(self) -> bool:
        """Its lake table receives the changes now (not while a copy replaces rows that are no
        longer the source's: a replaced, created or stopped table waits for its resync)."""
        return self.live and (self.resync is None or self.resync.applies_live)

    def track_source(self, columns, exact: bool) -> None:
        self.source_columns = {c.name.lower(): c for c in columns}
        self.columns_exact = exact


@dataclass
class BatchReport:
    changes: dict[str, int] = field(default_factory=dict)
    position: BinlogPosition | None = None
    commit_ms: float = 0.0
    lag_seconds: float = 0.0


def resync_hint(spec: TableSpec) -> str:
    return f"re-snapshot it with `lakehouse run cdc --resync {spec.source}`"


def _parent_changes(
    fk: foreign_keys.ForeignKey,
    transactions: list[Transaction],
    upstream: dict[tuple[str, str], list[RowChange]] | None,
    since: BinlogPosition,
) -> list[RowChange]:
    """The changes of `fk`'s parent a cascade starts from: the batch's after `since` (the child's
    position), or, one level down, the rows the level above found changed (`upstream`)."""
    if upstream is not None:
        return upstream.get(fk.parent, [])
    return [c for tx in transactions if tx.end.order > since.order for c in tx.changes.get(fk.parent, ())]


class CdcSync(StreamingJob):
    """The job's state across batches: per-table position, the binlog reader, the MERGE step."""

    def __init__(
        self,
        spark,
        config: LakehouseConfig,
        tables: TableSelection | Sequence[TableSpec],
        *,
        resync: Sequence[str] = (),
        server_id: int | None = None,
        max_batch_changes: int = MAX_BATCH_CHANGES,
        on_commit: Callable[[str, list[RowChange], float], None] | None = None,
        connect_timeout: float = 120.0,
        progress_seconds: float = PROGRESS_SECONDS,
        metrics: MetricsSink = NO_METRICS,
        warm_up: bool = False,
        change_wait_seconds: float = 0.0,
        stop_at_source_end: bool = False,
        snapshot_chunk_rows: int = snapshot.CHUNK_ROWS,
        snapshot_commit_rows: int = snapshot.COMMIT_ROWS,
        schema_changes: str = schema_policy.DEFAULT_POLICY,
        snapshot_reader_process: bool = True,
        snapshot_readers: int = snapshot.READERS,
        request_poll_seconds: float = REQUEST_POLL_SECONDS,
    ) -> None:
        self.spark = spark
        self.config = config
        self.selection = tables if isinstance(tables, TableSelection) else TableSelection.of(config, tables)
        self.resync = list(resync)
        self.server_id = server_id or config.mysql.server_id
        self.max_batch_changes = max_batch_changes
        self.on_commit = on_commit
        self.connect_timeout = connect_timeout
        self.progress_seconds = progress_seconds
        self.metrics = guarded(metrics)
        self.warm_up = warm_up
        # An idle batch waits this long for the next change and starts applying when it comes,
        # instead of sleeping a whole trigger interval first (the jobs pass their trigger).
        self.change_wait_seconds = change_wait_seconds
        # --until-idle: the job's end is the binlog position the source has when it starts.
        self.stop_at_source_end = stop_at_source_end
        self.snapshot_chunk_rows = snapshot_chunk_rows
        self.snapshot_commit_rows = snapshot_commit_rows
        # False reads the snapshot's chunks in this process, in turn with the commits (slower; for
        # tests that hook the reads).
        self.snapshot_reader_process = snapshot_reader_process
        self.snapshot_readers = snapshot_readers  # ranges of keys read side by side
        self.request_poll_seconds = request_poll_seconds
        self._next_request_poll = 0.0  # the first batch looks: a request made while it was stopped
        self._requests_taken: dict[tuple[str, str], str] = {}  # table -> the request it copies for
        if schema_changes not in schema_policy.POLICIES:
            raise ConfigError(
                f"--schema-changes {schema_changes!r}: choose from {', '.join(schema_policy.POLICIES)}"
            )
        self.schema_changes = schema_changes
        self._source_end: BinlogPosition | None = None
        self.credentials = source_db.cdc_credentials(config)
        self.tables: dict[tuple[str, str], TableState] = {}
        self.foreign_keys: list[foreign_keys.ForeignKey] = []  # of the synced tables (cascades)
        self._gone_children: set[tuple[str, str]] = set()  # kept keys' children, gone from the source
        self._cascaded_from: dict[tuple[str, str], str] = {}  # what each lake table's property says
        self.reader: BinlogReader | None = None
        self.fatal: str | None = None
        self.last_report = BatchReport()
        self._is_mariadb = True
        self._unwinding: list[BesideStream] = []  # resyncs called off, their threads ending
        self._resync_failures: list[str] = []  # copies that never verified (the live table went on)
        for name in self.resync:
            if not self.selection.covers(name):
                raise ConfigError(f"--resync {name}: not a synced table ({self.selection.describe()})")

    # ---- start: snapshot what needs one, then start tailing --------------------------------------

    def _connect(self) -> pymysql.Connection:
        @retry(
            retry=retry_if_exception_type(pymysql.err.OperationalError),
            stop=stop_after_delay(self.connect_timeout),
            wait=wait_exponential(multiplier=0.5, max=10),
            before_sleep=before_sleep_log(log, logging.WARNING),
            reraise=True,
        )
        def attempt() -> pymysql.Connection:
            return source_db.connect(self.config, self.credentials)

        return attempt()

    def start(self) -> CdcSync:
        conn = self._connect()
        try:
            source_db.require_binlog_settings(conn)
            is_mariadb = self._is_mariadb = source_db.is_mariadb(conn)
            name_case = source_db.lower_case_table_names(conn)
            specs = self._selected_specs(conn)
            for name in self.resync:
                if not any(spec.matches(name) for spec in specs):
                    raise ConfigError(
                        f"--resync {name}: no such table in the source ({self.selection.describe()})"
                    )
            beside: list[TableState] = []  # `--resync` of a table the lake has: beside the stream
            for spec in specs:
                if spec.source_key not in self.tables:
                    background = any(spec.matches(name) for name in self.resync) and self._has_position(spec)
                    state = self.tables[spec.source_key] = self._prepare(conn, spec, is_mariadb, background)
                    if background and state.dropped is None and state.gone_by is None:
                        beside.append(state)
                    elif background:
                        log.warning("--resync %s: its source table is gone; nothing to copy", spec.source)
            resumable = []
            for state in beside:
                # An interrupted copy the source still has the binlog for may be resumed from its B.
                alive = [
                    position
                    for position in snapshot.staging_positions(self.spark, state.spec.target)
                    if self._position_problem(conn, position, is_mariadb) is None
                ]
                resumable += alive
                oldest = min(alive, key=lambda p: p.order) if alive else None
                self._request_resync(state, "--resync", conn=conn, hold_from=oldest)
            # With a pattern the reader runs even with no table yet: one may be created. A resync's
            # position is read after this, or is an interrupted one's the source still has.
            now = (
                BinlogPosition(*source_db.master_position(conn)) if self.selection.dynamic or beside else None
            )
            self._refresh_foreign_keys(conn)
            for state in beside:  # read now: the children of a table that waits for its copy
                if state.resync is not None and not state.resync.applies_live:
                    self._resync_descendants(state)
        finally:
            conn.close()
        active = [t for t in self.tables.values() if t.live]
        positions = [t.position for t in active if t.applies] + resumable + ([now] if now else [])
        if active or now is not None:
            start = min(positions, key=lambda p: p.order)
            self.reader = BinlogReader(
                source_db.connection_settings(self.config, self.credentials),
                self.server_id,
                start,
                {k: t.key for k, t in self.tables.items() if t.live},
                is_mariadb=is_mariadb,
                selects=self._takes_new_table,
                lower_case_table_names=name_case,
            ).start()
            log.info(
                "tailing the binlog from %s for %s%s",
                start,
                ", ".join(t.spec.target for t in active) or "no table yet",
                f"; tables created in the source that match {self.selection.describe()} join"
                if self.selection.dynamic
                else "",
            )
        if self.warm_up:
            for state in active:  # while the reader starts on the binlog (and reads any backlog)
                seconds = merge_warm_up.warm_up_merge(self.spark, state.columns, state.key)
                log.info("%s: MERGE warmed up (%.1fs)", state.spec.target, seconds)
        return self

    def _selected_specs(self, conn: pymysql.Connection) -> list[TableSpec]:
        """The explicitly named tables, then every listed source table the selection takes. A table
        that cannot be synced under its name, or whose target another table already has, gets a
        stopped state of its own (the others go on)."""
        specs = list(self.selection.explicit)
        targets = {spec.target: spec for spec in specs}
        listed = source_db.list_tables(conn, self.selection.schemas)
        for schema, name in listed:
            spec = self._spec_or_stop(schema, name, targets)
            if spec is not None and spec.source_key not in {s.source_key for s in specs}:
                specs.append(spec)
                targets[spec.target] = spec
        # Their sync stops in `_prepare`, with the reason.
        return specs + self._gone_from_source(set(listed), set(targets))

    def _gone_from_source(self, listed: set[tuple[str, str]], targets: set[str]) -> list[TableSpec]:
        """Lake tables this selection synced whose source table is no longer listed: dropped or
        renamed while the job was stopped (the binlog's DROP was never read for them)."""
        if not self.selection.dynamic:
            return []  # named tables: `_prepare` finds each one missing
        namespace = f"{self.config.catalog.name}.{self.selection.namespace}"
        if not self.spark.catalog.databaseExists(namespace):
            return []
        gone = []
        for row in self.spark.sql(f"SHOW TABLES IN {namespace}").collect():
            lake_name, target = row["tableName"], f"{namespace}.{row['tableName']}"
            if (
                target in targets
                or snapshot.STAGING_SUFFIX in lake_name
                or not self.selection.may_target(lake_name)
            ):
                continue
            try:
                source = target_table.synced_source(self.spark, target, self.config.mysql.database)
            except Exception as exc:  # noqa: BLE001 - one unreadable lake table must not stop the others
                log.warning("%s: cannot tell which source table it mirrors (%s); skipped", target, exc)
                continue
            schema, _, name = (source or "").partition(".")
            if source is None or (schema, name) in listed:
                continue
            try:
                spec = self.selection.spec_for(schema, name)
            except UnusableName:
                continue
            if spec is not None and spec.target == target:
                gone.append(spec)
        return gone

    def _spec_or_stop(self, schema: str, name: str, targets: dict[str, TableSpec]) -> TableSpec | None:
        try:
            spec = self.selection.spec_for(schema, name)
        except UnusableName as exc:
            self._unsyncable(TableSpec(schema, name, ""), f"cannot sync {exc}")
            return None
        if spec is None:
            return None
        other = targets.get(spec.target)
        if other is not None and other.source_key != spec.source_key:
            self._unsyncable(
                spec,
                f"cannot sync {spec.source}: {other.source} already syncs to {spec.target}; "
                f"name a target of its own with --table {spec.source}=<namespace>.<table>, or --exclude it",
            )
            return None
        return spec

    def _unsyncable(self, spec: TableSpec, message: str) -> TableState:
        state = TableState(spec, (), [], BinlogPosition("", 0), unsyncable=True)
        self.tables[spec.source_key] = state
        self._stop_table(state, message)
        return state

    def _takes_new_table(self, schema: str, name: str) -> bool:
        """The reader asks: does a table created (or given a primary key) under this name join?"""
        state = self.tables.get((schema, name))
        # a dropped table's name taken again is reported too: it stops until --resync
        return (state is None or state.awaits_key or state.dropped is not None) and self.selection.selects(
            schema, name
        )

    def _has_position(self, spec: TableSpec) -> bool:
        exists = target_table.table_exists(self.spark, spec.target)
        return exists and position_commit.stored_position(self.spark, spec.target) is not None

    def _prepare(
        self, conn: pymysql.Connection, spec: TableSpec, is_mariadb: bool, beside: bool = False
    ) -> TableState:
        """Resume `spec` from its stored position, or snapshot it (a table never synced, or one
        `--resync`ed that has no position). `beside`: it is re-snapshotted beside the stream after
        this (`_request_resync`): prepared from its stored position meanwhile, and so stopped
        (not applied to) if that cannot be."""
        stored = None
        in_lake = target_table.table_exists(self.spark, spec.target)
        if in_lake:
            stored = position_commit.stored_position(self.spark, spec.target)
        wants_resync = any(spec.matches(name) for name in self.resync)
        if stored is not None and not wants_resync:
            snapshot.drop_finished_staging(self.spark, spec.target, stored)
        taken = None
        dropped = target_table.source_dropped(self.spark, spec.target) if in_lake else None
        if (
            dropped is not None
            and (beside or not wants_resync)
            and source_db.table_exists(conn, *spec.source_key)
        ):
            state = TableState(spec, (), [], stored or BinlogPosition("", 0), dropped=dropped)
            if beside:  # its rows are another table's: the new copy replaces them, nothing is applied
                state.dropped = None
                state.error = f"{spec.target}: the source table was dropped {dropped} and created again"
            else:
                self._created_again(state, f"CREATE TABLE {spec.source}, while the job was stopped")
            return state
        try:
            if stored is None:
                taken = self._snapshot(conn, spec, is_mariadb, resume=True)
                position, source = taken.position, taken.source
            else:
                position = stored
                source = source_db.describe_table(conn, spec.source_schema, spec.source_name)
            for column in source.columns:
                column.spark_type  # noqa: B018 - raises UnsupportedType for a type with no mapping
            if taken is None and (merged_by := target_table.identifier_fields(self.spark, spec.target)):
                if {c.lower() for c in merged_by} != {c.lower() for c in source.key}:
                    # changed while the job was stopped: rows the old key kept apart may share the new
                    # one (or the reverse), and merging by the new key would not undo what is there
                    state = TableState(spec, (), [], stored)
                    self._stop_table(
                        state,
                        f"the source table's primary key is ({', '.join(source.key)}), the lake table's "
                        f"({', '.join(sorted(merged_by))}): it changed while the job was stopped; "
                        f"{resync_hint(spec)}",
                    )
                    return state
        except UnsupportedType as exc:
            state = TableState(spec, (), [], stored or BinlogPosition("", 0))
            self._stop_table(state, f"cannot sync {spec.source}: {exc}; change or drop that column")
            return state
        except source_db.NoPrimaryKey as exc:
            state = TableState(spec, (), [], stored or BinlogPosition("", 0), awaits_key=True)
            self._stop_table(state, f"cannot sync: {exc}")
            return state
        except source_db.MissingTable:
            database = self.config.mysql.database
            if not in_lake or target_table.synced_source(self.spark, spec.target, database) != spec.source:
                raise  # never synced from it: a misspelt --table, or created and gone (the caller says)
            state = TableState(spec, (), [], stored or BinlogPosition("", 0))
            marked = target_table.source_dropped(self.spark, spec.target)
            if marked is not None:
                state.dropped = marked
                log.info(
                    "%s: its source table %s was dropped %s (kept, not synced)",
                    spec.target,
                    spec.source,
                    marked,
                )
            elif following := self._follow_to_drop(conn, spec, stored, is_mariadb):
                return following
            else:
                self._source_dropped(state, f"after {stored} (while the job was stopped)")
            return state
        target_table.configure_table(self.spark, spec.target, source.key, spec.source)
        state = TableState(spec, source.key, target_table.target_columns(self.spark, spec.target), position)
        if taken is None:
            state.unsynced = target_table.unsynced_columns(self.spark, spec.target)
        else:  # a fresh snapshot's table mirrors the source: not dropped, every column synced
            target_table.clear_marks(self.spark, spec.target)
        # The source's columns as of the position only when the snapshot described them before it.
        state.track_source(source.columns, exact=taken is not None and taken.described_before_position)
        # Only a stored position can be stale; a fresh snapshot's is the source's own.
        problem = None if position is not stored else self._position_problem(conn, position, is_mariadb)
        if problem is not None:
            state.error = (
                f"{spec.target}: its stored binlog position {position} is {problem}; {resync_hint(spec)}"
            )
            log.error(state.error)
        return state

    def _follow_to_drop(
        self, conn: pymysql.Connection, spec: TableSpec, stored: BinlogPosition | None, is_mariadb: bool
    ) -> TableState | None:
        """A table dropped (or renamed away) while the job was stopped: the changes the source made to
        it after its stored position and before the DROP are applied (the binlog names their columns),
        then the DROP marks it. The DROP is before the binlog's end now (`gone_by`): a table still
        followed past there is marked as of its position. None (marked as of its position at once):
        its position is no longer in the binlog, the lake table has no key to merge by, or its
        parents' changes cascaded to it (`_mark_cascaded_children`), which cannot be read any more."""
        if stored is None or self._position_problem(conn, stored, is_mariadb) is not None:
            return None
        if target_table.cascaded_from(self.spark, spec.target):
            return None  # its parents' changes cascaded to it too: with its keys gone, not readable
        merged_by = {c.lower() for c in target_table.identifier_fields(self.spark, spec.target)}
        columns = target_table.target_columns(self.spark, spec.target)
        key = tuple(name for name, _ in columns if name.lower() in merged_by)
        if not key:
            return None
        gone_by = BinlogPosition(*source_db.master_position(conn))
        state = TableState(spec, key, columns, stored, gone_by=gone_by)
        state.unsynced = target_table.unsynced_columns(self.spark, spec.target)
        log.info("%s: its source table %s is gone; its changes up to the DROP are applied", spec.target,
                 spec.source)  # fmt: skip
        return state

    @staticmethod
    def _position_problem(conn: pymysql.Connection, position: BinlogPosition, is_mariadb: bool) -> str | None:
        gtid_state = source_db.mariadb_gtid_state(conn) if is_mariadb else None
        return position_problem(position, source_db.binary_logs(conn), gtid_state)

    def _snapshot(
        self, conn: pymysql.Connection, spec: TableSpec, is_mariadb: bool, resume: bool
    ) -> snapshot.SnapshotResult:
        return snapshot.snapshot_table(
            **self._snapshot_options(conn, spec, is_mariadb, resume), readers=self.snapshot_readers
        )

    def _snapshot_options(
        self, conn: pymysql.Connection, spec: TableSpec, is_mariadb: bool, resume: bool
    ) -> dict:
        """What a snapshot between two batches and a copy beside the stream share."""
        return {
            "spark": self.spark,
            "conn": conn,
            "source_schema": spec.source_schema,
            "source_name": spec.source_name,
            "target": spec.target,
            "binlog_alive": lambda position: self._position_problem(conn, position, is_mariadb),
            "chunk_rows": self.snapshot_chunk_rows,
            "commit_rows": self.snapshot_commit_rows,
            "resume": resume,
            "reader_connection": (
                source_db.connection_settings(self.config, self.credentials)
                if self.snapshot_reader_process
                else None
            ),
            "metrics": self.metrics,
        }

    # ---- re-snapshots beside the stream (resync.py) ----------------------------------------------

    def _request_resync(
        self,
        state: TableState,
        why: str,
        applies_live: bool | None = None,
        conn: pymysql.Connection | None = None,
        hold_from: BinlogPosition | None = None,
        descendants: bool = True,
        resume: bool | None = None,
    ) -> None:
        """Re-snapshot `state`'s table beside the stream; one already under way starts again.
        `applies_live` (default: whether it applies now): the live table goes on receiving changes.
        `hold_from`: the B of an interrupted copy it may resume (default: the source's binlog end).
        `descendants`: a table that waits for its copy has its cascading children copied after it.
        `resume` (default: for `--resync`): an interrupted staging table may be resumed."""
        spec = state.spec
        applies_live = state.applies if applies_live is None else applies_live
        self._call_off(state)
        own = conn is None
        conn = conn or self._connect()
        try:
            described = source_db.describe_table(conn, spec.source_schema, spec.source_name)
            # Every DDL up to here is in the copy (its position is read later).
            floor = BinlogPosition(*source_db.master_position(conn))
        except source_db.MissingTable as exc:  # by a DDL, a cascade, a request: its DROP is ahead
            if state.gone_by is not None:  # followed to a DROP while the job was stopped: as it says
                self._stop_table(state, f"re-snapshot ({why}) cannot start: {exc}; {resync_hint(spec)}")
            else:
                self._gone_for_copy(state, applies_live and state.live, self._lake_position(state), why)
            return
        except source_db.NoPrimaryKey as exc:
            self._stop_table(state, f"re-snapshot ({why}) cannot start: {exc}; {resync_hint(spec)}")
            return
        finally:
            if own:
                conn.close()
        if not applies_live:  # the held changes are keyed as the source's table is now
            state.key = described.key
        if self.reader is not None:
            self.reader.follow(spec.source_key, state.key)
        was = state.error
        state.error = None
        state.resync = BesideStream(
            self.spark,
            spec.target,
            why,
            build=lambda *arguments: self._build_beside(spec, *arguments),
            verify=self._verify_copy,
            applies_live=applies_live,
            floor=floor,
            hold_from=hold_from,
            lake_position=self._lake_position(state),
            # An interrupted `--resync` goes on (the reader started before its B).
            resume=why == "--resync" if resume is None else resume,
        )
        log.info(
            "%s: re-snapshot beside the stream (%s)%s; the other tables go on",
            spec.target,
            why,
            "; the live table goes on receiving changes until the copy replaces it"
            if applies_live
            else f"; the lake table waits for the copy{f' (it was stopped: {was})' if was else ''}",
        )
        if not applies_live and descendants:
            self._resync_descendants(state)

    def _take_resync_requests(self) -> None:
        """Resyncs requested of the running job (`lakehouse run cdc --request-resync`: a table
        property): each table is copied beside the stream, as `--resync` at a start does (a copy
        already under way answers it: its swap replaces every row). The request is answered when the
        copy is swapped in (`_swap`), or when no copy runs for it any more (it failed, with its line;
        its source is gone). One still pending at a start (the job stopped mid-copy) is taken again.
        A table's error here is logged and looked at again next time: the other tables go on."""
        for key, state in list(self.tables.items()):
            if state.unsyncable:
                continue  # a name it cannot sync, a target another table has
            try:
                self._take_resync_request(key, state)
            except Exception as exc:  # noqa: BLE001 - not in the lake yet, the catalog, the source
                if "NoSuchTable" not in str(exc):
                    log.warning("%s: could not look for a requested resync (%s)", state.spec.target, exc)

    def _take_resync_request(self, key: tuple[str, str], state: TableState) -> None:
        target = state.spec.target
        requested = target_table.pending_resync_request(self.spark, target)
        taken = self._requests_taken.get(key)
        if requested is None or requested == taken:
            if requested is not None and state.resync is None:
                self._answer_request(state)  # its copy failed (its line says why), or never started
            return
        self._requests_taken[key] = requested
        if state.resync is not None:
            log.info("%s: a re-snapshot was requested (%s); the copy under way answers it", target, requested)
        elif state.gone_by is not None or not self._source_exists(state):
            log.warning("%s: a re-snapshot was requested (%s), but its source table %s is gone; the lake "
                        "table stays as it is", target, requested, state.spec.source)  # fmt: skip
            self._answer_request(state)
        else:
            self._request_resync(state, f"requested {requested}")

    def _answer_request(self, state: TableState) -> None:
        request = self._requests_taken.get(state.spec.source_key)
        if request is not None:
            target_table.answer_resync_request(self.spark, state.spec.target, request)
            del self._requests_taken[state.spec.source_key]

    def _resync_descendants(self, state: TableState) -> None:
        """While a table waits for its copy, the rows its parents' changes cascade to are found in the
        copy once built (`_cascade_into_copy`), too late for its own cascading children, whose rows
        are found through them: each is re-snapshotted after it (resyncs run in request order; one
        requested before it is requested again), to any depth."""
        descendants, todo = [state.spec.source_key], [state.spec.source_key]
        while todo:
            parent = todo.pop()
            for fk in self.foreign_keys:
                known = fk.child in self.tables and fk.child not in descendants
                if fk.cascades and fk.parent == parent and known:
                    descendants.append(fk.child)
                    todo.append(fk.child)
        for child in [self.tables[key] for key in descendants[1:]]:
            if not child.live or child.spec.source_key in self._gone_children:
                continue  # (gone from the source, its DROP ahead: nothing to copy)
            if child.resync is None and child.applies:
                why = (f"{state.spec.source}, whose changes cascade to it, waits for a copy: the rows they "
                       "cascade to meanwhile are read after it")  # fmt: skip
                self._request_resync(child, why, applies_live=True, descendants=False)
            elif child.resync is not None and child.resync.queued_at <= state.resync.queued_at:
                if child.resync.phase is Phase.QUEUED:  # not started: it only moves back in the queue,
                    child.resync.queued_at = time.monotonic()  # keeping what it holds (from an old B)
                else:  # under way: built again after it, afresh (it held from its own B only)
                    self._request_resync(child, child.resync.why, child.resync.applies_live,
                                         descendants=False, resume=False)  # fmt: skip

    def _build_beside(self, spec: TableSpec, cancelled, on_position, resume: bool) -> snapshot.BuiltSnapshot:
        """In the resync's thread: the staging table with the source's rows at B."""
        conn = self._connect()
        try:
            return snapshot.build_staging(
                **self._snapshot_options(conn, spec, self._is_mariadb, resume),
                readers=RESYNC_READERS,
                cancelled=cancelled,
                on_position=on_position,
                pace=RESYNC_PACE,
                max_tasks=self._resync_tasks,
            )
        finally:
            conn.close()

    @property
    def _resync_tasks(self) -> int:
        """Spark tasks a re-snapshot beside the stream runs at once: its share of the slots."""
        return max(1, int(self.spark.sparkContext.defaultParallelism * RESYNC_SLOT_SHARE))

    def _verify_copy(self, beside: BesideStream) -> Verdict:
        """In the resync's thread: the staging table against the source, as `lakehouse verify` does."""
        staging, source = beside.built.staging, beside.built.source
        conn = self._connect()
        try:
            now = source_db.describe_table(conn, source.schema, source.name)
            if now.columns != source.columns or now.key != source.key:  # its DDL restarts the copy
                return Verdict(0, (("columns changed since the copy's position", 1, ()),), 0)
            comparison = reconcile.compare(
                self.spark, conn, staging, main_snapshot(self.spark, staging), beside.staging_position,
                source,
                source_db.connection_settings(self.config, self.credentials),
                self.server_id + RESYNC_VERIFY_SERVER_ID_OFFSET, self._is_mariadb, RESYNC_PACE,
                max_tasks=self._resync_tasks,
            )  # fmt: skip
            mismatches = tuple(
                (kind, len(keys), tuple("key " + ", ".join(k) for k in sorted(keys)[:3]))
                for kind, keys in comparison.kinds()
            )
            in_flight = len(comparison.differing & comparison.in_flight)
            return Verdict(comparison.compared, mismatches, in_flight)
        finally:
            conn.close()

    def _call_off(self, state: TableState) -> None:
        beside, state.resync = state.resync, None
        if beside is None:
            return
        beside.cancel()
        if beside.running:
            self._unwinding.append(beside)  # its staging table goes with the next build or start
        elif beside.built is not None:
            try:
                snapshot.drop_staging(self.spark, beside.built.staging, state.spec.target)
            except Exception as exc:  # noqa: BLE001 - the next start drops it
                log.warning("%s: could not drop %s (%s)", state.spec.target, beside.built.staging, exc)

    @property
    def resyncing(self) -> bool:
        return any(t.resync is not None for t in self.tables.values())

    def _advance_resyncs(self) -> None:
        """Between two batches: move each resync on (catch up, verify, swap), start the next."""
        self._unwinding = [b for b in self._unwinding if b.running]
        for state in [t for t in self.tables.values() if t.resync is not None]:
            try:
                self._step_resync(state)
            except ConcurrentWriterError:
                raise
            except Exception as exc:  # noqa: BLE001 - this table's copy fails, not the other tables
                log.exception("%s: re-snapshot step failed", state.spec.target)
                self._resync_again(state, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")
        waiting = [t for t in self.tables.values() if t.resync is not None]
        if all(t.resync.phase is Phase.QUEUED for t in waiting) and not self._unwinding:
            queued = waiting
            if queued:
                first = min(queued, key=lambda t: t.resync.queued_at)
                log.info("%s: re-snapshot beside the stream starts (%s)", first.spec.target, first.resync.why)
                first.resync.start()

    def _step_resync(self, state: TableState) -> None:
        beside = state.resync
        if beside.phase is Phase.BUILT:
            self._cascade_into_copy(state)
            merged = beside.catch_up()
            log.info(
                "%s: copy built (%s rows at %s, %.0f s); %d held changes merged up to %s; verifying it "
                "against the source",
                state.spec.target, f"{beside.built.progress.rows:,}", beside.position,
                time.monotonic() - beside.began, merged, beside.staging_position,
            )  # fmt: skip
            beside.start_verify()
        elif beside.phase is Phase.VERIFIED and beside.verdict.clean:
            beside.catch_up()
            self._swap(state)
        elif beside.phase is Phase.VERIFIED:
            self._resync_again(state, f"the copy does not equal the source: {beside.verdict.describe()}")
        elif beside.phase is Phase.FAILED and not self._source_exists(state):
            self._gone_while_copied(state)
        elif beside.phase is Phase.FAILED:
            self._resync_again(state, beside.error)

    def _source_exists(self, state: TableState) -> bool:
        conn = self._connect()
        try:
            return source_db.table_exists(conn, *state.spec.source_key)
        finally:
            conn.close()

    def _kept_while_copied(
        self,
        state: TableState,
        lake_position: BinlogPosition | None,
        why: str = "a re-snapshot was under way",
    ) -> str:
        """Where a table that waited for its copy is kept as of, its source gone: not the DROP (it
        received no changes meanwhile), but an older table's own mark or the position it stored."""
        kept = target_table.source_dropped(self.spark, state.spec.target)
        return kept or f"after {lake_position or state.position} ({why})"

    def _gone_while_copied(self, state: TableState) -> None:
        """The source table went while its copy was built (a DROP the reader has yet to deliver, or
        one from before the copy's position): as a DROP, not as a failed copy."""
        applies, beside = state.applies, state.resync
        self._call_off(state)
        self._gone_for_copy(state, applies, beside.lake_position)

    def _lake_position(self, state: TableState) -> BinlogPosition | None:
        """The position the lake table stores (None: no lake table, or none stored)."""
        if not target_table.table_exists(self.spark, state.spec.target):
            return None
        return position_commit.stored_position(self.spark, state.spec.target)

    def _gone_for_copy(
        self,
        state: TableState,
        applies: bool,
        lake_position: BinlogPosition | None,
        why: str = "",
        statement: str | None = None,
    ) -> None:
        """A copy with no source table to copy (its DROP, or RENAME away, still ahead in the binlog;
        or one from before the copy's position). A table still applied to takes its last changes,
        then the DROP, from the stream in binlog order; one that waits (its values rewritten without
        row events, a replaced table) is kept as of the position it stored; a table never copied yet
        is not synced."""
        spec = state.spec
        if why:
            log.warning("%s: re-snapshot (%s) not started: its source table %s is gone (its DROP is ahead "
                        "in the binlog)", spec.target, why, spec.source)  # fmt: skip
        if applies:  # its changes, then the DROP, come from the stream
            return
        if target_table.table_exists(self.spark, spec.target):
            kept = "a re-snapshot could not start" if why else "a re-snapshot was under way"
            self._source_dropped(state, self._kept_while_copied(state, lake_position, kept), statement)
        else:
            if self.reader is not None:
                self.reader.unfollow(spec.source_key)
            del self.tables[spec.source_key]
            log.warning("%s: created, then dropped%s before its snapshot; not synced", spec.source,
                        f" (`{statement}`)" if statement else "")  # fmt: skip

    def _resync_again(self, state: TableState, problem: str) -> None:
        beside = state.resync
        if beside is None:  # called off, or swapped in, before the step failed
            log.error("%s: %s", state.spec.target, problem)
            return
        if beside.attempt < ATTEMPTS:
            log.warning(
                "%s: re-snapshot (%s), attempt %d of %d: %s; building it again",
                state.spec.target, beside.why, beside.attempt, ATTEMPTS, problem,
            )  # fmt: skip
            self._call_off(state)
            state.resync = beside.again()
            return
        self._call_off(state)
        message = f"re-snapshot beside the stream ({beside.why}) failed {ATTEMPTS} times, last: {problem}"
        if beside.applies_live and state.live:
            self._resync_failures.append(f"{state.spec.target}: {message}; its lake table syncs as before")
            log.error(self._resync_failures[-1])
        else:
            self._stop_table(state, f"{message}; {resync_hint(state.spec)}")

    def _swap(self, state: TableState) -> None:
        """The verified copy replaces the live table's rows in one commit storing its position."""
        beside, spec = state.resync, state.spec
        built, position = beside.built, beside.staging_position
        if target_table.table_exists(self.spark, spec.target):
            expected = state.position if state.applies else beside.lake_position  # this job's last
            stored = position_commit.stored_position(self.spark, spec.target)
            if stored != expected:
                raise position_commit.other_writer(spec.target, stored, expected)
        try:
            snapshot.publish(self.spark, built, spec.target, position=position)
        except Exception:
            if position_commit.stored_position(self.spark, spec.target) != position:
                raise  # not swapped in: this copy is built again
            # Swapped in; what failed is the clean-up after (the staging table goes at the next start).
            log.exception("%s: swapped in; the clean-up after it failed", spec.target)
        state.resync = None
        state.key, state.position = built.source.key, position
        state.columns = target_table.target_columns(self.spark, spec.target)
        state.track_source(built.source.columns, exact=built.described_before_position)
        state.unsynced = frozenset()  # the copy has every column the source has
        target_table.clear_marks(self.spark, spec.target)
        state.error = state.dropped = None
        state.awaits_key = False
        state.last_commit = time.monotonic()
        self._cascaded_from.pop(spec.source_key, None)  # a first copy has no mark yet: written now
        self._mark_cascaded_children()
        try:
            self._answer_request(state)  # (a job that exits now must not copy it again at its start)
        except Exception as exc:  # noqa: BLE001 - swapped in all the same; the next look answers it
            log.warning("%s: could not mark the requested resync answered (%s)", spec.target, exc)
        log.info(
            "%s: re-snapshotted beside the stream (%s): %s rows, verified against the source, swapped in "
            "at %s after %.0f s",
            spec.target, beside.why, f"{beside.verdict.compared:,}", position,
            time.monotonic() - beside.began,
        )  # fmt: skip

    # ---- one micro-batch ----------------------------------------------------------------------

    def _drain(self) -> tuple[list[Transaction], DdlEvent | None, bool]:
        """Queued transactions up to the next DDL; the flag says whether the queue ran empty.

        Waits up to `change_wait_seconds` for the first one, then keeps draining while the reader
        keeps producing: briefly when it is close to the source (a steady trickle must not delay the
        commit), longer when it is catching up on a backlog (fewer, larger MERGEs)."""
        transactions: list[Transaction] = []
        count = 0
        wait = max(0.05, self.change_wait_seconds)
        started = deadline = None
        while count < self.max_batch_changes and (deadline is None or time.monotonic() < deadline):
            try:
                item = self.reader.items.get(timeout=wait)
            except queue.Empty:
                return transactions, None, True
            if isinstance(item, DdlEvent):
                return transactions, item, False
            transactions.append(item)
            count += sum(len(v) for v in item.changes.values())
            started = started or time.monotonic()
            catching_up = time.time() - item.timestamp > CATCH_UP_LAG_SECONDS
            deadline = started + (CATCH_UP_DRAIN_SECONDS if catching_up else DRAIN_SECONDS)
            # Catching up, the reader may pause briefly (decoding, a busy CPU): only a longer gap
            # means it reached the end of the backlog.
            wait = CATCH_UP_GAP_SECONDS if catching_up else 0.05
        return transactions, None, False

    def run_batch(self) -> int:
        """Apply what the reader has queued; returns the number of row changes applied."""
        if self.reader is None:
            return 0
        if self.reader.fatal is not None:
            self._fail_all(f"binlog unreadable from {self.reader.position}: {self.reader.fatal}")
            return 0
        if time.monotonic() >= self._next_request_poll:
            self._take_resync_requests()
            self._next_request_poll = time.monotonic() + self.request_poll_seconds
        self._advance_resyncs()
        began = time.monotonic()
        # Read before draining: every transaction ending at or before it is then drained or applied.
        read_up_to = self.reader.position
        transactions, ddl, drained_all = self._drain()
        report = BatchReport()
        if transactions:
            self._apply(transactions, report)
        if ddl is not None:
            self._apply_ddl(ddl)
        if drained_all:
            self._commit_progress(read_up_to)
        elif transactions:
            # Under a steady stream the queue is rarely empty: quiet tables still move on to the end
            # of what this batch applied, so they never fall behind the source's binlog retention.
            self._commit_progress(transactions[-1].end)
        if report.changes:
            log.info(
                "cdc batch: %s | position %s | commit %.0f ms | lag %.1f s",
                " ".join(f"{t}={n}" for t, n in report.changes.items()),
                report.position,
                report.commit_ms,
                report.lag_seconds,
            )
            self.last_report = report
            for target, changes in report.changes.items():
                self.metrics.record(
                    BatchMetrics(
                        job="cdc",
                        table=target,
                        records_in=changes,
                        batch_seconds=time.monotonic() - began,
                        commit_seconds=report.commit_ms / 1000,
                        lag_seconds=report.lag_seconds,
                    )
                )
        return sum(report.changes.values())

    def _apply(self, transactions: list[Transaction], report: BatchReport) -> None:
        end = transactions[-1].end
        own: dict[tuple[str, str], list[RowChange]] = {}
        for source_key, state in self.tables.items():
            if state.live:
                own[source_key] = [
                    change
                    for tx in transactions
                    if tx.end.order > state.position.order
                    for change in tx.changes.get(source_key, ())
                ]
        # What the parents' changes cascaded to in the source goes into the child's own MERGE, after its
        # own changes: the child's position moves past a parent's change only with its cascade.
        cascaded = self._cascades(transactions, own, end) if self.foreign_keys else {}
        for source_key, state in self.tables.items():
            changes = own.get(source_key, []) + cascaded.get(source_key, [])
            if state.resync is not None:  # for its new copy, as the source has it (every column)
                after = state.resync.held_after.order  # its own position, not the live table's
                held = [
                    c for tx in transactions if tx.end.order > after for c in tx.changes.get(source_key, ())
                ]
                held += cascaded.get(source_key, [])
                state.resync.hold(end, last_change_per_key(held) if held else [])
            if not state.applies or not changes:
                continue
            latest = [state.row_for_lake(change) for change in last_change_per_key(changes)]
            began = time.monotonic()
            apply_changes.apply_changes(
                self.spark, state.spec.target, state.columns, state.key, latest, state.position, end
            )
            committed = time.time()
            state.last_commit = time.monotonic()
            report.commit_ms += (time.monotonic() - began) * 1000
            report.changes[state.spec.target.split(".", 1)[-1]] = len(changes)
            state.position = end
            if self.on_commit is not None:
                self.on_commit(state.spec.target, latest, committed)
        report.position = end
        report.lag_seconds = max(0.0, time.time() - transactions[-1].timestamp)

    # ---- foreign-key cascades (foreign_keys.py) --------------------------------------------------

    def _refresh_foreign_keys(self, conn: pymysql.Connection | None = None) -> None:
        """Read the synced tables' foreign keys again (at start, after any DDL); a synced child whose
        cascading key references a table that is not synced stops: its cascades would never be seen."""
        schemas = sorted({schema for schema, _ in self.tables})
        own = conn is None
        conn = conn or self._connect()
        try:
            read = foreign_keys.read_foreign_keys(conn, schemas)
            # A child gone from the source whose DROP is still ahead in the binlog: the source forgot
            # its keys, and its parents' changes before the DROP still cascade to it.
            children = {fk.child for fk in read}
            ahead = [
                fk
                for fk in self.foreign_keys
                if fk.child not in children
                and self.tables.get(fk.child) is not None
                and self.tables[fk.child].live
                and not source_db.table_exists(conn, *fk.child)
            ]
            self.foreign_keys = read + ahead
            self._gone_children = {fk.child for fk in ahead}
        finally:
            if own:
                conn.close()
        self._mark_cascaded_children()
        for fk in ahead:  # its parent renamed or stopped meanwhile: what cascades to it is unknown now
            child, parent = self.tables[fk.child], self.tables.get(fk.parent)
            if child.live and (parent is None or not parent.live):
                self._source_dropped(child, f"after {child.position} (gone before the rows its parent's "
                                     "changes cascaded to could be read)")  # fmt: skip
        while True:  # a stopped child is a parent no longer followed for its own children
            live = {key for key, state in self.tables.items() if state.live}
            unfollowed = foreign_keys.unfollowed_parents(read, live)  # (kept keys' children: above)
            if not unfollowed:
                return
            for child, fk in unfollowed.items():
                parent, names = self.tables.get(fk.parent), (".".join(fk.parent), ".".join(child))
                if parent is not None and parent.unsyncable:
                    self._stop_table(
                        self.tables[child],
                        f"its foreign key {fk.describe()}: the parent cannot be synced (its own line says "
                        f"why), so the rows its changes cascade to would never reach the lake; make "
                        f"{names[0]} syncable first, or --exclude {names[1]}",
                    )
                    continue
                # A parent selected, dropped or stopped for a reason of its own (a reload drops and
                # makes it again): a resync of both cures it; not one stopped for its own parent.
                if parent is not None and "its foreign key" not in (parent.error or ""):
                    self._stop_table(
                        self.tables[child],
                        f"its foreign key {fk.describe()}: the parent's sync is stopped (or its source "
                        f"table dropped), so the rows its changes cascade to would not reach the lake; "
                        f"re-snapshot both once it is there: "
                        f"`lakehouse run cdc --resync {names[0]} --resync {names[1]}`",
                    )
                    continue
                self._stop_table(
                    self.tables[child],
                    f"its foreign key {fk.describe()}: the parent is not synced, so the rows its changes "
                    f"cascade to would never reach the lake; sync {names[0]} too, or --exclude {names[1]}",
                )

    def _mark_cascaded_children(self) -> None:
        """Each synced child's lake table names the parents that cascade to it (a table property,
        written when that changes): once the source table is gone, its keys are too, and a restart
        must know that the changes it missed include cascades it can no longer read."""
        parents: dict[tuple[str, str], set[str]] = {}
        for fk in self.foreign_keys:
            if fk.cascades and fk.child in self.tables:
                parents.setdefault(fk.child, set()).add(".".join(fk.parent))
        for key in set(parents) | set(self._cascaded_from):
            state, value = self.tables.get(key), ",".join(sorted(parents.get(key, ())))
            if state is None or not state.live or self._cascaded_from.get(key) == value:
                continue
            target = state.spec.target
            if not target_table.table_exists(self.spark, target):
                continue  # not in the lake yet: its first copy is on its way; marked at the next read
            if target_table.cascaded_from(self.spark, target) != value:
                target_table.set_cascaded_from(self.spark, target, value)
            self._cascaded_from[key] = value

    def _cascades(
        self,
        transactions: list[Transaction],
        own: dict[tuple[str, str], list[RowChange]],
        end: BinlogPosition,
    ) -> dict[tuple[str, str], list[RowChange]]:
        """Per child table, the rows its parents' changes cascaded to in the source (no row events),
        as the source has them now; then their own children, until nothing more changes (InnoDB stops
        at 15 levels). A child's seeds are its parents' changes after the *child's* position, so a
        cascade a crash cut off is found again from the binlog on restart."""
        cascaded: dict[tuple[str, str], list[RowChange]] = {}
        seen: set[tuple] = set()
        upstream: dict[tuple[str, str], list[RowChange]] | None = None  # None: the binlog's changes
        for _ in range(16):
            found: dict[tuple[str, str], list[RowChange]] = {}
            for fk in self.foreign_keys:
                child = self.tables.get(fk.child)
                if not fk.cascades or child is None:
                    continue
                if child.live and child.resync is not None and child.resync.phase is Phase.BUILDING:
                    self._seed_copy(child.resync, fk, transactions, upstream, end)
                if self._cascade_table(child) is None:
                    continue
                since = child.position if child.applies else child.resync.held_after
                if since.order >= end.order:
                    continue  # a child already past this batch (a fresh snapshot) holds the cascade
                old, new = foreign_keys.cascade_values(fk, _parent_changes(fk, transactions, upstream, since))
                if not old and not new:
                    continue
                in_batch = own.get(fk.child, []) + cascaded.get(fk.child, [])
                if not child.applies:  # rows held for its copy and not merged into it yet
                    in_batch += child.resync.unmerged()
                try:
                    now = self._children_now(child, fk, old, new, in_batch)
                except source_db.MissingTable:  # dropped since: its DROP is later in the binlog
                    if child.applies:  # (one waiting for its copy: the DROP settles it, as any)
                        self._source_dropped(child, f"after {child.position} (gone before the rows its "
                                             f"parent's changes cascaded to could be read)")  # fmt: skip
                    continue
                changes = [c for c in now if (fk.child, c.key) not in seen]
                if not changes:
                    continue
                seen.update((fk.child, c.key) for c in changes)
                cascaded.setdefault(fk.child, []).extend(changes)
                found.setdefault(fk.child, []).extend(changes)
                log.info("%s: %d rows as %s cascaded them (%s)", child.spec.target, len(changes),
                         ".".join(fk.parent), fk.name)  # fmt: skip
            if not found:
                return cascaded
            upstream = found
        return cascaded

    @staticmethod
    def _seed_copy(
        beside: BesideStream,
        fk: foreign_keys.ForeignKey,
        transactions: list[Transaction],
        upstream: dict[tuple[str, str], list[RowChange]] | None,
        end: BinlogPosition,
    ) -> None:
        """A copy being built read each chunk at some moment after its B: a parent's change after B
        may have cascaded to rows a chunk read before it. Its referenced values are kept with the
        batch's end, and the rows under them found in the copy once it is built
        (`_cascade_into_copy`). A copy still queued reads every row later: nothing to keep."""
        parent_changes = _parent_changes(fk, transactions, upstream, beside.held_after)
        old, new = foreign_keys.cascade_values(fk, parent_changes)
        if old or new:
            beside.cascade_seeds.append((end, fk, old, new))

    def _cascade_into_copy(self, state: TableState) -> None:
        """Before a built copy is caught up: the rows its parents' changes cascaded to while it was
        built (`_seed_copy`), as the source has them now, held for it after every change held so far,
        then what they cascade to within the table itself (a table referencing itself)."""
        beside = state.resync
        seeds, beside.cascade_seeds = beside.cascade_seeds, []
        level = {}  # one read per foreign key: every batch's values after B together
        for end, fk, old, new in seeds:
            if end.order > beside.built.progress.position.order:
                values = level.setdefault(fk, (set(), set()))
                values[0].update(old)
                values[1].update(new)
        level = [(fk, old, new) for fk, (old, new) in level.items()]
        staging, found_all, seen = beside.built.staging, [], set()
        for _ in range(16):  # InnoDB stops at 15 levels
            found = []
            held = beside.unmerged()
            for fk, old, new in level:
                try:
                    now = self._children_now(state, fk, old, new, held + found_all + found, staging)
                except source_db.MissingTable:  # dropped since: as any copy of a table that went
                    log.warning("%s: gone from the source while its copy was built", state.spec.target)
                    return
                found += [c for c in now if c.key not in seen]
                seen.update(c.key for c in found)
            if not found:
                break
            found_all += found
            level = [
                (fk, *foreign_keys.cascade_values(fk, found))
                for fk in self.foreign_keys
                if fk.cascades and fk.parent == fk.child == state.spec.source_key
            ]
        if found_all:
            beside.hold(beside.seen_until or beside.built.progress.position, found_all)
            log.info(
                "%s: %d rows of the copy as its parents' changes cascaded them while it was built",
                state.spec.target, len(found_all),
            )  # fmt: skip

    @staticmethod
    def _cascade_table(child: TableState) -> str | None:
        """Where a child's rows are, to find those its parents' changes cascaded to: its lake table,
        or, while that waits for a copy, the built copy (held for it like its own changes). None:
        neither (a copy still being built: `_seed_copy`)."""
        if child.applies:
            return child.spec.target
        if child.live and child.resync is not None and child.resync.built is not None:
            return child.resync.built.staging
        return None

    def _children_now(
        self,
        child: TableState,
        fk: foreign_keys.ForeignKey,
        old: set[tuple],
        new: set[tuple],
        in_batch: list[RowChange],
        table: str | None = None,
    ) -> list[RowChange]:
        """The child rows under the parents' old referenced values (in the lake, or changed in this
        batch), each as the source has it now (an upsert; a delete when the source no longer has the
        key), and the source's child rows under the new values (ON UPDATE CASCADE moved them there, a
        key that includes the foreign key too)."""
        from functools import reduce

        from pyspark.sql import functions as F

        columns = [F.col(identifier(c)) for c in fk.child_columns]
        candidates: dict[tuple, dict] = {}  # key text -> the row as the lake (or this batch) has it
        ordered = sorted(old, key=repr)
        for start in range(0, len(ordered), 500):
            chunk = ordered[start : start + 500]
            if len(columns) == 1:
                condition = columns[0].isin([v[0] for v in chunk])
            else:
                terms = [reduce(lambda a, b: a & b, (c == F.lit(x) for c, x in zip(columns, v, strict=True)))
                         for v in chunk]  # fmt: skip
                condition = reduce(lambda a, b: a | b, terms)
            for row in self.spark.table(table or self._cascade_table(child)).where(condition).collect():
                values = foreign_keys.as_binlog_values(row.asDict())
                candidates[foreign_keys.key_text(values, child.key)] = values
        for change in in_batch:  # inserted or moved under an old value in this same batch
            if change.op != DELETE and foreign_keys.referenced(change.row, fk.child_columns) in old:
                candidates[foreign_keys.key_text(change.row, child.key)] = change.row
        now = source_db.rows_by_key(
            self._connect, child.spec.source_schema, child.spec.source_name, child.key,
            [tuple(row[k] for k in child.key) for row in candidates.values()],
        )  # fmt: skip
        if new:
            now.update(source_db.rows_where(
                self._connect, child.spec.source_schema, child.spec.source_name, child.key,
                fk.child_columns, sorted(new, key=repr),
            ))  # fmt: skip
        changes = []
        for text, row in candidates.items():
            key = tuple(row[k] for k in child.key)
            current = now.pop(text, None)
            changes.append(
                RowChange(UPSERT, key, current, before=row) if current else RowChange(DELETE, key, row)
            )
        for current in now.values():  # moved under a new value, the key with it
            changes.append(RowChange(UPSERT, tuple(current[k] for k in child.key), current))
        return changes

    def _commit_progress(self, position: BinlogPosition) -> None:
        """Move quiet tables' stored positions up to `position` (everything before it is applied)."""
        for state in self.tables.values():
            if state.live and state.gone_by is not None and position.order >= state.gone_by.order:
                # read past the binlog's end at the start, no DROP for it (dropped unlogged)
                self._source_dropped(state, f"after {state.position} (while the job was stopped)")
                continue
            if state.resync is not None:
                state.resync.hold(position, [])  # read up to here: nothing more of it was held
            if not state.applies or position.order <= state.position.order:
                continue
            if time.monotonic() - state.last_commit < self.progress_seconds:
                continue
            target = state.spec.target
            position_commit.commit_position(
                self.spark,
                target,
                state.position,
                position,
                lambda properties, target=target: position_commit.commit_progress_only(
                    self.spark, target, properties
                ),
            )
            state.position, state.last_commit = position, time.monotonic()
            log.info("%s: no changes; stored position moved to %s", target, position)

    def _apply_ddl(self, ddl: DdlEvent) -> None:
        statement = " ".join(ddl.change.statement.split())
        self._apply_table_ddl(ddl, statement)
        self._refresh_foreign_keys()  # a FOREIGN KEY added or dropped, a table created or dropped

    def _apply_table_ddl(self, ddl: DdlEvent, statement: str) -> None:
        for source_key in ddl.tables:
            state = self.tables.get(source_key)  # None: followed once, then gone before its snapshot
            if state is not None and state.dropped and ddl.change.created:
                self._created_again(state, statement)
                continue
            if state is not None and state.resync is not None:
                if not state.resync.changed_after(ddl.end):
                    self._wait_for_copy(state, f"`{statement}`, from before the copy's position")
                    continue  # the copy has it
                if not self._ddl_beside(state, ddl, statement):
                    continue
            if state is None or not state.live or ddl.end.order <= state.position.order:
                continue
            if (
                ddl.change.foreign_keys_changed
                and not ddl.change.column_changes
                and not ddl.change.unsupported
            ):
                continue  # the keys are read again after the statement
            if ddl.change.drops:  # renamed away too: the new name is a new table (`ddl.created`)
                renamed = " (renamed away)" if ddl.change.renamed else ""
                self._source_dropped(state, f"at {ddl.end}{renamed}", statement)
            elif ddl.change.replaces:  # CREATE OR REPLACE: the source's rows are new, without row events
                self._replaced(state, statement)
            elif ddl.change.created and not ddl.change.unsupported:
                continue  # CREATE TABLE IF NOT EXISTS on a table that exists: nothing changed
            elif ddl.change.truncate:
                self._truncate(state, ddl.end, statement)
            elif ddl.change.unsupported:
                what = f"unsupported DDL on {state.spec.source} (`{ddl.change.reason}`)"
                self._stop_or_wait(
                    state, f"sync stopped at {ddl.end}: {what}: `{statement}`; {resync_hint(state.spec)}"
                )
            else:
                self._evolve(state, ddl, statement)
        for schema, name in ddl.created:
            self._follow_created_table(schema, name, statement)
        for source_key in ddl.recreated:
            state = self.tables.get(source_key)
            if state is None:  # gone with its first copy (`_ddl_beside`): the new table is new
                self._follow_created_table(*source_key, statement)
            elif state.dropped:
                self._created_again(state, statement)

    def _ddl_beside(self, state: TableState, ddl: DdlEvent, statement: str) -> bool:
        """A DDL on a table being re-snapshotted, after the copy's position (its columns are B's): the
        copy starts again (a DROP ends it). Returns whether the live table takes the DDL too."""
        beside = state.resync
        self._call_off(state)
        if not ddl.change.drops:
            self._request_resync(state, f"{beside.why}; again after `{statement}`", beside.applies_live)
            return beside.applies_live
        if beside.applies_live:
            return True
        self._gone_for_copy(state, False, beside.lake_position, statement=statement)
        return False

    def _follow_created_table(self, schema: str, name: str, statement: str) -> None:
        """A table the selection takes was created (or renamed into place, or given the primary key
        it waited for) in the source: snapshot it and follow it, between two batches of the others."""
        waiting = self.tables.get((schema, name))
        if waiting is not None and waiting.dropped:
            self._created_again(waiting, statement)
            return
        if waiting is not None and not waiting.awaits_key:
            return
        others = {t.spec.target: t.spec for k, t in self.tables.items() if k != (schema, name)}
        spec = self._spec_or_stop(schema, name, others)
        if spec is None:
            return
        conn = self._connect()
        try:
            described = source_db.describe_table(conn, schema, name)
            for column in described.columns:
                column.spark_type  # noqa: B018 - raises UnsupportedType for a type with no mapping
        except source_db.MissingTable:
            log.warning("%s: created (`%s`), gone before its snapshot; not synced", spec.source, statement)
            return
        except source_db.NoPrimaryKey as exc:
            state = TableState(spec, (), [], BinlogPosition("", 0), awaits_key=True)
            self.tables[spec.source_key] = state
            self._stop_table(state, f"cannot sync: {exc}")
            return
        except UnsupportedType as exc:
            state = self.tables[spec.source_key] = TableState(spec, (), [], BinlogPosition("", 0))
            self._stop_table(state, f"cannot sync {spec.source}: {exc}; change or drop that column")
            return
        finally:
            conn.close()
        # Followed from now on: before the copy's position, so none of its changes after it is missed.
        state = self.tables[spec.source_key] = TableState(spec, described.key, [], BinlogPosition("", 0))
        self._request_resync(state, f"new source table: `{statement}`", applies_live=False)

    def _source_dropped(self, state: TableState, where: str, statement: str | None = None) -> None:
        """The source table is gone: the lake table keeps its rows, marked with where the DROP was
        (`lakehouse.cdc.source-dropped`), and the job goes on. Said once: later starts find the mark."""
        spec = state.spec
        if state.resync is not None:  # a copy of what is gone: nothing to swap in
            self._call_off(state)
        state.dropped, state.error = where, None  # (a table stopped for its copy: nothing to copy now)
        if self.reader is not None:
            self.reader.unfollow(spec.source_key)
        target_table.mark_source_dropped(self.spark, spec.target, where)
        log.warning(
            "%s: the source table %s was dropped %s%s; the lake table keeps its rows (table property %s). "
            "If it comes back, `lakehouse run cdc --resync %s` syncs it anew; to remove the lake table: "
            "`lakehouse run cdc --drop-orphaned %s`",
            spec.target,
            spec.source,
            where,
            f" (`{statement}`)" if statement else "",
            target_table.DROPPED_PROPERTY,
            spec.source,
            spec.target,
        )

    def _created_again(self, state: TableState, statement: str) -> None:
        """A dropped table's name is taken again: its rows are another table's. Synced anew only on
        request, so the kept rows are never replaced by surprise. A CREATE replayed from before the DROP
        (a restart reads from the oldest table's position) finds no table in the source: nothing."""
        conn = self._connect()
        try:
            exists = source_db.table_exists(conn, *state.spec.source_key)
        finally:
            conn.close()
        if not exists:
            log.info("%s: `%s` replayed; the table it made was dropped since", state.spec.target, statement)
            return
        if state.error is None:
            self._stop_table(
                state,
                f"the source table {state.spec.source} was created again (`{statement}`) after it was "
                f"dropped {state.dropped}; the lake table keeps the old rows; {resync_hint(state.spec)}",
            )

    def _stop_table(self, state: TableState, message: str) -> None:
        if state.gone_by is not None and state.dropped is None:  # no source to re-snapshot from
            why = message.split("; re-snapshot it")[0]
            self._source_dropped(state, f"after {state.position} (while the job was stopped; then {why})")
            return
        if state.resync is not None:  # what stops the table stops its copy too: it would not cure it
            self._call_off(state)
        state.error = f"{state.spec.target or state.spec.source}: {message}"
        log.error(state.error)

    def _stop_or_wait(self, state: TableState, message: str) -> None:
        """A DDL the live table cannot follow: it stops, unless a copy (with the source's columns
        after the DDL: `_ddl_beside` started it again) is on its way to replace it."""
        if state.resync is not None:
            self._wait_for_copy(state, message)
        else:
            self._stop_table(state, message)

    def _wait_for_copy(self, state: TableState, why: str) -> None:
        """The live table of a table being re-snapshotted stops receiving changes (they stay held for
        the copy, which replaces its rows): what it would have to follow, the copy already has."""
        if state.resync.applies_live:
            state.resync.applies_live = False
            state.resync.lake_position = state.position  # what this job stored last
            log.warning("%s: %s; the lake table waits for the copy re-snapshotted beside the stream",
                        state.spec.target, why)  # fmt: skip
            self._resync_descendants(state)

    def _evolve(self, state: TableState, ddl: DdlEvent, statement: str) -> None:
        """Column changes, per the `--schema-changes` policy (`schema_policy.py`)."""
        target = state.spec.target
        planned = schema_policy.plan(
            ddl.change.column_changes,
            self.schema_changes,
            state.source_columns,
            {name.lower(): kind for name, kind in state.columns},
            state.key,
            exact=state.columns_exact,
        )
        if planned.stop is not None:
            self._stop_or_wait(
                state,
                f"sync stopped at {ddl.end}: `{statement}` on {state.spec.source}: {planned.stop}; "
                f"{resync_hint(state.spec)}",
            )
            return
        for action in planned.actions:  # types checked by the plan: every one has a mapping
            if action.kind == "add":
                target_table.add_columns(self.spark, target, (action.column,))
            elif action.kind == "rename":
                target_table.rename_column(self.spark, target, action.name, action.new_name)
            elif action.kind == "promote":
                target_table.promote_column(self.spark, target, action.name, action.column.spark_type)
        state.source_columns = planned.source_columns
        state.columns = target_table.target_columns(self.spark, target)
        if planned.unsynced - state.unsynced:
            state.unsynced = frozenset(state.unsynced | planned.unsynced)
            target_table.set_unsynced_columns(self.spark, target, state.unsynced)
        log.info(
            "%s: `%s` followed (--schema-changes %s): %s",
            target,
            statement,
            self.schema_changes,
            ", ".join(
                f"{a.kind} {a.name}" + (f" -> {a.new_name}" if a.new_name else "") for a in planned.actions
            )
            or "the lake schema stays",
        )
        if planned.resnapshot is not None:
            # The source changed existing rows without row events: re-read the table.
            self._resnapshot(state, planned.resnapshot)

    def _truncate(self, state: TableState, end: BinlogPosition, statement: str) -> None:
        """TRUNCATE in the source: the lake table is emptied at the same binlog position."""
        target = state.spec.target
        position_commit.commit_position(
            self.spark,
            target,
            state.position,
            end,
            lambda properties: with_snapshot_properties(
                self.spark, properties, lambda: self.spark.sql(f"DELETE FROM {target}")
            ),
        )
        state.position, state.last_commit = end, time.monotonic()
        log.info("%s: emptied at %s, as the source was: `%s`", target, end, statement)

    def _replaced(self, state: TableState, statement: str) -> None:
        """CREATE OR REPLACE: a new table under the old name, maybe with another key (or none). The
        reader keys its row events by the (maybe new) key from here on, before the copy reads its
        position; the lake table keeps its rows, not applied to, until the copy replaces them."""
        self._request_resync(state, f"`{statement}` replaced the source table", applies_live=False)

    def _resnapshot(self, state: TableState, why: str) -> None:
        """The source rewrote existing values without row events: the lake table waits for the copy,
        its stored position before the statement, so a job stopped before the swap meets it again."""
        self._request_resync(state, why, applies_live=False)

    def _fail_all(self, reason: str) -> None:
        for state in self.tables.values():
            if state.live:
                state.error = f"{state.spec.target}: sync stopped: {reason}; {resync_hint(state.spec)}"
                log.error(state.error)

    # ---- status -------------------------------------------------------------------------------

    @property
    def errors(self) -> list[str]:
        return [t.error for t in self.tables.values() if t.error] + self._resync_failures

    @property
    def all_stopped(self) -> bool:
        """Nothing is left to sync: every table stopped and none can join (no pattern), or the
        binlog cannot be read on."""
        if self.reader is not None and self.reader.fatal is not None:
            return True
        return not self.selection.dynamic and not any(t.live for t in self.tables.values())

    def caught_up(self, target: BinlogPosition) -> bool:
        """Everything up to `target` has been read and applied (or the reader cannot go on)."""
        if self.reader is None or self.all_stopped:
            return True
        position = self.reader.position
        if any(t.live and t.gone_by is not None for t in self.tables.values()):
            return False  # a table gone at start: marked by the batch that reads past `gone_by`
        return self.reader.items.empty() and position.order >= target.order and not self.resyncing

    def close(self) -> None:
        # Also after a failure: a reader left running would share the server id with a restarted
        # job's reader, and MySQL drops one of two dump threads with the same id whenever one connects.
        if self.reader is not None:
            self.reader.stop()
        for state in self.tables.values():
            if state.resync is not None:  # its staging table stays: a `--resync` resumes it
                state.resync.cancel()
                self._unwinding.append(state.resync)
        for beside in self._unwinding:
            beside.wait(RESYNC_STOP_SECONDS)

    # ---- as a streaming job (jobs/common/streaming_job.py) ----------------------------------------

    def prepare(self) -> None:
        self.start()
        if self.stop_at_source_end:
            conn = self._connect()
            try:
                self._source_end = BinlogPosition(*source_db.master_position(conn))
            finally:
                conn.close()

    def finish(self) -> None:
        for error in self.errors:  # a table stopped (unsupported DDL, ...): the others went on
            log.error("cdc: %s", error)

    def background_work(self) -> bool:
        return self.resyncing

    def lag_seconds(self) -> float | None:
        return self.last_report.lag_seconds if self.last_report.position else None

    def reached_end(self) -> bool:
        return self.all_stopped or (self._source_end is not None and self.caught_up(self._source_end))

    def problem(self) -> str | None:
        failed = self.reader.connection_error if self.reader is not None else None
        if failed is None or time.monotonic() - failed[0] > PROBLEM_SHOWN_SECONDS:
            return "; ".join(self.errors) or None
        return f"binlog connection lost, reconnecting ({failed[1][:200]})"


def run_sync(sync: CdcSync, mode: RunMode, stop: StopRequest) -> int:
    """Start `sync` and run batches until the mode says stop; returns the exit code.

    2: some table stopped with an error. 3: another CDC job committed to a table (nothing written).
    """
    sync.stop_at_source_end = sync.stop_at_source_end or mode.until_idle  # --until-idle: the source's end now
    try:
        sync.prepare()

        def batch() -> int:
            handled = sync.run_batch()
            if sync.reached_end():
                stop.set()
            return handled

        total = run_batches(batch, mode, stop, busy=sync.background_work)
        log.info("cdc stopped after %d changes", total)
    except ConcurrentWriterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return CONCURRENT_WRITER_EXIT
    finally:
        sync.close()
    for error in sync.errors:
        print(f"error: {error}", file=sys.stderr)
    return 2 if sync.errors else 0
