"""The ingest job against the real local stack: gendata -> Kafka -> ingest -> Iceberg, read back.

Every test uses its own topic and tables, so the tests are independent of each other and of
whatever else the session's stack holds.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lakehouse.gendata import VALID, generate_records, produce, producer_config

pytestmark = pytest.mark.stack

REPO = Path(__file__).resolve().parent.parent
LAKEHOUSE_BIN = str(Path(sys.prefix) / "bin" / "lakehouse")
PARTITIONS = 3
DAY_MS = 24 * 3600 * 1000
SEED_PRODUCT_NAMES = {str(i): f"test0{i}" for i in range(1, 10)}  # MariaDB seed rows


# ---- helpers ---------------------------------------------------------------------------------------


class Case:
    """A fresh topic and fresh fact/rejects tables for one test."""

    def __init__(self, config, name: str) -> None:
        suffix = f"{name}_{uuid.uuid4().hex[:6]}"
        self.config = config
        self.topic = f"clicks_{suffix}"
        self.fact = f"ods_behavior.click_{suffix}"
        self.rejects = f"ods_behavior.click_rejects_{suffix}"
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
        admin.create_topics([NewTopic(self.topic, PARTITIONS, 1)])[self.topic].result(timeout=30)

    def job_args(self) -> list[str]:
        return [
            "--topic",
            self.topic,
            "--fact-table",
            f"lakehouse.{self.fact}",
            "--rejects-table",
            f"lakehouse.{self.rejects}",
        ]

    def produce(self, payloads: list[bytes]) -> list[tuple[int, int, bytes]]:
        """Send round-robin over the partitions; returns (partition, offset, payload) per record."""
        from confluent_kafka import Producer

        producer = Producer(producer_config(self.config))
        delivered: list[tuple[int, int, bytes]] = []

        def on_delivery(err, msg):
            assert err is None, err
            delivered.append((msg.partition(), msg.offset(), msg.value()))

        for i, raw in enumerate(payloads):
            producer.produce(self.topic, raw, partition=i % PARTITIONS, on_delivery=on_delivery)
            producer.poll(0)
        assert producer.flush(60) == 0
        return delivered

    def produce_generated(self, count: int, seed: int, bad_ratio: float, rate: float | None = None):
        records = list(generate_records(count, seed, bad_ratio))
        summary = produce(
            producer_config(self.config), self.topic, iter(records), count, rate, record_deliveries=True
        )
        assert summary.sent == count and summary.failed == 0
        return summary.delivered

    def rows(self, table: str, catalog) -> list[dict]:
        return catalog.load_table(table).scan().to_arrow().to_pylist()

    def ingest_in_process(self, spark, idle_seconds: float = 1.5) -> int:
        from jobs.clickstream_ingest import ClickstreamIngest, IngestSettings
        from jobs.common.run_modes import RunMode, StopRequest, run_batches

        settings = IngestSettings(
            topic=self.topic,
            fact_table=f"lakehouse.{self.fact}",
            rejects_table=f"lakehouse.{self.rejects}",
            products_table=self.config.table("dim_db", "products"),
        )
        ingest = ClickstreamIngest(spark, self.config, settings, StopRequest())
        ingest.prepare()
        return run_batches(ingest.run_batch, RunMode(0.2, True, idle_seconds), StopRequest())

    def start_job(self, *extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [LAKEHOUSE_BIN, "run", "ingest", *self.job_args(), *extra],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )


def keys(rows: list[dict]) -> list[tuple[int, int]]:
    return sorted((r["kafka_partition"], r["kafka_offset"]) for r in rows)


def assert_exactly_once(case: Case, catalog, delivered: list[tuple]) -> None:
    fact_rows, reject_rows = case.rows(case.fact, catalog), case.rows(case.rejects, catalog)
    assert keys(fact_rows) == sorted((p, o) for p, o, kind, *_ in delivered if kind == VALID)
    assert keys(reject_rows) == sorted((p, o) for p, o, kind, *_ in delivered if kind != VALID)


def wait_for_line(process: subprocess.Popen, needle: str, timeout: float, seen: list[str]) -> None:
    """Read the job's stderr until a line contains `needle` (lines are kept in `seen`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            if process.poll() is not None:
                break
            continue
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"no {needle!r} in job output within {timeout}s:\n{''.join(seen[-30:])}")


def drain(process: subprocess.Popen, seen: list[str]) -> threading.Thread:
    thread = threading.Thread(target=lambda: seen.extend(process.stderr), daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def catalog(pyiceberg_catalog):
    return pyiceberg_catalog


# ---- tests -------------------------------------------------------------------------------------------


def test_gendata_to_ingest_rows_match_what_was_produced(spark, lake_config, catalog):
    case = Case(lake_config, "e2e")
    records = list(generate_records(3000, seed=11, bad_ratio=0.1))
    delivered = case.produce([r.payload for r in records])
    payload_kind = {r.payload: r.kind for r in records}
    delivered = [(p, o, payload_kind[raw], raw) for p, o, raw in delivered]

    assert case.ingest_in_process(spark) == 3000

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
    assert case.ingest_in_process(spark, idle_seconds=0.5) == 0
    assert_exactly_once(case, catalog, delivered)


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
    for kill_after in (14, 12, 13):
        job = case.start_job(*small_batches)
        seen: list[str] = []
        wait_for_line(job, "batch 1:", 120, seen)
        time.sleep(kill_after - 10)
        job.kill()  # SIGKILL: no chance to finish the batch
        job.wait(30)
    producer.join(120)
    final = case.start_job("--until-idle", "--idle-seconds", "2")
    _, stderr = final.communicate(timeout=240)
    assert final.returncode == 0, stderr[-3000:]
    assert len(produced) == 12_000
    assert_exactly_once(case, catalog, produced)


def test_sigterm_finishes_and_commits_the_current_batch(lake_config, catalog):
    case = Case(lake_config, "sigterm")
    produced = case.produce_generated(6000, seed=8, bad_ratio=0.05)
    job = case.start_job("--max-records-per-partition", "500", "--trigger-seconds", "0.5")
    seen: list[str] = []
    wait_for_line(job, "batch 1:", 120, seen)
    job.send_signal(signal.SIGTERM)
    _, rest = job.communicate(timeout=60)
    seen.append(rest)
    assert job.returncode == 0, "".join(seen)[-3000:]
    batch_lines = [line for line in "".join(seen).splitlines() if " batch " in line and "offsets=" in line]
    last_offsets = json.loads(batch_lines[-1].split("offsets=")[1].split(" commit_ms")[0])
    committed = {(p, o) for p, o, *_ in produced if o < last_offsets.get(str(p), 0)}
    assert set(keys(case.rows(case.fact, catalog)) + keys(case.rows(case.rejects, catalog))) == committed
    assert 0 < len(committed) < 6000  # it stopped mid-stream, after committing what it had read


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
