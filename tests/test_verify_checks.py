"""The reconciliation's transforms on small, hand-made inputs whose answer is known: offset ranges
missing or stored twice (at the bounds too), rows past their table's stored offsets, view counts
against the clicks they counted (NULL groups included), and the exit codes."""

from __future__ import annotations

from decimal import Decimal

import pytest

from jobs.verify.clicks import (
    beyond_stored,
    bounds_frame,
    check_clicks,
    duplicate_ranges,
    lost_ranges,
    missing_ranges,
)
from jobs.verify.findings import CheckResult, Finding, exit_code, metric_data
from jobs.verify.views import check_views


def _lineage(spark, pairs):
    from pyspark.sql import functions as F

    frame = spark.createDataFrame(pairs, "kafka_partition int, kafka_offset long")
    return frame.withColumn("ingested_at", F.lit("2026-11-29 00:00:00").cast("timestamp"))


def _ranges(frame) -> list[tuple[int, int, int]]:
    return sorted((r["kafka_partition"], r["first"], r["last"]) for r in frame.collect())


def test_missing_offsets_come_as_ranges_including_both_ends(spark) -> None:
    rows = _lineage(spark, [(0, o) for o in (2, 3, 6, 7, 9)] + [(1, 0), (1, 1)])
    bounds = bounds_frame(spark, {0: 0, 1: 0, 2: 5}, {0: 12, 1: 2, 2: 8})
    # partition 0: 0-1 before the first row, 4-5 and 8 between, 10-11 after the last;
    # partition 1 complete; partition 2 holds no row at all in [5, 8).
    assert _ranges(missing_ranges(rows, bounds)) == [(0, 0, 1), (0, 4, 5), (0, 8, 8), (0, 10, 11), (2, 5, 7)]


def test_offsets_below_the_earliest_or_at_the_stored_end_are_not_gaps(spark) -> None:
    rows = _lineage(spark, [(0, o) for o in (5, 6, 7)])
    assert _ranges(missing_ranges(rows, bounds_frame(spark, {0: 5}, {0: 8}))) == []


def test_duplicates_come_as_ranges(spark) -> None:
    rows = _lineage(spark, [(0, 1), (0, 3), (0, 3), (0, 4), (0, 4), (0, 4), (0, 9), (0, 9), (1, 3), (1, 3)])
    assert _ranges(duplicate_ranges(rows)) == [(0, 3, 4), (0, 9, 9), (1, 3, 3)]


def test_rows_past_their_tables_stored_offsets(spark) -> None:
    rows = _lineage(spark, [(0, 1), (0, 2), (0, 3), (0, 4), (1, 0), (2, 7)])
    # partition 0 stored up to 3 (offsets 3 and 4 are past it); partition 2 never stored
    assert _ranges(beyond_stored(rows, {0: 3, 1: 1})) == [(0, 3, 4), (2, 7, 7)]


def test_check_clicks_counts_what_it_compared_and_waits_for_the_rejects(spark) -> None:
    fact = _lineage(spark, [(0, o) for o in range(10) if o != 4])
    rejects = _lineage(spark, [(0, 4)])
    result = check_clicks(spark, fact, rejects, {0: 10}, {0: 8}, {0: 0}, "t")
    assert result.status == "ok" and result.compared == 8
    assert any("8-9 wait for the rejects" in note for note in result.notes)
    # The rejects lost offset 4: missing, and named.
    lost = check_clicks(spark, fact, rejects.where("kafka_offset <> 4"), {0: 10}, {0: 10}, {0: 0}, "t")
    assert [(f.kind, f.count, f.examples) for f in lost.findings] == [
        ("missing offsets", 1, ("partition 0: 4",))
    ]


