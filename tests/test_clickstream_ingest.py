"""The ingest job against the real local stack: gendata -> Kafka -> ingest -> Iceberg, read back.

Every test uses its own topic and tables, so the tests are independent of each other and of
whatever else the session's stack holds.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from datetime import UTC, datetime

import pytest
from ingest_case import DAY_MS, SEED_PRODUCT_NAMES, Case, assert_exactly_once, drain, keys, wait_for_line

from jobs.gendata.generator import VALID, generate_records

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def catalog(pyiceberg_catalog):
    return pyiceberg_catalog


# ---- tests -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("read_by", ["driver", "tasks"])
def test_gendata_to_ingest_rows_match_what_was_produced(spark, lake_config, catalog, caplog, read_by):
    """Both ways of reading a batch (the driver for small ones, tasks for a backlog) land every
    produced record once, with its fields."""
    case = Case(lake_config, f"e2e_{read_by}")
    records = list(generate_records(3000, seed=11, bad_ratio=0.1))
    delivered = case.produce([r.payload for r in records])
    payload_kind = {r.payload: r.kind for r in records}
    delivered = [(p, o, payload_kind[raw], raw) for p, o, raw in delivered]

    with caplog.at_level("INFO", logger="clickstream_ingest"):
        assert case.ingest_in_process(spark, read_by=read_by) == 3000
    batches = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch ")]
    assert batches and all(line.endswith(f"read_by={read_by}") for line in batches)

    assert_exactly_once(case, catalog, delivered)
    fact = {(r["kafka_partition"], r["kafka_offset"]): r for r in case.rows(case.fact, catalog)}
    for partition, offset, kind, raw in delivered:
        if kind != VALID:
            continue
        sent = json.loads(raw)
        row = fact[(partition, offset)]
        event_time = datetime.fromtimestamp(sent["updateTime"] / 1000, UTC)
        assert (row["webpageId"], row["uid"], row["productId"], row["cookieId"], row["expendTime"]) == (
            sent["webpageId"],
            sent["uid"],
            sent["productId"],
            sent["cookieId"],
            sent["expendTime"],
        )
        assert row["eventTime"] == event_time
        assert row["dt"] == event_time.strftime("%Y%m%d")
        # Left join: ids 1..9 are in the seed products; 0 and 10..19 are unknown and keep the event.
        assert row["name"] == SEED_PRODUCT_NAMES.get(sent["productId"])
        assert (row["product_price"] is None) == (sent["productId"] not in SEED_PRODUCT_NAMES)
    rejects = {(r["kafka_partition"], r["kafka_offset"]): r for r in case.rows(case.rejects, catalog)}
    for partition, offset, kind, raw in delivered:
        if kind != VALID:
            reject = rejects[(partition, offset)]
            stored = reject["raw_payload"].encode() if not reject["payload_is_base64"] else None
            assert stored is None or stored == raw

    # A second run finds nothing new: replays are harmless.
    assert case.ingest_in_process(spark, idle_seconds=0.5, read_by=read_by) == 0
    assert_exactly_once(case, catalog, delivered)


def test_once_the_driver_reads_the_batches_planning_asks_the_broker_for_no_watermark(
    spark, lake_config, catalog, monkeypatch
):
    """The driver's kept readers know each partition's watermark from their last fetch response:
    a steady stream's batches are planned without a request per partition (50-400 ms of a batch
    on a busy box), and still read everything below it."""
    case = Case(lake_config, "cached_hw")
    first = case.produce([r.payload for r in generate_records(300, seed=3, bad_ratio=0.0)])
    ingest = case.new_ingest(spark, read_by="driver")
    handled, deadline = 0, time.monotonic() + 60
    while handled < 300 and time.monotonic() < deadline:
        handled += ingest.run_batch()
    assert handled == 300

    asked: list[list[int]] = []
    broker_watermarks = ingest._metadata.high_watermarks
    monkeypatch.setattr(
        ingest._metadata,
        "high_watermarks",
        lambda topic, partitions: asked.append(partitions) or broker_watermarks(topic, partitions),
    )
    second = case.produce([r.payload for r in generate_records(300, seed=4, bad_ratio=0.0)])
    deadline = time.monotonic() + 60
    while handled < 600 and time.monotonic() < deadline:
        handled += ingest.run_batch()
    ingest.finish()
    assert handled == 600 and asked == []
    assert_exactly_once(case, catalog, [(p, o, VALID, raw) for p, o, raw in first + second])


def test_every_malformed_kind_lands_in_rejects_with_its_reason(spark, lake_config, catalog):
    case = Case(lake_config, "malformed")
    now = int(time.time() * 1000)
    good = {
        "webpageId": 12,
        "uid": "513248",
        "productId": "3",
        "cookieId": "abcdefghijklmno",
        "expendTime": 3,
        "updateTime": now,
    }
    missing = {k: v for k, v in good.items() if k != "cookieId"}
    cases = {
        b"this is not json": "not_json",
        b'["an", "array"]': "not_object: list",
        json.dumps(missing).encode(): "missing_field: cookieId",
        json.dumps({**good, "uid": None}).encode(): "null_field: uid",
        json.dumps({**good, "expendTime": "3"}).encode(): "wrong_type: expendTime is str, not int",
        json.dumps({**good, "pad": "x" * 70_000}).encode(): "payload_too_large",
        b'{"uid": "\xc3\x28"}': "not_utf8",
        json.dumps({**good, "updateTime": 900_000_000_000}).encode(): "update_time_out_of_range",
        json.dumps({**good, "updateTime": now + 2 * DAY_MS}).encode(): "update_time_out_of_range",
        json.dumps({**good, "productId": "12345"}).encode(): None,  # unknown product: kept
    }
    delivered = case.produce(list(cases))
    case.ingest_in_process(spark)

    rejects = {(r["kafka_partition"], r["kafka_offset"]): r for r in case.rows(case.rejects, catalog)}
    fact = {(r["kafka_partition"], r["kafka_offset"]): r for r in case.rows(case.fact, catalog)}
    for partition, offset, raw in delivered:
        reason = cases[raw]
        if reason is None:
            row = fact[(partition, offset)]
            assert (row["productId"], row["name"], row["product_price"]) == ("12345", None, None)
            continue
        reject = rejects.pop((partition, offset))
        assert reject["reason"] == reason
        if reason == "not_utf8":
            import base64

            assert reject["payload_is_base64"] and base64.b64decode(reject["raw_payload"]) == raw
        else:
            assert not reject["payload_is_base64"] and reject["raw_payload"].encode() == raw
    assert not rejects and len(fact) == 1


def test_late_event_lands_in_its_event_day_partition(spark, lake_config):
    case = Case(lake_config, "late")
    now = int(time.time() * 1000)
    late_ms = now - 3 * DAY_MS
    event = {
        "webpageId": 40,
        "uid": "10952",
        "productId": "5",
        "cookieId": "latelatelatelat",
        "expendTime": 1,
        "updateTime": late_ms,
    }
    on_time = {**event, "updateTime": now, "cookieId": "ontimeontimeont"}
    case.produce([json.dumps(on_time).encode(), json.dumps(event).encode()])
    case.ingest_in_process(spark)

    late_day = datetime.fromtimestamp(late_ms / 1000, UTC).date()
    rows = spark.sql(
        f"SELECT dt, _partition.eventTime_day AS day FROM lakehouse.{case.fact} "
        "WHERE cookieId = 'latelatelatelat'"
    ).collect()
    assert [(r["dt"], r["day"]) for r in rows] == [(late_day.strftime("%Y%m%d"), late_day)]
    # Partitioned by event day, not by processing day: two days -> two partitions.
    assert spark.sql(f"SELECT count(*) FROM lakehouse.{case.fact}.partitions").collect()[0][0] == 2


def test_exactly_once_when_the_job_is_killed_mid_stream(lake_config, catalog):
    case = Case(lake_config, "kill9")
    produced: list = []
    producer = threading.Thread(
        target=lambda: produced.extend(case.produce_generated(12_000, seed=5, bad_ratio=0.1, rate=1500)),
        daemon=True,
    )
    producer.start()
    small_batches = ("--max-records-per-partition", "400", "--trigger-seconds", "0.2")
    commits = 0
    for kill_after in (14, 12):  # twice: a restart after a restart resumes too
        job = case.start_job(*small_batches)
        seen: list[str] = []
        wait_for_line(job, "committed=fact", 120, seen)  # a batch of this run reached the lake
        time.sleep(kill_after - 10)
        assert job.poll() is None, "".join(seen)[-3000:]  # killed mid-stream, not after it ended
        job.kill()  # SIGKILL: no chance to finish the batch
        assert job.wait(30) == -signal.SIGKILL
        # Each run committed something before it died: the restarts resume from stored offsets.
        now = len(catalog.load_table(case.fact).snapshots())
        assert now > commits
        commits = now
    producer.join(120)
    final = case.start_job("--until-idle", "--idle-seconds", "2")
    _, stderr = final.communicate(timeout=240)
    assert final.returncode == 0, stderr[-3000:]
    assert len(produced) == 12_000
    assert_exactly_once(case, catalog, produced)


def test_sigterm_finishes_and_commits_the_current_batch(lake_config, catalog, tmp_path):
    """SIGTERM arrives while the first batch is fetched and not yet committed (a test hook holds the
    job there); the job must commit that batch, rejects included, and stop with exit 0."""
    from jobs.common.lake_tables import OFFSETS_KEY, offsets_from_summary

    case = Case(lake_config, "sigterm")
    produced = case.produce_generated(6000, seed=8, bad_ratio=0.05)
    cap = 500
    meeting = tmp_path / "before-commit"
    meeting.mkdir()
    job = case.start_job(
        "--max-records-per-partition",
        str(cap),
        "--trigger-seconds",
        "0.5",
        env={"LAKEHOUSE_RENDEZVOUS": f"ingest.before-commit:{meeting}:2"},
    )
    deadline = time.monotonic() + 120
    while not any(meeting.iterdir()):  # the job holds its first batch, about to commit it
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
        time.sleep(0.1)
    job.send_signal(signal.SIGTERM)
    time.sleep(1)
    (meeting / "release").touch()
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == 0, stderr[-3000:]

    # The in-flight batch was committed, in one snapshot per table with the same end offsets (a
    # batch reads at most `cap` records of each partition, and may stop sooner); each table holds
    # exactly the records the producer had acknowledged below that end, each once.
    (fact_snapshot,) = catalog.load_table(case.fact).snapshots()
    end = offsets_from_summary(fact_snapshot.summary[OFFSETS_KEY], case.topic)
    assert sorted(end) == [0, 1, 2] and all(0 < o <= cap for o in end.values()), end
    rejects_summary = catalog.load_table(case.rejects).current_snapshot().summary
    assert offsets_from_summary(rejects_summary[OFFSETS_KEY], case.topic) == end
    below = [(p, o, kind) for p, o, kind in produced if o < end[p]]
    assert keys(case.rows(case.fact, catalog)) == sorted((p, o) for p, o, kind in below if kind == VALID)
    assert keys(case.rows(case.rejects, catalog)) == sorted((p, o) for p, o, kind in below if kind != VALID)


def test_partitions_added_while_ingesting_are_read_from_their_start_without_a_restart(
    spark, lake_config, catalog, monkeypatch
):
    """An operator raises the topic's partitions (infra/config.py: the capacity model) while the
    ingest runs: the running job picks the new partitions up at its next batch, from offset 0, and
    every record lands once.

    The local broker has no CreatePartitions (tansu 0.6.0: "not supported by broker"), so the topic
    is made with 5 partitions and the broker's metadata answers 3 until the moment they are "added",
    which is all a consumer can see of it on Kafka."""
    from jobs.common.run_modes import RunMode, StopRequest, run_batches
    from jobs.ingest.kafka_source import TopicMetadata

    case = Case(lake_config, "add_partitions", partitions=5)
    visible = {"count": 3}
    real_partitions = TopicMetadata.partitions
    monkeypatch.setattr(
        TopicMetadata, "partitions", lambda self, topic: real_partitions(self, topic)[: visible["count"]]
    )
    records = list(generate_records(6000, seed=43, bad_ratio=0.05))
    kinds = {r.payload: r.kind for r in records}
    payloads = [r.payload for r in records]
    ingest = case.new_ingest(spark)
    delivered: list = []
    stop = StopRequest()
    runner = threading.Thread(
        target=lambda: run_batches(ingest.run_batch, RunMode(0.2, False, 0), stop), daemon=True
    )
    runner.start()
    delivered += case.produce(payloads[:2000])
    wait_until = time.monotonic() + 120
    while len(case.rows(case.fact, catalog)) < 1000 and time.monotonic() < wait_until:
        time.sleep(0.5)  # the job has committed from the first three partitions
    visible["count"] = 5  # the partitions are added
    delivered += case.produce(payloads[2000:], partitions=5)
    assert {p for p, *_ in delivered} == {0, 1, 2, 3, 4}
    valid = sum(1 for r in records if r.kind == VALID)
    wait_until = time.monotonic() + 120
    while len(case.rows(case.fact, catalog)) < valid:  # the rejects are held until the stop
        assert time.monotonic() < wait_until, "the new partitions' records never landed"
        time.sleep(0.5)
    stop.set()
    runner.join(60)
    ingest.finish()
    assert_exactly_once(case, catalog, [(p, o, kinds[raw], raw) for p, o, raw in delivered])


def test_broker_stopped_and_restarted_mid_run_loses_nothing(local_stack, lake_config, catalog):
    from lakehouse.local.settings import load_or_create_secrets

    case = Case(lake_config, "broker")
    first = case.produce_generated(3000, seed=21, bad_ratio=0.05)
    job = case.start_job("--trigger-seconds", "0.5")
    seen: list[str] = []
    try:
        wait_for_line(job, "batch 1:", 120, seen)
        local_stack.broker.stop()
        wait_for_line(job, "unavailable", 90, seen)
        local_stack.broker.start(load_or_create_secrets(local_stack.settings))
        second = case.produce_generated(3000, seed=22, bad_ratio=0.05)
        deadline = time.monotonic() + 120
        drain(job, seen)
        while time.monotonic() < deadline:
            total = len(case.rows(case.fact, catalog)) + len(case.rows(case.rejects, catalog))
            if total >= 6000:
                break
            time.sleep(1)
    finally:
        local_stack.broker.start(load_or_create_secrets(local_stack.settings))
        job.send_signal(signal.SIGTERM)
        job.wait(60)
    assert job.returncode == 0, "".join(seen)[-3000:]
    assert_exactly_once(case, catalog, first + second)


def _source_products(lake_config) -> Counter:
    """MySQL's products as a multiset of text tuples, read here rather than by the code under test."""
    import pymysql

    mysql = lake_config.mysql
    conn = pymysql.connect(
        host=mysql.host, port=mysql.port, user=mysql.user, password=mysql.password, database=mysql.database
    )
    with conn, conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(
            "SELECT CAST(productId AS CHAR), name, description, CAST(product_price AS CHAR), "
            "DATE_FORMAT(update_time, '%Y-%m-%d %H:%i:%s') FROM products"
        )
        return Counter(tuple(r) for r in cur.fetchall())


