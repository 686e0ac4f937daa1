"""Table maintenance (`jobs/maintain`) against the real local catalog and warehouse.

Each stack test builds its own click-like table (the ingest's DDL) from many small appends that carry
progress keys in their snapshot summaries, runs the maintenance, and reads the table back.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from support import run_cli

from jobs.common.lake_tables import OFFSETS_KEY, fact_table_ddl, offsets_summary
from jobs.common.snapshot_progress import read_progress, retry_commit, writer_options
from jobs.maintain.__main__ import main
from jobs.maintain.job import MaintainSettings, UnknownTableError, maintain_table, short_name
from jobs.maintain.procedures import (
    MIN_MANIFESTS_TO_REWRITE,
    TableStats,
    error_summary,
    is_maintenance_conflict,
    manifest_count,
    read_snapshots,
    rewrite_data_files,
    rewrite_strategy,
    table_stats,
)
from jobs.maintain.retention import SnapshotInfo, expiry_plan, snapshots_from_metadata

stack = pytest.mark.stack

TOPIC = "clicks"
CHECKPOINT_KEY = "lakehouse.test.checkpoint"  # a second progress key, set by early commits only
DAY0 = 1_714_521_600  # 2024-05-01 00:00:00 UTC
DAYS = 3
AGGRESSIVE = MaintainSettings(retain_hours=0, retain_last=1)


# ---- helpers ---------------------------------------------------------------------------------------


def click_batch(spark, batch: int, rows: int):
    """`rows` click rows spread over DAYS days and 20 products, offsets batch*rows.. on partition 0."""
    first = batch * rows
    event_seconds = F.lit(DAY0) + (F.col("id") % DAYS) * 86_400 + F.lit(batch * 60) + F.col("id")
    event_time = F.timestamp_seconds(event_seconds)
    return spark.range(0, rows, 1, 2).select(
        (F.col("id") % 7 + 1).cast("int").alias("webpageId"),
        F.concat(F.lit("u"), (F.col("id") % 50).cast("string")).alias("uid"),
        ((F.col("id") * 7 + batch) % 20 + 1).cast("string").alias("productId"),
        F.concat(F.lit("c"), (F.lit(first) + F.col("id")).cast("string")).alias("cookieId"),
        (F.col("id") % 100).cast("int").alias("expendTime"),
        event_time.alias("eventTime"),
        F.lit(None).cast("string").alias("name"),
        F.lit(None).cast("decimal(10,4)").alias("product_price"),
        F.date_format(event_time, "yyyyMMdd").alias("dt"),
        F.lit(0).alias("kafka_partition"),
        (F.lit(first) + F.col("id")).alias("kafka_offset"),
        F.timestamp_seconds(F.lit(DAY0 + batch)).alias("ingested_at"),
    )


def append_batch(spark, ident: str, batch: int, rows: int, extra: dict[str, str] | None = None) -> None:
    summary = {OFFSETS_KEY: offsets_summary(TOPIC, {0: (batch + 1) * rows}), **(extra or {})}
    frame = click_batch(spark, batch, rows)

    @retry_commit()
    def append() -> None:
        frame.writeTo(ident).options(**writer_options(summary)).append()

    append()


def create_clicks(spark, name: str) -> str:
    ident = f"lakehouse.{name}"
    spark.sql(f"DROP TABLE IF EXISTS {ident} PURGE")
    for statement in fact_table_ddl(ident):
        spark.sql(statement)
    return ident


def rows_of(spark, ident: str) -> Counter:
    return Counter(tuple(r) for r in spark.table(ident).collect())


def count_of(spark, ident: str, metadata_table: str) -> int:
    return spark.sql(f"SELECT count(*) FROM {ident}.{metadata_table}").first()[0]


def one_product_day_files(catalog, name: str) -> int:
    """Data files Iceberg's scan planning keeps for productId 3 on the first day (pyiceberg)."""
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan

    day = datetime.fromtimestamp(DAY0, UTC)  # Spark timestamp columns are Iceberg timestamptz
    row_filter = And(
        EqualTo("productId", "3"),
        And(
            GreaterThanOrEqual("eventTime", day.isoformat()),
            LessThan("eventTime", (day + timedelta(days=1)).isoformat()),
        ),
    )
    return len(list(catalog.load_table(name).scan(row_filter=row_filter).plan_files()))