def test_a_repair_is_planned_for_what_the_topic_holds_and_for_doubles_below_the_stored_offsets(spark) -> None:
    """`verify --repair` takes missing offsets the topic still holds and offsets doubled below both
    tables' stored offsets; not what the topic lost, nor doubles at or past the stored offsets (not
    the ingest's to have written, and a repair there would stop it)."""
    offsets = [o for o in range(20) if o not in (2, 3, 11)] + [5, 6, 12, 18]  # 18: past rejects' 15
    fact = _lineage(spark, [(0, o) for o in offsets] + [(1, o) for o in range(4)] + [(1, 4), (1, 4)])
    rejects = _lineage(spark, [])
    repairs: list = []
    result = check_clicks(
        spark, fact, rejects, {0: 20, 1: 4}, {0: 15, 1: 4}, {0: 3, 1: 0}, "t", repairs=repairs
    )
    assert {f.kind for f in result.findings} >= {"missing offsets", "duplicate offsets"}
    (plan,) = repairs
    assert plan.readable == [(0, 3, 3), (0, 11, 11)]  # offset 2 is gone from the topic
    assert plan.duplicates == [(0, 5, 6), (0, 12, 12)]  # not 18 (past 15) nor partition 1's 4 (past 4)


def test_offsets_the_topic_no_longer_holds_are_checked_within_the_lake(spark) -> None:
    """Issue 51, item 4: past the topic's retention a loss stays visible. From the first offset the
    lake holds per partition, every offset must be in one of the two tables (the producers are not
    transactional: no offset without a record), so a gap there is a loss the topic can no longer
    repair; a gap straddling the earliest offset the topic holds is split at it."""
    fact = _lineage(spark, [(0, o) for o in range(3, 10)])
    result = check_clicks(spark, fact, None, {0: 10}, {}, {0: 5}, "t")  # no rejects table
    assert result.status == "ok" and result.compared == 7
    assert result.notes == [
        "partition 0: offsets 3-4 are no longer in the topic; checked within the lake (each once, no gap)",
        "partition 0: offsets before 3 are in neither the topic nor the lake; not compared",
    ]
    # Offsets 1 (before the topic's earliest, 4), 4-5 (across it) and 8 lost; 0 is the first the lake holds.
    holes = _lineage(spark, [(0, 0), (0, 2), (0, 3), (0, 6), (0, 7), (0, 9), (1, 5), (1, 6)])
    rejects = _lineage(spark, [(1, 7)])
    damaged = check_clicks(spark, holes, rejects, {0: 10, 1: 8}, {0: 10, 1: 8}, {0: 4, 1: 5}, "t")
    found = {f.kind: (f.count, f.examples) for f in damaged.findings}
    assert found == {
        "missing offsets no longer in the topic": (1, ("partition 0: 1",)),
        "missing offsets": (3, ("partition 0: 4-5", "partition 0: 8")),
    }
    # Partition 1 starts at 5 in the lake and in the topic: nothing can tell what came before.
    assert damaged.compared == 10 + 3
    unknown = "partition 1: offsets before 5 are in neither the topic nor the lake; not compared"
    assert unknown in damaged.notes
    lost_hint = next(f.hint for f in damaged.findings if f.kind == "missing offsets no longer in the topic")
    assert "no longer holds" in lost_hint and "lakehouse.kafka.lost.<topic>.<partition>" in lost_hint
    # A loss recorded as accepted (table property) is noted, not found; the rest is still found.
    accepted = lost_ranges({"lakehouse.kafka.lost.t.0": "1-1", "lakehouse.kafka.lost.other.0": "4-5"}, "t")
    assert accepted == {0: [(1, 1)]}
    known = check_clicks(spark, holes, rejects, {0: 10, 1: 8}, {0: 10, 1: 8}, {0: 4, 1: 5}, "t", accepted)
    assert {f.kind for f in known.findings} == {"missing offsets"}
    assert "partition 0: offsets 1-1 recorded as lost (lakehouse.kafka.lost); not counted" in known.notes
    with pytest.raises(ValueError, match="lakehouse.kafka.lost.t.0"):
        lost_ranges({"lakehouse.kafka.lost.t.0": "one-two"}, "t")


