"""`lakehouse replay-rejects` (issue 51, item 3) against the real broker, ingest, views and catalog.

An ingest with a validator bug (it rejects every valid click whose webpageId is a multiple of 7,
as `wrong_type: webpageId`) fills the tables; today's validator lets those clicks through. The
replay is killed (-9) just before its commit and just after it, then run again; meanwhile the
ingest and the views job keep their own progress. Compared as multisets with what the producer
delivered: every valid click in the fact table exactly once (the fixed ones as replayed rows), the
rejects as the ingest wrote them, the view equal to the GROUP BY of the facts, and verify's checks
clean.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from ingest_case import Case
from support import run_cli

from jobs.common.run_modes import RunMode, StopRequest, run_batches
from jobs.gendata.generator import VALID, generate_records
from jobs.ingest import kafka_source
from jobs.ingest.validation import ClickEvent, Rejected

pytestmark = pytest.mark.stack
BUG = "wrong_type: webpageId"


def hit_by_the_bug(payload: bytes | None) -> bool:
    try:
        document = json.loads(payload or b"")
    except ValueError:
        return False
    page = document.get("webpageId") if isinstance(document, dict) else None
    return type(page) is int and page % 7 == 0


def buggy(verdict, payload: bytes):
    """What the earlier release's validator said: valid clicks hit by the bug are rejected."""
    return (
        Rejected(BUG, payload.decode(), False)
        if isinstance(verdict, ClickEvent) and hit_by_the_bug(payload)
        else verdict
    )


def lineage(rows: list[dict]) -> Counter:
    return Counter((r["kafka_partition"], r["kafka_offset"]) for r in rows)


