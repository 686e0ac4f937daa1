"""The snapshot's reader process (jobs/cdc/chunk_reader.py) against the local MariaDB, as the CDC
user: what it hands over is the table (as a multiset), and a source error reaches the driver as the
error the sync handles. No Spark: the pieces are read back with pyarrow."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from jobs.cdc import source_db
from jobs.cdc.chunk_reader import READ_AHEAD, ChunkReader, Pace


@pytest.fixture
def source(local_stack, lake_config):
    """A fresh `user_db` table with 1,005 rows (an INT key, a decimal, a nullable text, a timestamp)
    and the CDC user's connection settings."""
    from lakehouse.local.mariadb import APP_USER
    from lakehouse.local.settings import load_or_create_secrets

    conn = local_stack.mariadb.connect(
        APP_USER, load_or_create_secrets(local_stack.settings)["mysql_app_password"]
    )
    with conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS chunk_reader_test")
        cur.execute(
            "CREATE TABLE chunk_reader_test (id INT PRIMARY KEY, price DECIMAL(10,2), note VARCHAR(20), "
            "at TIMESTAMP NOT NULL DEFAULT '2026-01-02 03:04:05')"
        )
        cur.executemany(
            "INSERT INTO chunk_reader_test (id, price, note) VALUES (%s, %s, %s)",
            [(i, Decimal(i) / 4, None if i % 7 == 0 else f"n{i % 3}") for i in range(1, 1006)],
        )
    conn.commit()
    settings = source_db.connection_settings(lake_config, source_db.cdc_credentials(lake_config))
    cdc = source_db.connect_with(settings)
    yield conn, settings, source_db.describe_table(cdc, "user_db", "chunk_reader_test")
    cdc.close()
    with conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS chunk_reader_test")
    conn.close()


def piece_rows(path: str) -> list[tuple]:
    with pa.OSFile(path, "rb") as f:
        table = pa.ipc.open_stream(f).read_all()
    return list(zip(*(column.to_pylist() for column in table.columns), strict=True))


def test_the_pieces_are_the_table_in_key_order(source, tmp_path) -> None:
    conn, settings, table = source
    reader = ChunkReader(settings, table, None, chunk_rows=100, piece_rows=300, directory=str(tmp_path))
    got, pieces = [], []
    try:
        for piece in reader:
            rows = piece_rows(piece.path)
            Path(piece.path).unlink()
            got += rows
            pieces.append((piece.rows, piece.chunks, piece.after, piece.done))
            assert piece.rows == len(rows) and piece.rested == 0  # at full speed: no rest
    finally:
        reader.close()
    # One chunk first (the driver's first commit overlaps the next read), then pieces of 3 chunks;
    # each piece says where the next starts.
    assert pieces == [
        (100, 1, (100,), False),
        (300, 3, (400,), False),
        (300, 3, (700,), False),
        (300, 3, (1000,), False),
        (5, 1, (1005,), True),
    ]
    with conn.cursor() as cur:
        cur.execute("SELECT id, price, note, at FROM chunk_reader_test")
        source_rows = Counter((i, p, n, at.replace(tzinfo=None)) for i, p, n, at in cur.fetchall())
    lake_rows = Counter((i, p, n, at.replace(tzinfo=None)) for i, p, n, at in got)
    assert lake_rows == source_rows
    assert [r[0] for r in got] == sorted(r[0] for r in got)
    assert not list(tmp_path.glob("*/*")) and not list(tmp_path.iterdir())  # nothing left behind


def test_a_paced_reader_rests_after_its_chunks_at_a_lower_priority_and_reads_every_row(
    source, tmp_path
) -> None:
    """A re-snapshot beside the stream (`Pace`): the reader process runs 5 nice levels lower than
    its driver and rests after each chunk (each piece says how long); the rows are the same."""
    _, settings, table = source
    pace = Pace(niceness=5, rest_ratio=2.0)
    reader = ChunkReader(settings, table, None, 100, 300, str(tmp_path), pace=pace)
    keys, rested = Counter(), []
    try:
        niceness = os.getpriority(os.PRIO_PROCESS, reader.process.pid)
        for piece in reader:
            keys.update(row[0] for row in piece_rows(piece.path))
            Path(piece.path).unlink()
            rested.append(piece.rested)
    finally:
        reader.close()
    assert niceness == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
    assert keys == Counter(range(1, 1006))
    assert len(rested) == 5 and all(seconds > 0 for seconds in rested), rested