def _clicks(spark, rows):
    return spark.createDataFrame(
        rows, "productId string, name string, product_price decimal(10,4), uid string, "
        "kafka_partition int, kafka_offset long",
    )  # fmt: skip


def _views(spark, rows):
    schema = "productId string, name string, product_price decimal(10,4), views long"
    return spark.createDataFrame(rows, schema)


def test_views_equal_the_counted_clicks_and_a_miscount_is_named(spark) -> None:
    price = Decimal("1.5000")
    clicks = _clicks(
        spark,
        [
            ("p1", "one", price, "u1", 0, 0),
            ("p1", "one", price, "u2", 0, 1),
            (None, None, None, "u3", 1, 0),  # an unknown product: its own group
            ("p1", "one", price, None, 1, 1),  # count(uid) leaves it out
            ("p2", "two", price, "u4", 0, 2),  # above the watermark: not counted yet
        ],
    )
    watermark = {0: 2, 1: 2}
    right = _views(spark, [("p1", "one", price, 2), (None, None, None, 1)])
    assert check_views(clicks, right, watermark, "v").status == "ok"
    wrong = _views(spark, [("p1", "one", price, 3), (None, None, None, 1), ("p9", "x", price, 1)])
    (finding,) = check_views(clicks, wrong, watermark, "v").findings
    assert finding.count == 2
    assert finding.examples == ("p1/one/1.5000: 3 counted of 2", "p9/x/1.5000: 1 counted of 0")


def test_keys_compare_alike_from_spark_and_from_the_binlog(spark) -> None:
    """A differing key (from Spark) and a key changed in flight (from the binlog's Python values)
    must be the same text, or every change in flight on a binary- or timestamp-keyed table would
    look like a mismatch."""
    from datetime import datetime

    from jobs.cdc.reconcile import canonical, key_columns, key_text

    frame = spark.sql(
        "SELECT X'01FF' AS b, TIMESTAMP '2024-01-02 03:04:05.6' AS t, "
        "CAST(1.5 AS DECIMAL(10,4)) AS d, 'k' AS s"
    )
    key = ("b", "t", "d", "s")
    (row,) = frame.select(*key_columns(frame, key)).collect()
    from_binlog = (b"\x01\xff", datetime(2024, 1, 2, 3, 4, 5, 600000), Decimal("1.5000"), "k")
    assert key_text(row, key) == tuple(canonical(v) for v in from_binlog)


@pytest.mark.parametrize("max_tasks", [None, 1, 2])
def test_a_dimensions_differences_are_multisets_however_many_tasks_compare(spark, max_tasks) -> None:
    """Each side's rows the other lacks, as often as it has them more: a row the lake has twice is
    one row of difference, a changed row is its key on both sides, NULLs compare as values, and a
    key with equal rows is no difference; one task (beside the stream) or many say the same."""
    from jobs.cdc.reconcile import _differences

    schema = "id int, name string, price decimal(10,4)"
    source = spark.createDataFrame(
        [(1, "a", Decimal("1.5")), (2, "b", None), (3, "c", Decimal("3")), (4, None, None), (6, "f", None)],
        schema,
    )
    lake = spark.createDataFrame(
        [
            (1, "a", Decimal("1.5")),
            (2, "b", None),
            (2, "b", None),  # twice: once too many
            (3, "c", Decimal("3.0001")),  # changed
            (5, "e", Decimal("5")),  # only the lake
            (5, "e", Decimal("5")),  # ... twice
            (6, None, None),  # a NULL where the source has a value: not (6, "f", None)
        ],
        schema,
    )
    only_source, only_lake = _differences(source, lake, ("id",), 7, max_tasks)
    assert sorted(only_source) == [(("3",), (3,)), (("4",), (4,)), (("6",), (6,))]
    assert sorted(only_lake) == [
        (("2",), (2,)),
        (("3",), (3,)),
        (("5",), (5,)),
        (("5",), (5,)),
        (("6",), (6,)),
    ]


