"""Clickstream ingest benchmark on a private local stack (own home and ports).

Measures, in one run: the raw Kafka consume rate (one confluent-kafka consumer, the ceiling), the
ingest throughput on a backlog, and freshness (produced -> visible in the table's current snapshot)
at a steady produce rate. Sizes: BENCH_BACKLOG (default 1,000,000), BENCH_RATE (5000 events/s),
BENCH_FRESHNESS_SECONDS (30).
"""

from __future__ import annotations

import os
import threading
import time

from bench.private_stack import percentiles, private_stack, row

TARGET_THROUGHPUT = 100_000
TARGET_RATIO = 0.3
TARGET_P95_SECONDS = 3.0


def _create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep it alive until the future resolves
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)


def raw_consume_rate(bootstrap: str, topic: str, expected: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-raw", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    read, began, last = 0, time.monotonic(), time.monotonic()
    while read < expected:
        messages = consumer.consume(10_000, timeout=2.0)
        if not messages:
            break
        read += len(messages)
        last = time.monotonic()
    consumer.close()
    return read / (last - began)


def _ingest(spark, config, topic: str, fact: str, max_records: int):
    from jobs.clickstream.kafka_source import FetchSettings
    from jobs.clickstream_ingest import ClickstreamIngest, IngestSettings
    from jobs.common.run_modes import StopRequest

    settings = IngestSettings(
        topic=topic,
        fact_table=fact,
        rejects_table=f"{fact}_rejects",
        products_table=config.table("dim_db", "products"),
        fetch=FetchSettings(max_records_per_partition=max_records),
    )
    stop = StopRequest()
    ingest = ClickstreamIngest(spark, config, settings, stop)
    ingest.prepare()
    return ingest, stop


def backlog_throughput(spark, config, topic: str, backlog: int) -> tuple[float, int]:
    ingest, _ = _ingest(spark, config, topic, config.table("ods_behavior", "bench_backlog"), 200_000)
    handled, busy = 0, 0.0
    while handled < backlog:
        began = time.monotonic()
        records = ingest.run_batch()
        if not records:
            break
        busy += time.monotonic() - began
        handled += records
    return handled / busy, ingest.batches


def freshness(spark, config, catalog, rate: float, seconds: float) -> list[float]:
    from confluent_kafka import Producer

    from jobs.clickstream_ingest import offsets_from_summary
    from jobs.common.run_modes import RunMode, run_batches
    from lakehouse.gendata import generate_records, producer_config

    topic = "bench_fresh"
    _create_topic(config.kafka.bootstrap, topic)
    fact = config.table("ods_behavior", "bench_fresh")
    ingest, stop = _ingest(spark, config, topic, fact, 50_000)
    job = threading.Thread(target=run_batches, args=(ingest.run_batch, RunMode(0.5), stop), daemon=True)
    job.start()

    sent: dict[tuple[int, int], float] = {}  # (partition, offset) -> produce time (epoch s)
    visible: dict[int, list[tuple[float, int]]] = {0: [], 1: [], 2: []}  # when offsets became visible
    done = threading.Event()

    def watch() -> None:
        table = catalog.load_table("ods_behavior.bench_fresh")
        while not done.is_set():
            table.refresh()
            snapshot = table.current_snapshot()
            if snapshot is not None:
                now = time.time()
                value = snapshot.summary.additional_properties.get("lakehouse.kafka.offsets")
                for partition, end in offsets_from_summary(value, topic).items():
                    if not visible[partition] or visible[partition][-1][1] < end:
                        visible[partition].append((now, end))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    producer = Producer(producer_config(config) | {"linger.ms": 1})
    count = int(rate * seconds)
    began = time.monotonic()
    for i, record in enumerate(generate_records(count, seed=7)):
        ahead = began + i / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        produced_at = time.time()
        producer.produce(
            topic,
            record.payload,
            partition=i % 3,
            on_delivery=lambda err, msg, t=produced_at: sent.__setitem__((msg.partition(), msg.offset()), t),
        )
        producer.poll(0)
    producer.flush(30)
    time.sleep(5)
    done.set()
    stop.set()
    job.join(60)
    watcher.join(5)
    latencies = []
    for (partition, offset), produced_at in sent.items():
        seen = next((t for t, end in visible[partition] if end > offset), None)
        if seen is not None:
            latencies.append(seen - produced_at)
    return latencies


def run() -> list[dict]:
    backlog = int(os.environ.get("BENCH_BACKLOG", "1000000"))
    rate = float(os.environ.get("BENCH_RATE", "5000"))
    fresh_seconds = float(os.environ.get("BENCH_FRESHNESS_SECONDS", "30"))
    with private_stack("clickstream") as stack:
        from jobs.clickstream_ingest import job_spark_conf
        from jobs.spark_session import build_spark
        from lakehouse.config import LakehouseConfig
        from lakehouse.gendata import generate_records, produce, producer_config
        from lakehouse.local.catalog import pyiceberg_catalog

        config = LakehouseConfig.local(stack.settings.home)
        topic = "bench_backlog"
        _create_topic(config.kafka.bootstrap, topic)
        summary = produce(producer_config(config), topic, generate_records(backlog, seed=1), backlog)
        raw = raw_consume_rate(config.kafka.bootstrap, topic, backlog)
        spark = build_spark(config, "clickstream-bench", job_spark_conf())
        throughput, batches = backlog_throughput(spark, config, topic, backlog)
        catalog = pyiceberg_catalog(stack.settings.catalog_path, stack.settings.warehouse)
        latencies = freshness(spark, config, catalog, rate, fresh_seconds)
        spark.stop()
    p50, p95 = percentiles(latencies)
    return [
        row("produce rate (gendata, setup)", f"{summary.rate:,.0f} ev/s"),
        row("raw consume rate (ceiling)", f"{raw:,.0f} ev/s"),
        row(
            f"ingest throughput, {backlog:,} backlog ({batches} batches)",
            f"{throughput:,.0f} ev/s",
            f">= {TARGET_THROUGHPUT:,} ev/s",
            throughput >= TARGET_THROUGHPUT,
        ),
        row(
            "ingest / raw consume",
            f"{throughput / raw:.2f}x",
            f">= {TARGET_RATIO}x",
            throughput / raw >= TARGET_RATIO,
        ),
        row(f"freshness p50 at {rate:,.0f} ev/s ({len(latencies):,} events)", f"{p50:.2f} s"),
        row(
            f"freshness p95 at {rate:,.0f} ev/s",
            f"{p95:.2f} s",
            f"<= {TARGET_P95_SECONDS} s",
            p95 <= TARGET_P95_SECONDS,
        ),
    ]
