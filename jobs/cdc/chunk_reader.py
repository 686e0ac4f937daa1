"""The snapshot's reading half, in a process of its own: chunks by primary key -> Arrow files.

Why a process: reading (pymysql parses every row in Python) and converting rows for Spark are both
Python work. In the driver's process they shared one interpreter lock with each other and with
py4j, and the snapshot copied at 0.28x the speed of a bare `SELECT *`. The child reads a piece
(`piece_rows` rows, read `chunk_rows` at a time), converts it to Arrow and writes it as an Arrow
IPC stream file; the driver hands each file to the JVM and commits it while the child reads on.

Protocol (`python -m jobs.cdc.chunk_reader`): one JSON request on stdin (connection settings, the
table as described by the driver, the key range (after a key, up to a key), sizes (of a piece, of a
chunk, of an Arrow batch), the directory for the files); one JSON line per piece on stdout (`path`,
`after` = its last key, `rows`, `chunks`, `done`), or one `error` line and exit status 1. The
child writes ahead of the driver by at most `READ_AHEAD` files, and exits when the driver is gone
(a kill -9 leaves no reader behind). A snapshot may run several, each over a range of keys.
"""

from __future__ import annotations

import datetime
import decimal
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pymysql
from pymysql import converters
from pymysql.constants import FIELD_TYPE

from jobs.cdc import source_db
from jobs.cdc.apply_changes import arrow_column
from jobs.cdc.schema_mapping import SourceColumn
from jobs.cdc.source_db import SourceTable
from jobs.common.arrow_frames import ARROW_BATCH_ROWS, write_arrow_file
from jobs.common.fault_injection import pause_point
from jobs.config import ConfigError

READ_AHEAD = 2  # pieces written and not yet taken by the driver
# Dates and datetimes stay MySQL's text: Arrow parses each piece's column at once (`arrow_column`).
# PyMySQL parses them value by value in Python (2.2 s per million values here): a date-stamped
# table's reader spent a sixth of its time on that. A piece's last key is parsed (`_typed_key`).
ARROW_PARSED_CONVERSIONS = {
    **converters.conversions,
    **{kind: converters.through for kind in (FIELD_TYPE.DATE, FIELD_TYPE.DATETIME, FIELD_TYPE.TIMESTAMP)},
}


@dataclass(frozen=True)
class Pace:
    """How a reader leaves the box (and the source) to others: `niceness` added to its process's CPU
    priority, and `rest_ratio` seconds of rest per second of reading a chunk (gh-ost's `--nice-ratio`:
    1.0 reads at half speed at most). On a 2-core box a niced process still slows the others: with a
    busy loop at nice 19 beside it, the no-resync p95 of `python -m bench cdc_resync` was 1.60 s
    (1.25-1.37 s without: measured by hand, not a bench row)."""

    niceness: int = 0
    rest_ratio: float = 0.0


FULL_SPEED = Pace()


@dataclass(frozen=True)
class Piece:
    path: str  # an Arrow IPC stream file of the piece's rows, in column order
    after: tuple | None  # the last key of the piece (None: the table had no row after the start)
    rows: int
    chunks: int
    done: bool  # the table has no rows after this piece
    rested: float = 0.0  # seconds the reader rested while it read the piece (`Pace.rest_ratio`)


class ReaderFailed(RuntimeError):
    """The reader process failed for a reason that is not the source's (a bug, a full disk)."""


class StoredAsText(str):
    """A key value an earlier version stored as text (a decimal, a date, a TIME): MySQL may compare
    it inexactly. Read only from an earlier version's progress, which is not resumed
    (`snapshot.SnapshotProgress.earlier_version`)."""


def keys_to_json(key: tuple | None) -> list | None:
    """A key as JSON that reads back as the same Python values, so that MySQL compares the key
    exactly as in the run that read it (a decimal as text would be compared as a double)."""
    return None if key is None else [_json_value(v) for v in key]


def keys_from_json(data: list | None) -> tuple | None:
    return None if data is None else tuple(_value(v) for v in data)