@pytest.mark.parametrize(
    ("source_rows", "lake_rows", "only_source", "only_lake"),
    [
        # A NULL moved to the other column: a hash that skips NULLs sees "x" in both.
        ([(1, None, "x")], [(1, "x", None)], [1], [1]),
        ([(1, "x", "y")], [(1, "y", "x")], [1], [1]),  # two values swapped between columns
        ([(1, "a", "b"), (2, "c", "d")], [(1, "c", "d"), (2, "a", "b")], [1, 2], [1, 2]),  # between rows
        # As many rows a side: one twice in the lake, another missing.
        ([(1, "a", None), (2, "b", None)], [(1, "a", None), (1, "a", None)], [2], [1]),
    ],
)
def test_the_first_pass_by_row_hashes_misses_no_difference_its_sums_could_hide(
    spark, source_rows, lake_rows, only_source, only_lake
) -> None:
    """`_differences` compares value by value only the buckets of keys whose row counts or row-hash
    sums differ: each case keeps the counts equal, and would hide behind a hash that skips NULLs or
    a sum that ignores which row a value is in."""
    from jobs.cdc.reconcile import _differences

    schema = "id int, name string, note string"
    found = _differences(
        spark.createDataFrame(source_rows, schema), spark.createDataFrame(lake_rows, schema), ("id",), 2, 1
    )
    assert [sorted(k for (k,), _ in side) for side in found] == [
        [str(k) for k in only_source],
        [str(k) for k in only_lake],
    ]


def test_a_clean_comparison_reads_no_row_twice_and_a_difference_reads_only_its_bucket(
    spark, monkeypatch
) -> None:
    """The value-by-value comparison (the costly one) runs on the buckets that differ only: not at
    all when the multisets are equal however their rows are ordered and split, and on a fraction of
    the rows when one differs."""
    from pyspark.sql import functions as F

    from jobs.cdc import reconcile

    compared: list[int] = []
    row_differences = reconcile._row_differences

    def counted(left, right, *args):
        compared.append(left.count() + right.count())
        return row_differences(left, right, *args)

    monkeypatch.setattr(reconcile, "_row_differences", counted)
    frame = spark.range(20_000).selectExpr("CAST(id AS INT) AS id", "IF(id % 3 = 0, NULL, id % 7) AS qty")
    reordered = frame.orderBy(F.desc("id")).repartition(5)
    assert reconcile._differences(frame, reordered, ("id",), 20_000) == ([], [])
    assert compared == []
    changed = reordered.withColumn("qty", F.when(F.col("id") == 77, F.lit(1)).otherwise(F.col("qty")))
    only_source, only_lake = reconcile._differences(frame, changed, ("id",), 20_000)
    assert (only_source, only_lake) == ([(("77",), (77,))], [(("77",), (77,))])
    assert 0 < compared[0] <= 2 * 20_000 // 10, compared  # 20 buckets: one, or a few by chance


def test_bucket_sums_of_the_pieces_a_source_is_read_in_add_up_to_the_whole(spark) -> None:
    """`compare` sums each source piece as it is read (`BucketSums.add`): the pieces' sums equal the
    whole table's, and a piece missing or read twice shows in the buckets it touches."""
    from jobs.cdc.reconcile import BucketSums

    frame = spark.range(5_000).selectExpr("CAST(id AS INT) AS id", "IF(id % 4 = 0, NULL, id % 9) AS qty")
    pieces = [frame.where(f"id >= {lo} AND id < {lo + 1_700}") for lo in range(0, 5_000, 1_700)]
    sums = BucketSums(("id",), 5, frame, frame, max_tasks=1)
    whole, added = sums.of(frame), {}
    for piece in pieces:
        BucketSums.add(added, sums.of(piece))
    assert added == whole and sum(rows for rows, _, _ in whole.values()) == 5_000
    assert sums.differing(added, whole) == []
    BucketSums.add(added, sums.of(pieces[1]))  # a piece read twice
    assert sums.differing(added, whole) == sorted(sums.of(pieces[1]))


