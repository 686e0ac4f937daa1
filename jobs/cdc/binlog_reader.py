"""Thin I/O over python-mysql-replication: a background reader that queues whole transactions.

The reader keeps only ROW events of the configured tables and hands the job complete transactions
(never half of one), each tagged with the binlog position just after its commit and the GTID state
that includes it. DDL on a configured table is queued in binlog order too, and so is a statement
that creates a table the job's selection takes (the job then snapshots it and calls `follow`). On a
lost connection (server restart, network) it reconnects with backoff from the end of the last
complete transaction it read; a partially read transaction is dropped and read again.

Resuming: on MariaDB by GTID (the library's `auto_position`; with `is_mariadb=True` it ignores
file/pos and would stream from the oldest binlog file), elsewhere by file/pos. The position only
moves between transactions: a SAVEPOINT or other statement inside one never moves it.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    FormatDescriptionEvent,
    GtidEvent,
    MariadbBinLogCheckPointEvent,
    MariadbGtidEvent,
    MariadbGtidListEvent,
    NotImplementedEvent,
    PreviousGtidsEvent,
    QueryEvent,
    RotateEvent,
    StopEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.gtid import Gtid, GtidSet
from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from jobs.cdc.binlog_values import selected_row
from jobs.cdc.change_batch import RowChange, row_changes
from jobs.cdc.ddl import DdlChange, classify
from jobs.cdc.source_db import binlog_setting_problems

log = logging.getLogger(__name__)

_ROW_KIND = {WriteRowsEvent: "insert", UpdateRowsEvent: "update", DeleteRowsEvent: "delete"}
BINLOG_GONE_CODE = 1236  # ER_MASTER_FATAL_ERROR_READING_BINLOG: file purged / position invalid
# Events the library does not decode (it hands them over as NotImplementedEvent): a compressed
# transaction or event holds row changes that would otherwise vanish without a trace.
COMPRESSED_EVENTS = {
    40: "MySQL Transaction_payload_event (binlog_transaction_compression=ON)",
    **{code: "MariaDB compressed event (log_bin_compress=ON)" for code in range(165, 172)},
}
COMPRESSION_FIX = (
    "turn binlog compression off (RDS MySQL: binlog_transaction_compression=OFF in the DB parameter "
    "group, and no session enables it; MariaDB: log_bin_compress=OFF)"
)

INCIDENT_EVENT = 26  # e.g. LOST_EVENTS: a change the server could not write to the binlog
INCIDENT_FIX = "re-snapshot the synced tables (`lakehouse run cdc --resync <schema.table>`)"


@dataclass(frozen=True)
class BinlogPosition:
    file: str
    pos: int
    gtid: str = field(default="", compare=False)

    @property
    def order(self) -> tuple[str, int]:
        # Binlog file names share a prefix and a zero-padded sequence number: they sort as text.
        return (self.file, self.pos)

    def to_json(self) -> str:
        return json.dumps({"file": self.file, "pos": self.pos, "gtid": self.gtid}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BinlogPosition:
        data = json.loads(text)
        return cls(data["file"], int(data["pos"]), data.get("gtid", ""))

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}" + (f" gtid={self.gtid}" if self.gtid else "")


def add_gtid(state: str, gtid: str) -> str:
    """The GTID state `state` after the transaction `gtid` committed.

    MariaDB (`domain-server-seq`): the state keeps the last GTID per replication domain.
    MySQL (`uuid:n`): a GTID set; the library's GtidSet does the interval arithmetic.
    """
    if not gtid:
        return state
    if ":" in gtid:
        return str(GtidSet(state) + Gtid(gtid)) if state else gtid
    domain = gtid.split("-", 1)[0]
    kept = [g for g in state.split(",") if g.strip() and g.strip().split("-", 1)[0] != domain]
    return ",".join([*(g.strip() for g in kept), gtid])


@dataclass
class Transaction:
    """One committed source transaction: row changes per source table, in binlog order."""

    changes: dict[tuple[str, str], list[RowChange]]
    end: BinlogPosition
    timestamp: int  # server commit time (epoch seconds)


@dataclass(frozen=True)
class DdlEvent:
    change: DdlChange
    tables: tuple[tuple[str, str], ...]  # the configured source tables it touches
    end: BinlogPosition
    timestamp: int
    # Tables it made exist that the reader does not follow yet and the selection takes.
    created: tuple[tuple[str, str], ...] = ()
    # Followed tables it took away and made again (RENAME t TO t_old, t_new TO t).
    recreated: tuple[tuple[str, str], ...] = ()


class BinlogGone(RuntimeError):
    """The stored position is no longer in the server's binlog (purged)."""


