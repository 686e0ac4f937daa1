"""The streaming application's supervision, with scripted jobs (no Spark, no sources): a job that
fails is closed (its binlog reader, its consumers) before its replacement starts; the table
maintenance beside the jobs runs on schedule, survives a failing run and stops with them."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from jobs.common.run_modes import RunMode, StopRequest
from jobs.maintain.job import TableReport
from jobs.maintain.procedures import TableStats
from jobs.streaming.application import StreamingApplication, StreamingOptions
from jobs.streaming.maintenance import PeriodicMaintenance


class ScriptedJob:
    def __init__(self, number: int, events: list, fail_in: str | None) -> None:
        self.number, self.events, self.fail_in = number, events, fail_in

    def _step(self, name: str) -> None:
        self.events.append((self.number, name))
        if self.fail_in == name:
            raise RuntimeError(f"job {self.number} failed in {name}")

    def prepare(self) -> None:
        self._step("prepare")

    def run_batch(self) -> int:
        self._step("run_batch")
        return 0

    def finish(self) -> None:
        self._step("finish")

    def close(self) -> None:
        self.events.append((self.number, "close"))

    def lag_seconds(self):
        return None

    def reached_end(self) -> bool:
        return True

    def background_work(self) -> bool:
        return False

    def problem(self):
        return None


def _run(failures: list[str | None]) -> list:
    events: list = []
    made: list[ScriptedJob] = []

    def factory(_stop):
        job = ScriptedJob(len(made), events, failures[len(made)] if len(made) < len(failures) else None)
        made.append(job)
        return job

    spark = SimpleNamespace(sparkContext=SimpleNamespace(setLocalProperty=lambda key, value: None))
    options = StreamingOptions(
        jobs=("views",), mode=RunMode(0.05, True, 0.1), max_failures=5, first_backoff_seconds=0.01
    )
    assert StreamingApplication(spark, options, {"views": factory}).run() == 0
    return events


def test_a_job_failing_in_a_batch_is_closed_before_its_replacement_starts():
    events = _run(["run_batch"])
    assert events[:3] == [(0, "prepare"), (0, "run_batch"), (0, "close")]
    assert events[3] == (1, "prepare")
    assert events[-2:] == [(1, "finish"), (1, "close")]
    assert sum(1 for _, step in events if step == "close") == 2


def test_a_job_failing_while_it_prepares_is_closed_too():
    events = _run(["prepare"])
    assert events[:2] == [(0, "prepare"), (0, "close")]
    assert (0, "finish") not in events


# ---- table maintenance beside the jobs (local stack) ------------------------------------------------


class FakeLake:
    """Current snapshot ids of tables. A job commit moves a table's id and leaves work for
    maintenance; maintaining a table with work commits a rewrite (the id moves again), one
    without work commits nothing. `during_run` is called inside a maintenance call, after its
    rewrite: a job commit there landed while maintenance ran."""

    def __init__(self, tables) -> None:
        self.ids = dict.fromkeys(tables, 1)
        self.work = set(tables)
        self.during_run = lambda table: None

    def job_commits(self, table: str) -> None:
        self.ids[table] += 1
        self.work.add(table)

    def maintained(self, table: str) -> None:
        if table in self.work:
            self.work.discard(table)
            self.ids[table] += 100
        self.during_run(table)


def _maintenance(script: list, tables=("ods_behavior.clickevent", "dim_db.products"), lake=None):
    """A PeriodicMaintenance over `tables` whose calls (one per table maintained) follow `script`:
    the reports to return, or an exception to raise; afterwards a call returns a report of no change.
    `lake` (a FakeLake) stands for the catalog's current snapshots; without it every table reads as
    changed on every run."""
    calls = []

    def maintain(spark, config, tables, settings, should_stop):
        calls.append((tuple(tables), settings))
        for table in tables:
            if lake is not None:
                lake.maintained(table)
        step = script[len(calls) - 1] if len(calls) <= len(script) else None
        if isinstance(step, Exception):
            raise step
        if step is not None:
            return step
        return [TableReport(t, TableStats(1, 1, 1, 0), TableStats(1, 1, 1, 0)) for t in tables]

    def snapshot_of(spark, table):
        return lake.ids[table.split(".", 1)[1]] if lake is not None else object()

    spark = SimpleNamespace(sparkContext=SimpleNamespace(setLocalProperty=lambda key, value: None))
    config = SimpleNamespace(catalog=SimpleNamespace(name="lakehouse"))
    maintenance = PeriodicMaintenance(
        spark, config, 0.05, StopRequest(), maintain,
        tables_of=lambda spark, catalog: list(tables), snapshot_of=snapshot_of,
    )  # fmt: skip
    return maintenance, calls


def test_maintenance_runs_every_interval_reports_files_and_survives_a_failing_run():
    compacted = TableReport(
        "ods_behavior.clickevent", TableStats(120, 9_000, 60, 0), TableStats(4, 8_000, 5, 0)
    )
    failed = TableReport("dim_db.products", TableStats(0, 0, 0, 0), error="CommitFailedException: boom")
    maintenance, calls = _maintenance([RuntimeError("catalog locked"), [compacted], [failed]])
    maintenance.start()
    deadline = time.monotonic() + 10
    while maintenance.status.runs < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    maintenance.stop.set()
    maintenance.thread.join(5)
    status = maintenance.status
    assert not maintenance.thread.is_alive() and status.state == "stopped"
    assert status.runs >= 3  # the failing first run did not end the schedule
    assert all(settings.skip_orphans for _, settings in calls)  # orphan removal lists the whole warehouse
    # What one run reports: files and snapshots before -> after per table, one line per failed table.
    maintenance2, _ = _maintenance([[compacted], [failed], [compacted], [failed]])
    maintenance2.run_once()
    assert maintenance2.status.tables == {
        "ods_behavior.clickevent": {"data_files": [120, 4], "snapshots": [60, 5]}
    }
    assert maintenance2.status.errors == ["dim_db.products: CommitFailedException: boom"]
    assert maintenance2.status.data_files_removed == {"ods_behavior.clickevent": 116}
    maintenance2.run_once()  # another run that removed files: they add up
    assert maintenance2.status.data_files_removed == {"ods_behavior.clickevent": 232}
    maintenance3, _ = _maintenance([RuntimeError("catalog locked")])
    maintenance3.run_once()
    assert maintenance3.status.errors == ["RuntimeError: catalog locked"] and maintenance3.status.runs == 1


def test_maintenance_skips_a_table_nothing_was_committed_to_since_its_last_run(monkeypatch):
    """An idle stack must cost no maintenance, yet every job commit must be maintained: also one
    that lands while maintenance runs, and a table whose run failed is tried again. Once a changed
    table's snapshots have aged past the retention it gets one more run (the expiry)."""
    clicks, products, empty = "ods_behavior.clickevent", "dim_db.products", "ods_behavior.clickevent_rejects"
    lake = FakeLake((clicks, products, empty))
    lake.work -= {products, empty}  # their runs commit nothing: ids stay
    lake.ids[empty] = None  # a table with no snapshot yet
    failed = TableReport(products, TableStats(0, 0, 0, 0), error="CommitFailedException: boom")
    maintenance, calls = _maintenance([None, [failed]], tables=(clicks, products, empty), lake=lake)
    runs = []

    def run() -> list[str]:
        maintenance.run_once()
        runs.append([t for (t,), _ in calls[sum(len(r) for r in runs) :]])
        return runs[-1]

    assert run() == [clicks, products, empty]  # nothing known yet; products fails
    assert run() == [clicks, products]  # clicks: its own rewrite landed since; products: it failed
    assert run() == [] and maintenance.status.unchanged == [clicks, products, empty]  # idle
    lake.job_commits(clicks)
    lake.during_run = lambda table: lake.job_commits(clicks) if table == clicks else None
    assert run() == [clicks]  # ... and the ingest commits while it runs
    lake.during_run = lambda table: None
    assert run() == [clicks]  # that commit is maintained
    assert run() == [clicks]  # the rewrite of it landed
    assert run() == []
    # Five minutes later (the in-app retention): one expiry pass each, then nothing.
    later = time.time() + 6 * 60
    monkeypatch.setattr("jobs.streaming.maintenance.time.time", lambda: later)
    assert run() == [clicks, products, empty]
    assert run() == []
    # A current snapshot that cannot be read: the table is maintained, not skipped.
    maintenance._snapshot_of = lambda spark, table: (_ for _ in ()).throw(RuntimeError("database is locked"))
    assert run() == [clicks, products, empty]