def test_a_table_dropped_while_read_is_the_drivers_missing_table(source, tmp_path) -> None:
    conn, settings, table = source
    reader = ChunkReader(settings, table, None, chunk_rows=100, piece_rows=100, directory=str(tmp_path))
    try:
        pieces = iter(reader)
        first = next(pieces)
        # The reader writes ahead READ_AHEAD pieces, then waits for the driver.
        deadline = time.monotonic() + 30
        while len(list(Path(first.path).parent.glob("*.arrow"))) < READ_AHEAD and time.monotonic() < deadline:
            time.sleep(0.05)
        with conn.cursor() as cur:
            cur.execute("DROP TABLE chunk_reader_test")
        with pytest.raises(source_db.MissingTable, match="user_db.chunk_reader_test was dropped while read"):
            for piece in pieces:
                Path(piece.path).unlink(missing_ok=True)
            Path(first.path).unlink(missing_ok=True)
    finally:
        reader.close()
    assert reader.process.returncode == 1


def drain(reader: ChunkReader) -> tuple[list[tuple], list[tuple]]:
    """All rows the reader hands over, and (rows, chunks, after, done) per piece."""
    got, pieces = [], []
    try:
        for piece in reader:
            got += piece_rows(piece.path) if piece.rows else []
            Path(piece.path).unlink(missing_ok=True)
            pieces.append((piece.rows, piece.chunks, piece.after, piece.done))
    finally:
        reader.close()
    return got, pieces


@contextlib.contextmanager
def keyed_table(source, name: str, columns: str, rows: list[tuple]):
    """A `user_db` table `name` (`columns`: its DDL body) holding `rows`, as the CDC user describes
    it; dropped afterwards."""
    conn, settings, _ = source
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {name}")
        cur.execute(f"CREATE TABLE {name} ({columns})")
        cur.executemany(f"INSERT INTO {name} VALUES ({', '.join(['%s'] * len(rows[0]))})", rows)
    conn.commit()
    try:
        cdc = source_db.connect_with(settings)
        table = source_db.describe_table(cdc, "user_db", name)
        cdc.close()
        yield table
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE {name}")


def test_a_resume_from_a_composite_key_of_bytes_decimal_and_date_goes_on_after_it(source, tmp_path) -> None:
    """A resumed snapshot hands the stored last key to the reader process as JSON: bytes, a decimal
    and a date must come back as what MySQL compares the key with, or rows are skipped or read twice."""
    rows = [
        (bytes([c, 0xFF]), Decimal(a) / 8, dt.date(2026, 1, 1) + dt.timedelta(days=d), c * 100 + a * 10 + d)
        for c in (1, 2, 3)
        for a in range(4)
        for d in range(3)
    ]
    columns = "code VARBINARY(4), amount DECIMAL(8,3), day DATE, v INT, PRIMARY KEY (code, amount, day)"
    ordered = sorted(rows)
    start = ordered[13][:3]  # the last key of an interrupted snapshot's last commit
    with keyed_table(source, "chunk_reader_keys", columns, rows) as table:
        got, pieces = drain(
            ChunkReader(source[1], table, start, chunk_rows=5, piece_rows=10, directory=str(tmp_path))
        )
    assert Counter(got) == Counter(ordered[14:])  # exactly the rows after it, each once
    # The first piece (one chunk) ends at the 5th row after it, its key as the values they were.
    assert pieces[0][2] == ordered[18][:3]
    assert pieces[-1][3] is True and sum(p[0] for p in pieces) == len(ordered) - 14


