"""A CDC table's history under maintenance (issue 46): many MERGE commits, bounded metadata.

A dimension of BENCH_EXPIRY_ROWS (1,000) rows on a private stack, updated by BENCH_EXPIRY_COMMITS
(10,000) source transactions, each applied by CDC as one MERGE commit (as a busy dimension is), and
maintained as the streaming application maintains it (`IN_APP_SETTINGS`: expiry in the driver,
small-file compaction) every BENCH_EXPIRY_MAINTAIN_EVERY (200) commits. The retention window is
BENCH_EXPIRY_RETAIN_SECONDS (60; the application keeps 5 minutes) so that a short run reaches it.
A CDC table's history used to keep every snapshot: its first copy's commits (summary key
`lakehouse.cdc.snapshot`) pinned the expiry cutoff for good.

Per tenth of the run: the table's snapshots and its current metadata.json's size. The bound: after
maintenance, the snapshots of the retention window plus what one interval adds (the most commits any
window of that length held in the run, its compactions, the interval, retain-last); it must not grow
with the commits. (The first 10,000-commit run bounded the window by the average rate, 2.8/s, and
its peak, 384, exceeded that bound, 377, by 2%: a window's rate varies.) At the end the table equals its
source as a multiset.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

from bench.private_stack import private_stack, row

TABLE = "bench_expiry"
PAIR = f"user_db.{TABLE}=dim_db.{TABLE}"


def run() -> list[dict]:
    commits = int(os.environ.get("BENCH_EXPIRY_COMMITS", 10_000))
    rows = int(os.environ.get("BENCH_EXPIRY_ROWS", 1_000))
    every = int(os.environ.get("BENCH_EXPIRY_MAINTAIN_EVERY", 200))
    retain = float(os.environ.get("BENCH_EXPIRY_RETAIN_SECONDS", 60))
    with private_stack("expiry") as stack:
        return _measure(stack, commits, rows, every, retain)


def _metadata_bytes(spark, ident: str) -> int:
    from jobs.common.lake_tables import load_iceberg_table

    location = load_iceberg_table(spark, ident).operations().current().metadataFileLocation()
    return Path(location.removeprefix("file:")).stat().st_size


def _measure(stack, commits: int, rows: int, every: int, retain: float) -> list[dict]:
    from dataclasses import replace

    from bench.cdc_bench import _app_conn
    from jobs.cdc.sync import CdcSync
    from jobs.cdc.table_selection import TableSpec
    from jobs.common.spark_session import build_spark, stop_spark
    from jobs.config import LakehouseConfig
    from jobs.maintain.job import maintain_table
    from jobs.maintain.procedures import table_stats
    from jobs.streaming.maintenance import IN_APP_SETTINGS

    config = LakehouseConfig.local(stack.settings.home)
    spark = build_spark(config, "expiry_bench", {"spark.sql.shuffle.partitions": "2"})
    ident, lake = f"dim_db.{TABLE}", f"lakehouse.dim_db.{TABLE}"
    settings = replace(IN_APP_SETTINGS, retain_hours=retain / 3600)
    conn = _app_conn(stack)
    checkpoints: list[tuple[int, int, int, float]] = []  # (commits, snapshots, metadata bytes, s)
    merging = 0.0  # seconds spent applying
    applied: list[float] = []  # when each commit was applied: the busiest retention window
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {TABLE} (id INT PRIMARY KEY, qty INT NOT NULL)")
            cur.executemany(f"INSERT INTO {TABLE} VALUES (%s, 0)", [(i,) for i in range(rows)])
        conn.commit()
        spec = TableSpec.parse(PAIR, config)
        sync = CdcSync(spark, config, [spec], server_id=4301, change_wait_seconds=0.05).start()  # first copy
        began = time.monotonic()
        with conn.cursor() as cur:
            for i in range(1, commits + 1):
                cur.execute(f"UPDATE {TABLE} SET qty = qty + 1 WHERE id = %s", (i % rows,))
                conn.commit()
                applying = time.monotonic()
                while sync.run_batch() == 0:  # one source transaction, one MERGE
                    if sync.errors or time.monotonic() - applying > 120:
                        raise RuntimeError(f"commit {i} not applied in 120 s: {sync.errors}")
                merging += time.monotonic() - applying
                applied.append(time.monotonic())
                if i % max(1, commits // 10) == 0:  # before the maintenance due now: the interval's peak
                    snapshots, size = table_stats(spark, lake).snapshots, _metadata_bytes(spark, lake)
                    checkpoints.append((i, snapshots, size, time.monotonic() - began))
                    print(
                        f"expiry bench: {i:,}/{commits:,} commits, {snapshots:,} snapshots, "
                        f"{size / 1024:,.0f} KiB metadata, {time.monotonic() - began:.0f} s",
                        flush=True,
                    )
                if i % every == 0:
                    maintain_table(spark, config, ident, settings)
        sync.close()
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, qty FROM {TABLE}")
            source = Counter(tuple(r) for r in cur.fetchall())
        conn.commit()
        lake_rows = Counter(tuple(r) for r in spark.sql(f"SELECT id, qty FROM {lake}").collect())
    finally:
        conn.close()
        stop_spark(spark)

    rate = commits / merging
    # The busiest retention window's MERGEs and compactions, an interval's MERGEs since the last
    # expiry, retain-last, and the first copy's and a compaction's commit at the edges.
    window, first = 0, 0
    for last, at in enumerate(applied):
        while applied[first] < at - retain:
            first += 1
        window = max(window, last - first + 1)
    bound = window + window // every + 1 + every + settings.retain_last + 3
    peak = max(s for _, s, _, _ in checkpoints)
    half = max((s for c, s, _, _ in checkpoints if c <= commits // 2), default=0)
    late = max((s for c, s, _, _ in checkpoints if c > commits // 2), default=0)
    result = [
        row(
            f"after {c:,} MERGE commits: snapshots / metadata.json",
            f"{s:,} / {b / 1024:,.0f} KiB ({seconds:.0f} s)",
        )
        for c, s, b, seconds in checkpoints
    ]
    return [
        *result,
        row("MERGE commits/s while applying (one source transaction each)", f"{rate:.1f}"),
        row(
            f"snapshots bounded: the busiest {retain:g} s ({window:,} commits) + an interval ({every}) "
            "+ retain-last",
            f"max {peak:,}",
            f"<= {bound:,}",
            peak <= bound,
        ),
        row(
            "no growth with the commits: the second half's peak against the first half's",
            f"{late:,} / {half:,}",
            "<= 1.25x",
            0 < half and late <= 1.25 * half,
        ),
        row(
            "lake equals the source (id, qty; as multisets)",
            str(lake_rows == source),
            "True",
            lake_rows == source,
        ),  # fmt: skip
    ]
