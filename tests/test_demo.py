"""`lakehouse demo` (what `make demo` runs): a short run of the whole scenario on a fresh stack of
its own (as after a fresh clone) exits 0 and leaves a consistent lake behind."""

from __future__ import annotations

import collections
import json
import re

import pytest
from support import private_stack_env, run_cli

from lakehouse.local.catalog import pyiceberg_catalog

pytestmark = pytest.mark.stack


@pytest.fixture
def demo_env(tmp_path):
    env = private_stack_env(tmp_path / "demo-home")
    yield env
    run_cli("local", "down", "--purge", env=env, check=False)


def test_short_demo_runs_the_scenario_end_to_end(demo_env, tmp_path):
    # 12 s of clicks: the scenario's steps all run; the 2 minutes of `make demo` only add volume.
    result = run_cli("demo", "--seconds", "12", "--rate", "200", timeout=900, check=False, env=demo_env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for stage in ("1/7", "2/7", "3/7", "4/7", "5/7", "6/7", "7/7", "demo summary", "demo done"):
        assert stage in out
    assert "memberLevel=2" in out  # the source system's UPDATE reached dim_db.user_member

    home = tmp_path / "demo-home"
    catalog = pyiceberg_catalog(home / "catalog.db", home / "warehouse")
    views = catalog.load_table("ads_behavior.product_views").scan().to_arrow().to_pylist()
    clicks = catalog.load_table("ods_behavior.clickevent").scan().to_arrow().to_pylist()
    rejects = catalog.load_table("ods_behavior.clickevent_rejects").scan().to_arrow().to_pylist()

    # Compared with what went in: every record in the topic (read back by a plain consumer) is in
    # exactly one of the two tables, exactly once, and the views count the clicks per product.
    sent = read_topic(f"127.0.0.1:{demo_env['LAKEHOUSE_KAFKA_PORT']}", "clicktopic")
    landed = collections.Counter((r["kafka_partition"], r["kafka_offset"]) for r in clicks + rejects)
    assert landed == collections.Counter(sent.keys()), (len(sent), sum(landed.values()))
    # The summary's counts are the tables' (the 30 warm-up events, all valid, are not in them).
    shown = {
        label: int(re.search(rf"{re.escape(label)}\s*│\s*([\d,]+)", out).group(1).replace(",", ""))
        for label in (
            "events produced",
            "events in (ods_behavior.clickevent)",
            "rejects (ods_behavior.clickevent_rejects)",
        )
    }
    assert shown["events in (ods_behavior.clickevent)"] == len(clicks) - 30
    assert shown["rejects (ods_behavior.clickevent_rejects)"] == len(rejects)
    assert len(clicks) - 30 + len(rejects) == shown["events produced"] == 2400
    for row in clicks:
        assert (
            row["productId"] == json.loads(sent[(row["kafka_partition"], row["kafka_offset"])])["productId"]
        )
    # The views count exactly the clicks, per product and price.
    counted = collections.Counter()
    for r in views:
        counted[(r["productId"], r["product_price"])] += r["views"]
    assert +counted == collections.Counter((r["productId"], r["product_price"]) for r in clicks)
    assert len(clicks) > 0
    # ... and per product, the clicks the topic holds (read back by the plain consumer).
    per_product = collections.Counter()
    for r in views:
        per_product[r["productId"]] += r["views"]
    fact_keys = [(r["kafka_partition"], r["kafka_offset"]) for r in clicks]
    assert +per_product == collections.Counter(json.loads(sent[k])["productId"] for k in fact_keys)
    # The price change reached the dimension, once. (Whether new clicks already carry it depends on
    # how fast CDC applied it within the 12 s stream: a timing, measured by the demo and the bench,
    # not asserted here; test_product_views checks the price change deterministically.)
    products = catalog.load_table("dim_db.products").scan().to_arrow().to_pylist()
    assert [float(p["product_price"]) for p in products if p["productId"] == "1"] == [8.1]
    report = catalog.load_table("ads_behavior.member_daily_report").scan().to_arrow()
    assert report.num_rows > 0


def read_topic(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes]:
    """Every record of `topic`, read from offset 0 until a poll comes back empty (the local broker's
    watermarks cannot be trusted); keyed by (partition, offset)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "demo-test", "enable.auto.commit": False}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: dict[tuple[int, int], bytes] = {}
        while messages := consumer.consume(10_000, timeout=3):
            for m in messages:
                if m.error() is None:
                    records[(m.partition(), m.offset())] = m.value()
        return records
    finally:
        consumer.close()