# What a lost or refused connection raises: PyMySQL turns a short read or a socket (or TLS) error
# into its own errors. (A struct.error comes from the library's decoders: a decoding failure.)
CONNECTION_ERRORS = (pymysql.err.Error, OSError)
UNDECODABLE_TRIES = 3


# The events the reader asks for. Between transactions, each one's end is a place to resume from, so
# an idle reader reaches the server's binlog end (MySQL starts every file with Format_description and
# Previous_gtids; MariaDB with Format_description, Gtid_list and Binlog_checkpoint).
READ_EVENTS = [
    WriteRowsEvent,
    UpdateRowsEvent,
    DeleteRowsEvent,
    TableMapEvent,
    QueryEvent,
    XidEvent,
    RotateEvent,
    FormatDescriptionEvent,
    MariadbGtidEvent,
    GtidEvent,
    MariadbGtidListEvent,
    MariadbBinLogCheckPointEvent,
    PreviousGtidsEvent,  # MySQL: after a rotate, where an idle reader reaches the file's end
    StopEvent,
    XAPrepareEvent,
    NotImplementedEvent,
]


class UnreadableBinlog(RuntimeError):
    """The binlog holds what the reader cannot decode (compression) or its settings changed."""


class BinlogReader:
    def __init__(
        self,
        connection_settings: dict,
        server_id: int,
        start: BinlogPosition,
        tables: dict[tuple[str, str], tuple[str, ...]],
        *,
        is_mariadb: bool = True,
        max_queued: int = 20_000,
        max_backoff: float = 10.0,
        selects: Callable[[str, str], bool] = lambda schema, name: False,
        lower_case_table_names: int = 0,
    ) -> None:
        self._settings = connection_settings
        self._server_id = server_id
        self._tables = dict(tables)
        # A table created (or given a primary key) under such a name is reported (DdlEvent.created).
        self._selects = selects
        # The server's lower_case_table_names: a DDL may name a table in any letter case (1: names are
        # stored in lower case; 2: as created, compared in lower case). Row events carry stored names.
        self._name_case = lower_case_table_names
        self._is_mariadb = is_mariadb
        self._max_backoff = max_backoff
        self.items: queue.Queue[Transaction | DdlEvent] = queue.Queue(maxsize=max_queued)
        self.start_position = start
        self.position = start  # end of the last complete transaction read (and queued)
        self.reconnects = 0
        self.fatal: BaseException | None = None
        # The last connection failure and when (monotonic): the job reports it while it is recent.
        self.connection_error: tuple[float, str] | None = None
        self._stop = threading.Event()
        self._stream: BinLogStreamReader | None = None
        self._thread = threading.Thread(target=self._run, name="binlog-reader", daemon=True)

    def start(self) -> BinlogReader:
        self._thread.start()
        return self

    def follow(self, table: tuple[str, str], key: tuple[str, ...]) -> None:
        """Queue `table`'s row changes from now on (a table created while the reader runs). Called
        before the table's snapshot reads its position, so no change after that position is missed."""
        self._tables[table] = key

    def unfollow(self, table: tuple[str, str]) -> None:
        """Stop queueing `table`'s changes (it went before the job could snapshot it)."""
        self._tables.pop(table, None)

    def stop(self) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            # The reading thread sits in a blocking recv until the next event or heartbeat (5 s):
            # shutting the socket down wakes it now; close() alone does not.
            sock = getattr(getattr(stream, "_stream_connection", None), "_sock", None)
            try:
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
                stream.close()
            except Exception:  # noqa: BLE001 - closing a dead socket may fail; we are leaving
                pass
        self._thread.join(timeout=5)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ---- the reading thread -------------------------------------------------------------------

    def _resume_from(self) -> dict:
        if self._is_mariadb and self.position.gtid:
            # MariaDB streams from the transaction after this GTID state (strict mode: a GTID the
            # server does not have is an error, not a silent skip).
            return {"is_mariadb": True, "auto_position": self.position.gtid}
        # The file/pos dump; MariaDB accepts it too (then without GTID checks).
        return {"is_mariadb": False, "log_file": self.position.file, "log_pos": self.position.pos}

    def _open(self) -> BinLogStreamReader:
        return BinLogStreamReader(
            connection_settings=self._settings,
            server_id=self._server_id,
            resume_stream=True,  # without it the position is ignored
            blocking=True,
            **self._resume_from(),
            only_events=READ_EVENTS,
            # Hand over the events the library cannot decode (by default it drops them unseen):
            # a compressed one must stop the sync, not vanish.
            filter_non_implemented_events=False,
            enable_logging=False,  # it would log the connection parameters
            # No only_tables/only_schemas: the library then skips other tables' TableMap events and
            # keeps a stale table-id entry, so after a server restart reuses the id of a synced table
            # for another one, that table's rows were parsed with the synced table's columns (seen as
            # "Result length not requested length" forever). Rows are parsed lazily and `_read`
            # touches them only for synced tables, so filtering here costs nothing extra.
            slave_heartbeat=5,
        )

    def _run(self) -> None:
        backoff = 0.5
        undecodable, failed_at = 0, None  # failures at one position that no connection problem explains
        while not self._stop.is_set():
            try:
                self._check_settings()  # at every (re)connect: they may have changed meanwhile
                if self._stop.is_set():  # stopped meanwhile: open no dump connection
                    break
                self._stream = self._open()
                self._read(self._stream)
            except Exception as exc:  # noqa: BLE001 - classified below
                if self._stop.is_set():
                    break
                if isinstance(exc, UnreadableBinlog):
                    self.fatal = exc
                    break
                if isinstance(exc, pymysql.err.OperationalError) and exc.args[0] == BINLOG_GONE_CODE:
                    self.fatal = BinlogGone(str(exc.args[1] if len(exc.args) > 1 else exc))
                    break
                if not isinstance(exc, CONNECTION_ERRORS):
                    # Reading again from the same position meets the same event: after a few tries
                    # this is an event the reader cannot decode, not a connection to wait out.
                    undecodable = undecodable + 1 if failed_at == self.position else 1
                    failed_at = self.position
                    if undecodable >= UNDECODABLE_TRIES:
                        self.fatal = UnreadableBinlog(
                            f"the event after {self.position} failed {undecodable} times in a row "
                            f"({type(exc).__name__}: {exc})"
                        )
                        log.error("binlog reader stopped: %s", self.fatal)
                        break
                self.reconnects += 1
                self.connection_error = (time.monotonic(), f"{type(exc).__name__}: {exc}")
                log.warning(
                    "binlog connection lost (%s: %s); reconnecting in %.1fs from %s",
                    type(exc).__name__,
                    exc,
                    backoff,
                    self.position,
                )
                self._stop.wait(backoff)
                backoff = min(self._max_backoff, backoff * 2)
            else:
                backoff = 0.5
            finally:
                if self._stream is not None:
                    try:
                        self._stream.close()
                    except Exception:  # noqa: BLE001
                        pass
                    self._stream = None

    def _check_settings(self) -> None:
        conn = pymysql.connect(**self._settings)
        try:
            problems = binlog_setting_problems(conn)
        finally:
            conn.close()
        if problems:
            raise UnreadableBinlog(f"the source's binlog settings changed: {'; '.join(problems)}")

    def _put(self, item: Transaction | DdlEvent) -> None:
        while not self._stop.is_set():
            try:
                self.items.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def _read(self, stream: BinLogStreamReader) -> None:
        pending: dict[tuple[str, str], list[RowChange]] = {}
        committed = self.position.gtid  # GTID state after the last complete transaction
        current = ""  # GTID of the transaction being read
        in_transaction = False
        for event in stream:
            if self._stop.is_set():
                return
            if isinstance(event, NotImplementedEvent):
                # Never skipped: the position stays before this transaction.
                if event.event_type in COMPRESSED_EVENTS:
                    raise UnreadableBinlog(
                        f"{COMPRESSED_EVENTS[event.event_type]} at {stream.log_file}:{stream.log_pos}, "
                        f"which the binlog reader cannot decode: {COMPRESSION_FIX}"
                    )
                if event.event_type == INCIDENT_EVENT:
                    raise UnreadableBinlog(
                        f"the server logged an incident at {stream.log_file}:{stream.log_pos} (changes "
                        f"may be missing from the binlog; a replica would stop here): {INCIDENT_FIX}"
                    )
                continue
            kind = _ROW_KIND.get(type(event))
            if kind is not None:
                table = (event.schema, event.table)
                key = self._tables.get(table)
                if key is not None:
                    rows = [selected_row(row, event.columns) for row in event.rows]
                    try:
                        changes = row_changes(kind, rows, key)
                    except KeyError as missing:
                        # The table changed under its name (key dropped or changed, replaced, renamed
                        # over): the job stops or re-snapshots it at that DDL, and `follow`s it again.
                        self._tables.pop(table, None)
                        log.warning(
                            "%s.%s: its rows no longer have key column %s: not followed from %s on",
                            *table, missing, self.position,
                        )  # fmt: skip
                        continue
                    pending.setdefault(table, []).extend(changes)
                continue
            if isinstance(event, MariadbGtidEvent):
                # FL_STANDALONE: a single statement (DDL) with no terminating XID/COMMIT follows.
                current, in_transaction = event.gtid, not event.flags & 1
                continue
            if isinstance(event, GtidEvent):
                current = event.gtid  # MySQL: a transaction opens with a BEGIN query
                continue
            if isinstance(event, (XidEvent, XAPrepareEvent)):
                # XA PREPARE ends its binlog group; the rows count once prepared (XA ROLLBACK of a
                # prepared transaction is not followed: jobs/cdc/README.md).
                committed = add_gtid(committed, current)
                end = BinlogPosition(stream.log_file, stream.log_pos, committed)
                self._commit(pending, end, event.timestamp)
                pending, in_transaction = {}, False
            elif isinstance(event, QueryEvent):
                upper = event.query.strip().upper()
                if upper == "BEGIN" or upper.startswith("XA START"):
                    in_transaction = True
                    continue
                ends_group = upper == "COMMIT" or upper.startswith(("XA COMMIT", "XA ROLLBACK"))
                if in_transaction and not ends_group:
                    if upper.startswith("CREATE") and (ddl := classify(event.query)) is not None:
                        # CREATE ... SELECT: logged inside the transaction that writes its rows. A
                        # position inside that transaction: after any stored before it, before its end.
                        inside = BinlogPosition(stream.log_file, stream.log_pos, committed)
                        self._queue_ddl(ddl, event.schema, inside, event.timestamp)
                    continue  # SAVEPOINT, ROLLBACK TO, XA END ...: still inside the transaction
                committed = add_gtid(committed, current)
                end = BinlogPosition(stream.log_file, stream.log_pos, committed)
                in_transaction = False
                if ends_group:  # non-transactional engines end with a COMMIT query
                    self._commit(pending, end, event.timestamp)
                    pending = {}
                    continue
                ddl = classify(event.query)
                if ddl is not None:
                    self._queue_ddl(ddl, event.schema, end, event.timestamp)
                self._advance(end)
            elif not in_transaction and not pending and stream.log_pos >= 4:
                # Between transactions (rotate, format description, GTID list, checkpoint): this is
                # a safe place to resume from, and it lets "caught up" see the end of a new file.
                self._advance(BinlogPosition(stream.log_file, stream.log_pos, committed))

    def _advance(self, position: BinlogPosition) -> None:
        # Never backwards: a resumed stream starts with a rotate event to the file's beginning.
        if position.order >= self.position.order:
            self.position = position

    def _commit(self, pending: dict, end: BinlogPosition, timestamp: int) -> None:
        if pending:
            self._put(Transaction(pending, end, timestamp))
        self._advance(end)

    def _stored_name(self, table: tuple[str, str]) -> tuple[str, str]:
        """The name the server stores for `table` as a DDL spells it (row events carry that one)."""
        if not self._name_case:
            return table
        folded = (table[0].lower(), table[1].lower())
        for followed in tuple(self._tables):  # the job's thread follows and unfollows meanwhile
            if (followed[0].lower(), followed[1].lower()) == folded:
                return followed
        return folded if self._name_case == 1 else table

    def _queue_ddl(self, ddl: DdlChange, default_schema: bytes | str, end: BinlogPosition, timestamp: int):
        schema = default_schema.decode() if isinstance(default_schema, bytes) else default_schema
        named_in = [self._stored_name((s or schema, n)) for s, n in ddl.tables]
        touched = tuple(t for t in named_in if t in self._tables)
        if ddl.dropped_schema is not None:  # DROP DATABASE: every followed table in it
            dropped = ddl.dropped_schema.lower() if self._name_case else ddl.dropped_schema
            touched = tuple(
                t for t in tuple(self._tables) if (t[0].lower() if self._name_case else t[0]) == dropped
            )
        # Created, or given the primary key it lacked: a table the job may start following.
        named = [
            self._stored_name((s or schema, n))
            for s, n in (*ddl.created, *(ddl.tables if ddl.adds_key else ()))
        ]
        created = tuple(t for t in named if t not in self._tables and self._selects(*t))
        recreated = tuple(t for t in named if t in touched) if ddl.drops else ()
        if touched or created:
            self._put(DdlEvent(ddl, touched, end, timestamp, created, recreated))
