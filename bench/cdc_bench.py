"""CDC benchmark on a private local stack (own home and ports).

Measures, in one run: the raw binlog read rate (python-mysql-replication alone, the ceiling), the
CDC apply rate on a backlog (binlog -> reduce -> MERGE, start to caught up), and change -> visible
latency (source commit -> Iceberg commit) at a steady write rate. Sizes: BENCH_CDC_BACKLOG (default
200,000 row changes), BENCH_CDC_RATE (500 changes/s), BENCH_CDC_FRESHNESS_SECONDS (30).
"""

from __future__ import annotations

import os
import threading
import time

from bench.private_stack import percentiles, private_stack, row

TARGET_RATE = 30_000
TARGET_RATIO = 0.5
TARGET_P95_SECONDS = 3.0
TABLE = "bench_cdc"
PAIR = f"user_db.{TABLE}=dim_db.{TABLE}"
ROWS_PER_TX = 500


def _app_conn(stack):
    from lakehouse.local.mariadb import APP_USER
    from lakehouse.local.settings import load_or_create_secrets

    return stack.mariadb.connect(APP_USER, load_or_create_secrets(stack.settings)["mysql_app_password"])


def write_backlog(conn, changes: int) -> int:
    """Half inserts, then updates and deletes over them, in multi-row transactions."""
    inserts = changes // 2
    updates = changes * 3 // 10
    deletes = changes - inserts - updates
    with conn.cursor() as cur:
        for lo in range(0, inserts, ROWS_PER_TX):
            rows = [(i, f"name{i}", i % 97, i / 100) for i in range(lo, min(inserts, lo + ROWS_PER_TX))]
            cur.executemany(f"INSERT INTO {TABLE} (id, name, qty, price) VALUES (%s,%s,%s,%s)", rows)
            conn.commit()
        for lo in range(0, updates, ROWS_PER_TX):
            cur.execute(
                f"UPDATE {TABLE} SET qty = qty + 1 WHERE id >= %s AND id < %s",
                (lo, min(updates, lo + ROWS_PER_TX)),
            )
            conn.commit()
        for lo in range(inserts - deletes, inserts, ROWS_PER_TX):
            cur.execute(
                f"DELETE FROM {TABLE} WHERE id >= %s AND id < %s", (lo, min(inserts, lo + ROWS_PER_TX))
            )
            conn.commit()
    return inserts + updates + deletes


