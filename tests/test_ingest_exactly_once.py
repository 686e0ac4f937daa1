"""The ingest's exactly-once guarantee at its edges: restarts at commit boundaries, commits whose
outcome is unknown, and two writers on the same tables.

Every check compares the tables with what the producer delivered, as multisets of
(partition, offset): a duplicate or a loss fails it.
"""

from __future__ import annotations

import collections

import pytest
from ingest_case import Case, assert_exactly_once, keys, run_until_idle

from jobs.common.snapshot_progress import CONCURRENT_WRITER_EXIT
from jobs.gendata.generator import VALID

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def catalog(pyiceberg_catalog):
    return pyiceberg_catalog


def duplicated(rows: list[dict]) -> int:
    return sum(n - 1 for n in collections.Counter(keys(rows)).values() if n > 1)


def test_restart_before_the_rejects_table_ever_committed_duplicates_nothing(spark, lake_config, catalog):
    """The issue's scenario: all-valid clicks, so the rejects table has not committed when the job
    dies after its third batch; the restart reads from the rejects table's (older) offsets."""
    case = Case(lake_config, "restart_lagging_rejects")
    delivered = case.produce_generated(6000, seed=31, bad_ratio=0.0)
    first = case.new_ingest(spark, max_records_per_partition=200, rejects_commit_seconds=3600)
    for _ in range(3):
        assert first.run_batch() > 0
    # The scenario's precondition: the facts committed three times, the rejects never.
    assert len(catalog.load_table(case.fact).snapshots()) == 3
    assert catalog.load_table(case.rejects).snapshots() == []
    # Killed here: no finish(), so nothing more reaches either table.
    case.ingest_in_process(spark, cap=200)

    fact = case.rows(case.fact, catalog)
    assert duplicated(fact) == 0
    assert len(fact) == 6000
    assert_exactly_once(case, catalog, delivered)


def test_a_commit_that_landed_but_reported_failure_is_not_appended_again(
    spark, lake_config, catalog, monkeypatch
):
    """A catalog that times out after the commit landed (CommitStateUnknownException on Glue/S3)."""
    from pyspark.sql.readwriter import DataFrameWriterV2

    case = Case(lake_config, "unknown_outcome")
    delivered = case.produce_generated(900, seed=32, bad_ratio=0.1)
    ingest = case.new_ingest(spark)
    failed_after_landing: list[str] = []

    def landing_then_failing(original):
        def write(self, *args, **kwargs):
            original(self, *args, **kwargs)
            if not failed_after_landing:
                failed_after_landing.append(original.__name__)
                raise RuntimeError("org.apache.iceberg.exceptions.CommitStateUnknownException: timed out")

        return write

    for name in ("append", "overwrite"):
        monkeypatch.setattr(DataFrameWriterV2, name, landing_then_failing(getattr(DataFrameWriterV2, name)))
    run_until_idle(ingest)

    assert failed_after_landing, "the injected failure never ran"
    assert duplicated(case.rows(case.fact, catalog)) == 0
    assert_exactly_once(case, catalog, delivered)


def test_a_second_writer_on_the_same_tables_aborts_with_a_clear_error(spark, lake_config, catalog):
    """Two instances resumed from the same offsets (a re-submitted step beside a live one): the one
    that commits second must not append the same range again."""
    from jobs.ingest.job import ConcurrentWriterError

    case = Case(lake_config, "two_writers")
    delivered = case.produce_generated(1500, seed=33, bad_ratio=0.1)
    first, second = case.new_ingest(spark), case.new_ingest(spark)

    assert first.run_batch() == 1500
    with pytest.raises(ConcurrentWriterError, match="another ingest committed to"):
        second.run_batch()

    fact = case.rows(case.fact, catalog)
    assert duplicated(fact) == 0
    assert sorted(keys(fact)) == sorted((p, o) for p, o, kind, *_ in delivered if kind == VALID)
    # The first one carries on undisturbed (its rejects are committed by `finish` at the latest).
    more = case.produce_generated(300, seed=34, bad_ratio=0.0)
    assert first.run_batch() == 300
    first.finish()
    assert_exactly_once(case, catalog, delivered + more)
    # Exclusive appends are still `append` snapshots to readers (overwrite-nothing adds only).
    operations = {s.summary.operation.value for s in catalog.load_table(case.fact).snapshots()}
    assert operations == {"append"}


def test_rejects_are_held_across_batches_and_land_once_on_a_clean_stop(spark, lake_config, catalog):
    """Rejects do not add a commit to every batch: they are held, and committed together."""
    case = Case(lake_config, "held_rejects")
    delivered = case.produce_generated(900, seed=36, bad_ratio=0.1)
    ingest = case.new_ingest(spark, max_records_per_partition=100, rejects_commit_seconds=3600)
    handled = 0
    for _ in range(30):
        handled += ingest.run_batch()
        if handled == 900:
            break
    assert ingest.batches >= 3
    assert sorted(keys(case.rows(case.fact, catalog))) == sorted(
        (p, o) for p, o, kind, *_ in delivered if kind == VALID
    )
    assert catalog.load_table(case.rejects).snapshots() == []  # held, not committed yet
    ingest.finish()
    assert_exactly_once(case, catalog, delivered)
    assert len(catalog.load_table(case.rejects).snapshots()) == 1