def snapshot_ids(spark, ident: str) -> set[int]:
    return {r[0] for r in spark.sql(f"SELECT snapshot_id FROM {ident}.snapshots").collect()}


@pytest.fixture
def drop_after(spark):
    made: list[str] = []
    yield made.append
    for ident in made:
        spark.sql(f"DROP TABLE IF EXISTS {ident} PURGE")


# ---- pure helpers ----------------------------------------------------------------------------------


def snap(sid: int, ms: int, keys=(), ancestor: bool = True) -> SnapshotInfo:
    return SnapshotInfo(sid, ms, ancestor, ms if ancestor else None, frozenset(keys))


def test_expiry_cutoff_is_capped_at_oldest_progress_snapshot():
    now = 10_000_000
    snapshots = [
        snap(1, 1_000, [OFFSETS_KEY, CHECKPOINT_KEY]),
        snap(2, 2_000, [CHECKPOINT_KEY]),  # newest carrying the checkpoint: must survive
        snap(3, 3_000, [OFFSETS_KEY]),
        snap(4, 4_000, [OFFSETS_KEY]),  # newest carrying the offsets
        snap(5, 5_000),  # e.g. a compaction
    ]
    plan = expiry_plan(snapshots, now, retain_hours=0)
    assert plan.older_than_ms == 2_000
    assert plan.capped
    assert {k: s.snapshot_id for k, s in plan.protected.items()} == {CHECKPOINT_KEY: 2, OFFSETS_KEY: 4}


def test_expiry_cutoff_ignores_non_ancestors_and_other_keys():
    now = 10 * 3_600_000
    snapshots = [
        snap(1, 1_000, [OFFSETS_KEY]),
        snap(2, 9 * 3_600_000, [OFFSETS_KEY]),
        snap(3, 9 * 3_600_000 + 5, [OFFSETS_KEY], ancestor=False),  # rolled back: read_progress skips it
        snap(4, 2_000, ["spark.app.id"]),
    ]
    plan = expiry_plan(snapshots, now, retain_hours=2)
    assert plan.older_than_ms == 8 * 3_600_000  # the retention alone: the progress snapshot is newer
    assert not plan.capped
    assert plan.protected[OFFSETS_KEY].snapshot_id == 2


def test_a_cdc_table_s_finished_snapshot_does_not_pin_its_history():
    """A CDC table made by renaming its snapshot's staging table keeps the staging commits
    (lakehouse.cdc.snapshot) in its history; protecting the newest of them capped every later
    expiry at the snapshot's time, so no MERGE snapshot of the table ever expired."""
    from jobs.common.progress_keys import CDC_POSITION, CDC_SNAPSHOT

    hour = 3_600_000
    snapshots = [
        snap(1, 1 * hour, [CDC_SNAPSHOT]),  # staging commits of the snapshot
        snap(2, 2 * hour, [CDC_SNAPSHOT, CDC_POSITION]),  # its last piece, with the table's position
        *(snap(3 + i, (3 + i) * hour, [CDC_POSITION]) for i in range(20)),  # MERGE commits
    ]
    plan = expiry_plan(snapshots, 30 * hour, retain_hours=2)
    # everything before the table's current position may go (was: nothing after the staging commits)
    assert plan.older_than_ms == 22 * hour
    assert {k: s.snapshot_id for k, s in plan.protected.items()} == {CDC_POSITION: 22}
    # A snapshot still in progress (no position of the table's own yet) keeps its progress.
    in_progress = expiry_plan(snapshots[:1], 30 * hour, retain_hours=2)
    assert in_progress.capped and in_progress.protected[CDC_SNAPSHOT].snapshot_id == 1