def raw_read_rate(config, start, expected: int) -> float:
    """Row changes/s reading the same binlog range with python-mysql-replication and nothing else."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    from jobs.cdc import source_db

    creds = source_db.cdc_credentials(config)
    stream = BinLogStreamReader(
        connection_settings=source_db.connection_settings(config, creds),
        server_id=4299,
        resume_stream=True,
        log_file=start.file,
        log_pos=start.pos,
        blocking=False,
        is_mariadb=True,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        only_tables=[TABLE],
        enable_logging=False,
    )
    read, began = 0, time.monotonic()
    for event in stream:
        read += len(event.rows)
        if read >= expected:
            break
    elapsed = time.monotonic() - began
    stream.close()
    return read / elapsed


def run() -> list[dict]:
    backlog = int(os.environ.get("BENCH_CDC_BACKLOG", 200_000))
    rate = int(os.environ.get("BENCH_CDC_RATE", 500))
    seconds = float(os.environ.get("BENCH_CDC_FRESHNESS_SECONDS", 30))
    with private_stack("cdc") as stack:
        return _measure(stack, backlog, rate, seconds)


def _measure(stack, backlog: int, rate: int, seconds: float) -> list[dict]:
    from jobs.cdc.sync import CdcSync
    from jobs.cdc.table_selection import TableSpec
    from jobs.common.run_modes import RunMode, StopRequest, run_batches
    from jobs.common.spark_session import build_spark, stop_spark
    from jobs.config import LakehouseConfig

    config = LakehouseConfig.local(stack.settings.home)
    spark = build_spark(config, "cdc_bench", {"spark.sql.shuffle.partitions": "2"})
    specs = [TableSpec.parse(PAIR, config)]
    conn = _app_conn(stack)
    with conn.cursor() as cur:
        cur.execute(
            f"CREATE TABLE {TABLE} (id INT PRIMARY KEY, name VARCHAR(32) NOT NULL, qty INT, "
            "price DECIMAL(10,4), updated TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP)"
        )
    conn.commit()
    CdcSync(spark, config, specs, server_id=4201).start().close()  # initial snapshot: empty table
    start = spark.sql(
        f"SELECT summary['lakehouse.cdc.position'] FROM lakehouse.dim_db.{TABLE}.snapshots"
    ).collect()[0][0]
    from jobs.cdc.binlog_reader import BinlogPosition

    start = BinlogPosition.from_json(start)

    written = write_backlog(conn, backlog)
    raw = raw_read_rate(config, start, written)

    # Apply rate: a job starting against the backlog, until everything is in Iceberg (set up as
    # `lakehouse run cdc` sets it up).
    sync = CdcSync(spark, config, specs, server_id=4202, warm_up=True, change_wait_seconds=1.0)
    began = time.monotonic()
    sync.start()
    start_seconds = time.monotonic() - began  # stored-position check, reader start, MERGE warm-up
    conn2 = sync._connect()
    from jobs.cdc import source_db

    target = BinlogPosition(*source_db.master_position(conn2))
    conn2.close()
    applied = 0
    while True:
        applied += sync.run_batch()
        if sync.caught_up(target):
            break
    apply_seconds = time.monotonic() - began
    apply_rate = applied / apply_seconds
    mysql_count = _count_mysql(conn)
    iceberg_count = spark.table(f"lakehouse.dim_db.{TABLE}").count()

    # Freshness: steady inserts at `rate` rows/s; latency = Iceberg commit done - source commit.
    committed_at: dict[int, float] = {}
    latencies: list[float] = []

    def on_commit(_target, changes, at) -> None:
        for change in changes:
            written_at = committed_at.get(change.key[0])
            if written_at is not None:
                latencies.append(at - written_at)

    sync.on_commit = on_commit
    stop = StopRequest()
    loop = threading.Thread(target=run_batches, args=(sync.run_batch, RunMode(trigger_seconds=1.0), stop))
    loop.start()
    per_tx = max(1, rate // 50)
    next_id = 10_000_000
    with conn.cursor() as cur:
        t0 = time.monotonic()
        tick = 0
        while time.monotonic() - t0 < seconds:
            rows = [(i, "fresh", 1, 1.0) for i in range(next_id, next_id + per_tx)]
            cur.executemany(f"INSERT INTO {TABLE} (id, name, qty, price) VALUES (%s,%s,%s,%s)", rows)
            conn.commit()
            now = time.time()
            for inserted in rows:
                committed_at[inserted[0]] = now
            next_id += per_tx
            tick += 1
            time.sleep(max(0.0, t0 + tick * per_tx / rate - time.monotonic()))
    deadline = time.monotonic() + 30
    while len(latencies) < len(committed_at) and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    loop.join()
    sync.close()
    stop_spark(spark)
    conn.close()
    p50, p95 = percentiles(latencies)
    ratio = apply_rate / raw
    return [
        row("raw binlog read (ceiling)", f"{raw:,.0f} changes/s"),
        row(
            f"CDC apply, {written:,}-change backlog",
            f"{apply_rate:,.0f} changes/s ({apply_seconds:.1f}s)",
            f">= {TARGET_RATE:,}",
            apply_rate >= TARGET_RATE,
            before="17.6k changes/s",
        ),
        row(
            "  of which: start (position check, MERGE warm-up; the reader reads meanwhile)",
            f"{start_seconds:.1f}s",
        ),
        row("apply / raw", f"{ratio:.2f}x", f">= {TARGET_RATIO}x", ratio >= TARGET_RATIO),
        row(
            f"change -> visible p50 / p95 at {rate}/s",
            f"{p50:.2f}s / {p95:.2f}s ({len(latencies)} of {len(committed_at)} seen)",
            f"p95 <= {TARGET_P95_SECONDS}s",
            p95 <= TARGET_P95_SECONDS,
        ),
        row(
            "backlog converged (rows mysql / iceberg)",
            f"{mysql_count} / {iceberg_count}",
            "equal",
            mysql_count == iceberg_count,
        ),
    ]


def _count_mysql(conn) -> int:
    with conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {TABLE}")
        count = cur.fetchone()[0]
    conn.commit()
    return count