def _json_value(value: object) -> object:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, bool) or value is None or isinstance(value, int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return {"decimal": str(value)}
    if isinstance(value, datetime.datetime):  # before date: a datetime is a date
        return {"datetime": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"date": value.isoformat()}
    if isinstance(value, datetime.timedelta):  # TIME
        return {"time_us": value // datetime.timedelta(microseconds=1)}
    raise TypeError(f"a primary key value of type {type(value).__name__} cannot be stored: {value!r}")


def _value(value: object) -> object:
    if not isinstance(value, dict):
        return value
    (kind, data), *_ = value.items()
    readers = {
        "hex": bytes.fromhex,
        "decimal": decimal.Decimal,
        "datetime": datetime.datetime.fromisoformat,
        "date": datetime.date.fromisoformat,
        "time_us": lambda us: datetime.timedelta(microseconds=us),
        "text": StoredAsText,
    }
    return readers[kind](data)


def rows_table(source: SourceTable, rows: list[tuple]):
    """Source rows (as `source_db.read_chunk` returns them) as an Arrow table of the lake's types."""
    import pyarrow as pa

    columns = [(c.name, c.spark_type) for c in source.columns]
    arrays = [arrow_column([row[i] for row in rows], kind) for i, (_, kind) in enumerate(columns)]
    return pa.Table.from_arrays(arrays, names=[n for n, _ in columns])


def read_pieces(
    conn,
    source: SourceTable,
    after: tuple | None,
    chunk_rows: int,
    piece_rows: int,
    upto: tuple | None = None,
    rest_ratio: float = 0.0,
) -> Iterator[tuple[list[tuple], tuple | None, int, bool, float]]:
    """(rows, last key, chunks, done, seconds rested) per piece of about `piece_rows` rows, in key
    order, after key `after` and up to key `upto` included (None: no bound). The first piece is one
    chunk: the driver's first commit (seconds of JVM warm-up) then overlaps with reading the second
    piece instead of waiting for a whole one. After each chunk, a rest of `rest_ratio` times its read."""
    pending: list[tuple] = []
    chunks, rested = 0, 0.0
    wanted = chunk_rows
    while True:
        pause_point(f"cdc.snapshot-chunk.{source.name}")
        began = time.monotonic()
        rows, last = source_db.read_chunk(conn, source, after, chunk_rows, upto)
        if rest_ratio:
            rest = rest_ratio * (time.monotonic() - began)
            time.sleep(rest)
            rested += rest
        pending += rows
        chunks += 1
        after = last if last is not None else after
        done = len(rows) < chunk_rows
        if len(pending) >= wanted or done:
            yield pending, after, chunks, done, rested
            pending, chunks, rested, wanted = [], 0, 0.0, piece_rows
        if done:
            return


# ---- the driver's side -------------------------------------------------------------------------


class ChunkReader:
    """Starts the reader process and yields its pieces; `close()` stops it (also on errors)."""

    def __init__(
        self,
        connection: dict,
        source: SourceTable,
        after: tuple | None,
        chunk_rows: int,
        piece_rows: int,
        directory: str,
        batch_rows: int = ARROW_BATCH_ROWS,
        upto: tuple | None = None,
        pace: Pace = FULL_SPEED,
    ) -> None:
        """`pace`: a re-snapshot beside the stream leaves the box to the stream's batches."""
        self.directory = Path(directory) / f"cdc-snapshot-{uuid.uuid4().hex[:8]}"
        self.directory.mkdir(parents=True)
        request = {
            "connection": connection,
            "source": asdict(source),
            "after": keys_to_json(after),
            "upto": keys_to_json(upto),
            "chunk_rows": chunk_rows,
            "piece_rows": piece_rows,
            "batch_rows": batch_rows,
            "rest_ratio": pace.rest_ratio,
            "directory": str(self.directory),
        }
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "jobs.cdc.chunk_reader"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=os.getcwd(),
            )
        except OSError:
            self.directory.rmdir()
            raise
        if pace.niceness:
            priority = os.getpriority(os.PRIO_PROCESS, 0) + pace.niceness
            os.setpriority(os.PRIO_PROCESS, self.process.pid, priority)
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request))  # the password goes through a pipe, not argv
            self.process.stdin.close()
        except OSError:
            self.close()
            raise

    def __iter__(self) -> Iterator[Piece]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            if "error" in message:
                self.process.wait(timeout=30)  # it exits right after reporting
                raise _error(message)
            after = keys_from_json(message["after"])
            yield Piece(
                message["path"], after, message["rows"], message["chunks"], message["done"], message["rested"]
            )
            if message["done"]:
                return
        status = self.process.wait()
        raise ReaderFailed(
            f"the snapshot's reader process ended (exit status {status}) before the table's end"
        )

    def close(self) -> None:
        """Stop the process and remove its files (again: nothing more to do)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def _error(message: dict) -> Exception:
    """The child's error as the exception the driver's callers handle (see `main`)."""
    kind, text = message["error"], message["message"]
    if kind == "MissingTable":
        return source_db.MissingTable(text)
    if kind == "OperationalError":
        code = message.get("code", 2013)
        if code in source_db.REFUSALS:  # the credentials refused: waiting will not help
            return ConfigError(f"the snapshot's reader was refused by MySQL: {text}")
        return pymysql.err.OperationalError(code, text)  # unreachable: retried like any connection
    return ReaderFailed(f"the snapshot's reader process failed: {kind}: {text}")


# ---- the child ---------------------------------------------------------------------------------


def _typed_key(source: SourceTable, key: tuple | None) -> tuple | None:
    """The last key as any other connection reads it: its dates and datetimes parsed (this
    connection leaves them text), so that it is stored typed."""
    if key is None:
        return None
    parsers = {
        "date": converters.convert_date,
        "datetime": converters.convert_datetime,
        "timestamp": converters.convert_datetime,
    }
    kinds = {c.name: c.base_type for c in source.columns}
    return tuple(
        parsers[kinds[name]](value) if isinstance(value, str) and kinds[name] in parsers else value
        for name, value in zip(source.key, key, strict=True)
    )


def _parent_gone(parent: int) -> bool:
    return os.getppid() != parent


def main() -> int:
    parent = os.getppid()
    request = json.loads(sys.stdin.read())
    data = request["source"]
    source = SourceTable(
        data["schema"], data["name"], tuple(SourceColumn(**c) for c in data["columns"]), tuple(data["key"])
    )
    after = keys_from_json(request["after"])
    directory = Path(request["directory"])
    try:
        conn = source_db.connect_with({**request["connection"], "conv": ARROW_PARSED_CONVERSIONS})
        upto, rest = keys_from_json(request["upto"]), request.get("rest_ratio", 0.0)
        pieces = read_pieces(conn, source, after, request["chunk_rows"], request["piece_rows"], upto, rest)
        for number, (rows, last, chunks, done, rested) in enumerate(pieces):
            while len(list(directory.glob("*.arrow"))) >= READ_AHEAD:  # the driver is behind
                if _parent_gone(parent):
                    return 1
                time.sleep(0.02)
            path = directory / f"{number:06d}.arrow"
            write_arrow_file(rows_table(source, rows), path.with_suffix(".tmp"), request["batch_rows"])
            path.with_suffix(".tmp").rename(path)  # whole files only
            piece = {
                "path": str(path),
                "after": keys_to_json(_typed_key(source, last)),
                "rows": len(rows),
                "chunks": chunks,
                "done": done,
                "rested": rested,
            }
            print(json.dumps(piece), flush=True)
    except BrokenPipeError:
        return 1  # the driver is gone
    except Exception as exc:  # noqa: BLE001 - reported to the driver, which raises it
        report = {"error": type(exc).__name__, "message": str(exc.args[-1] if exc.args else exc)}
        if isinstance(exc, pymysql.err.OperationalError) and exc.args:
            report["code"] = exc.args[0]
        if not isinstance(exc, source_db.MissingTable | pymysql.err.OperationalError):
            report["message"] = repr(exc)
        print(json.dumps(report), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