def _lake_products(spark, table: str) -> Counter:
    return Counter(
        tuple(r)
        for r in spark.sql(
            "SELECT productId, name, description, CAST(product_price AS STRING), "
            f"date_format(update_time, 'yyyy-MM-dd HH:mm:ss') FROM {table}"
        ).collect()
    )


def test_the_ingest_creates_and_loads_the_products_dimension_cdc_never_wrote(spark, lake_config):
    """No CDC yet: the ingest creates the dimension with CDC's schema and loads MySQL's products,
    each once; a second start finds it written and loads nothing more."""
    from jobs.ingest.products_dimension import ensure_products_dimension

    table = "lakehouse.dim_db.products_ingest_probe"
    spark.sql(f"DROP TABLE IF EXISTS {table}")
    source = _source_products(lake_config)
    assert sum(source.values()) >= 9, "the seed products are missing from MySQL"

    ensure_products_dimension(spark, lake_config, table)
    assert _lake_products(spark, table) == source
    ensure_products_dimension(spark, lake_config, table)
    assert _lake_products(spark, table) == source
    assert spark.sql(f"SELECT count(*) FROM {table}.snapshots").first()[0] == 1


def test_the_ingests_load_yields_to_a_cdc_snapshot_that_commits_first(spark, lake_config, monkeypatch):
    """CDC's snapshot commits while the ingest reads MySQL: the ingest's serializable overwrite fails
    validation and CDC's rows stand, once; neither doubled (an append) nor replaced (no isolation)."""
    from jobs.ingest import products_dimension

    table = "lakehouse.dim_db.products_race_probe"
    spark.sql(f"DROP TABLE IF EXISTS {table}")
    real_fetch = products_dimension.fetch_source_products

    def fetch_while_cdc_commits(config):
        rows = real_fetch(config)
        # CDC's snapshot, with its own marks so a replacement by the ingest's rows shows.
        cdc_rows = [(pid, f"cdc:{name}", desc, price, updated) for pid, name, desc, price, updated in rows]
        spark.createDataFrame(cdc_rows, products_dimension.PRODUCTS_SCHEMA).writeTo(table).append()
        return rows

    monkeypatch.setattr(products_dimension, "fetch_source_products", fetch_while_cdc_commits)
    products_dimension.ensure_products_dimension(spark, lake_config, table)

    expected = Counter(
        (pid, f"cdc:{name}", desc, price, updated)
        for pid, name, desc, price, updated in _source_products(lake_config)
    )
    assert _lake_products(spark, table) == expected
    assert spark.sql(f"SELECT count(*) FROM {table}.snapshots").first()[0] == 1
