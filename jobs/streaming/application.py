"""`lakehouse run streaming`: CDC, ingest and product views in one Spark application.

The same module is an EMR step. One SparkSession; each job's batch loop runs in its own thread
with its own FAIR scheduler pool, so a slow MERGE in one job never holds back another's fetch.
The per-job entry points (`python -m jobs.cdc`, `jobs.ingest`, `jobs.views`) stay: they are what
scales out on a big cluster.

Exactly-once is each job's own (progress is committed with the data), so this module only runs and
supervises them:
* a job that raises is restarted from what the lake stores, after a backoff, while the others keep
  committing; past `--max-failures` failures within an hour, the application stops with a message
  naming the job and the cause. A job that found another writer on its table, or offsets that went
  back, stops the application at once: that needs an operator, not a retry.
* SIGTERM/SIGINT: every job finishes and commits its batch, then the application exits.
* At start, while another binlog reader of the CDC user is connected (another cluster's or
  version's application, e.g. a replaced cluster still running), no job starts: two applications
  would stop each other's commits. After `--wait-for-readers-minutes` it exits 3.
* `--until-idle`: CDC stops at the binlog position the source had at start, the ingest once idle
  after CDC finished, views once idle after the ingest finished (so views count every click).
* `--status-file`: the jobs' state (batches, records, last commit, lag, failures) as JSON, rewritten
  every second; `lakehouse demo` shows it live.
* Where nothing else schedules table maintenance (the local stack), `maintenance.py` runs it every
  `--maintain-every-minutes` beside the jobs; it stops with them.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jobs.common.metrics import NO_METRICS, MetricsSink
from jobs.common.run_modes import RunMode, StopRequest, run_batches
from jobs.common.snapshot_progress import CONCURRENT_WRITER_EXIT, ConcurrentWriterError
from jobs.common.streaming_job import NeedsOperator, StreamingJob
from jobs.config import ConfigError, LakehouseConfig
from jobs.registry import JOBS, Kind, names
from jobs.streaming.maintenance import PeriodicMaintenance

log = logging.getLogger("streaming")

JOB_NAMES = names(Kind.STREAMING)
# What each job consumes: it starts after its upstream is prepared, and with --until-idle it stops
# only after its upstream finished.
UPSTREAM = {name: JOBS[name].upstream for name in JOB_NAMES if JOBS[name].upstream}
# Needs an operator: restarting would fail again, or worse.
FATAL_ERRORS: tuple[type[BaseException], ...] = (NeedsOperator, ConfigError)
FAILURE_WINDOW_SECONDS = 3600.0
MAX_BACKOFF_SECONDS = 60.0


JobFactory = Callable[[StopRequest], StreamingJob]


@dataclass
class JobStatus:
    name: str
    state: str = "waiting"  # waiting | starting | running | retrying | finished | failed
    batches: int = 0
    records: int = 0
    last_commit_at: float | None = None  # wall clock of the last batch that handled records
    lag_seconds: float | None = None
    failures: int = 0
    error: str | None = None


@dataclass(frozen=True)
class StreamingOptions:
    jobs: tuple[str, ...] = JOB_NAMES
    mode: RunMode = field(default_factory=RunMode)
    max_failures: int = 5  # within FAILURE_WINDOW_SECONDS, then the application fails
    status_file: Path | None = None
    first_backoff_seconds: float = 2.0
    # How long to wait at start for another binlog reader of the CDC user to go, then exit 3.
    wait_for_readers_seconds: float = 1800.0


# ---- the jobs: each is a StreamingJob itself -----------------------------------------------------------


def default_factories(
    spark, config: LakehouseConfig, mode: RunMode, metrics: MetricsSink = NO_METRICS
) -> dict[str, JobFactory]:
    from jobs.cdc.sync import CdcSync
    from jobs.cdc.table_selection import TableSelection
    from jobs.ingest.job import ClickstreamIngest, IngestSettings
    from jobs.views.job import ProductViews, ViewsSettings

    def cdc(stop: StopRequest) -> StreamingJob:
        return CdcSync(  # every table of the source database, also those created later
            spark, config, TableSelection.from_args(config), metrics=metrics, warm_up=True,
            change_wait_seconds=mode.trigger_seconds, stop_at_source_end=mode.until_idle,
        )  # fmt: skip

    return {
        "cdc": cdc,
        "ingest": lambda stop: ClickstreamIngest(
            spark, config, IngestSettings.default(config), stop, metrics
        ),
        "views": lambda stop: ProductViews(spark, ViewsSettings.default(config), metrics),
    }


# ---- supervision -------------------------------------------------------------------------------------


class JobFailed(RuntimeError):
    def __init__(self, name: str, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.name = name
        self.exit_code = exit_code


class _JobRunner:
    """One job's thread: prepare, batches, finish; restarted from the lake's state after a failure."""

    def __init__(self, app: StreamingApplication, name: str, factory: JobFactory) -> None:
        self.app = app
        self.name = name
        self.factory = factory
        self.status = JobStatus(name)
        self.stop = StopRequest()
        self.prepared = threading.Event()  # downstream jobs wait for it
        self.finished = threading.Event()
        self.failure: JobFailed | None = None
        self._failures: deque[float] = deque()
        self.thread = threading.Thread(target=self._run, name=f"job-{name}", daemon=True)

    def _upstream(self) -> _JobRunner | None:
        return self.app.runners.get(UPSTREAM.get(self.name, ""))

    def _upstream_done(self) -> bool:
        upstream = self._upstream()
        return upstream is None or upstream.finished.is_set()

    def _run(self) -> None:
        # Each job's Spark jobs go to its own FAIR pool (a thread-local property, pinned threads).
        self.app.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.name)
        try:
            upstream = self._upstream()
            while upstream is not None and not (upstream.prepared.is_set() or upstream.finished.is_set()):
                if self.stop.wait(0.2):
                    return
            delay = self.app.options.first_backoff_seconds
            while not self.stop.requested:
                try:
                    self._run_once()
                    return
                except FATAL_ERRORS as exc:
                    code = CONCURRENT_WRITER_EXIT if isinstance(exc, ConcurrentWriterError) else 1
                    self._fail(f"{self.name}: {_cause(exc)}", code)
                    return
                except Exception as exc:  # noqa: BLE001 - any other failure: restart the job
                    if self._failed_too_often(exc):
                        return
                    self.status.state, self.status.error = "retrying", _cause(exc)
                    log.warning(
                        "%s failed (%s); restarting it from the lake's state in %.0fs (failure %d)",
                        self.name, _cause(exc), delay, self.status.failures, exc_info=True,
                    )  # fmt: skip
                    self.stop.wait(delay)
                    delay = min(delay * 2, MAX_BACKOFF_SECONDS)
        finally:
            self.finished.set()
            if self.status.state not in ("failed",):
                self.status.state = "finished"

    def _run_once(self) -> None:
        self.status.state = "starting"
        job = self.factory(self.stop)
        try:
            self._prepare_and_run(job)
        finally:
            job.close()  # also after a failure, before the job is built again

    def _prepare_and_run(self, job: StreamingJob) -> None:
        job.prepare()
        self.prepared.set()
        self.status.state = "running"

        def batch() -> int:
            handled = job.run_batch()
            self.status.batches += 1 if handled else 0
            self.status.records += handled
            if handled:
                self.status.last_commit_at = time.time()
                self.status.lag_seconds = job.lag_seconds()
            self.status.error = job.problem()
            if self.app.options.mode.until_idle and job.reached_end():
                self.stop.set()
            return handled

        run_batches(
            batch,
            self.app.options.mode,
            self.stop,
            upstream_done=self._upstream_done,
            busy=job.background_work,
        )
        job.finish()

    def _failed_too_often(self, exc: BaseException) -> bool:
        now = time.monotonic()
        self._failures.append(now)
        while self._failures and now - self._failures[0] > FAILURE_WINDOW_SECONDS:
            self._failures.popleft()
        self.status.failures += 1
        if len(self._failures) > self.app.options.max_failures:
            self._fail(
                f"{self.name} failed {len(self._failures)} times within an hour; last cause: {_cause(exc)}", 1
            )
            return True
        return False

    def _fail(self, message: str, exit_code: int) -> None:
        self.status.state, self.status.error = "failed", message
        self.failure = JobFailed(self.name, message, exit_code)
        log.error("%s", message)
        self.app.stop.set()  # the others finish and commit their batch


def _cause(exc: BaseException) -> str:
    text = str(exc).strip()
    # Py4J errors carry the whole Java stack: the first line says what happened.
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {first[:400]}"


class StreamingApplication:
    def __init__(
        self,
        spark,
        options: StreamingOptions,
        factories: dict[str, JobFactory],
        stop: StopRequest | None = None,
        maintenance: PeriodicMaintenance | None = None,
        other_binlog_readers: Callable[[], list[str]] | None = None,
    ) -> None:
        self.spark = spark
        self.options = options
        self.stop = stop or StopRequest()
        self.runners = {name: _JobRunner(self, name, factories[name]) for name in options.jobs}
        self.maintenance = maintenance
        self.other_binlog_readers = other_binlog_readers
        self.waiting_for: str | None = None

    def run(self) -> int:
        """Run until every job finished (or stop); returns the exit code."""
        refused = self._wait_for_other_binlog_readers()
        if refused is not None:
            return refused
        log.info("streaming: starting %s", ", ".join(self.runners))
        for runner in self.runners.values():
            runner.thread.start()
        if self.maintenance is not None:
            log.info("table maintenance every %.0f s", self.maintenance.status.every_seconds)
            self.maintenance.start()
        while any(r.thread.is_alive() for r in self.runners.values()):
            if self.stop.requested:
                for runner in self.runners.values():
                    runner.stop.set()
            self._write_status()
            time.sleep(1.0)
        if self.maintenance is not None:
            self.maintenance.stop.set()
            if self.maintenance.status.state == "running":
                log.info("waiting for table maintenance to finish the table it is on")
            self.maintenance.thread.join()
        self._write_status()
        failures = [r.failure for r in self.runners.values() if r.failure is not None]
        for failure in failures:
            print(f"error: streaming job {failure.name}: {failure}", file=sys.stderr)
        summary = ", ".join(f"{r.name} {r.status.records} records" for r in self.runners.values())
        log.info("streaming stopped: %s", summary)
        return max((f.exit_code for f in failures), default=0)

    def _wait_for_other_binlog_readers(self) -> int | None:
        """Before any job starts, wait while another binlog reader of the CDC user is connected: the
        streaming application of another cluster (a replaced cluster that is still running) or of
        another version, or a verify run. Two applications on the same tables would each stop the
        other's commits, and their binlog readers (one replica id) would disconnect each other.
        Returns the exit code when the application must not start (a stop request: 0; still there
        after `wait_for_readers_seconds`: 3), else None."""
        if self.other_binlog_readers is None:
            return None
        began, logged = time.monotonic(), None
        while True:
            try:
                others = self.other_binlog_readers()
            except Exception as exc:  # noqa: BLE001 - MySQL down: CDC handles that once it runs
                log.warning("could not check for another binlog reader (%s): starting", _cause(exc))
                others = []
            waited = time.monotonic() - began
            if not others:
                if self.waiting_for is not None:
                    log.info("the other binlog reader went after %.0f s: starting", waited)
                self.waiting_for = None
                return None
            self.waiting_for = f"another binlog reader of the CDC user is connected ({'; '.join(others)})"
            if waited >= self.options.wait_for_readers_seconds:
                message = (
                    f"{self.waiting_for} after {waited:.0f} s: another streaming application (on AWS, a "
                    "replaced cluster still running: lift its termination protection and terminate it) or "
                    "a long verify run. Not starting: two applications on the same tables stop each other"
                )
                log.error("%s", message)
                print(f"error: {message}", file=sys.stderr)
                self._write_status()
                return CONCURRENT_WRITER_EXIT
            if logged is None or time.monotonic() - logged >= 30:
                logged = time.monotonic()
                log.info(
                    "waiting: %s; jobs start when it goes (%.0f s so far, at most %.0f s)",
                    self.waiting_for,
                    waited,
                    self.options.wait_for_readers_seconds,
                )
            self._write_status()
            if self.stop.wait(2.0):
                self.waiting_for = None
                return 0

    def statuses(self) -> list[JobStatus]:
        return [r.status for r in self.runners.values()]

    def _write_status(self) -> None:
        path = self.options.status_file
        if path is None:
            return
        tmp = path.with_suffix(".tmp")
        status = {
            "at": time.time(),
            "jobs": [asdict(s) for s in self.statuses()],
            "waiting_for": self.waiting_for,
        }
        if self.maintenance is not None:
            status["maintenance"] = asdict(self.maintenance.status)
        tmp.write_text(json.dumps(status))
        os.replace(tmp, path)


def job_spark_conf() -> dict[str, str]:
    return {
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": str(Path(__file__).with_name("fairscheduler.xml")),
        "spark.cleaner.periodicGC.interval": "2min",
        "spark.ui.showConsoleProgress": "false",
    }