def test_a_comparison_beside_the_stream_runs_no_more_tasks_at_once_than_it_is_given(spark) -> None:
    """`max_tasks`: every stage of the comparison has that many tasks at most, however many
    partitions its inputs have (a copy's verification leaves the other slots to the batches)."""
    from jobs.cdc.reconcile import _differences

    frame = spark.range(4_000).selectExpr("CAST(id AS INT) AS id", "CAST(id % 7 AS STRING) AS name")
    source, lake = frame.repartition(8), frame.where("id != 5").repartition(6)
    tracker, group = spark.sparkContext.statusTracker(), "lakehouse-test-max-tasks"
    spark.sparkContext.setJobGroup(group, "max_tasks")
    try:
        only_source, only_lake = _differences(source, lake, ("id",), 4_000, max_tasks=2)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert (only_source, only_lake) == ([(("5",), (5,))], [])
    stages = [
        tracker.getStageInfo(stage)
        for job in tracker.getJobIdsForGroup(group)
        for stage in tracker.getJobInfo(job).stageIds
    ]
    ran = [s.numTasks for s in stages if s is not None and s.numCompletedTasks]
    assert ran and max(ran) <= 2, ran


@pytest.mark.parametrize(
    ("statuses", "code"),
    [(("ok", "ok"), 0), (("ok", "mismatch"), 1), (("cannot run", "ok"), 2), (("cannot run", "mismatch"), 1)],
)
def test_exit_codes(statuses, code) -> None:
    def result(status: str) -> CheckResult:
        made = CheckResult("c", "t", error="down" if status == "cannot run" else None)
        if status == "mismatch":
            made.findings.append(Finding("k", 1, ("x",), "h"))
        return made

    results = [result(s) for s in statuses]
    assert exit_code(results) == code
    total = metric_data(results)[0]
    assert total["Dimensions"] == [{"Name": "Job", "Value": "verify"}]
    assert total["Value"] == (1.0 if "mismatch" in statuses else 0.0)


def _found_everywhere() -> list[CheckResult]:
    offsets = CheckResult("kafka -> clicks", "ods_behavior.clickevent")
    offsets.findings.append(Finding("missing offsets", 3, ("partition 0: 5-7",), "roll back"))
    keys = CheckResult("mysql -> dimension", "dim_db.user_member")
    keys.findings.append(
        Finding("rows that differ", 12, ("key alice@example.com",), "resync", row_values=True)
    )
    return [offsets, keys, CheckResult("clicks -> views", "ads_behavior.product_views", compared=4)]


def test_on_aws_row_values_stay_out_of_the_output_and_the_stored_file_has_them(spark, lake_config, tmp_path):
    """Issue 50, item 9: on AWS, verify's stdout is in the EMR logs bucket, which has no read guard.
    Primary keys and groups (row values) are replaced by where the full findings are stored (beside
    the tables, under the lake's read guard); offset ranges (lineage) stay; counts and the exit code
    are those of the full findings. Locally, everything is printed."""
    import json
    import os
    from dataclasses import replace

    from jobs.config import LakehouseConfig
    from jobs.verify.__main__ import FINDINGS_FOLDER, printable, store_findings

    results = _found_everywhere()
    config = replace(lake_config, catalog=replace(lake_config.catalog, warehouse=str(tmp_path / "wh")))
    stored_at = store_findings(spark, config, 0.0, results)
    name = f"verify-19700101T000000Z-{os.getpid()}.json"
    assert stored_at == f"{tmp_path}/wh/{FINDINGS_FOLDER}/{name}"
    stored = json.loads((tmp_path / "wh" / FINDINGS_FOLDER / name).read_text())
    assert stored["checks"][1]["findings"][0]["examples"] == ["key alice@example.com"]
    assert stored["exit_code"] == 1

    assert printable(results, lake_config, stored_at) == results  # local: all of it
    aws = LakehouseConfig.aws(
        env="dev", region="eu-west-1", kafka_bootstrap="b:9098", mysql_host="db", mysql_cdc_secret_id="s"
    )
    shown = printable(results, aws, stored_at)
    text = json.dumps([r.to_dict() for r in shown])
    assert "alice" not in text and "partition 0: 5-7" in text
    assert shown[1].findings[0].examples == (f"examples (row values) in {stored_at}",)
    assert [r.mismatches for r in shown] == [3, 12, 0] and exit_code(shown) == 1
    unstored = printable(results, aws, None)
    assert "alice" not in json.dumps([r.to_dict() for r in unstored])


