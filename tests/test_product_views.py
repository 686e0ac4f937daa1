"""product_views against the real local stack: equal to the GROUP BY over the click table after
ingest, a price change, compaction and snapshot expiry; restarts neither skip nor double-count."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from support import LAKEHOUSE_BIN, REPO

from jobs.common.lake_tables import OFFSETS_KEY, fact_table_ddl, offsets_summary, products_table_ddl
from jobs.common.snapshot_progress import ConcurrentWriterError, with_snapshot_properties
from jobs.views.job import (
    ANY_TOPIC,
    PROGRESS_KEY,
    ClickOffsetsRegressed,
    ProductViews,
    ViewsSettings,
    watermark_from_summary,
)

pytestmark = pytest.mark.stack

PARTITIONS = 3


def source_statistic(spark, clicks: str) -> list[tuple]:
    """The source system's real-time query, verbatim apart from the table name."""
    rows = spark.sql(
        f"SELECT productId, name, product_price, count(uid) FROM {clicks} "
        "GROUP BY productId, name, product_price"
    ).collect()
    return sorted((tuple(r) for r in rows), key=repr)


def views_rows(spark, views: str) -> list[tuple]:
    rows = spark.sql(f"SELECT productId, name, product_price, views FROM {views}").collect()
    return sorted((tuple(r) for r in rows), key=repr)


def catch_up(job: ProductViews) -> int:
    total = 0
    while handled := job.run_batch():
        total += handled
    return total


@pytest.fixture
def names():
    suffix = uuid.uuid4().hex[:6]
    return {
        "topic": f"views_{suffix}",
        "clicks": f"lakehouse.ods_behavior.views_clicks_{suffix}",
        "rejects": f"lakehouse.ods_behavior.views_rejects_{suffix}",
        "products": f"lakehouse.dim_db.views_products_{suffix}",
        "views": f"lakehouse.ads_behavior.views_{suffix}",
    }


