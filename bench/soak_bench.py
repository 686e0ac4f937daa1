"""The embedded stack under a long load (issue 26): the streaming application on a private stack, a
plain producer (linger 5 ms, 200/s, in its own process) measured for BENCH_SOAK_SECONDS (60) each
time the topic has received another BENCH_SOAK_WINDOW (100,000) records, up to BENCH_SOAK_RECORDS
(1,000,000). Between windows a fill at BENCH_SOAK_FILL_RATE (4,000/s, same small batches) adds the
records, and the lake catches up before the next window. Per window: click -> visible and click ->
counted in product_views p50/p95 (snapshot metadata against the producer's own clock) and the
batch objects the broker stores, and the click table's data files and snapshots.
BENCH_SOAK_RETENTION=0 runs it without the topic retention. The streaming application maintains
the tables itself as on any local stack (every 5 minutes; BENCH_SOAK_MAINTAIN_MINUTES=M changes
it, 0 turns it off). BENCH_SOAK_MAINTAIN_EVERY=N instead runs `maintain` as a process of its own
after every N records (the in-application maintenance then off), as the hourly EMR step does on AWS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lake_visibility import CLICKS, Record, click_commits, latencies, views_commits
from bench.private_stack import percentiles, private_stack, row
from jobs.config import LOCAL_STREAMING_MAINTENANCE_MINUTES

RATE = 200
TARGET_CLICK_P95 = 3.0
TARGET_VIEWS_P95 = 6.0
# Issue 26's "now" column: a fresh stack, then the same stack after ~36k records.
BEFORE_FRESH = {"click": "3.6-3.7s", "views": "7.2-8.0s"}
BEFORE_USED = {"click": "6.6s (after ~36k)", "views": "10.8s (after ~36k)"}
CATCH_UP_SECONDS = 180  # after a window, how long the lake may take to show its last record
REPO = Path(__file__).resolve().parent.parent


def run() -> list[dict]:
    total = int(os.environ.get("BENCH_SOAK_RECORDS", 1_000_000))
    window = int(os.environ.get("BENCH_SOAK_WINDOW", 100_000))
    seconds = float(os.environ.get("BENCH_SOAK_SECONDS", 60))
    fill_rate = float(os.environ.get("BENCH_SOAK_FILL_RATE", 4_000))
    retention = os.environ.get("BENCH_SOAK_RETENTION", "1") != "0"
    maintain_every = int(os.environ.get("BENCH_SOAK_MAINTAIN_EVERY", 0))
    maintain_minutes = os.environ.get("BENCH_SOAK_MAINTAIN_MINUTES", "0" if maintain_every else "")
    with private_stack("soak", topic_retention=retention) as stack:
        return _soak(stack, total, window, seconds, fill_rate, retention, maintain_every, maintain_minutes)


def _soak(
    stack,
    total: int,
    window: int,
    seconds: float,
    fill_rate: float,
    retention: bool,
    maintain_every: int,
    maintain_minutes: str,
) -> list[dict]:
    from lakehouse.demo import STATUS_FILE, wait_running
    from lakehouse.job_processes import JobProcesses, run_job
    from lakehouse.local.catalog import pyiceberg_catalog

    settings = stack.settings
    catalog = pyiceberg_catalog(settings.catalog_path, settings.warehouse)
    processes = JobProcesses(settings.home / "logs" / "soak")
    status_file = processes.log_dir / STATUS_FILE
    maintenance = ("--maintain-every-minutes", maintain_minutes) if maintain_minutes else ()
    processes.start(
        "streaming", "--status-file", str(status_file), *maintenance, ready_pattern=r"streaming: starting"
    )
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    rows, first_p95, sent, maintained_at = [], None, 0, 0
    minutes = float(maintain_minutes) if maintain_minutes else LOCAL_STREAMING_MAINTENANCE_MINUTES
    label = ("" if retention else " (no retention)") + (
        f" (maintain every {maintain_every:,})"
        if maintain_every
        else f" (in-app maintenance every {minutes:g} min)"
        if minutes
        else " (no maintenance)"
    )
    try:
        wait_running(status_file, processes, timeout=300)
        warm = _produce(stack, work / "warm.txt", rate=RATE, records=30)  # Python workers start here
        _caught_up(catalog, processes, warm)
        sent = 30
        milestone = 0
        while True:
            if sent < milestone:
                fill = _produce(stack, work / "fill.txt", rate=fill_rate, records=milestone - sent)
                sent += len(fill)
                fill_clicks, fill_views = _caught_up(catalog, processes, fill)
                if fill_clicks[1] or fill_views[1]:
                    raise RuntimeError(
                        f"the lake did not catch up within {CATCH_UP_SECONDS}s after the fill to "
                        f"{milestone:,} ({fill_clicks[1]:,} clicks, {fill_views[1]:,} views not visible)"
                    )
            if maintain_every and sent - maintained_at >= maintain_every:
                maintenance = run_job("maintain")
                if maintenance.returncode != 0:
                    raise RuntimeError(f"maintain failed:\n{maintenance.stderr[-2000:]}")
                maintained_at = sent
            stored_before = sum(stack.broker.stored_batches(stack.saved_secrets()).values())
            began = time.strftime("%H:%M:%S", time.gmtime())
            measured = _produce(stack, work / "window.txt", rate=RATE, records=int(RATE * seconds))
            print(f"window {milestone:,}: produced {began}-{time.strftime('%H:%M:%S', time.gmtime())} UTC")
            sent += len(measured)
            clicks, views = _caught_up(catalog, processes, measured)
            stored = stack.broker.stored_batches(stack.saved_secrets())
            clicks_table = catalog.load_table(CLICKS)
            files = sum(1 for _ in clicks_table.scan().plan_files())
            click_p50, click_p95 = percentiles(clicks[0])
            views_p50, views_p95 = percentiles(views[0])
            first_p95 = click_p95 if first_p95 is None else first_p95
            before = BEFORE_FRESH if milestone == 0 else BEFORE_USED
            late = f"; {clicks[1]:,} clicks / {views[1]:,} views not visible in {CATCH_UP_SECONDS}s"
            rows += [
                row(f"{milestone:,} records stored{label}: click -> visible p50 / p95",
                    f"{click_p50:.2f}s / {click_p95:.2f}s" + (late if clicks[1] or views[1] else ""),
                    f"p95 <= {TARGET_CLICK_P95}s", click_p95 <= TARGET_CLICK_P95 and not clicks[1],
                    before=before["click"]),
                row("  click -> counted in product_views p50 / p95",
                    f"{views_p50:.2f}s / {views_p95:.2f}s", f"p95 <= {TARGET_VIEWS_P95}s",
                    views_p95 <= TARGET_VIEWS_P95 and not views[1], before=before["views"]),
                row("  batch objects in the broker (before / after the window; max per partition)",
                    f"{stored_before:,} / {sum(stored.values()):,}; {max(stored.values()):,}"),
                row("  click table: data files / snapshots; in-app maintenance runs so far",
                    f"{files:,} / {len(clicks_table.snapshots()):,}; {_maintenance_runs(status_file)}"),
            ]  # fmt: skip
            if sent >= total or clicks[1]:  # a stalled broker makes later windows meaningless
                break
            milestone = min(total, milestone + window)
        trend_ok = click_p95 <= max(first_p95 * 1.25, first_p95 + 0.5)
        rows.append(
            row(f"no upward trend{label}: click p95 first / last window",
                f"{first_p95:.2f}s / {click_p95:.2f}s", "last <= max(1.25x first, first + 0.5s)",
                trend_ok, before="3.6s -> 6.6s after 36k")
        )  # fmt: skip
    finally:
        processes.stop()
    return rows


def _maintenance_runs(status_file: Path) -> str:
    """How often the application maintained the tables itself ("off" when it does not)."""
    maintenance = json.loads(status_file.read_text()).get("maintenance")
    return "off" if maintenance is None else str(maintenance["runs"])


def _produce(stack, out: Path, rate: float, records: int) -> list[Record]:
    """Run the plain producer in its own process; its deliveries."""
    subprocess.run(
        [sys.executable, "-m", "bench.plain_producer", stack.broker.bootstrap, "clicktopic",
         "--rate", str(rate), "--records", str(records), "--out", str(out)],
        cwd=REPO, check=True, timeout=records / rate + 300,
    )  # fmt: skip
    return _read(out)


def _read(path: Path) -> list[Record]:
    found = []
    for line in path.read_text().splitlines():
        partition, offset, at = line.split()
        found.append((int(partition), int(offset), float(at)))
    return found


def _caught_up(catalog, processes, records: list[Record]):
    """Wait (CATCH_UP_SECONDS at most) until the click table and product_views cover every record;
    then (latencies, not covered) for each."""
    deadline = time.monotonic() + CATCH_UP_SECONDS
    while True:
        processes.check()
        clicks = latencies(records, click_commits(catalog))
        views = latencies(records, views_commits(catalog))
        if (not clicks[1] and not views[1]) or time.monotonic() > deadline:
            return clicks, views
        time.sleep(2)