def test_expiry_cutoff_without_progress_is_the_retention():
    assert expiry_plan([snap(1, 5)], 3_600_000, retain_hours=0.5).older_than_ms == 1_800_000


def test_snapshots_from_metadata_follow_the_log_and_the_current_ancestry():
    progress = {OFFSETS_KEY: "{}", "added-records": "5"}
    metadata = {
        "current-snapshot-id": 4,
        "snapshots": [
            {"snapshot-id": 1, "timestamp-ms": 100, "summary": progress},
            {"snapshot-id": 2, "parent-snapshot-id": 1, "timestamp-ms": 200, "summary": {}},
            {"snapshot-id": 3, "parent-snapshot-id": 2, "timestamp-ms": 300, "summary": progress},
            {"snapshot-id": 4, "parent-snapshot-id": 2, "timestamp-ms": 500, "summary": {}},
            {"snapshot-id": 5, "parent-snapshot-id": 4, "timestamp-ms": 600, "summary": {}},  # staged
        ],
        # 3 was rolled back (2 made current again at 400); 1's log entry was expired.
        "snapshot-log": [
            {"snapshot-id": 2, "timestamp-ms": 200},
            {"snapshot-id": 3, "timestamp-ms": 300},
            {"snapshot-id": 2, "timestamp-ms": 400},
            {"snapshot-id": 4, "timestamp-ms": 500},
        ],
    }
    progress_keys = frozenset({OFFSETS_KEY})
    assert Counter(snapshots_from_metadata(metadata)) == Counter(
        [
            SnapshotInfo(1, 100, False, None, progress_keys),
            SnapshotInfo(2, 200, True, 200),
            SnapshotInfo(2, 200, True, 400),
            SnapshotInfo(3, 300, False, 300, progress_keys),
            SnapshotInfo(4, 500, True, 500),
            SnapshotInfo(5, 600, False, None),
        ]
    )
    assert snapshots_from_metadata({"current-snapshot-id": -1}) == []


def test_rewrite_strategy():
    assert rewrite_strategy("ods_behavior.clickevent", None) == (
        "sort",
        "productId ASC NULLS FIRST, eventTime ASC NULLS FIRST",
    )
    assert rewrite_strategy("ads_behavior.x", "a ASC NULLS FIRST") == ("sort", "a ASC NULLS FIRST")
    assert rewrite_strategy("dim_db.products", None) == ("binpack", None)


def test_a_table_of_one_data_file_is_not_compacted():
    # product_views (rewritten whole every batch) and small dimensions: no planning, no Spark job.
    no_spark = None
    assert rewrite_data_files(
        no_spark, "lakehouse", "ads_behavior.product_views", TableStats(1, 900, 40, 0)
    ) == ("1 data files: nothing to compact")
    assert rewrite_data_files(no_spark, "lakehouse", "dim_db.products", TableStats(0, 0, 1, 0)).startswith(
        "0 "
    )


def test_lost_commit_races_are_retried_and_summarized():
    lost = Exception(
        "An error occurred while calling o63.sql.\n: org.apache.iceberg.exceptions.ValidationException: "
        "Deleted manifest /w/m5.avro could not be found in the latest snapshot 415\n\tat org.apache..."
    )
    assert is_maintenance_conflict(lost)
    assert error_summary(lost).startswith(
        "org.apache.iceberg.exceptions.ValidationException: Deleted manifest"
    )
    assert is_maintenance_conflict(Exception("CommitFailedException: Cannot commit: stale table metadata"))
    assert not is_maintenance_conflict(Exception("[TABLE_OR_VIEW_NOT_FOUND] lakehouse.x.y"))


def test_table_names():
    assert short_name("lakehouse.dim_db.products", "lakehouse") == "dim_db.products"
    assert short_name("dim_db.products", "lakehouse") == "dim_db.products"
    with pytest.raises(UnknownTableError, match="NAMESPACE.NAME"):
        short_name("products", "lakehouse")


