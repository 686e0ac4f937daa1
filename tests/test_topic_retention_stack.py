"""The topic retention against the real broker, ingest and catalog: batches go only once the lake
holds them, the broker serves what is left, and the lake still gets every record exactly once."""

from __future__ import annotations

import logging
from collections import Counter

from confluent_kafka import Producer
from ingest_case import PARTITIONS, Case

from jobs.common.run_modes import RunMode, StopRequest, run_batches
from jobs.gendata.generator import VALID, generate_records, producer_config
from lakehouse.local.object_store import BROKER_BUCKET
from lakehouse.local.topic_retention import RetentionSettings, TopicRetention, lake_reader, stored_offsets


def _produce_one_batch_each(case: Case, records) -> list[tuple[int, int, str]]:
    """Each record flushed alone, so each is one batch object: (partition, offset, kind)."""
    producer = Producer({**producer_config(case.config), "linger.ms": 0})
    delivered = []

    def on_delivery(err, msg):
        assert err is None, err
        delivered.append((msg.partition(), msg.offset(), kind))

    for index, record in enumerate(records):
        kind = record.kind
        producer.produce(case.topic, record.payload, partition=index % PARTITIONS, on_delivery=on_delivery)
        assert producer.flush(15) == 0
    return delivered


def _stored_batches(local_stack, topic: str) -> dict[int, int]:
    return local_stack.broker.stored_batches(local_stack.saved_secrets(), topic)


def test_read_batches_go_and_the_lake_still_gets_every_record_once(
    spark, lake_config, local_stack, pyiceberg_catalog, caplog, monkeypatch
):
    case = Case(lake_config, "retention")
    settings = RetentionSettings(topic=case.topic, tables=(case.fact, case.rejects), keep_batches=2)
    s3 = local_stack.object_store.client(local_stack.saved_secrets())
    retention = TopicRetention(s3, BROKER_BUCKET, lake_reader(pyiceberg_catalog, settings), settings)

    first = _produce_one_batch_each(case, generate_records(60, seed=26, bad_ratio=0.1))
    assert retention.run_once() == {}  # nothing is read yet: nothing goes
    assert _stored_batches(local_stack, case.topic) == {0: 20, 1: 20, 2: 20}

    caplog.set_level(logging.INFO)
    # The ingest commits the facts at once and holds the rejects (and their offsets) until a clean
    # stop: what the rejects table has not stored is not read yet, so nothing goes.
    ingest = case.new_ingest(spark, rejects_commit_seconds=3600)
    run_batches(ingest.run_batch, RunMode(0.2, True, 1.5), StopRequest())
    assert stored_offsets(pyiceberg_catalog, case.fact, case.topic) == {0: 20, 1: 20, 2: 20}
    assert stored_offsets(pyiceberg_catalog, case.rejects, case.topic) == {}
    assert retention.run_once() == {}
    ingest.finish()  # commits the held rejects and their offsets
    # Each partition: 20 one-record batches, all read; the newest 2 stay.
    assert retention.run_once() == {0: 18, 1: 18, 2: 18}
    assert _stored_batches(local_stack, case.topic) == {0: 2, 1: 2, 2: 2}

    second = _produce_one_batch_each(case, generate_records(30, seed=27, bad_ratio=0.1))
    case.ingest_in_process(spark)  # reads on from the lake's offsets, past the deleted batches

    delivered = first + second
    facts = case.rows(case.fact, pyiceberg_catalog)
    rejects = case.rows(case.rejects, pyiceberg_catalog)
    assert Counter((r["kafka_partition"], r["kafka_offset"]) for r in facts) == Counter(
        (p, o) for p, o, kind in delivered if kind == VALID
    )
    assert Counter((r["kafka_partition"], r["kafka_offset"]) for r in rejects) == Counter(
        (p, o) for p, o, kind in delivered if kind != VALID
    )
    assert not [r for r in caplog.records if "DATA LOST" in r.getMessage()]

    # verify past the retention (issue 51, item 4): the offsets the broker deleted are checked within
    # the lake, so a row lost there is named, though the topic can no longer show it.
    def verify_clicks():
        from dataclasses import replace

        from jobs.common import lake_tables
        from jobs.verify.__main__ import verify_clicks

        monkeypatch.setattr(lake_tables, "FACT_TABLE", tuple(case.fact.split(".")))
        monkeypatch.setattr(lake_tables, "REJECTS_TABLE", tuple(case.rejects.split(".")))
        config = replace(lake_config, kafka=replace(lake_config.kafka, topic=case.topic))
        return verify_clicks(spark, config)

    clean = verify_clicks()
    assert clean.status == "ok" and clean.compared == len(delivered), clean
    assert "partition 0: offsets 0-17 are no longer in the topic; checked within the lake" in clean.notes[0]
    # Not a partition's first offset (the check starts at the lake's first one): one in the middle.
    lost = next(r for r in facts if 5 <= r["kafka_offset"] < 15)
    pyiceberg_catalog.load_table(case.fact).delete(
        f"kafka_partition = {lost['kafka_partition']} AND kafka_offset = {lost['kafka_offset']}"
    )
    (finding,) = verify_clicks().findings
    assert finding.kind == "missing offsets no longer in the topic"
    assert finding.examples == (f"partition {lost['kafka_partition']}: {lost['kafka_offset']}",)