def test_a_resume_from_wide_decimal_and_time_keys_goes_on_exactly_after_them(source, tmp_path) -> None:
    """Decimals beyond a double's 15 digits, and TIMEs past 24 h or below zero: as text, MySQL
    compared the decimals as doubles (a whole run of keys equal, so rows skipped or read twice) and
    could not parse `str(timedelta)` ("1 day, 1:00:00")."""
    spans = [
        dt.timedelta(hours=-30),
        dt.timedelta(seconds=-1, microseconds=250_000),
        dt.timedelta(0),
        dt.timedelta(hours=25, microseconds=500_000),
        dt.timedelta(hours=100),
    ]
    rows = [(Decimal(10**21 + b), s, b * 10 + i) for b in range(1, 4) for i, s in enumerate(spans)]
    ordered = sorted(rows)
    resumes = (0, 3, 5, 8)
    columns = "big DECIMAL(30,0), span TIME(6), v INT, PRIMARY KEY (big, span)"
    with keyed_table(source, "chunk_reader_wide_keys", columns, rows) as table:
        with source[0].cursor() as cur:  # the lake holds a TIME as MySQL's text
            cur.execute("SELECT big, CAST(span AS CHAR), v FROM chunk_reader_wide_keys ORDER BY big, span")
            as_lake = list(cur.fetchall())
        read = {
            after: drain(
                ChunkReader(
                    source[1], table, ordered[after][:2], chunk_rows=2, piece_rows=4, directory=str(tmp_path)
                )
            )
            for after in resumes
        }
    assert [r[2] for r in as_lake] == [r[2] for r in ordered]
    for after, (got, _) in read.items():
        assert Counter(got) == Counter(as_lake[after + 1 :]), f"resumed after {ordered[after][:2]}"
    # Each piece's last key comes back as the value it was, for the next resume.
    assert [pieces[0][2] for _, pieces in read.values()] == [ordered[after + 2][:2] for after in resumes]


@pytest.mark.parametrize(
    ("key_type", "keys"),
    [
        # ORDER BY sorts an ENUM or SET by its declared position, not by its text.
        ("ENUM('z','a','m','b')", ["z", "a", "m", "b"]),
        ("SET('z','a','m')", ["z", "a", "z,a", "m", "z,m"]),
        # The text protocol prints a FLOAT with 6 digits: 123456.7 and 123456.9 both read 123457.
        ("FLOAT", [123456.7, 123456.8, 123456.9, -0.25, 1e-7]),
        ("BIT(12)", [1, 2, 255, 256, 4095]),
        # A DOUBLE printed with fewer than 17 digits would not read back as itself.
        ("DOUBLE", [0.1 + 0.2, 0.3, 0.1, 1 / 3, 2 / 3, 1e300, -1.5]),
    ],
)
def test_every_row_is_read_once_whatever_the_key_type(source, tmp_path, key_type, keys) -> None:
    """A chunk continues after the previous chunk's last key: the WHERE must order keys as the
    ORDER BY does, or rows are skipped or read twice (here a chunk is one row: every key is a
    boundary)."""
    rows = [(k, i) for i, k in enumerate(keys)]
    name = "chunk_reader_key_" + key_type.split("(")[0].lower()
    with keyed_table(source, name, f"k {key_type} NOT NULL, v INT, PRIMARY KEY (k)", rows) as table:
        columns = ", ".join(source_db.select_expression(c) for c in table.columns)
        with source[0].cursor() as cur:
            cur.execute(f"SELECT {columns} FROM {name}")
            expected = Counter(cur.fetchall())
        got, pieces = drain(
            ChunkReader(source[1], table, None, chunk_rows=1, piece_rows=1, directory=str(tmp_path))
        )
    assert len(expected) == len(keys)
    assert Counter(got) == expected
    assert sum(p[0] for p in pieces) == len(keys)


@pytest.mark.parametrize("rows", [0, 1_000])
def test_an_empty_table_and_one_of_whole_chunks_end_with_an_empty_last_piece(source, tmp_path, rows) -> None:
    conn, settings, table = source
    with conn.cursor() as cur:
        cur.execute("DELETE FROM chunk_reader_test WHERE id > %s", (rows,))
    conn.commit()
    got, pieces = drain(
        ChunkReader(settings, table, None, chunk_rows=100, piece_rows=300, directory=str(tmp_path))
    )
    assert len(got) == rows
    # The last read finds no row: an empty last piece that only says "done", after the last key.
    assert pieces[-1] == (0, 1, (rows,) if rows else None, True)
    assert not list(tmp_path.iterdir())