def test_orphan_min_age_below_one_hour_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--orphan-min-age-hours", "0.5"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "too young" in err and "in flight" in err and "at least 1" in err


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--table", "--retain-hours", "--retain-last", "--orphan-min-age-hours", "--skip-orphans"):
        assert option in out


# ---- against the local stack -----------------------------------------------------------------------


@stack
@pytest.mark.parametrize("expire_in_driver", [False, True], ids=["spark-action", "driver"])
def test_compaction_keeps_rows_and_progress_and_expires_snapshots(
    spark, lake_config, pyiceberg_catalog, drop_after, expire_in_driver
):
    name = "ods_behavior.maint_test_clicks"
    ident = create_clicks(spark, name)
    drop_after(ident)
    appends, checkpoint_until = 16, 6
    for batch in range(appends):
        extra = {CHECKPOINT_KEY: f"batch-{batch}"} if batch < checkpoint_until else None
        append_batch(spark, ident, batch, rows=250, extra=extra)
    files_before = count_of(spark, ident, "data_files")
    rows_before = rows_of(spark, ident)
    progress_before = {key: read_progress(spark, ident, key) for key in (OFFSETS_KEY, CHECKPOINT_KEY)}
    snapshots_before = spark.sql(
        f"SELECT snapshot_id, summary, manifest_list FROM {ident}.snapshots ORDER BY committed_at"
    ).collect()
    checkpoint_snapshot = [s.snapshot_id for s in snapshots_before if CHECKPOINT_KEY in s.summary][-1]
    older = {
        s.snapshot_id
        for s in snapshots_before[: [s.snapshot_id for s in snapshots_before].index(checkpoint_snapshot)]
    }

    scanned_before = one_product_day_files(pyiceberg_catalog, name)

    report = maintain_table(spark, lake_config, name, replace(AGGRESSIVE, expire_in_driver=expire_in_driver))

    files_after = count_of(spark, ident, "data_files")
    assert files_before >= 10 * files_after, (files_before, files_after)
    assert files_after <= DAYS  # one sorted file per day partition
    assert rows_of(spark, ident) == rows_before
    assert sum(rows_before.values()) == appends * 250
    assert {key: read_progress(spark, ident, key) for key in progress_before} == progress_before
    assert progress_before == {
        OFFSETS_KEY: offsets_summary(TOPIC, {0: appends * 250}),
        CHECKPOINT_KEY: f"batch-{checkpoint_until - 1}",
    }
    remaining = snapshot_ids(spark, ident)
    assert checkpoint_snapshot in remaining  # capped: the old progress snapshot survived retain_last=1
    assert not remaining & older  # everything older than it was expired
    io = pyiceberg_catalog.load_table(name).io
    expired_lists = [s.manifest_list for s in snapshots_before if s.snapshot_id in older]
    assert expired_lists and not any(io.new_input(path).exists() for path in expired_lists)
    assert len(remaining) < len(snapshots_before)
    assert (report.before.data_files, report.after.data_files) == (files_before, files_after)
    bytes_after = spark.sql(f"SELECT sum(file_size_in_bytes) FROM {ident}.data_files").first()[0]
    assert report.after.data_bytes == bytes_after
    assert report.after.snapshots == len(remaining)
    assert report.before.delete_files == report.after.delete_files == 0
    # Sorted by productId within each day: the scan for one product in one day plans one file.
    assert one_product_day_files(pyiceberg_catalog, name) == 1
    assert scanned_before >= 5
    # 16 appends left at least as many manifests: rewritten into few.
    assert report.steps["rewrite_manifests"].endswith(" -> 1"), report.steps
    assert manifest_count(spark, ident) < MIN_MANIFESTS_TO_REWRITE


