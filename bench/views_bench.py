"""product_views freshness behind the click table, on a private local stack.

Appends click batches (as the ingest writes them) every BENCH_VIEWS_INTERVAL seconds (default 1)
for BENCH_VIEWS_SECONDS (default 30) while the views job runs continuously with its default 1 s
trigger; latency = views commit that includes a click snapshot - that click snapshot's commit.
"""

from __future__ import annotations

import os
import threading
import time

from bench.private_stack import percentiles, private_stack, row

CLICKS = "lakehouse.ods_behavior.bench_views_clicks"
VIEWS = "lakehouse.ads_behavior.bench_views"
ROWS_PER_PARTITION = 500
PARTITIONS = 3


def _append(spark, start: int) -> None:
    spark.sql(
        f"""INSERT INTO {CLICKS}
            SELECT 10 + id % 90, '10001', CAST(id % 20 AS string), 'cookie', CAST(id % 20 AS int),
                   current_timestamp(), NULL, NULL, '20261121',
                   CAST(id % {PARTITIONS} AS int), {start} + id DIV {PARTITIONS}, current_timestamp()
            FROM range({ROWS_PER_PARTITION * PARTITIONS})"""
    )


def run() -> list[dict]:
    seconds = float(os.environ.get("BENCH_VIEWS_SECONDS", "30"))
    interval = float(os.environ.get("BENCH_VIEWS_INTERVAL", "1"))
    with private_stack("views") as stack:
        from jobs.common.lake_tables import fact_table_ddl
        from jobs.common.run_modes import RunMode, StopRequest, run_batches
        from jobs.common.spark_session import build_spark, stop_spark
        from jobs.config import LakehouseConfig
        from jobs.views.job import ProductViews, ViewsSettings

        config = LakehouseConfig.local(stack.settings.home)
        spark = build_spark(config, "views-bench", {"spark.sql.shuffle.partitions": "2"})
        for statement in fact_table_ddl(CLICKS):
            spark.sql(statement)
        _append(spark, 0)
        views = ProductViews(spark, ViewsSettings(CLICKS, VIEWS))
        views.prepare()
        views.run_batch()  # first batch pays for table creation and warm-up
        counted_at: dict[int, float] = {}
        views.on_commit = lambda _delta, snapshot: counted_at.setdefault(snapshot, time.time())
        stop = StopRequest()
        loop = threading.Thread(target=run_batches, args=(views.run_batch, RunMode(), stop))
        loop.start()
        appended, began = ROWS_PER_PARTITION, time.monotonic()
        while time.monotonic() - began < seconds:
            _append(spark, appended)
            appended += ROWS_PER_PARTITION
            time.sleep(interval)
        time.sleep(5)
        stop.set()
        loop.join()
        commits = spark.sql(f"SELECT snapshot_id, committed_at FROM {CLICKS}.snapshots").collect()
        commit_times = {r.snapshot_id: r.committed_at.timestamp() for r in commits}
        # A click commit is visible in views at the first views commit covering a snapshot at or after it.
        covered = sorted((commit_times[s], at) for s, at in counted_at.items() if s in commit_times)
        latencies = []
        for committed in sorted(commit_times.values())[1:]:
            seen = next((at for snap_time, at in covered if snap_time >= committed), None)
            if seen is not None:
                latencies.append(seen - committed)
        total_views = spark.sql(f"SELECT sum(views) FROM {VIEWS}").collect()[0][0]
        stop_spark(spark)
    p50, p95 = percentiles(latencies)
    expected = appended * PARTITIONS
    return [
        row(f"click commits every {interval:g}s for {seconds:.0f}s", f"{len(commit_times) - 1} commits"),
        row("views freshness p50 behind the click table", f"{p50:.2f} s"),
        row("views freshness p95 behind the click table", f"{p95:.2f} s"),
        row("views total / clicks appended", f"{total_views} / {expected}", "equal", total_views == expected),
    ]