def test_the_application_stops_its_maintenance_with_the_jobs_and_reports_it(tmp_path):
    maintenance, _ = _maintenance([])
    spark = maintenance.spark
    options = StreamingOptions(
        jobs=("views",), mode=RunMode(0.05, True, 0.3), status_file=tmp_path / "status.json"
    )
    factory = lambda _stop: ScriptedJob(0, [], None)  # noqa: E731
    assert StreamingApplication(spark, options, {"views": factory}, maintenance=maintenance).run() == 0
    assert not maintenance.thread.is_alive()
    written = json.loads((tmp_path / "status.json").read_text())
    assert written["maintenance"]["state"] == "stopped"
    assert written["maintenance"]["every_seconds"] == 0.05


def test_maintenance_knows_the_cdc_staging_tables_by_name() -> None:
    from jobs.cdc.snapshot import STAGING_SUFFIX
    from jobs.streaming.maintenance import STAGING_MARK

    assert STAGING_MARK == STAGING_SUFFIX + "_"


def _waiting_app(tmp_path, readers, wait_seconds: float, stop: StopRequest | None = None):
    events: list = []
    spark = SimpleNamespace(sparkContext=SimpleNamespace(setLocalProperty=lambda key, value: None))
    options = StreamingOptions(
        jobs=("views",), mode=RunMode(0.05, True, 0.1), status_file=tmp_path / "status.json",
        wait_for_readers_seconds=wait_seconds,
    )  # fmt: skip
    factory = lambda _stop: ScriptedJob(0, events, None)  # noqa: E731
    return StreamingApplication(
        spark, options, {"views": factory}, stop, other_binlog_readers=readers
    ), events