def test_held_rejects_are_committed_when_due_while_the_topic_is_quiet(spark, lake_config, catalog):
    """A batch with rejects, then nothing more on the topic: the next (empty) batch past the
    commit interval commits them; the job does not wait for new records or a stop."""
    import dataclasses

    case = Case(lake_config, "quiet_rejects")
    delivered = case.produce_generated(300, seed=37, bad_ratio=0.2)
    ingest = case.new_ingest(spark, rejects_commit_seconds=3600)
    handled = 0
    for _ in range(30):
        handled += ingest.run_batch()
        if handled == 300:
            break
    assert catalog.load_table(case.rejects).snapshots() == []  # held
    ingest.settings = dataclasses.replace(ingest.settings, rejects_commit_seconds=0.0)  # now due
    assert ingest.run_batch() == 0  # nothing new on the topic
    ingest.close()
    assert_exactly_once(case, catalog, delivered)


class Killed(BaseException):
    """Stands for kill -9 at a crash point: nothing after it runs, nothing is cleaned up."""


def test_a_hot_partition_read_by_several_tasks_and_killed_mid_commit_lands_every_record_once(
    spark, lake_config, catalog, caplog, monkeypatch
):
    """One partition holds the whole backlog: the batch reads it as several exact pieces, one task
    each. The first such batch dies after the fact commit and before the rejects': the next run
    resumes from what the lake stores, the pieces cut anew."""
    import jobs.ingest.job as ingest_job
    from jobs.gendata.generator import generate_records
    from jobs.ingest.kafka_source import TopicMetadata

    case = Case(lake_config, "hot_partition")
    records = list(generate_records(12_000, seed=41, bad_ratio=0.1))
    kinds = {r.payload: r.kind for r in records}
    delivered = [(p, o, kinds[raw], raw) for p, o, raw in case.produce([r.payload for r in records], 0)]
    assert {p for p, *_ in delivered} == {0}

    def kill(point: str) -> None:
        if point == "ingest.between-commits":
            raise Killed(point)

    # The local broker reports a wrong (low) high watermark (ENVIRONMENT.md); MSK's is the partition's
    # end, which the pieces are cut by. Here it is what the producer was told.
    ends = {p: max((o + 1 for q, o, *_ in delivered if q == p), default=0) for p in range(3)}
    monkeypatch.setattr(
        TopicMetadata, "high_watermarks", lambda self, topic, partitions: {p: ends[p] for p in partitions}
    )
    monkeypatch.setattr(ingest_job, "crash_point", kill)
    first = case.new_ingest(spark, max_records_per_partition=8_000, read_by="tasks", min_split_records=1_000)
    with caplog.at_level("INFO", logger="clickstream_ingest"), pytest.raises(Killed):
        first.run_batch()
    # The fact table took the first 8,000 offsets (valid ones) in one commit; the rejects nothing.
    (snapshot,) = catalog.load_table(case.fact).snapshots()
    assert catalog.load_table(case.rejects).snapshots() == []
    first_batch = sorted((p, o) for p, o, kind, _ in delivered if kind == VALID and o < 8_000)
    assert keys(case.rows(case.fact, catalog)) == first_batch
    monkeypatch.setattr(ingest_job, "crash_point", lambda point: None)

    with caplog.at_level("INFO", logger="clickstream_ingest"):
        second = case.new_ingest(
            spark, max_records_per_partition=8_000, read_by="tasks", min_split_records=1_000
        )
        assert run_until_idle(second) > 0  # from the rejects' stored offsets: 0
    split = [r.getMessage() for r in caplog.records if "read_by=tasks(" in r.getMessage()]
    assert split, [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch ")]
    assert duplicated(case.rows(case.fact, catalog)) == 0
    assert_exactly_once(case, catalog, delivered)


def test_killed_between_the_fact_and_rejects_commits_lands_every_record_once(lake_config, catalog):
    """kill -9 at the commit boundary (a test hook in the job), twice, then a clean run."""
    case = Case(lake_config, "crash_between_commits")
    delivered = case.produce_generated(6000, seed=35, bad_ratio=0.1)
    small_batches = ("--max-records-per-partition", "300", "--trigger-seconds", "0.1")
    for nth in (2, 3):
        job = case.start_job(*small_batches, env={"LAKEHOUSE_CRASH_AT": f"ingest.between-commits:{nth}"})
        _, stderr = job.communicate(timeout=240)
        assert job.returncode == -9, stderr[-3000:]
    final = case.start_job(*small_batches, "--until-idle", "--idle-seconds", "2")
    _, stderr = final.communicate(timeout=240)
    assert final.returncode == 0, stderr[-3000:]
    assert duplicated(case.rows(case.fact, catalog)) == 0
    assert duplicated(case.rows(case.rejects, catalog)) == 0
    assert_exactly_once(case, catalog, delivered)


def test_two_jobs_started_at_once_land_every_click_once(lake_config, catalog, tmp_path):
    """Both jobs read the same first batch and reach its commit together (a test hook holds each
    until the other is there), so the race happens every run: one commits, the other stops."""
    case = Case(lake_config, "two_jobs")
    delivered = case.produce_generated(20_000, seed=36, bad_ratio=0.05)
    meeting = tmp_path / "before-commit"
    meeting.mkdir()
    race = {"LAKEHOUSE_RENDEZVOUS": f"ingest.before-commit:{meeting}:2"}
    jobs = [case.start_job("--until-idle", "--idle-seconds", "2", env=race) for _ in range(2)]
    outcomes = sorted((job.wait(300), job.communicate()[1]) for job in jobs)

    assert len(list(meeting.iterdir())) == 2, "the two jobs never met before their first commit"
    (won, _), (lost, stderr) = outcomes
    assert (won, lost) == (0, CONCURRENT_WRITER_EXIT), stderr[-3000:]
    assert "another ingest committed to" in stderr, stderr[-3000:]
    assert_exactly_once(case, catalog, delivered)