def test_a_replay_killed_before_and_after_its_commit_lands_each_fixed_reject_once(
    spark, lake_config, pyiceberg_catalog, monkeypatch
) -> None:
    from jobs.common import lake_tables
    from jobs.replay.job import ReplaySettings, replay_rejects
    from jobs.verify.__main__ import verify_clicks, verify_views
    from jobs.views.job import ProductViews, ViewsSettings

    case = Case(lake_config, "replay")
    records = list(generate_records(1500, seed=51, bad_ratio=0.1))
    kind = {r.payload: r.kind for r in records}
    delivered = case.produce([r.payload for r in records])
    fixed = Counter(
        (p, o) for p, o, payload in delivered if kind[payload] == VALID and hit_by_the_bug(payload)
    )
    assert len(fixed) > 50

    valid, classify = kafka_source.valid_event_values, kafka_source.classify_payload
    with monkeypatch.context() as bug:  # the ingest of an earlier release (read in the driver: patched)
        bug.setattr(
            kafka_source, "valid_event_values", lambda p, t: None if hit_by_the_bug(p) else valid(p, t)
        )
        bug.setattr(kafka_source, "classify_payload", lambda p, t: buggy(classify(p, t), p))
        ingest = case.new_ingest(spark, rejects_commit_seconds=0.0, read_by="driver")
        run_batches(ingest.run_batch, RunMode(0.2, True, 1.5), StopRequest())
    rejects_before = case.rows(case.rejects, pyiceberg_catalog)
    assert Counter(r["reason"] for r in rejects_before)[BUG] == len(fixed)

    # Compaction beside it all: a rewrite adds data files too, yet no row (the ingest passes it).
    spark.sql(
        f"CALL lakehouse.system.rewrite_data_files(table => 'ods_behavior.{case.fact.split('.')[1]}', "
        "options => map('min-input-files', '2', 'rewrite-all', 'true'))"
    )
    views_table = f"lakehouse.ads_behavior.views_{case.fact.rsplit('_', 1)[-1]}"
    views = ProductViews(spark, ViewsSettings(f"lakehouse.{case.fact}", views_table))
    views.prepare()
    assert views.run_batch() > 0

    tables = {"fact_table": f"lakehouse.{case.fact}", "rejects_table": f"lakehouse.{case.rejects}"}
    tables |= {"views_table": views_table, "topic": case.topic}
    replay = ["replay-rejects", *(a for k, v in tables.items() for a in (f"--{k.replace('_', '-')}", v))]
    facts_before = lineage(case.rows(case.fact, pyiceberg_catalog))
    killed = run_cli(*replay, check=False, env={**os.environ, "LAKEHOUSE_CRASH_AT": "replay.before-commit"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert lineage(case.rows(case.fact, pyiceberg_catalog)) == facts_before  # nothing landed
    killed = run_cli(*replay, check=False, env={**os.environ, "LAKEHOUSE_CRASH_AT": "replay.after-commit"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert lineage(case.rows(case.fact, pyiceberg_catalog)) == facts_before + fixed  # all landed, once

    settings = ReplaySettings(**tables, products_table=lake_config.table("dim_db", "products"))
    again = replay_rejects(spark, settings)
    assert again.replayed == 0 and not again.passing  # the replayed are done; the malformed still fail
    time_bound = [r for r in rejects_before if r["reason"].startswith("update_time_out_of_range")]
    assert sum(again.considered.values()) == len(rejects_before) - len(fixed) - len(time_bound)
    # The time-bound reason only when named; the generator's are far out of range: still rejects.
    from dataclasses import replace as with_

    named = replay_rejects(spark, with_(settings, reasons=("update_time_out_of_range",), dry_run=True))
    assert (sum(named.considered.values()), named.passing) == (len(time_bound), {}) and time_bound

    # The ingest carries on past the replay's commit (an append without its offsets), and so does views.
    more = case.produce([r.payload for r in generate_records(300, seed=52)])
    assert ingest.run_batch() == 300
    ingest.finish()
    views.run_batch()

    expected_facts = Counter(
        (p, o) for p, o, payload in [*delivered, *more] if kind.get(payload, VALID) == VALID
    )
    facts = case.rows(case.fact, pyiceberg_catalog)
    assert lineage(facts) == expected_facts
    assert lineage(case.rows(case.rejects, pyiceberg_catalog)) == lineage(rejects_before)  # kept on record
    groups = Counter((r["productId"], r["name"], r["product_price"]) for r in facts if r["uid"] is not None)
    counted = {
        (r["productId"], r["name"], r["product_price"]): r["views"]
        for r in pyiceberg_catalog.load_table(views_table.removeprefix("lakehouse."))
        .scan()
        .to_arrow()
        .to_pylist()
    }
    assert counted == dict(groups)

    monkeypatch.setattr(lake_tables, "FACT_TABLE", tuple(case.fact.split(".")))
    monkeypatch.setattr(lake_tables, "REJECTS_TABLE", tuple(case.rejects.split(".")))
    monkeypatch.setattr(lake_tables, "VIEWS_TABLE", tuple(views_table.split(".")[1:]))
    from dataclasses import replace

    config = replace(lake_config, kafka=replace(lake_config.kafka, topic=case.topic))
    clicks = verify_clicks(spark, config)
    assert clicks.status == "ok" and clicks.compared == len(delivered) + len(more), clicks
    counts = verify_views(spark, config)
    assert counts.status == "ok", counts

    # An append that is no replay (no bounds below the ingest's offsets) still stops an ingest.
    from jobs.common.snapshot_progress import ConcurrentWriterError

    other = case.new_ingest(spark, read_by="driver")
    pyiceberg_catalog.load_table(case.fact).append(
        pyiceberg_catalog.load_table(case.fact).scan(limit=1).to_arrow()
    )
    case.produce([r.payload for r in generate_records(30, seed=53)])
    with pytest.raises(ConcurrentWriterError, match="another ingest committed to"):
        other.run_batch()
    other.close()


def test_a_replay_or_a_repair_refuses_a_view_an_earlier_release_counts(spark, lake_config) -> None:
    """A views job of an earlier release would never count the rows a replay adds (one storing no
    counted click snapshot) or a repair removes (one storing no `lineage.views-counts`) below its
    watermark: each refuses before it writes; once a release's views job that counts them has
    committed, it goes ahead."""
    from jobs.common.progress_keys import VIEWS_CLICK_OFFSETS, VIEWS_CLICKS_SNAPSHOT
    from jobs.common.snapshot_progress import writer_options
    from jobs.common.views_counting import COUNTS, COUNTS_KEY, ViewsOfAnEarlierRelease, check_views_count
    from jobs.replay.job import ReplaySettings, replay_rejects
    from jobs.verify.clicks_repair import ClicksRepair, ClickTables, repair_clicks

    table = "lakehouse.ads_behavior.views_replay_probe"
    spark.sql(f"DROP TABLE IF EXISTS {table}")
    spark.sql(f"CREATE TABLE {table} (productId string, views bigint) USING iceberg")
    row = spark.createDataFrame([("1", 3)], "productId string, views bigint")

    def committed_by(**summary: str) -> dict[str, bool]:
        if summary:
            row.writeTo(table).options(**writer_options(summary)).append()
        counts = {}
        for what in ("replays", "repairs"):
            try:
                check_views_count(spark, table, what)
                counts[what] = True
            except ViewsOfAnEarlierRelease as exc:
                assert "earlier release" in str(exc) and f"then {what[:-1]}" in str(exc), exc
                counts[what] = False
        return counts

    assert committed_by() == {"replays": True, "repairs": True}  # nothing counted yet: fine
    offsets = {VIEWS_CLICK_OFFSETS: '{"clicktopic":{"0":3}}'}
    assert committed_by(**offsets) == {"replays": False, "repairs": False}
    # ... and the replay asks as a replay, before it reads or writes anything
    settings = ReplaySettings("lakehouse.none.fact", "lakehouse.none.rejects", "lakehouse.none.p", "t", table)
    with pytest.raises(ViewsOfAnEarlierRelease, match="then replay"):
        replay_rejects(spark, settings)
    counted = {**offsets, VIEWS_CLICKS_SNAPSHOT: "1"}  # the release that counted replays first
    assert committed_by(**counted) == {"replays": True, "repairs": False}
    # ... and the repair asks as a repair, before it reads or writes anything
    tables = ClickTables("lakehouse.none.fact", "lakehouse.none.rejects", table, "lakehouse.none.p", "t")
    with pytest.raises(ViewsOfAnEarlierRelease, match="then repair"):
        repair_clicks(spark, ClicksRepair({}, {}), tables, client_config_factory=None)
    assert committed_by(**counted, **{COUNTS_KEY: COUNTS}) == {"replays": True, "repairs": True}


def test_candidates_are_rejects_below_the_stored_offsets_not_yet_in_the_facts(spark) -> None:
    """A reject at or past the fact table's stored offsets (after a rollback of the fact table) is
    one the ingest will read again: never a candidate; nor one already replayed, nor (by default)
    one whose verdict needs the Kafka timestamp."""
    from jobs.replay.job import not_replayed

    schema = "reason string, kafka_partition int, kafka_offset long, ingested_at timestamp"
    rejects = spark.createDataFrame(
        [("not_json", 0, 5, None), ("not_json", 0, 12, None), ("not_json", 1, 2, None),
         ("wrong_type: uid", 0, 7, None), ("update_time_out_of_range", 0, 8, None)],
        schema,
    )  # fmt: skip
    facts = spark.createDataFrame([(0, 7)], "kafka_partition int, kafka_offset long")

    def candidates(reasons=(), stored=None):
        chosen = not_replayed(rejects, facts, reasons, None, {0: 10, 1: 1} if stored is None else stored)
        return sorted((r["kafka_partition"], r["kafka_offset"]) for r in chosen.collect())

    assert candidates() == [
        (0, 5)
    ]  # 12 and (1, 2) are past the stored offsets; 7 is replayed; 8 is time-bound
    assert candidates(("update_time_out_of_range",)) == [(0, 8)]
    assert candidates(stored={0: 20, 1: 3}) == [(0, 5), (0, 12), (1, 2)]


def test_an_ingest_validates_past_a_replay_only_below_its_own_offsets() -> None:
    from jobs.common.lake_tables import OFFSETS_KEY, REPLAY_KEY, replayed_below

    replay = {REPLAY_KEY: json.dumps({"id": "r", "below": {"0": 10, "1": 4}})}
    assert replayed_below(replay, {0: 10, 1: 9})
    assert not replayed_below(replay, {0: 9, 1: 9})  # one row at the ingest's offset 9: it reads it again
    assert not replayed_below(replay, {0: 10})  # a partition the ingest has not read
    assert not replayed_below({**replay, OFFSETS_KEY: "{}"}, {0: 10, 1: 9})  # an ingest's commit
    assert not replayed_below({REPLAY_KEY: json.dumps({"id": "r"})}, {0: 10})  # an earlier format: no bounds
    assert not replayed_below({}, {0: 10})
    # A click repair (`verify --repair`) below the ingest's offsets is passed the same way; a
    # dimension's repair names no bounds.
    from jobs.common.lake_tables import REPAIR_KEY

    repair = {REPAIR_KEY: json.dumps({"id": "v", "ranges": {"0": [[3, 9]]}, "below": {"0": 10}})}
    assert replayed_below(repair, {0: 10}) and not replayed_below(repair, {0: 9})
    assert not replayed_below({REPAIR_KEY: json.dumps({"id": "v", "keys": 3})}, {0: 10})
