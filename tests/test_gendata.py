"""`lakehouse gendata`: deterministic content, every malformed kind, and the real command."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from support import run_cli

from jobs.gendata.generator import MALFORMED_KINDS, UIDS, VALID, generate_records
from jobs.ingest.validation import ClickEvent, Rejected, classify_payload


def test_same_seed_gives_the_same_records():
    first = list(generate_records(500, seed=42, bad_ratio=0.2, start_ms=1_763_700_000_000))
    second = list(generate_records(500, seed=42, bad_ratio=0.2, start_ms=1_763_700_000_000))
    other = list(generate_records(500, seed=43, bad_ratio=0.2, start_ms=1_763_700_000_000))
    assert first == second
    assert first != other


def test_valid_events_follow_the_clickevent_shape():
    for record in generate_records(300, seed=1, start_ms=1_763_700_000_000, step_ms=10):
        event = json.loads(record.payload)
        assert record.kind == VALID
        assert 10 <= event["webpageId"] <= 99 and 0 <= event["expendTime"] <= 19
        assert event["uid"] in UIDS and event["productId"] in {str(i) for i in range(20)}
        assert len(event["cookieId"]) == 15 and event["cookieId"].isalpha()


def test_bad_ratio_mixes_every_malformed_kind_and_the_validator_rejects_each():
    # The ingest itself rejecting gendata's kinds: tests/test_clickstream_ingest.py (end to end).
    records = list(generate_records(3000, seed=3, bad_ratio=0.3))
    bad = [r for r in records if r.kind != VALID]
    assert {r.kind for r in bad} == set(MALFORMED_KINDS)
    assert 0.25 < len(bad) / len(records) < 0.35
    now_ms = int(time.time() * 1000)
    expected_prefix = {
        "update_time_too_old": "update_time_out_of_range",
        "update_time_in_future": "update_time_out_of_range",
    }
    for record in records:
        result = classify_payload(record.payload, now_ms)
        if record.kind == VALID:
            assert isinstance(result, ClickEvent)
        else:
            assert isinstance(result, Rejected)
            assert result.reason.startswith(expected_prefix.get(record.kind, record.kind))


@pytest.mark.stack
def test_gendata_command_sends_and_summarises(local_stack, tmp_path):
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"gendata_{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": local_stack.broker.bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(timeout=30)
    manifest = tmp_path / "sent.csv"
    result = run_cli(
        "gendata",
        "--count",
        "2000",
        "--seed",
        "9",
        "--bad-ratio",
        "0.1",
        "--rate",
        "4000",
        "--topic",
        topic,
        "--manifest",
        str(manifest),
        "--start-ms",  # fixed event times: the content is then a function of the seed alone
        "1763700000000",
    )
    assert "sent=2000 failed=0" in result.stderr and "events/s" in result.stderr
    lines = manifest.read_text().splitlines()[1:]
    assert len(lines) == 2000
    kinds = [line.split(",")[2] for line in lines]
    assert kinds.count(VALID) == sum(r.kind == VALID for r in generate_records(2000, seed=9, bad_ratio=0.1))
    partitions = {line.split(",")[0] for line in lines}
    assert partitions == {"0", "1", "2"}
    # The topic read back holds exactly what the manifest says was delivered, and those payloads
    # are the seeded records, each once.
    from collections import Counter

    from lakehouse.rehearsal.checks import read_topic

    stored = read_topic(local_stack.broker.bootstrap, topic, 3)
    assert sorted(stored) == sorted((int(line.split(",")[0]), int(line.split(",")[1])) for line in lines)
    expected = Counter(
        r.payload for r in generate_records(2000, seed=9, bad_ratio=0.1, start_ms=1763700000000)
    )
    assert Counter(stored.values()) == expected
