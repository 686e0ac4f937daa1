"""CDC's initial snapshot on a private local stack (issue 27): a BENCH_SNAPSHOT_ROWS (1,000,000)-row
table, read by the chunked lock-free snapshot (`jobs/cdc/snapshot.py`, with the CDC user's RDS
privileges) into Iceberg, beside a raw `SELECT *` of the same table with the same driver in the same
run (the ceiling: reading without writing anything), and once more leaving dates as text the way the
snapshot's reader does (Arrow parses them). Then a snapshot killed (SIGKILL) after half of
its progress commits, and the time the next start takes to resume and finish it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.private_stack import private_stack, row

TABLE = "bench_snapshot"
PAIR = f"user_db.{TABLE}=dim_db.{TABLE}"
TARGET_RATIO = 0.5
INSERT_BATCH = 5_000
REPO = Path(__file__).resolve().parent.parent


def run() -> list[dict]:
    rows = int(os.environ.get("BENCH_SNAPSHOT_ROWS", 1_000_000))
    with private_stack("cdc-snapshot") as stack:
        return _measure(stack, rows)


def fill_source(conn, rows: int) -> None:
    """The bench table: `rows` rows of 6 columns, an INT key (also the verify bench's dimension)."""
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {TABLE}")
        cur.execute(
            f"CREATE TABLE {TABLE} (id INT PRIMARY KEY, name VARCHAR(32) NOT NULL, qty INT, "
            "price DECIMAL(10,4), note VARCHAR(64), updated TIMESTAMP DEFAULT CURRENT_TIMESTAMP)"
        )
        for lo in range(0, rows, INSERT_BATCH):
            batch = [
                (i, f"name{i}", i % 97, i / 100, f"note {i % 1000}")
                for i in range(lo, min(rows, lo + INSERT_BATCH))
            ]
            cur.executemany(
                f"INSERT INTO {TABLE} (id, name, qty, price, note) VALUES (%s,%s,%s,%s,%s)", batch
            )
            conn.commit()
        cur.execute(f"ANALYZE TABLE {TABLE}")  # the snapshot's progress uses InnoDB's row estimate
        cur.fetchall()


def _raw_select(config, credentials, conversions: dict | None = None) -> tuple[int, float]:
    """Rows and seconds of `SELECT *` streamed with the driver the snapshot uses, nothing else; with
    the driver's own conversions, or `conversions`."""
    import pymysql

    from jobs.cdc import source_db

    settings = source_db.connection_settings(config, credentials)
    conn = source_db.connect_with({**settings, "conv": conversions} if conversions else settings)
    began = time.monotonic()
    count = 0
    with conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(f"SELECT * FROM user_db.{TABLE}")
        while batch := cur.fetchmany(10_000):
            count += len(batch)
    seconds = time.monotonic() - began
    conn.close()
    return count, seconds


def _killed_half_way(commits: int) -> subprocess.CompletedProcess:
    # private_stack() put the stack's home and ports in the environment.
    env = {**os.environ, "LAKEHOUSE_CRASH_AT": f"cdc.snapshot-commit:{max(1, commits // 2)}"}
    return subprocess.run(
        [sys.executable, "-m", "jobs.cdc", "--until-idle", "--table", PAIR, "--server-id", "4302"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip


def _measure(stack, rows: int) -> list[dict]:
    from jobs.cdc import snapshot, source_db
    from jobs.cdc.chunk_reader import ARROW_PARSED_CONVERSIONS
    from jobs.cdc.sync import CdcSync
    from jobs.cdc.table_selection import TableSpec
    from jobs.common.spark_session import build_spark, stop_spark
    from jobs.config import LakehouseConfig
    from lakehouse.local.mariadb import APP_USER
    from lakehouse.local.settings import load_or_create_secrets

    config = LakehouseConfig.local(stack.settings.home)
    conn = stack.mariadb.connect(APP_USER, load_or_create_secrets(stack.settings)["mysql_app_password"])
    began = time.monotonic()
    fill_source(conn, rows)
    fill_seconds = time.monotonic() - began
    credentials = source_db.cdc_credentials(config)
    raw_rows, raw_seconds = _raw_select(config, credentials)
    text_dates_rows, text_dates_seconds = _raw_select(config, credentials, ARROW_PARSED_CONVERSIONS)

    spark = build_spark(config, "cdc_snapshot_bench", {"spark.sql.shuffle.partitions": "2"})
    target = f"lakehouse.dim_db.{TABLE}"
    try:
        specs = [TableSpec.parse(PAIR, config)]
        began = time.monotonic()
        CdcSync(spark, config, specs, server_id=4301).start().close()
        snapshot_seconds = time.monotonic() - began
        lake_rows = spark.table(target).count()

        # Readers side by side (`--snapshot-readers`), each over a range of keys; the JVM warm now.
        warm: dict[int, tuple[float, int]] = {}
        for server_id, readers in ((4304, 1), (4305, 2)):
            spark.sql(f"DROP TABLE {target}")
            began = time.monotonic()
            CdcSync(spark, config, specs, server_id=server_id, snapshot_readers=readers).start().close()
            warm[readers] = (time.monotonic() - began, spark.table(target).count())

        # Killed after half of its progress commits, then resumed by the next start (--resync: the
        # table was snapshotted above; the resync goes through the same staging table).
        # Each reader's range: a first commit of one chunk (chunk_reader.read_pieces), then
        # COMMIT_ROWS each.
        per_range = 1 + -(-(rows // snapshot.READERS - snapshot.CHUNK_ROWS) // snapshot.COMMIT_ROWS)
        commits = snapshot.READERS * per_range
        spark.sql(f"DROP TABLE {target}")
        killed = _killed_half_way(commits)
        if killed.returncode != -signal.SIGKILL:
            raise RuntimeError(f"the snapshot was not killed half-way:\n{killed.stderr[-3000:]}")
        staged = spark.table(snapshot.staging_tables(spark, target)[0]).count()
        began = time.monotonic()
        CdcSync(spark, config, specs, server_id=4303).start().close()
        resume_seconds = time.monotonic() - began
        resumed_rows = spark.table(target).count()
    finally:
        stop_spark(spark)
        conn.close()
    raw_rate, snapshot_rate = raw_rows / raw_seconds, lake_rows / snapshot_seconds
    text_dates_rate = text_dates_rows / text_dates_seconds
    ratio = snapshot_rate / raw_rate
    return [
        row(f"source table filled ({rows:,} rows)", f"{fill_seconds:.1f}s"),
        row("raw SELECT * (pymysql, streamed; the ceiling)", f"{raw_rate:,.0f} rows/s ({raw_seconds:.1f}s)"),
        row(
            "raw SELECT *, dates left text as the snapshot's reader does",
            f"{text_dates_rate:,.0f} rows/s ({text_dates_seconds:.1f}s); "
            f"snapshot / it: {snapshot_rate / text_dates_rate:.2f}x",
        ),
        row(
            f"snapshot -> Iceberg ({lake_rows:,} rows, chunks of {snapshot.CHUNK_ROWS:,}, lock-free, "
            f"{snapshot.READERS} readers, JVM cold)",
            f"{snapshot_rate:,.0f} rows/s ({snapshot_seconds:.1f}s, start to published)",
            before="66,157 rows/s (15.1s; 1 reader, pieces as local relations, dates parsed by PyMySQL)",
        ),
        row("snapshot / raw", f"{ratio:.2f}x", f">= {TARGET_RATIO}x", ratio >= TARGET_RATIO, before="0.42x"),
        row(
            "the same, JVM warm: 1 reader / 2 readers side by side (--snapshot-readers)",
            " / ".join(f"{rows_ / seconds:,.0f} rows/s ({seconds:.1f}s)" for seconds, rows_ in warm.values()),
        ),
        row(
            "kill -9 half-way, then the next start resumes",
            f"{staged:,} rows kept; resumed and published in {resume_seconds:.1f}s "
            f"({resume_seconds / snapshot_seconds:.0%} of a whole snapshot)",
            "resumes, not restarts",
            staged > 0 and resume_seconds < snapshot_seconds,
        ),
        row(
            "rows source / lake (whole, warm 1 and 2 readers, resumed)",
            f"{raw_rows:,} / {lake_rows:,}, {warm[1][1]:,}, {warm[2][1]:,}, {resumed_rows:,}",
            "equal",
            raw_rows == lake_rows == warm[1][1] == warm[2][1] == resumed_rows,
        ),
    ]
