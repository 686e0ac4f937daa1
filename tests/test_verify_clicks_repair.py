"""`lakehouse verify --repair` of the click tables (issue 51, item 2) against the real broker,
ingest, views job and catalog.

The tables are damaged the way a faulty ingest would (commits that carry the ingest's offsets, so
the ingest resumes past them): fact and reject rows deleted, some stored twice. The view counts
the damaged table. Then, while an ingest process keeps reading a producer that keeps producing,
the repair runs in a process killed -9 between its two tables' commits, and again to its end.
Compared as multisets with what the producer delivered: every record in exactly one table once, the
view equal to the GROUP BY of the facts, verify clean, and the ingest never stopped.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime

import pytest
from ingest_case import Case

from jobs.common.run_modes import RunMode, StopRequest, run_batches
from jobs.gendata.generator import VALID, generate_records

pytestmark = pytest.mark.stack

# The repair as `lakehouse verify --repair` runs it, on this test's tables (argv: fact, rejects,
# views, topic): the verify CLI has no table options, so the tables' names are patched here.
REPAIR_PROCESS = """
import dataclasses, os, sys
from jobs.common import lake_tables
from jobs.common.spark_session import build_spark, stop_spark
from jobs.config import LakehouseConfig
from jobs.verify.__main__ import repaired_clicks
fact, rejects, views, topic = sys.argv[1:]
lake_tables.FACT_TABLE = tuple(fact.split("."))
lake_tables.REJECTS_TABLE = tuple(rejects.split("."))
lake_tables.VIEWS_TABLE = tuple(views.split("."))
config = LakehouseConfig.local(os.environ["LAKEHOUSE_HOME"])
config = dataclasses.replace(config, kafka=dataclasses.replace(config.kafka, topic=topic))
spark = build_spark(config, "verify")
try:
    print(repaired_clicks(spark, config))
finally:
    stop_spark(spark)
"""


def lineage(rows: list[dict]) -> Counter:
    return Counter((r["kafka_partition"], r["kafka_offset"]) for r in rows)


def damage(spark, table: str, statement: str) -> None:
    """A commit as a faulty ingest would make it: with the ingest's stored offsets unchanged."""
    from jobs.common.lake_tables import OFFSETS_KEY
    from jobs.common.snapshot_progress import progress_as_of, with_snapshot_properties

    stored = progress_as_of(spark, table, None, OFFSETS_KEY)
    with_snapshot_properties(spark, {OFFSETS_KEY: stored}, lambda: spark.sql(statement.format(t=table)))


def sent_fields(sent_at: dict, row: dict, fields: tuple) -> tuple:
    document = json.loads(sent_at[row["kafka_partition"], row["kafka_offset"]])
    return tuple(document[f] for f in fields)


def as_utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)


def raw_text(payload: bytes, reject: dict) -> str:
    return base64.b64encode(payload).decode() if reject["payload_is_base64"] else payload.decode()


def wait_for_a_commit(spark, table: str, ingest: subprocess.Popen) -> None:
    """Until the ingest process commits (its stored offsets move on), a liveness wait."""
    from jobs.common.lake_tables import OFFSETS_KEY
    from jobs.common.snapshot_progress import progress_as_of

    before, deadline = progress_as_of(spark, table, None, OFFSETS_KEY), time.monotonic() + 180
    while progress_as_of(spark, table, None, OFFSETS_KEY) == before:
        assert ingest.poll() is None, ingest.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the ingest committed nothing in 180 s"
        time.sleep(1)