@stack
def test_compaction_below_a_size_rewrites_only_the_small_files_and_keeps_every_row(
    spark, lake_config, drop_after
):
    """The streaming application's runs: what was committed since the last run is compacted, the
    files an earlier run wrote are left as they are (else every run rewrites the whole table)."""
    name = "ods_behavior.maint_test_small_files"
    ident = create_clicks(spark, name)
    drop_after(ident)
    append_batch(spark, ident, 0, rows=30_000)  # as an earlier run's output: large files
    large = {
        r[0]: r[1] for r in spark.sql(f"SELECT file_path, file_size_in_bytes FROM {ident}.files").collect()
    }
    for batch in range(1, 9):
        append_batch(spark, ident, batch, rows=40)
    files = {
        r[0]: r[1] for r in spark.sql(f"SELECT file_path, file_size_in_bytes FROM {ident}.files").collect()
    }
    small = {path: size for path, size in files.items() if path not in large}
    assert max(small.values()) < min(large.values()), (small, large)
    rows_before = rows_of(spark, ident)
    threshold = (max(small.values()) + min(large.values())) // 2

    in_app = replace(AGGRESSIVE, compact_below_bytes=threshold, sort_and_rewrite_manifests=False)
    report = maintain_table(spark, lake_config, name, in_app)

    after = {r[0] for r in spark.sql(f"SELECT file_path FROM {ident}.files").collect()}
    assert set(large) <= after  # not rewritten
    assert not after & set(small)  # all compacted
    assert len(after) <= len(large) + DAYS  # one new file per day partition at most
    assert rows_of(spark, ident) == rows_before
    assert sum(rows_before.values()) == 30_000 + 8 * 40
    assert report.steps["rewrite_data_files"].startswith("binpack"), report.steps
    assert f"{len(small)} files -> " in report.steps["rewrite_data_files"], report.steps
    assert "rewrite_manifests" not in report.steps


@stack
def test_snapshots_read_from_metadata_match_the_metadata_tables(spark, drop_after):
    ident = create_clicks(spark, "ods_behavior.maint_test_snapshot_log")
    drop_after(ident)
    for batch in range(3):
        append_batch(spark, ident, batch, rows=5)
    second = sorted(spark.sql(f"SELECT committed_at, snapshot_id FROM {ident}.snapshots").collect())[1][1]
    spark.sql(f"CALL lakehouse.system.rollback_to_snapshot('{ident.split('.', 1)[1]}', {second})")
    append_batch(spark, ident, 3, rows=5)
    rows = spark.sql(
        f"""SELECT s.snapshot_id, unix_millis(s.committed_at) AS committed_ms,
                   map_keys(s.summary) AS summary_keys,
                   coalesce(h.is_current_ancestor, false) AS is_current_ancestor,
                   unix_millis(h.made_current_at) AS made_current_ms
            FROM {ident}.snapshots s LEFT JOIN {ident}.history h ON h.snapshot_id = s.snapshot_id"""
    ).collect()
    from_tables = Counter(
        SnapshotInfo(
            r["snapshot_id"],
            r["committed_ms"],
            r["is_current_ancestor"],
            r["made_current_ms"],
            frozenset(k for k in r["summary_keys"] if k.startswith("lakehouse.")),
        )
        for r in rows
    )
    assert Counter(read_snapshots(spark, ident)) == from_tables
    assert sum(from_tables.values()) == 5  # 4 snapshots, the second made current twice
    assert [s.snapshot_id for s in from_tables if not s.is_current_ancestor] != []  # the rolled back one


@stack
def test_table_stats_read_from_metadata_match_the_metadata_tables(spark, drop_after):
    """The report's counts come from the snapshot summary (no Spark job); they must be what the
    metadata tables count, also for a table with delete files (whose bytes the summary mixes in)."""
    ident = create_clicks(spark, "ods_behavior.maint_test_stats")
    drop_after(ident)

    def counted() -> TableStats:
        row = spark.sql(
            f"""SELECT (SELECT count(*) FROM {ident}.data_files), (SELECT sum(file_size_in_bytes) FROM
                {ident}.data_files), (SELECT count(*) FROM {ident}.snapshots),
                (SELECT count(*) FROM {ident}.delete_files)"""
        ).first()
        return TableStats(*row)

    assert table_stats(spark, ident) == TableStats(0, 0, 0, 0)
    for batch in range(3):
        append_batch(spark, ident, batch, rows=50)
    spark.sparkContext.setJobGroup("maint_test_stats", "table_stats from the summary")
    from_summary = table_stats(spark, ident)
    assert spark.sparkContext.statusTracker().getJobIdsForGroup("maint_test_stats") == []  # no Spark job
    spark.sparkContext.setJobGroup("", "")
    assert from_summary == counted()
    spark.sql(
        f"ALTER TABLE {ident} SET TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read')"
    )
    spark.sql(f"DELETE FROM {ident} WHERE kafka_offset = 0")

    stats = table_stats(spark, ident)  # from the metadata tables
    assert stats == counted()
    assert stats.delete_files >= 1 and stats.snapshots == 4