def test_findings_that_cannot_be_stored_keep_the_verdict(spark, lake_config, tmp_path) -> None:
    """A warehouse the file system cannot write (here a file where the folder should be): no path, a
    warning, and verify goes on to its verdict."""
    from dataclasses import replace

    from jobs.verify.__main__ import store_findings

    (tmp_path / "wh").write_text("a file, not a folder")
    config = replace(lake_config, catalog=replace(lake_config.catalog, warehouse=str(tmp_path / "wh")))
    assert store_findings(spark, config, 0.0, _found_everywhere()) is None


def test_verify_cannot_run_exit_2_when_mysql_is_down_and_notes_a_dropped_source(spark, lake_config) -> None:
    """MySQL unreachable: every dimension check "cannot run" and the verdict is exit 2, never a match.
    A source table that is gone (dropped) is a note, not a failure (the lake keeps its rows on purpose)."""
    import socket
    from dataclasses import replace

    from jobs.cdc.target_table import DROPPED_PROPERTY, SOURCE_PROPERTY
    from jobs.verify.__main__ import verify_dimensions
    from jobs.verify.findings import CANNOT_RUN, OK

    probe = "lakehouse.dim_db.verify_probe_gone"
    spark.sql(f"DROP TABLE IF EXISTS {probe}")
    spark.sql(
        f"CREATE TABLE {probe} (id STRING) USING iceberg TBLPROPERTIES "
        f"('{SOURCE_PROPERTY}'='user_db.verify_probe_gone', '{DROPPED_PROPERTY}'='at mysql-bin.000009:4')"
    )
    from jobs.cdc.binlog_reader import BinlogPosition
    from jobs.cdc.target_table import POSITION_KEY
    from jobs.common.snapshot_progress import writer_options

    position = {POSITION_KEY: BinlogPosition("mysql-bin.000009", 4).to_json()}
    spark.createDataFrame([("kept",)], "id string").writeTo(probe).options(
        **writer_options(position)
    ).append()
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = unused.getsockname()[1]
    try:
        down = replace(lake_config, mysql=replace(lake_config.mysql, port=closed))
        (result,) = verify_dimensions(spark, down, ["dim_db.verify_probe_gone"], server_id=5990)
        assert result.status == CANNOT_RUN and result.error.startswith("MySQL unreachable")
        assert exit_code([result]) == 2
        (noted,) = verify_dimensions(spark, lake_config, ["dim_db.verify_probe_gone"], server_id=5991)
        assert noted.status == OK and noted.compared == 0, noted
        assert noted.notes == [
            "not compared: the source table user_db.verify_probe_gone was dropped at mysql-bin.000009:4; "
            "the lake table keeps its rows "
            "(`lakehouse run cdc --drop-orphaned dim_db.verify_probe_gone` removes it)"
        ]
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {probe}")


