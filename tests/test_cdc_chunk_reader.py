"""The snapshot's reader process (jobs/cdc/chunk_reader.py) against the local MariaDB, as the CDC
user: what it hands over is the table (as a multiset), and a source error reaches the driver as the
error the sync handles. No Spark: the pieces are read back with pyarrow."""

from __future__ import annotations

import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from jobs.cdc import source_db
from jobs.cdc.chunk_reader import READ_AHEAD, ChunkReader


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
            assert piece.rows == len(rows)
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
