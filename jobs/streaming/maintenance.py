"""Table maintenance inside the streaming application, for a stack where nothing else schedules it.

On AWS a state machine runs the `maintain` step hourly. The local stack has no scheduler, and
without compaction and snapshot expiry every small file and snapshot the streaming jobs add makes
the next views batch slower (`bench soak`: views p95 grew from 6 to 12 s over 700k records). So
locally the application runs the same steps itself, every `streaming_maintenance_minutes` (config),
in a thread and FAIR pool of its own, beside the jobs: compaction of the files under 1 MiB
(bin-packed; what was committed since the last run, not the day's whole partition again) and
snapshot expiry (the jobs' resume snapshots are always kept). The compactions keep the manifests
few themselves, and orphan removal lists the whole warehouse: both stay with `lakehouse run
maintain`, which also sorts. A table nothing was committed to since its last run began is skipped
(after one expiry pass once that run's snapshots aged past the retention), so an idle stack does no
maintenance. A failing run is logged and retried at the next interval; it never stops the jobs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from jobs.common.run_modes import StopRequest
from jobs.common.snapshot_progress import main_snapshot
from jobs.config import LakehouseConfig
from jobs.maintain.job import MaintainSettings, TableReport, lake_tables, maintain_tables

log = logging.getLogger("streaming.maintenance")

POOL = "maintain"
_UNKNOWN = object()  # a current snapshot that could not be read
STAGING_MARK = "__cdc_snapshot_"  # jobs/cdc/snapshot.py's staging tables (by name: no import of cdc)
# Snapshots accrue about one a second per streaming table: keep 5 minutes of time travel locally
# (the hourly step on AWS keeps an hour), so each table's metadata stays small for every reader.
# Expiry by the driver: the Spark action's jobs took 11 of a 24 s run beside the streaming jobs.
# Compaction of the files under 1 MiB only (~50k clicks): with Iceberg's default (75% of 512 MB)
# every local file is small, and each run rewrote the whole day's partition again, a cost that
# grew with every record stored.
IN_APP_SETTINGS = MaintainSettings(
    retain_hours=5 / 60,
    skip_orphans=True,
    expire_in_driver=True,
    compact_below_bytes=1 << 20,
    sort_and_rewrite_manifests=False,
)


@dataclass
class MaintenanceStatus:
    every_seconds: float
    state: str = "waiting"  # waiting | running | stopped
    runs: int = 0
    last_started_at: float | None = None  # wall clock
    last_seconds: float | None = None
    next_at: float | None = None  # wall clock
    errors: list[str] = field(default_factory=list)  # of the last run, one line per failed table
    unchanged: list[str] = field(default_factory=list)  # of the last run: skipped, nothing committed
    # Of the last run: {table: {"data_files": [before, after], "snapshots": [before, after]}}
    tables: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    # Over all runs, per table: data files fewer after a run than before it (files the jobs
    # committed during a run count against it, so this is a lower bound of what was compacted).
    data_files_removed: dict[str, int] = field(default_factory=dict)


def _summary(reports: Sequence[TableReport]) -> tuple[dict[str, dict[str, list[int]]], list[str]]:
    tables, errors = {}, []
    for report in reports:
        if report.after is None:
            errors.append(f"{report.table}: {report.error}")
            continue
        tables[report.table] = {
            "data_files": [report.before.data_files, report.after.data_files],
            "snapshots": [report.before.snapshots, report.after.snapshots],
        }
    return tables, errors


class PeriodicMaintenance:
    """Runs `maintain` over every lake table each `every_seconds` (the first run after one interval)
    until `stop`; a run in progress finishes the table it is on, then stops."""

    def __init__(
        self,
        spark,
        config: LakehouseConfig,
        every_seconds: float,
        stop: StopRequest,
        maintain: Callable[..., list[TableReport]] = maintain_tables,
        tables_of: Callable[[object, str], list[str]] = lake_tables,
        snapshot_of: Callable[[object, str], int | None] = main_snapshot,
    ) -> None:
        self.spark = spark
        self.config = config
        self.stop = stop
        self.status = MaintenanceStatus(every_seconds)
        self._maintain = maintain
        self._tables_of, self._snapshot_of = tables_of, snapshot_of
        self._began_at: dict[str, int | None] = {}  # table -> its current snapshot when its last run began
        self._expiry_pass_at: dict[str, float] = {}  # table -> when its last changed run's snapshots expire
        self.thread = threading.Thread(target=self._run, name="maintain", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", POOL)
        try:
            while True:
                self.status.next_at = time.time() + self.status.every_seconds
                if self.stop.wait(self.status.every_seconds):
                    return
                self.run_once()
        finally:
            self.status.state, self.status.next_at = "stopped", None

    def run_once(self) -> None:
        self.status.state, self.status.last_started_at = "running", time.time()
        began = time.monotonic()
        try:
            reports, self.status.unchanged = self._maintain_changed_tables()
            self.status.tables, self.status.errors = _summary(reports)
            removed = dict(self.status.data_files_removed)  # a new dict: the status is read meanwhile
            for table, counts in self.status.tables.items():
                before, after = counts["data_files"]
                removed[table] = removed.get(table, 0) + max(0, before - after)
            self.status.data_files_removed = removed
        except Exception as exc:  # noqa: BLE001 - the jobs go on; the next interval tries again
            log.exception("table maintenance failed; next try in %.0f s", self.status.every_seconds)
            self.status.tables, self.status.errors = {}, [f"{type(exc).__name__}: {str(exc)[:300]}"]
            self.status.unchanged = []
        self.status.runs += 1
        self.status.last_seconds = time.monotonic() - began
        self.status.state = "waiting"
        files = ", ".join(
            f"{t} {v['data_files'][0]}->{v['data_files'][1]} files" for t, v in self.status.tables.items()
        )
        unchanged = ", ".join(self.status.unchanged)
        log.info(
            "table maintenance run %d took %.0f s: %s%s%s",
            self.status.runs,
            self.status.last_seconds,
            files or "no tables",
            f"; unchanged since their last run: {unchanged}" if unchanged else "",
            f"; failed: {'; '.join(self.status.errors)}" if self.status.errors else "",
        )

    def _maintain_changed_tables(self) -> tuple[list[TableReport], list[str]]:
        """Maintain each table that is due (reports), one at a time; the others are returned as
        unchanged. Due: anything was committed since its last run began (its own rewrites count,
        so a table is run once more after they land: cheap, and it catches a job commit or a
        compaction group lost to one during the run), or its last changed run's snapshots have
        aged past the retention since (one expiry pass, so an idle table does not keep them)."""
        catalog = self.config.catalog.name
        # A CDC snapshot's staging table is being filled, renamed or dropped: not ours to touch.
        tables = [t for t in self._tables_of(self.spark, catalog) if STAGING_MARK not in t]
        reports, unchanged = [], []
        for table in tables:
            if self.stop.requested:
                break
            began_at = self._current_snapshot(f"{catalog}.{table}")
            changed = began_at is _UNKNOWN or self._began_at.get(table, _UNKNOWN) != began_at
            expiry_pass = table in self._expiry_pass_at and time.time() >= self._expiry_pass_at[table]
            if not changed and not expiry_pass:
                unchanged.append(table)
                continue
            report = self._maintain(
                self.spark, self.config, [table], IN_APP_SETTINGS, should_stop=lambda: self.stop.requested
            )
            reports += report
            if report and report[0].after is not None and began_at is not _UNKNOWN:
                self._began_at[table] = began_at  # a failed table stays due
                if changed:
                    self._expiry_pass_at[table] = time.time() + IN_APP_SETTINGS.retain_hours * 3600
                else:
                    self._expiry_pass_at.pop(table, None)
        return reports, unchanged

    def _current_snapshot(self, ident: str) -> int | None | object:
        try:
            return self._snapshot_of(self.spark, ident)
        except Exception:  # noqa: BLE001 - catalog locked, table dropped: maintain (and report) it
            log.warning("could not read %s's current snapshot; maintaining it", ident, exc_info=True)
            return _UNKNOWN