def test_verify_cannot_run_exit_2_when_kafka_is_down(spark, lake_config, monkeypatch) -> None:
    """Kafka unreachable: the click check cannot tell which offsets the topic still holds, so it is
    "cannot run" (exit 2), never a match. Control: the same table with Kafka up gets a verdict."""
    import socket
    from dataclasses import replace

    from jobs.common import lake_tables
    from jobs.common.snapshot_progress import writer_options
    from jobs.verify.__main__ import run_checks
    from jobs.verify.findings import CANNOT_RUN

    fact = ("verify_probe", "clickevent_kafka_down")
    monkeypatch.setattr(lake_tables, "FACT_TABLE", fact)
    monkeypatch.setattr(lake_tables, "REJECTS_TABLE", ("verify_probe", "rejects_kafka_down"))
    table = lake_config.table(*fact)
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lakehouse.verify_probe")
    spark.sql(f"DROP TABLE IF EXISTS {table}")
    spark.sql(f"CREATE TABLE {table} (kafka_partition INT, kafka_offset BIGINT) USING iceberg")
    stored = {lake_tables.OFFSETS_KEY: lake_tables.offsets_summary(lake_config.kafka.topic, {0: 1})}
    spark.createDataFrame([(0, 0)], "kafka_partition int, kafka_offset long").writeTo(table).options(
        **writer_options(stored)
    ).append()
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = unused.getsockname()[1]
    down = replace(lake_config, kafka=replace(lake_config.kafka, bootstrap=f"127.0.0.1:{closed}"))

    (result,) = run_checks(spark, down, ["ods_behavior.clickevent"], server_id=5992)
    assert result.status == CANNOT_RUN, result
    assert result.error.startswith("Kafka cannot tell what the topic holds"), result.error
    assert exit_code([result]) == 2
    (control,) = run_checks(spark, lake_config, ["ods_behavior.clickevent"], server_id=5993)
    assert control.status != CANNOT_RUN and control.compared == 1, control


def test_a_repair_leaves_to_cdc_the_keys_the_binlog_changed_after_its_read(spark) -> None:
    """The repair writes rows read up to position E. If CDC's stored position is past E when it
    commits, a key the binlog changed in between already has CDC's newer row: the repair leaves it
    (else it would write the older row over it). Keys changed after CDC's position are asked about
    from E up to that position only, and the others are written."""
    from jobs.cdc.binlog_reader import BinlogPosition
    from jobs.cdc.reconcile import key_columns
    from jobs.cdc.schema_mapping import SourceColumn
    from jobs.cdc.source_db import SourceTable
    from jobs.cdc.target_table import POSITION_KEY
    from jobs.common.snapshot_progress import writer_options
    from jobs.verify.repair import plan_repair, repair_dimension

    target = "lakehouse.verify_probe.repair_race"
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lakehouse.verify_probe")
    spark.sql(f"DROP TABLE IF EXISTS {target}")
    spark.sql(f"CREATE TABLE {target} (id string NOT NULL, v int) USING iceberg")
    cdc_at = BinlogPosition("mysql-bin.000002", 900)
    spark.createDataFrame([("a", 0), ("b", 0)], "id string, v int").writeTo(target).options(
        **writer_options({POSITION_KEY: cdc_at.to_json()})
    ).append()
    source = SourceTable(
        "db", "t", (SourceColumn("id", "varchar(10)", False), SourceColumn("v", "int")), ("id",)
    )
    read = spark.createDataFrame([("a", 1), ("b", 2)], "id string not null, v int")
    end = BinlogPosition("mysql-bin.000002", 400)
    plan = plan_repair(
        target, source, read, {"id": "id", "v": "v"}, {("a",): ("a",), ("b",): ("b",)}, key_columns, end
    )
    asked = []

    def changed_since(start, until):
        asked.append((start, until))
        return {("b",)}  # CDC applied a newer row of b after the read

    outcome = repair_dimension(spark, plan, changed_since)
    assert asked == [(end, cdc_at)]
    assert (outcome.written, outcome.deleted, outcome.left_to_cdc) == (1, 0, 1)
    assert sorted(tuple(r) for r in spark.table(target).collect()) == [("a", 1), ("b", 0)]