@stack
def test_cdc_merges_into_a_large_table_write_delete_files_that_maintenance_applies(
    spark, lake_config, drop_after, monkeypatch
):
    """A table past MERGE_ON_READ_MIN_ROWS turns merge-on-read (jobs/cdc/target_table.py): CDC's
    MERGE then writes position deletes instead of rewriting data files, the rows are what the
    changes make them, and the next maintenance rewrites the files with deletes (none left)."""
    from jobs.cdc import target_table
    from jobs.cdc.apply_changes import apply_changes
    from jobs.cdc.binlog_reader import BinlogPosition
    from jobs.cdc.change_batch import DELETE, UPSERT, RowChange

    ident = "lakehouse.dim_db.maint_test_merge_on_read"
    spark.sql(f"DROP TABLE IF EXISTS {ident}")
    drop_after(ident)
    columns = [("id", "bigint"), ("qty", "int")]
    target_table.create_iceberg_table(spark, ident, columns, ("id",))
    spark.range(0, 2_000, 1, 2).selectExpr("id", "CAST(id % 7 AS INT) AS qty").writeTo(ident).append()
    monkeypatch.setattr(target_table, "MERGE_ON_READ_MIN_ROWS", 1_000)
    target_table.configure_table(spark, ident, ("id",), "user_db.big")
    props = dict(spark.sql(f"SHOW TBLPROPERTIES {ident}").collect())
    assert {props[k] for k in target_table.WRITE_MODE_KEYS} == {"merge-on-read"}

    expected = Counter((i, i % 7) for i in range(2_000))
    changes = []
    for i in range(0, 2_000, 40):  # updates and deletes spread over every data file
        changes.append(RowChange(UPSERT, (i,), {"id": i, "qty": 100}))
        expected[(i, i % 7)] -= 1
        expected[(i, 100)] += 1
    for i in (i for i in range(1, 2_000, 97) if i % 40):  # one change per key, as CDC applies them
        changes.append(RowChange(DELETE, (i,), {"id": i, "qty": i % 7}))
        expected[(i, i % 7)] -= 1
    changes.append(RowChange(UPSERT, (5_000,), {"id": 5_000, "qty": 1}))
    expected[(5_000, 1)] += 1
    data_files = table_stats(spark, ident).data_files
    apply_changes(spark, ident, columns, ("id",), changes, None, BinlogPosition("mysql-bin.000001", 4))

    rows = Counter(tuple(r) for r in spark.table(ident).collect())
    assert rows == +expected
    merged = table_stats(spark, ident)
    assert merged.delete_files >= 1  # deletes written, not every data file rewritten
    assert merged.data_files <= data_files + 2  # the new rows' files, not a rewrite of the old ones

    report = maintain_table(spark, lake_config, "dim_db.maint_test_merge_on_read", MaintainSettings())
    assert report.after.delete_files == 0, report.steps
    assert Counter(tuple(r) for r in spark.table(ident).collect()) == +expected