def test_no_job_starts_while_another_binlog_reader_is_connected_and_all_start_when_it_goes(tmp_path):
    answers = [["thread 7 from 10.0.0.5:40112, 300 s"]] * 2 + [[]]
    seen_waiting: list = []

    def readers():
        if (tmp_path / "status.json").exists():
            seen_waiting.append(json.loads((tmp_path / "status.json").read_text())["waiting_for"])
        return answers.pop(0)

    app, events = _waiting_app(tmp_path, readers, wait_seconds=60)
    app.stop.wait = lambda seconds: False  # no 2 s pauses in a unit test
    assert app.run() == 0
    assert answers == []  # asked until the other reader went
    assert seen_waiting and all("thread 7 from 10.0.0.5:40112" in w for w in seen_waiting)
    assert events[0] == (0, "prepare")  # the job started only then
    assert json.loads((tmp_path / "status.json").read_text())["waiting_for"] is None


def test_a_reader_that_stays_past_the_wait_stops_the_application_with_exit_3_before_any_job(tmp_path, capsys):
    app, events = _waiting_app(tmp_path, lambda: ["thread 7 from 10.0.0.5:40112, 300 s"], wait_seconds=0)
    assert app.run() == 3
    assert events == []
    err = capsys.readouterr().err
    assert "another binlog reader of the CDC user is connected (thread 7" in err and "terminate it" in err


def test_a_stop_while_waiting_exits_0_and_mysql_down_does_not_hold_the_start(tmp_path):
    stop = StopRequest()
    stop.set()
    app, events = _waiting_app(tmp_path, lambda: ["thread 7 from h:1, 1 s"], wait_seconds=60, stop=stop)
    assert app.run() == 0 and events == []

    def unreachable():
        raise ConnectionRefusedError("MySQL down")

    app, events = _waiting_app(tmp_path, unreachable, wait_seconds=60)
    assert app.run() == 0 and events[0] == (0, "prepare")