def test_verify_repair_reads_missing_offsets_again_and_removes_duplicates_beside_a_running_ingest(
    spark, lake_config, pyiceberg_catalog, monkeypatch
) -> None:
    from dataclasses import replace

    from jobs.common import lake_tables
    from jobs.common.lake_tables import REPAIR_KEY, load_iceberg_table
    from jobs.verify.__main__ import repaired_clicks, verify_clicks, verify_views
    from jobs.views.job import ProductViews, ViewsSettings

    case = Case(lake_config, "repair")
    fact, rejects = f"lakehouse.{case.fact}", f"lakehouse.{case.rejects}"
    records = list(generate_records(1500, seed=71, bad_ratio=0.1))
    kind = {r.payload: r.kind for r in records}
    delivered = case.produce([r.payload for r in records])
    ingest = case.new_ingest(spark, rejects_commit_seconds=0.0, read_by="driver")
    run_batches(ingest.run_batch, RunMode(0.2, True, 1.5), StopRequest())
    ingest.finish()

    # Lost: valid and invalid records of two partitions; doubled: rows of both tables.
    damage(spark, fact, "DELETE FROM {t} WHERE kafka_partition = 0 AND kafka_offset BETWEEN 100 AND 139")
    damage(spark, fact, "DELETE FROM {t} WHERE kafka_partition = 2 AND kafka_offset % 50 = 7")
    damage(spark, rejects, "DELETE FROM {t} WHERE kafka_partition = 1")
    damage(spark, fact, "INSERT INTO {t} SELECT * FROM {t} WHERE kafka_partition = 1 AND kafka_offset < 60")
    damage(spark, rejects, "INSERT INTO {t} SELECT * FROM {t} WHERE kafka_partition = 2")
    payload_at = {(p, o): payload for p, o, payload in delivered}
    held = lineage(case.rows(case.fact, pyiceberg_catalog))
    held += lineage(case.rows(case.rejects, pyiceberg_catalog))
    lost = {k for k in payload_at if k not in held}
    doubled = sum(n - 1 for n in lineage(case.rows(case.fact, pyiceberg_catalog)).values())
    assert len(lost) > 40 and doubled > 40
    assert {kind[payload_at[k]] == VALID for k in lost} == {True, False}  # both tables lost rows

    views_table = f"lakehouse.ads_behavior.views_{case.fact.rsplit('_', 1)[-1]}"
    views = ProductViews(spark, ViewsSettings(fact, views_table))
    views.prepare()
    assert views.run_batch() > 0  # it counts the doubled rows: the view agrees with its table

    monkeypatch.setattr(lake_tables, "FACT_TABLE", tuple(case.fact.split(".")))
    monkeypatch.setattr(lake_tables, "REJECTS_TABLE", tuple(case.rejects.split(".")))
    monkeypatch.setattr(lake_tables, "VIEWS_TABLE", tuple(views_table.split(".")[1:]))
    config = replace(lake_config, kafka=replace(lake_config.kafka, topic=case.topic))
    found = {f.kind: f.count for f in verify_clicks(spark, config).findings}
    assert found["missing offsets"] == len(lost) and found["duplicate offsets"] > 40, found

    # Beside a running ingest that keeps committing what a producer keeps sending.
    more: list[tuple] = []
    stop_producing = threading.Event()

    def producer() -> None:
        seed = 100
        while not stop_producing.is_set():
            batch = [r.payload for r in generate_records(40, seed=seed)]
            kind.update({payload: VALID for payload in batch})
            more.extend(case.produce(batch))
            seed += 1
            stop_producing.wait(0.5)

    running = case.start_job()
    producing = threading.Thread(target=producer, daemon=True)
    producing.start()
    try:
        wait_for_a_commit(spark, fact, running)  # running before the repair starts
        repair_began = datetime.now(UTC)
        tables = [case.fact, case.rejects, views_table.removeprefix("lakehouse."), case.topic]
        killed = subprocess.run(
            [sys.executable, "-c", REPAIR_PROCESS, *tables],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "LAKEHOUSE_CRASH_AT": "verify.clicks-repair.between-tables"},
        )
        assert killed.returncode == -9, killed.stderr[-3000:]
        facts = lineage(case.rows(case.fact, pyiceberg_catalog))
        assert all(facts[k] == 1 for k in lost if kind[payload_at[k]] == VALID), "fact commit landed"
        assert max(facts.values()) == 1
        rejects_now = lineage(case.rows(case.rejects, pyiceberg_catalog))
        assert not any(rejects_now[k] for k in lost), "the rejects' commit had not landed at the kill"

        result = repaired_clicks(spark, config)
        assert result.status == "ok", result
        assert result.repaired > 0 and result.notes[0].startswith("repaired "), result
        wait_for_a_commit(spark, fact, running)  # the ingest validated past the repair's commits
    finally:
        stop_producing.set()
        producing.join(timeout=30)
        running.send_signal(signal.SIGTERM)
        _, errors = running.communicate(timeout=120)
    assert running.returncode == 0, errors[-3000:]  # the ingest validated past the repair commits
    assert more, "the producer sent nothing while the repair ran"

    ingest = case.new_ingest(spark, rejects_commit_seconds=0.0, read_by="driver")
    run_batches(ingest.run_batch, RunMode(0.2, True, 1.5), StopRequest())
    ingest.finish()
    while views.run_batch():
        pass

    everything = [*delivered, *more]
    expected_facts = Counter((p, o) for p, o, payload in everything if kind[payload] == VALID)
    expected_rejects = Counter((p, o) for p, o, payload in everything if kind[payload] != VALID)
    facts = case.rows(case.fact, pyiceberg_catalog)
    assert lineage(facts) == expected_facts
    rejected = case.rows(case.rejects, pyiceberg_catalog)
    assert lineage(rejected) == expected_rejects
    # And with what was sent: the rows read again are the records, not just their offsets.
    sent_at = {(p, o): payload for p, o, payload in everything}
    fields = ("webpageId", "uid", "productId", "cookieId", "expendTime")
    # A reject read again carries its record's Kafka time (replay-rejects bounds updateTime by it).
    late = [r for r in rejected if (r["kafka_partition"], r["kafka_offset"]) in lost]
    assert late and all(as_utc(r["ingested_at"]) < repair_began for r in late)
    unlike = [r for r in facts if tuple(r[f] for f in fields) != sent_fields(sent_at, r, fields)]
    assert not unlike, unlike[:3]
    unlike = [
        r
        for r in rejected
        if r["raw_payload"] != raw_text(sent_at[r["kafka_partition"], r["kafka_offset"]], r)
    ]
    assert not unlike, unlike[:3]
    groups = Counter((r["productId"], r["name"], r["product_price"]) for r in facts if r["uid"] is not None)
    view = pyiceberg_catalog.load_table(views_table.removeprefix("lakehouse."))
    rows = view.scan().to_arrow().to_pylist()
    counted = {(r["productId"], r["name"], r["product_price"]): r["views"] for r in rows}
    assert counted == dict(groups)
    assert verify_clicks(spark, config).status == "ok"
    assert verify_views(spark, config).status == "ok"

    repairs = [
        json.loads(s.summary()[REPAIR_KEY])
        for s in load_iceberg_table(spark, fact).snapshots()
        if s.summary().get(REPAIR_KEY) is not None
    ]
    valid_lost = sorted(k for k in lost if kind[payload_at[k]] == VALID)
    assert len(repairs) == 1 and (repairs[0]["added"], repairs[0]["removed"]) == (len(valid_lost), doubled)
    assert int(repairs[0]["below"]["1"]) <= 60 and "1" in repairs[0]["ranges"], repairs
