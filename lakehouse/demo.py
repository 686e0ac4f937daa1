"""`lakehouse demo` / `make demo`: the source system's scenario end to end on the embedded stack.

1. stack up; 2. CDC, ingest and views in one streaming application (`python -m jobs.streaming`, a
child process, as on EMR); 3. clicks at a steady rate with a live view of the jobs, product_views
and freshness, a third of the way in the source system's two UPDATE statements; 4. their effect;
5. the batch report; 6. maintenance; 7. `verify` (the lake reconciled with its sources); then a
summary. The jobs are stopped at the end; the stack
stays up and the lake is queryable with `lakehouse sql`.

The demo must not slow down what it shows: it reads a table only when the catalog says it changed
(one SQLite query per second), and freshness comes from the click table's snapshot commit times,
not from when the demo happened to look.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from infra.seed_data import PRODUCT_ROWS, USER_MEMBER_ROWS
from jobs.config import LakehouseConfig
from jobs.registry import Kind, names
from lakehouse.click_latency import ClickLatencyTracker
from lakehouse.job_processes import JobProcesses, run_job
from lakehouse.local.catalog import pyiceberg_catalog
from lakehouse.local.mariadb import APP_USER
from lakehouse.local.settings import StackSettings
from lakehouse.local.stack import LocalStack

# The source system's two statements (its article), run a third of the way into the streaming phase.
PRICE_CHANGE = "UPDATE products SET description='test666', product_price=8.1 WHERE productId='1'"
LEVEL_CHANGE = "UPDATE user_member SET memberLevel=2 WHERE userid='555655'"
NEW_PRICE = 8.1

CLICKS = "ods_behavior.clickevent"
REJECTS = "ods_behavior.clickevent_rejects"
VIEWS = "ads_behavior.product_views"
WARM_UP_EVENTS = 30  # produced and counted before the clock starts; not in the freshness figure
PRODUCTS = "dim_db.products"
MEMBERS = "dim_db.user_member"

STATUS_FILE = "streaming-status.json"


@dataclass(frozen=True)
class DemoOptions:
    seconds: float = 120.0
    rate: float = 200.0
    bad_ratio: float = 0.01
    ready_timeout: float = 300.0


@dataclass
class DemoState:
    """What the live view and the summary show."""

    produced: int = 0
    clicks_before: int = 0
    rejects_before: int = 0
    clicks: int = 0
    rejects: int = 0
    views: list[dict] = field(default_factory=list)
    jobs: list[dict] = field(default_factory=list)  # the streaming application's per-job status
    events: list[str] = field(default_factory=list)  # timeline lines: statements and their effects
    changes_at: float | None = None  # wall clock (epoch s) when the UPDATEs committed
    price_applied_at: float | None = None  # seconds from the UPDATE to the commit that showed it
    price_in_views_at: float | None = None
    new_price_views_before: int = 0  # views of (product 1, 8.1) from earlier runs


def run_demo(console: Console, options: DemoOptions) -> None:
    began = time.monotonic()
    settings = StackSettings.resolve()
    stack = LocalStack(settings)
    console.rule("1/7 local stack")
    state_file = stack.up(progress=lambda msg: console.print(f"  {msg}"))
    config = LakehouseConfig.local(settings.home)
    conn = stack.mariadb.connect(APP_USER, state_file["mysql"]["password"])
    reset_demo_rows(conn)
    catalog = CatalogWatch(
        pyiceberg_catalog(settings.catalog_path, settings.warehouse), settings.catalog_path
    )
    state = DemoState()
    tracker = ClickLatencyTracker(config.kafka.topic)
    width = max(console.width, 120)  # the one-shot jobs print tables; keep them readable in a log
    processes = JobProcesses(settings.home / "logs" / "demo")
    status_file = processes.log_dir / STATUS_FILE
    status_file.unlink(missing_ok=True)
    try:
        console.rule("2/7 streaming: CDC (binlog -> dim_db), ingest (Kafka -> ods_behavior), views")
        with console.status(f"starting the streaming application; log in {processes.log_dir}"):
            # One Spark application, one thread per job; CDC's initial snapshot creates and loads
            # the dimensions before the ingest starts (the application orders them).
            processes.start("streaming", "--status-file", str(status_file),
                             ready_pattern=r"streaming: starting")  # fmt: skip
            wait_running(status_file, processes, options.ready_timeout)
            warm_up(config, catalog, tracker, processes, options.ready_timeout)
        console.print("  cdc, ingest and views are running in one Spark application (first batch done)")
        state.clicks_before = total_records(catalog, CLICKS)
        state.rejects_before = total_records(catalog, REJECTS)

        console.rule(f"3/7 clicks at {options.rate:,.0f}/s for {options.seconds:.0f}s (gendata), live")
        stream(console, options, config, conn, catalog, processes, tracker, state, status_file)

        catch_up(catalog, tracker, state, processes, timeout=90)
        codes = processes.stop()
        # Stopping, the ingest commits the rejects it still held (it commits them every 10 s).
        state.clicks = total_records(catalog, CLICKS) - state.clicks_before
        state.rejects = total_records(catalog, REJECTS) - state.rejects_before
        state.jobs = read_status(status_file)
        cdc_changes = next((j["records"] for j in state.jobs if j["name"] == "cdc"), "unknown")
        failed = {name: code for name, code in codes.items() if code != 0}
        if failed:
            raise RuntimeError(f"jobs exited with errors: {failed}; logs in {processes.log_dir}")

        console.rule("4/7 effect of the two statements")
        show_effect(console, catalog, state)

        console.rule("5/7 batch report (Spark): member_daily_report for today")
        report = run_job("report", "--date", datetime.now(UTC).date().isoformat(), width=width)
        console.print(report.stdout.rstrip())
        if report.returncode != 0:
            raise RuntimeError(f"batch report failed:\n{report.stderr[-2000:]}")
        console.print("  member 555655 now counts under level 2 (it was 3 when the demo started)")

        console.rule("6/7 maintenance: compaction, snapshot expiry, orphan files, manifests")
        files_before = data_files(catalog, CLICKS)
        maintenance = run_job("maintain", width=width)
        console.print(maintenance.stdout.rstrip())
        if maintenance.returncode != 0:
            raise RuntimeError(f"maintenance failed:\n{maintenance.stderr[-2000:]}")
        files_after = data_files(catalog, CLICKS)

        console.rule("7/7 verify: every table reconciled with its source (Kafka offsets, MySQL rows, views)")
        verified = run_job("verify", width=width)
        console.print(verified.stdout.rstrip())
        if verified.returncode != 0:
            raise RuntimeError(f"verify exited {verified.returncode}:\n{verified.stderr[-2000:]}")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping the jobs (each finishes and commits its batch)[/]")
        raise
    finally:
        if processes.jobs:
            processes.stop()
        conn.close()

    print_summary(console, options, state, tracker, cdc_changes, (files_before, files_after))
    console.print(
        f"[green]demo done[/] in {time.monotonic() - began:.0f}s; jobs stopped, stack still up. Try "
        f'`lakehouse sql "SELECT * FROM {VIEWS} ORDER BY views DESC"` or `lakehouse local down`.'
    )


# ---- the streaming phase -------------------------------------------------------------------------


def stream(console, options, config, conn, catalog, processes, tracker, state, status_file) -> None:
    from jobs.gendata.generator import generate_records, produce, producer_config

    count = int(options.rate * options.seconds)
    stop = threading.Event()
    summary_box: list = []

    def producer() -> None:
        summary_box.append(
            produce(
                producer_config(config),
                config.kafka.topic,
                generate_records(count, bad_ratio=options.bad_ratio),
                count,
                options.rate,
                on_delivered=tracker.produced,
                stop=stop,
            )
        )

    thread = threading.Thread(target=producer, name="gendata", daemon=True)
    started = time.monotonic()
    thread.start()
    live = Live(console=console, refresh_per_second=2, transient=False) if console.is_terminal else None
    last_line = 0.0
    try:
        if live:
            live.start()
        while thread.is_alive():
            processes.check()
            elapsed = time.monotonic() - started
            if state.changes_at is None and elapsed >= options.seconds / 3:
                run_statements(conn, state, elapsed)
            refresh(catalog, tracker, state, elapsed)
            state.jobs = read_status(status_file)
            if live:
                live.update(render(state, tracker, elapsed, options))
            elif time.monotonic() - last_line >= 10:
                console.print(status_line(state, tracker, elapsed))
                last_line = time.monotonic()
            time.sleep(1.0)
    except BaseException:
        stop.set()
        raise
    finally:
        if live:
            live.stop()
        thread.join(120)
    state.produced = summary_box[0].sent if summary_box else 0
    if not live:
        console.print(status_line(state, tracker, time.monotonic() - started))


def run_statements(conn, state: DemoState, elapsed: float) -> None:
    with conn.cursor() as cur:
        cur.execute(PRICE_CHANGE)
        cur.execute(LEVEL_CHANGE)
    conn.commit()
    state.changes_at = time.time()  # compared with snapshot commit times
    state.new_price_views_before = new_price_views(state.views)
    state.events.append(f"t+{elapsed:.0f}s  MySQL: {PRICE_CHANGE}")
    state.events.append(f"t+{elapsed:.0f}s  MySQL: {LEVEL_CHANGE}")


def refresh(catalog, tracker: ClickLatencyTracker, state: DemoState, elapsed: float) -> None:
    state.clicks = observe_clicks(catalog, tracker) - state.clicks_before
    state.rejects = total_records(catalog, REJECTS) - state.rejects_before
    state.views = read_rows(catalog, VIEWS)
    if state.changes_at is None:
        return
    # Seen by this poll, timed by the commit that made it visible (the poll runs every second or so).
    if state.price_applied_at is None and product_price(read_rows(catalog, PRODUCTS), "1") == NEW_PRICE:
        committed = first_commit_showing(
            catalog.load_table(PRODUCTS), state.changes_at, lambda rows: product_price(rows, "1") == NEW_PRICE
        )
        state.price_applied_at = committed - state.changes_at
        state.events.append(
            f"t+{elapsed:.0f}s  CDC applied the new price to {PRODUCTS} ({state.price_applied_at:.1f}s later)"
        )
    before = state.new_price_views_before
    if state.price_in_views_at is None and new_price_views(state.views) > before:
        committed = first_commit_showing(
            catalog.load_table(VIEWS), state.changes_at, lambda rows: new_price_views(rows) > before
        )
        state.price_in_views_at = committed - state.changes_at
        state.events.append(
            f"t+{elapsed:.0f}s  new clicks priced 8.1 counted in {VIEWS} "
            f"({state.price_in_views_at:.1f}s after the UPDATE)"
        )


def first_commit_showing(table, after: float, shows: Callable[[list[dict]], bool]) -> float:
    """Commit time (epoch s) of the first snapshot since `after` whose rows satisfy `shows`; now, if
    none does (what the poll saw was committed before `after`)."""
    for snapshot in sorted(table.snapshots(), key=lambda s: s.timestamp_ms):
        if snapshot.timestamp_ms / 1000 >= after and shows(
            table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()
        ):
            return snapshot.timestamp_ms / 1000
    return time.time()


def read_status(status_file) -> list[dict]:
    try:
        return json.loads(status_file.read_text())["jobs"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return []


def wait_running(status_file, processes: JobProcesses, timeout: float) -> None:
    """Until the streaming application says all three jobs run (CDC's initial snapshot is done)."""
    deadline = time.monotonic() + timeout
    while True:
        processes.check()
        jobs = read_status(status_file)
        if len(jobs) == len(names(Kind.STREAMING)) and all(j["state"] == "running" for j in jobs):
            return
        if time.monotonic() > deadline:
            states = ", ".join(f"{j['name']} {j['state']}" for j in jobs) or "no status yet"
            raise RuntimeError(
                f"streaming jobs not running after {timeout:.0f}s ({states}); see {processes.log_dir}"
            )
        time.sleep(0.5)


def warm_up(config, catalog, tracker: ClickLatencyTracker, processes: JobProcesses, timeout: float) -> None:
    """A few events through the ingest before the clock starts: the first micro-batch of a fresh
    Spark job pays for starting its Python workers, which is not what freshness should measure."""
    from jobs.gendata.generator import generate_records, produce, producer_config

    events = generate_records(WARM_UP_EVENTS)
    produce(
        producer_config(config), config.kafka.topic, events, WARM_UP_EVENTS, on_delivered=tracker.produced
    )
    deadline = time.monotonic() + timeout
    while tracker.waiting and time.monotonic() < deadline:
        processes.check()
        observe_clicks(catalog, tracker)
        time.sleep(0.5)
    tracker.latencies.clear()


def new_price_views(views: list[dict]) -> int:
    return sum(
        r["views"] for r in views if r["productId"] == "1" and float(r["product_price"] or 0) == NEW_PRICE
    )


def catch_up(catalog, tracker, state, processes, timeout: float) -> None:
    """After the last event is produced: wait until the click table and the views include it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        processes.check()
        refresh(catalog, tracker, state, 0)
        clicks_total = state.clicks + state.clicks_before
        if tracker.waiting == 0 and sum(r["views"] for r in state.views) == clicks_total:
            return
        time.sleep(1.0)


def render(state: DemoState, tracker: ClickLatencyTracker, elapsed: float, options: DemoOptions) -> Group:
    return Group(
        status_line(state, tracker, elapsed), jobs_table(state.jobs), views_table(state.views), *state.events
    )


def jobs_table(jobs: list[dict]) -> Table:
    table = Table(title="streaming jobs (one Spark application)")
    for column in ("job", "state", "batches", "records", "last commit", "lag", "problem"):
        table.add_column(
            column, justify="right" if column in ("batches", "records", "last commit", "lag") else "left"
        )
    now = time.time()
    for job in jobs:
        last = f"{now - job['last_commit_at']:.0f}s ago" if job["last_commit_at"] else "-"
        lag = f"{job['lag_seconds']:.1f}s" if job["lag_seconds"] is not None else "-"
        table.add_row(job["name"], job["state"], f"{job['batches']:,}", f"{job['records']:,}", last, lag,
                      (job["error"] or "")[:60])  # fmt: skip
    return table


def status_line(state: DemoState, tracker: ClickLatencyTracker, elapsed: float) -> str:
    fresh = tracker.percentiles()
    freshness = f"p50 {fresh[0]:.1f}s / p95 {fresh[1]:.1f}s" if fresh else "n/a"
    return (
        f"t+{elapsed:.0f}s  clicks in {state.clicks:,}  rejects {state.rejects:,}  "
        f"not yet visible {tracker.waiting:,}  freshness {freshness}"
    )


def views_table(rows: list[dict], limit: int = 12) -> Table:
    table = Table(title=f"{VIEWS} (top {limit})")
    for column in ("productId", "name", "product_price", "views"):
        table.add_column(column, justify="right" if column in ("views", "product_price") else "left")
    for r in sorted(rows, key=lambda r: -r["views"])[:limit]:
        table.add_row(r["productId"], r["name"] or "-", str(r["product_price"] or "-"), f"{r['views']:,}")
    return table


# ---- after the stream ----------------------------------------------------------------------------


def show_effect(console: Console, catalog, state: DemoState) -> None:
    product_one = [r for r in read_rows(catalog, VIEWS) if r["productId"] == "1"]
    console.print(views_table(product_one))
    console.print("  product 1 is counted at its old and its new price: new events carry the new price")
    member = [r for r in read_rows(catalog, MEMBERS) if r["userid"] == "555655"]
    console.print(f"  {MEMBERS} 555655: memberLevel={member[0]['memberLevel'] if member else 'missing'}")
    for line in state.events:
        console.print(f"  {line}")


def print_summary(console, options, state, tracker, cdc_changes, files) -> None:
    fresh = tracker.percentiles()
    freshness = f"{fresh[0]:.1f}s / {fresh[1]:.1f}s" if fresh else "n/a"
    table = Table(title="demo summary")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("events produced", f"{state.produced:,}"),
        ("events in (ods_behavior.clickevent)", f"{state.clicks:,}"),
        ("rejects (ods_behavior.clickevent_rejects)", f"{state.rejects:,}"),
        ("freshness p50 / p95 (produced -> visible)", freshness),
        ("CDC changes applied", str(cdc_changes)),
        ("price change -> new clicks in product_views", _seconds(state.price_in_views_at)),
        ("click table data files before / after compaction", f"{files[0]} / {files[1]}"),
    ]
    for measure, value in rows:
        table.add_row(measure, value)
    console.print(table)


def _seconds(value: float | None) -> str:
    return "not seen" if value is None else f"{value:.1f}s"


# ---- small readers (pyiceberg over the local catalog; no Spark in the demo process) ----------------


class CatalogWatch:
    """pyiceberg loads and scans, each redone only when the table's metadata pointer moved.

    The demo polls every second; loading a table parses its whole metadata file and a scan reads
    its manifests and data files, CPU the jobs on a two-core box would otherwise lose. The SQLite
    catalog answers "did it change" with one indexed query.
    """

    def __init__(self, catalog, catalog_path) -> None:
        self.catalog = catalog
        self._db = sqlite3.connect(f"file:{catalog_path}?mode=ro", uri=True, check_same_thread=False)
        self._loaded: dict[str, tuple[str, object]] = {}
        self._rows: dict[str, tuple[str, list[dict]]] = {}

    def _location(self, name: str) -> str | None:
        namespace, table = name.split(".")
        row = self._db.execute(
            "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?",
            (namespace, table),
        ).fetchone()
        return row[0] if row else None

    def table_exists(self, name: str) -> bool:
        return self._location(name) is not None

    def load_table(self, name: str):
        location = self._location(name)
        cached = self._loaded.get(name)
        if cached is None or cached[0] != location:
            cached = self._loaded[name] = (location, self.catalog.load_table(name))
        return cached[1]

    def rows(self, name: str) -> list[dict]:
        location = self._location(name)
        cached = self._rows.get(name)
        if cached is None or cached[0] != location:
            rows = self.load_table(name).scan().to_arrow().to_pylist() if location else []
            cached = self._rows[name] = (location, rows)
        return cached[1]


def total_records(catalog, table: str) -> int:
    if not catalog.table_exists(table):
        return 0
    return _records(catalog.load_table(table))


def _records(table) -> int:
    snapshot = table.current_snapshot()
    return int(snapshot.summary.additional_properties.get("total-records", 0)) if snapshot else 0


def observe_clicks(catalog, tracker: ClickLatencyTracker) -> int:
    """Feed the click table's snapshots to the tracker and return its rows: one metadata load."""
    if not catalog.table_exists(CLICKS):
        return 0
    clicks = catalog.load_table(CLICKS)
    tracker.observe(clicks.snapshots())
    return _records(clicks)


def read_rows(catalog: CatalogWatch, table: str) -> list[dict]:
    return catalog.rows(table)


def product_price(products: list[dict], product_id: str) -> float | None:
    rows = [r for r in products if r["productId"] == product_id]
    return float(rows[0]["product_price"]) if rows and rows[0]["product_price"] is not None else None


def data_files(catalog, table: str) -> int:
    return sum(1 for _ in catalog.load_table(table).scan().plan_files())


def reset_demo_rows(conn) -> None:
    """Put product 1 and member 555655 back to their seed values, so every run shows the change."""
    product = next(r for r in PRODUCT_ROWS if r[0] == "1")
    member = next(r for r in USER_MEMBER_ROWS if r[0] == "555655")
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE products SET description=%s, product_price=%s WHERE productId=%s",
            (product[2], product[3], product[0]),
        )
        cur.execute("UPDATE user_member SET memberLevel=%s WHERE userid=%s", (member[3], member[0]))
    conn.commit()
