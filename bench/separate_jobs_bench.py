"""The demo's load the way it ran before the one streaming application: the three streaming jobs as
separate processes (`python -m jobs.cdc`, `jobs.ingest`, `jobs.views`: three
Spark applications on two cores), clicks produced by `lakehouse gendata --rate` in a process of its
own, freshness computed from outside as bench/demo_bench.py computes it (Kafka timestamps against
snapshot commit times). BENCH_SEPARATE_RUNS (default 1) runs of BENCH_SEPARATE_SECONDS (60) at
BENCH_SEPARATE_RATE (200) clicks/s, each on a fresh private stack.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.demo_bench import TARGET_CLICK_P95, TARGET_VIEWS_P95, _outside, _sample_rss
from bench.private_stack import percentiles, private_stack, row

RATE = 200
JOBS = (
    # name, the log line that says it is consuming
    ("cdc", r"tailing the binlog"),
    ("ingest", r"resuming"),
    ("views", r"resuming"),
)
READY_SECONDS = 300


def run() -> list[dict]:
    runs = int(os.environ.get("BENCH_SEPARATE_RUNS", 1))
    seconds = float(os.environ.get("BENCH_SEPARATE_SECONDS", 60))
    rate = int(os.environ.get("BENCH_SEPARATE_RATE", RATE))
    rows = []
    for index in range(1, runs + 1):
        with private_stack("separate") as stack:
            rows += _one_run(stack, index, seconds, rate)
    return rows


def _one_run(stack, index: int, seconds: float, rate: int) -> list[dict]:
    from lakehouse.demo import CLICKS, WARM_UP_EVENTS, CatalogWatch, total_records
    from lakehouse.job_processes import JobProcesses
    from lakehouse.local.catalog import pyiceberg_catalog

    settings = stack.settings
    lake = pyiceberg_catalog(settings.catalog_path, settings.warehouse)
    catalog = CatalogWatch(lake, settings.catalog_path)
    processes = JobProcesses(settings.home / "logs" / "bench")
    peak = {"rss": 0, "pss": 0}
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_rss, args=(str(settings.home), peak, stop), daemon=True)
    sampler.start()
    count = int(rate * seconds)
    try:
        for name, ready in JOBS:
            processes.start(name, ready_pattern=ready)
            if name == "cdc":  # its initial snapshot creates the dimensions the others read
                processes.wait_ready(READY_SECONDS)
        processes.wait_ready(READY_SECONDS)
        # As in the demo: a first batch through every job before the clock starts.
        _gendata(WARM_UP_EVENTS)
        _wait(processes, lambda: total_records(catalog, CLICKS) >= WARM_UP_EVENTS)
        _wait(processes, lambda: _views_caught_up(catalog))
        _gendata(count, "--rate", str(rate), timeout=seconds * 3 + 120)
        _wait(processes, lambda: total_records(catalog, CLICKS) >= WARM_UP_EVENTS + count)
        _wait(processes, lambda: _views_caught_up(catalog))
    finally:
        codes = processes.stop()
        stop.set()
    failed = {name: code for name, code in codes.items() if code != 0}
    if failed:
        raise RuntimeError(f"jobs exited with errors: {failed}; logs in {processes.log_dir}")
    measured = _outside(settings.home, settings.kafka_port)
    click_p50, click_p95 = percentiles(measured["clicks"])
    views_p50, views_p95 = percentiles(measured["views"])
    prefix = f"separate processes, run {index} at {rate:,}/s: "
    return [
        row(prefix + "click freshness p50 / p95 (outside)",
            f"{click_p50:.2f}s / {click_p95:.2f}s ({len(measured['clicks']):,} of {count:,})",
            f"p95 <= {TARGET_CLICK_P95}s", click_p95 <= TARGET_CLICK_P95, before="~3s / ~5s"),
        row(prefix + "click -> counted in product_views p50 / p95",
            f"{views_p50:.2f}s / {views_p95:.2f}s ({len(measured['views']):,} of {count:,})",
            f"p95 <= {TARGET_VIEWS_P95}s", views_p95 <= TARGET_VIEWS_P95, before="~8.5s / ~11s"),
        row(prefix + "peak RSS (stack + jobs)",
            f"{peak['rss'] / 2**30:.2f} GiB (PSS {peak['pss'] / 2**30:.2f})"),
    ]  # fmt: skip


def _gendata(count: int, *args: str, timeout: float = 600) -> None:
    lakehouse = str(Path(sys.prefix) / "bin" / "lakehouse")
    command = [lakehouse, "gendata", "--count", str(count), "--no-progress", *args]
    subprocess.run(command, check=True, timeout=timeout)


def _views_caught_up(catalog) -> bool:
    """product_views has counted every click the click table holds (its watermark reached the
    click table's stored offsets)."""
    from jobs.common.lake_tables import OFFSETS_KEY, offsets_from_summary
    from jobs.config import CLICK_TOPIC
    from jobs.views.job import PROGRESS_KEY, watermark_from_summary
    from lakehouse.demo import CLICKS, VIEWS

    if not catalog.table_exists(CLICKS) or not catalog.table_exists(VIEWS):
        return False
    clicks = catalog.load_table(CLICKS).current_snapshot()
    views = catalog.load_table(VIEWS).current_snapshot()
    if clicks is None or views is None:
        return False
    offsets = offsets_from_summary(clicks.summary.additional_properties.get(OFFSETS_KEY), CLICK_TOPIC)
    watermark = watermark_from_summary(views.summary.additional_properties.get(PROGRESS_KEY))[1]
    return bool(offsets) and all(watermark.get(p, 0) >= o for p, o in offsets.items())


def _wait(processes, done, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        processes.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s; logs in {processes.log_dir}")
        time.sleep(0.5)
