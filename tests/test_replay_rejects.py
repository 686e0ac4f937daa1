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

    views_table = f"lakehouse.ads_behavior.views_{case.fact.rsplit('_', 1)[-1]}"
    views = ProductViews(spark, ViewsSettings(f"lakehouse.{case.fact}", views_table))
    views.prepare()
    assert views.run_batch() > 0

    replay = [
        "replay-rejects",
        "--fact-table",
        f"lakehouse.{case.fact}",
        "--rejects-table",
        f"lakehouse.{case.rejects}",
    ]
    facts_before = lineage(case.rows(case.fact, pyiceberg_catalog))
    killed = run_cli(*replay, check=False, env={**os.environ, "LAKEHOUSE_CRASH_AT": "replay.before-commit"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert lineage(case.rows(case.fact, pyiceberg_catalog)) == facts_before  # nothing landed
    killed = run_cli(*replay, check=False, env={**os.environ, "LAKEHOUSE_CRASH_AT": "replay.after-commit"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert lineage(case.rows(case.fact, pyiceberg_catalog)) == facts_before + fixed  # all landed, once

    settings = ReplaySettings(
        f"lakehouse.{case.fact}", f"lakehouse.{case.rejects}", lake_config.table("dim_db", "products")
    )
    again = replay_rejects(spark, settings)
    assert again.replayed == 0 and not again.passing  # the replayed are done; the malformed still fail
    assert sum(again.considered.values()) == sum(1 for _, _, p in delivered if kind[p] != VALID)

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