def test_views_equal_the_group_by_after_ingest_price_change_compaction_and_expiry(
    spark, lake_config, names
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from jobs.common.run_modes import RunMode, StopRequest, run_batches
    from jobs.gendata.generator import generate_records, produce, producer_config
    from jobs.ingest.job import ClickstreamIngest, IngestSettings

    admin = AdminClient({"bootstrap.servers": lake_config.kafka.bootstrap})
    admin.create_topics([NewTopic(names["topic"], PARTITIONS, 1)])[names["topic"]].result(timeout=30)
    # Own products dimension (products 1..9 known; the generator's 0 and 10..19 are unknown).
    for statement in products_table_ddl(names["products"]):
        spark.sql(statement)
    spark.sql(
        f"INSERT INTO {names['products']} VALUES "
        + ", ".join(f"('{i}', 'test0{i}', 'd', {i}.5, current_timestamp())" for i in range(1, 10))
    )
    ingest = ClickstreamIngest(
        spark,
        lake_config,
        IngestSettings(names["topic"], names["clicks"], names["rejects"], names["products"]),
    )
    ingest.prepare()
    views = ProductViews(spark, ViewsSettings(names["clicks"], names["views"]))
    views.prepare()

    def round_of(count: int, seed: int) -> None:
        records = generate_records(count, seed, bad_ratio=0.05)
        summary = produce(producer_config(lake_config), names["topic"], records, count)
        assert summary.failed == 0
        run_batches(ingest.run_batch, RunMode(0.2, True, 1.0), StopRequest())
        catch_up(views)
        assert views_rows(spark, names["views"]) == source_statistic(spark, names["clicks"])

    round_of(3000, seed=11)
    assert any(name is None for _, name, _, _ in views_rows(spark, names["views"]))  # unknown products

    # A price change in the dimension: new events carry it, and the aggregate gets a new group.
    spark.sql(f"UPDATE {names['products']} SET product_price = 8.1 WHERE productId = '1'")
    round_of(2000, seed=12)
    prices = {price for pid, _, price, _ in views_rows(spark, names["views"]) if pid == "1"}
    assert prices == {Decimal("1.5000"), Decimal("8.1000")}

    # Compaction: a rewrite snapshot holds the same rows, so there is nothing new to count.
    spark.sql(
        f"CALL lakehouse.system.rewrite_data_files(table => '{names['clicks']}', "
        "options => map('rewrite-all', 'true'))"
    )
    assert catch_up(views) == 0
    assert views_rows(spark, names["views"]) == source_statistic(spark, names["clicks"])
    round_of(1000, seed=13)

    # Snapshot expiry on the click table: no snapshot id is part of the views progress.
    spark.sql(
        f"CALL lakehouse.system.expire_snapshots(table => '{names['clicks']}', "
        f"older_than => TIMESTAMP '{datetime.now(UTC) + timedelta(seconds=1):%Y-%m-%d %H:%M:%S}', "
        "retain_last => 1)"
    )
    round_of(1000, seed=14)
    ingest.finish()
    total = spark.table(names["clicks"]).count()
    assert sum(v for *_, v in views_rows(spark, names["views"])) == total


def append_clicks(spark, clicks: str, start: int, count: int, topic: str | None = None) -> None:
    """Rows as the ingest writes them: per partition, consecutive offsets from `start`; with `topic`,
    the commit also stores the ingest's offsets for it, as the ingest does."""
    insert = f"""INSERT INTO {clicks}
            SELECT 10 + id % 90, '10001', CAST(id % 20 AS string), 'cookie', CAST(id % 20 AS int),
                   TIMESTAMP '2026-11-20 10:00:00', NULL, NULL, '20261120',
                   CAST(id % {PARTITIONS} AS int), {start} + id DIV {PARTITIONS}, current_timestamp()
            FROM range({count * PARTITIONS})"""
    if topic is None:
        spark.sql(insert)
        return
    offsets = offsets_summary(topic, dict.fromkeys(range(PARTITIONS), start + count))
    with_snapshot_properties(spark, {OFFSETS_KEY: offsets}, lambda: spark.sql(insert))


def new_views(spark, names) -> ProductViews:
    views = ProductViews(spark, ViewsSettings(names["clicks"], names["views"]))
    views.prepare()
    return views


def test_views_stop_when_the_click_offsets_go_back_below_what_they_counted(spark, names) -> None:
    """A recreated topic restarts at offset 0: its clicks sit below the watermark and would never be
    counted. The job must say so instead of silently counting nothing."""
    for statement in fact_table_ddl(names["clicks"]):
        spark.sql(statement)
    append_clicks(spark, names["clicks"], 0, 100, topic="clicktopic")
    views = new_views(spark, names)
    assert catch_up(views) == 100 * PARTITIONS
    stored = spark.sql(f"SELECT summary['{PROGRESS_KEY}'] FROM {names['views']}.snapshots").collect()[0][0]
    assert watermark_from_summary(stored) == ("clicktopic", dict.fromkeys(range(PARTITIONS), 100))

    append_clicks(spark, names["clicks"], 0, 40, topic="clicktopic")  # the topic, recreated
    with pytest.raises(ClickOffsetsRegressed, match="went below what product_views has counted"):
        views.run_batch()
    with pytest.raises(ClickOffsetsRegressed):
        new_views(spark, names).run_batch()  # a restart does not get past it either


def test_views_stop_when_the_click_table_switches_topic(spark, names) -> None:
    for statement in fact_table_ddl(names["clicks"]):
        spark.sql(statement)
    append_clicks(spark, names["clicks"], 0, 50, topic="clicktopic")
    views = new_views(spark, names)
    catch_up(views)
    append_clicks(spark, names["clicks"], 0, 50, topic="othertopic")
    with pytest.raises(ClickOffsetsRegressed, match="now holds topic 'othertopic'"):
        views.run_batch()


def test_a_second_views_job_on_the_same_table_aborts_and_counts_nothing_twice(spark, names) -> None:
    for statement in fact_table_ddl(names["clicks"]):
        spark.sql(statement)
    append_clicks(spark, names["clicks"], 0, 60, topic="clicktopic")
    first, second = new_views(spark, names), new_views(spark, names)
    assert first.run_batch() == 60 * PARTITIONS
    append_clicks(spark, names["clicks"], 60, 10, topic="clicktopic")
    with pytest.raises(ConcurrentWriterError, match="another product_views job committed"):
        second.run_batch()
    assert catch_up(first) == 10 * PARTITIONS
    assert views_rows(spark, names["views"]) == source_statistic(spark, names["clicks"])


def views_commits(spark, views: str) -> int:
    if not spark.catalog.tableExists(views):
        return 0
    spark.sql(f"REFRESH TABLE {views}")
    return spark.sql(f"SELECT count(*) FROM {views}.snapshots").collect()[0][0]


def test_views_restarts_neither_skip_nor_double_count(spark, names) -> None:
    for statement in fact_table_ddl(names["clicks"]):
        spark.sql(statement)
    args = ["--clicks-table", names["clicks"], "--views-table", names["views"]]
    cmd = [LAKEHOUSE_BIN, "run", "views", *args, "--trigger-seconds", "0.2"]
    appended, expected = 0, Counter()
    for round_no in range(2):
        before = views_commits(spark, names["views"])
        job = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # Keep appending while the job starts and runs; kill -9 it once this run has committed
            # views, a few appends later (wherever it then is).
            deadline, committed_at = time.monotonic() + 180, None
            while committed_at is None or appended < committed_at + 200 * (2 + round_no):
                assert time.monotonic() < deadline, "the views job committed nothing in 3 minutes"
                append_clicks(spark, names["clicks"], appended, 200)
                expected.update(str(i % 20) for i in range(200 * PARTITIONS))  # productId = id % 20
                appended += 200
                time.sleep(0.5)
                if committed_at is None and views_commits(spark, names["views"]) > before:
                    committed_at = appended
            assert job.poll() is None, f"the views job exited ({job.returncode}) before the kill"
        finally:
            job.send_signal(signal.SIGKILL)
            job.wait(30)
        assert job.returncode == -signal.SIGKILL
    finished = subprocess.run(
        [LAKEHOUSE_BIN, "run", "views", *args, "--until-idle", "--idle-seconds", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    # Against what was appended (the test's own count per product), and the source system's query.
    assert Counter({r[0]: r[3] for r in views_rows(spark, names["views"])}) == expected
    assert views_rows(spark, names["views"]) == source_statistic(spark, names["clicks"])
    stored = spark.sql(
        f"SELECT summary['{PROGRESS_KEY}'] FROM {names['views']}.snapshots ORDER BY committed_at DESC LIMIT 1"
    ).collect()[0][0]
    # Rows written by hand carry no ingest offsets: the watermark is for whatever topic they came from.
    assert watermark_from_summary(stored) == (ANY_TOPIC, dict.fromkeys(range(PARTITIONS), appended))


def test_a_repair_that_removes_counted_clicks_takes_them_off_and_a_second_job_cannot_count_it_again(
    spark, names
) -> None:
    """A click repair (`verify --repair`) deletes copies below the watermark: the view loses exactly
    those. The batch that counts it leaves the watermark where it was, so a second job resuming from
    the same point must still see that another job committed (the click snapshot counted through)."""
    import json

    from jobs.common.lake_tables import REPAIR_KEY

    for statement in fact_table_ddl(names["clicks"]):
        spark.sql(statement)
    append_clicks(spark, names["clicks"], 0, 30, topic="clicktopic")
    # Offsets 0-4 of partition 0 stored twice, counted twice (the view agrees with its table).
    with_snapshot_properties(
        spark,
        {OFFSETS_KEY: offsets_summary("clicktopic", dict.fromkeys(range(PARTITIONS), 30))},
        lambda: spark.sql(
            f"INSERT INTO {names['clicks']} SELECT webpageId, uid, productId, 'copy', expendTime, eventTime, "
            f"name, product_price, dt, kafka_partition, kafka_offset, ingested_at FROM {names['clicks']} "
            "WHERE kafka_partition = 0 AND kafka_offset < 5"
        ),
    )
    first = new_views(spark, names)
    assert catch_up(first) == 30 * PARTITIONS + 5
    second = new_views(spark, names)  # resumes from the same point
    repair = {"id": "r", "ranges": {"0": [[0, 4]]}, "below": {"0": 5}, "added": 0, "removed": 5}
    with_snapshot_properties(
        spark,
        {REPAIR_KEY: json.dumps(repair)},
        lambda: spark.sql(f"DELETE FROM {names['clicks']} WHERE cookieId = 'copy'"),
    )
    assert first.run_batch() == 5  # five clicks taken off, the watermark as it was
    assert views_rows(spark, names["views"]) == source_statistic(spark, names["clicks"])
    with pytest.raises(ConcurrentWriterError, match="another product_views job committed"):
        second.run_batch()
    assert views_rows(spark, names["views"]) == source_statistic(spark, names["clicks"])


def test_a_second_views_job_that_commits_inside_the_race_window_is_rejected(spark, names, monkeypatch):
    """The other job commits after this one checked the stored watermark but before it writes:
    the exclusive overwrite (validated from the snapshot it checked) must fail, not double-count."""
    import jobs.views.job as views_module

    for statement in fact_table_ddl(names["clicks"]):
        spark.sql(statement)
    append_clicks(spark, names["clicks"], 0, 50, topic="clicktopic")
    first, second = new_views(spark, names), new_views(spark, names)
    assert catch_up(first) == 50 * PARTITIONS
    # Both resume from the same point.
    second.topic, second.watermark, second.counted_snapshot = (
        first.topic,
        first.watermark,
        first.counted_snapshot,
    )
    append_clicks(spark, names["clicks"], 50, 20, topic="clicktopic")

    original = views_module.progress_summary_as_of
    raced: list[int] = []
    racing: list[bool] = []

    def check_then_let_the_other_job_commit(*args, **kwargs):
        stored = original(*args, **kwargs)
        if not racing and args[1] == names["views"]:
            racing.append(True)
            # Inside the window the other job counts more clicks than this one did, and commits.
            append_clicks(spark, names["clicks"], 70, 10, topic="clicktopic")
            raced.append(first.run_batch())
        return stored

    monkeypatch.setattr(views_module, "progress_summary_as_of", check_then_let_the_other_job_commit)
    with pytest.raises(ConcurrentWriterError):
        second.run_batch()
    assert raced == [30 * PARTITIONS]
    assert views_rows(spark, names["views"]) == source_statistic(spark, names["clicks"])


def test_a_views_job_that_finds_its_target_watermark_committed_by_another_job_stops(spark, names) -> None:
    """Two jobs resume from one watermark and count the same clicks: the first commits the watermark
    the second was about to write. The second must not take that commit for its own (it would go on
    building on rows without that batch and lose its counts at its next commit)."""
    for statement in fact_table_ddl(names["clicks"]):
        spark.sql(statement)
    append_clicks(spark, names["clicks"], 0, 50, topic="clicktopic")
    first, second = new_views(spark, names), new_views(spark, names)
    assert catch_up(second) == 50 * PARTITIONS  # the second holds the rows it committed
    # A restart reads the same progress.
    first.topic, first.watermark, first.counted_snapshot = (
        second.topic,
        second.watermark,
        second.counted_snapshot,
    )
    append_clicks(spark, names["clicks"], 50, 20, topic="clicktopic")
    assert first.run_batch() == 20 * PARTITIONS
    with pytest.raises(ConcurrentWriterError, match="another product_views job committed"):
        second.run_batch()
    append_clicks(spark, names["clicks"], 70, 10, topic="clicktopic")
    assert catch_up(first) == 10 * PARTITIONS
    assert views_rows(spark, names["views"]) == source_statistic(spark, names["clicks"])


def test_a_views_commit_that_landed_but_reported_failure_counts_each_click_once(spark, names, monkeypatch):
    """The job keeps the rows it committed and builds the next commit on them: a commit whose
    outcome was unknown (it landed, then reported a timeout) must neither be counted again nor leave
    the job building on rows it does not know landed."""
    from pyspark.sql.readwriter import DataFrameWriterV2

    for statement in fact_table_ddl(names["clicks"]):
        spark.sql(statement)
    views = new_views(spark, names)
    append_clicks(spark, names["clicks"], 0, 40, topic="clicktopic")
    assert catch_up(views) == 40 * PARTITIONS
    overwrite, failed = DataFrameWriterV2.overwrite, []

    def landing_then_failing(self, condition):
        overwrite(self, condition)
        if not failed:
            failed.append(True)
            raise RuntimeError("org.apache.iceberg.exceptions.CommitStateUnknownException: timed out")

    monkeypatch.setattr(DataFrameWriterV2, "overwrite", landing_then_failing)
    append_clicks(spark, names["clicks"], 40, 30, topic="clicktopic")
    assert catch_up(views) == 30 * PARTITIONS
    append_clicks(spark, names["clicks"], 70, 20, topic="clicktopic")
    assert catch_up(views) == 20 * PARTITIONS
    assert failed
    # Each append's rows have productId = id % 20 over its own ids 0 .. count * PARTITIONS - 1.
    expected = Counter(str(i % 20) for count in (40, 30, 20) for i in range(count * PARTITIONS))
    assert Counter({r[0]: r[3] for r in views_rows(spark, names["views"])}) == expected
    assert views_rows(spark, names["views"]) == source_statistic(spark, names["clicks"])


def test_a_views_commit_sends_its_rows_as_arrow_and_keeps_untouched_rows_exactly(
    spark, names, monkeypatch
) -> None:
    """Each commit rewrites the whole (small) view. Its rows must reach the JVM as Arrow, a local
    relation in the plan: `createDataFrame` of a Python list pickles them through a Python worker,
    which made every commit wait ~450 ms on a busy box (issue 26). A restarted job reads the rows
    back (PySpark returns naive local times) and must write the untouched ones unchanged, also when
    the local time zone is not UTC (here New York's)."""
    from pyspark.sql.readwriter import DataFrameWriterV2

    monkeypatch.setenv("TZ", "America/New_York")  # the Python side's local time; Spark's stays UTC
    time.tzset()
    try:
        for statement in fact_table_ddl(names["clicks"]):
            spark.sql(statement)
        append_clicks(spark, names["clicks"], 0, 20, topic="clicktopic")  # 3 clicks of each product
        assert catch_up(new_views(spark, names)) == 20 * PARTITIONS
        read = f"SELECT productId, views, updated_at FROM {names['views']}"
        before = {r[0]: r[2] for r in spark.sql(read).collect()}

        overwrite, plans = DataFrameWriterV2.overwrite, []

        def recording_the_plan(self, condition):
            plans.append(self._df._jdf.queryExecution().analyzed().toString())
            return overwrite(self, condition)

        monkeypatch.setattr(DataFrameWriterV2, "overwrite", recording_the_plan)
        spark.sql(f"""INSERT INTO {names["clicks"]}
                      SELECT 10, '10001', '3', 'cookie', 3, TIMESTAMP '2026-11-20 10:00:00', NULL, NULL,
                             '20261120', 0, 20, current_timestamp()""")  # one more click of product 3
        counting = datetime.now()  # naive, local: as PySpark returns the view's times
        assert catch_up(new_views(spark, names)) == 1  # a restart: the base rows are read back
        counted = datetime.now()
        after = spark.sql(read).collect()
    finally:
        monkeypatch.undo()  # TZ as it was, then make the process use it again
        time.tzset()
    assert len(plans) == 1 and "LocalRelation" in plans[0] and "LogicalRDD" not in plans[0], plans
    assert {r[0]: r[1] for r in after} == {str(p): 4 if p == 3 else 3 for p in range(20)}
    assert {r[0]: r[2] for r in after if r[0] != "3"} == {p: t for p, t in before.items() if p != "3"}
    assert counting <= next(r[2] for r in after if r[0] == "3") <= counted
