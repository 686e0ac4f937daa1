"""A fresh topic and fresh ingest tables per test, and the checks the ingest tests share."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from jobs.gendata.generator import VALID, generate_records, produce, producer_config

REPO = Path(__file__).resolve().parent.parent
LAKEHOUSE_BIN = str(Path(sys.prefix) / "bin" / "lakehouse")
PARTITIONS = 3
DAY_MS = 24 * 3600 * 1000
SEED_PRODUCT_NAMES = {str(i): f"test0{i}" for i in range(1, 10)}  # MariaDB seed rows


# ---- helpers ---------------------------------------------------------------------------------------


class Case:
    """A fresh topic and fresh fact/rejects tables for one test."""

    def __init__(self, config, name: str, partitions: int = PARTITIONS) -> None:
        suffix = f"{name}_{uuid.uuid4().hex[:6]}"
        self.config = config
        self.topic = f"clicks_{suffix}"
        self.fact = f"ods_behavior.click_{suffix}"
        self.rejects = f"ods_behavior.click_rejects_{suffix}"
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
        admin.create_topics([NewTopic(self.topic, partitions, 1)])[self.topic].result(timeout=30)

    def job_args(self) -> list[str]:
        return [
            "--topic",
            self.topic,
            "--fact-table",
            f"lakehouse.{self.fact}",
            "--rejects-table",
            f"lakehouse.{self.rejects}",
        ]

    def produce(
        self, payloads: list[bytes], partition: int | None = None, partitions: int = PARTITIONS
    ) -> list[tuple[int, int, bytes]]:
        """Send round-robin over `partitions` (or all to `partition`, a hot one); returns
        (partition, offset, payload) per record."""
        from confluent_kafka import Producer

        producer = Producer(producer_config(self.config))
        delivered: list[tuple[int, int, bytes]] = []

        def on_delivery(err, msg):
            assert err is None, err
            delivered.append((msg.partition(), msg.offset(), msg.value()))

        for i, raw in enumerate(payloads):
            to = i % partitions if partition is None else partition
            producer.produce(self.topic, raw, partition=to, on_delivery=on_delivery)
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

    def new_ingest(
        self,
        spark,
        max_records_per_partition: int | None = None,
        rejects_commit_seconds: float | None = None,
        read_by: str | None = None,
        min_split_records: int | None = None,
    ):
        """The job's batch loop object, in this process (prepared: offsets read). `read_by`
        "driver" or "tasks" makes every batch read that way (default: by the batch's size)."""
        from jobs.common.run_modes import StopRequest
        from jobs.ingest.job import ClickstreamIngest, IngestSettings
        from jobs.ingest.kafka_source import FetchSettings

        fetch = FetchSettings()
        if max_records_per_partition is not None:
            fetch = dataclasses.replace(fetch, max_records_per_partition=max_records_per_partition)
        if read_by is not None:
            fetch = dataclasses.replace(fetch, driver_max_records={"driver": 10**12, "tasks": -1}[read_by])
        if min_split_records is not None:
            fetch = dataclasses.replace(fetch, min_split_records=min_split_records)
        settings = IngestSettings(
            topic=self.topic,
            fact_table=f"lakehouse.{self.fact}",
            rejects_table=f"lakehouse.{self.rejects}",
            products_table=self.config.table("dim_db", "products"),
            fetch=fetch,
        )
        if rejects_commit_seconds is not None:
            settings = dataclasses.replace(settings, rejects_commit_seconds=rejects_commit_seconds)
        ingest = ClickstreamIngest(spark, self.config, settings, StopRequest())
        ingest.prepare()
        return ingest

    def ingest_in_process(
        self, spark, idle_seconds: float = 1.5, cap: int | None = None, read_by: str | None = None
    ) -> int:
        return run_until_idle(self.new_ingest(spark, cap, read_by=read_by), idle_seconds)

    def start_job(self, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            [LAKEHOUSE_BIN, "run", "ingest", *self.job_args(), *extra],
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )


def run_until_idle(ingest, idle_seconds: float = 1.5) -> int:
    """Batches until nothing new arrived for `idle_seconds`, then a clean stop; records handled."""
    from jobs.common.run_modes import RunMode, StopRequest, run_batches

    handled = run_batches(ingest.run_batch, RunMode(0.2, True, idle_seconds), StopRequest())
    ingest.finish()
    return handled


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