def test_the_childs_errors_become_what_the_sync_handles() -> None:
    """Refused credentials stop (ConfigError), an unreachable server is retried (OperationalError),
    a dropped table stops only that table (MissingTable), anything else fails the snapshot."""
    import pymysql

    from jobs.cdc.chunk_reader import ReaderFailed, _error
    from jobs.config import ConfigError

    refused = _error({"error": "OperationalError", "message": "Access denied for user 'cdc'", "code": 1045})
    assert isinstance(refused, ConfigError) and "Access denied" in str(refused)
    gone = _error({"error": "OperationalError", "message": "Lost connection", "code": 2013})
    assert type(gone) is pymysql.err.OperationalError and gone.args == (2013, "Lost connection")
    assert type(_error({"error": "MissingTable", "message": "t was dropped"})) is source_db.MissingTable
    other = _error({"error": "MemoryError", "message": "MemoryError()"})
    assert isinstance(other, ReaderFailed) and "MemoryError" in str(other)


@pytest.mark.parametrize("parts", [2, 3, 7])
def test_readers_over_split_ranges_read_every_row_once(source, tmp_path, parts) -> None:
    """Readers side by side, each over a range `split_points` cut: together they hand over the
    table (rows on the cut points included) once, each range in key order."""
    from jobs.cdc.snapshot import key_ranges

    conn, settings, table = source
    with conn.cursor() as cur:  # keys -50 and 1..1005: every cut point is the key of a row
        cur.execute("INSERT INTO chunk_reader_test (id, price) VALUES (-50, 1)")
        cur.execute("SELECT id, price, note, at FROM chunk_reader_test")
        expected = Counter((i, p, n, at.replace(tzinfo=dt.UTC)) for i, p, n, at in cur.fetchall())
    conn.commit()
    cdc = source_db.connect_with(settings)
    try:
        points = source_db.split_points(cdc, table, parts)
    finally:
        cdc.close()
    assert len(points) == parts - 1 and points == sorted(points)
    assert all(1 <= point <= 1005 for (point,) in points)  # rows on the cuts: read once, not 0 or 2 times
    got: list[tuple] = []
    for number, key_range in enumerate(key_ranges(points)):
        rows, pieces = drain(
            ChunkReader(
                settings, table, key_range.after, chunk_rows=50, piece_rows=100,
                directory=str(tmp_path / str(number)), upto=key_range.upto,
            )
        )  # fmt: skip
        keys = [row[0] for row in rows]
        assert keys == sorted(keys)
        assert all(key_range.after is None or k > key_range.after[0] for k in keys)
        assert all(key_range.upto is None or k <= key_range.upto[0] for k in keys)
        assert pieces[-1][3] is True
        got += rows
    assert Counter(got) == expected


def test_only_a_key_of_one_integer_column_is_split(source) -> None:
    conn, settings, table = source
    cdc = source_db.connect_with(settings)
    try:
        assert source_db.split_points(cdc, table, 1) == []
        assert source_db.split_points(cdc, table, 4) == [(252,), (503,), (754,)]  # keys 1..1005
        rows = [(f"k{i}", i, i) for i in range(50)]
        with keyed_table(
            source, "chunk_reader_text_key", "k VARCHAR(8) PRIMARY KEY, a INT, b INT", rows
        ) as text:
            assert source_db.split_points(cdc, text, 4) == []
        with keyed_table(
            source, "chunk_reader_pair_key", "k VARCHAR(8), a INT, b INT, PRIMARY KEY (a, b)", rows
        ) as pair:
            assert source_db.split_points(cdc, pair, 4) == []
        with keyed_table(
            source, "chunk_reader_narrow", "k VARCHAR(8), a INT PRIMARY KEY, b INT", rows[:3]
        ) as narrow:
            assert source_db.split_points(cdc, narrow, 4) == []  # keys 0..2: fewer than 4 apart
    finally:
        cdc.close()