@stack
def test_orphan_removal_deletes_only_old_unreferenced_files(spark, lake_config, drop_after):
    ident = create_clicks(spark, "ods_behavior.maint_test_orphans")
    drop_after(ident)
    for batch in range(2):
        append_batch(spark, ident, batch, rows=100)
    location = spark.sql(f"DESCRIBE TABLE EXTENDED {ident}").where("col_name = 'Location'").first()[1]
    data_dir = Path(location.removeprefix("file:")) / "data"
    old_orphan, fresh_orphan = data_dir / "orphan-old.parquet", data_dir / "orphan-fresh.parquet"
    for path in (old_orphan, fresh_orphan):
        path.write_bytes(b"not referenced by any snapshot")
    four_days_ago = time.time() - 4 * 86_400
    os.utime(old_orphan, (four_days_ago, four_days_ago))

    report = maintain_table(spark, lake_config, "ods_behavior.maint_test_orphans", MaintainSettings())

    assert not old_orphan.exists()
    assert fresh_orphan.exists()  # younger than the 72 h minimum age: may belong to a commit in flight
    assert "removed 1 files" in report.steps["remove_orphan_files"]
    assert spark.table(ident).count() == 200


@stack
def test_maintenance_while_appending_loses_nothing(spark, lake_config, drop_after):
    ident = create_clicks(spark, "ods_behavior.maint_test_concurrent")
    drop_after(ident)
    rows, initial = 200, 8
    for batch in range(initial):
        append_batch(spark, ident, batch, rows)
    maintenance_done = threading.Event()
    appended: list[int] = []
    errors: list[BaseException] = []

    def keep_appending() -> None:
        try:
            batch = initial
            while not maintenance_done.is_set() or len(appended) < 3:
                append_batch(spark, ident, batch, rows)
                appended.append(batch)
                batch += 1
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    writer = threading.Thread(target=keep_appending, daemon=True)
    writer.start()
    try:
        report = maintain_table(spark, lake_config, "ods_behavior.maint_test_concurrent", AGGRESSIVE)
    finally:
        maintenance_done.set()
        writer.join(120)
    assert not errors, errors
    assert not writer.is_alive()
    batches = initial + len(appended)
    offsets = [r[0] for r in spark.sql(f"SELECT kafka_offset FROM {ident}").collect()]
    assert len(offsets) == batches * rows
    assert set(offsets) == set(range(batches * rows))
    assert read_progress(spark, ident, OFFSETS_KEY) == offsets_summary(TOPIC, {0: batches * rows})
    assert report.after.data_files < report.before.data_files + len(appended) * 2 * DAYS


@stack
def test_unknown_table_exits_2_with_the_known_tables(spark, monkeypatch, caplog):
    # keep the session's Spark running
    monkeypatch.setattr("jobs.maintain.__main__.stop_spark", lambda _: None)
    assert main(["--table", "ods_behavior.maint_no_such_table"]) == 2
    assert "no such table in catalog lakehouse: ods_behavior.maint_no_such_table" in caplog.text
    assert "Lake tables: " in caplog.text


@stack
def test_cli_maintains_a_table(spark, drop_after):
    ident = create_clicks(spark, "ods_behavior.maint_test_cli")
    drop_after(ident)
    for batch in range(6):
        append_batch(spark, ident, batch, rows=100)
    files_before = count_of(spark, ident, "data_files")

    result = run_cli("run", "maintain", "--table", "ods_behavior.maint_test_cli", "--skip-orphans")

    files_after = count_of(spark, ident, "data_files")
    assert files_after < files_before
    assert "ods_behavior.maint_test_cli" in result.stdout
    assert f"{files_before} -> {files_after}" in result.stdout
    for step in ("rewrite_data_files", "rewrite_manifests", "expire_snapshots"):
        assert f"ods_behavior.maint_test_cli: {step}" in result.stderr
    # Six appends and a compaction leave fewer manifests than are worth a rewrite (and a commit).
    manifests = manifest_count(spark, ident)
    assert manifests < MIN_MANIFESTS_TO_REWRITE
    assert (
        f"rewrite_manifests {manifests} manifests: fewer than {MIN_MANIFESTS_TO_REWRITE}, left"
        in result.stderr
    )
    assert "remove_orphan_files" not in result.stderr
    assert spark.table(ident).count() == 600
