"""`lakehouse gendata`: produce ClickEvents (and, on request, malformed records) to Kafka.

acks=all, idempotent on MSK (plain retries on the local broker: see KafkaConfig), batches lingering
100 ms; deterministic content with --seed (event times too with
--start-ms); --rate paces the stream; --bad-ratio mixes in every malformed kind the ingest rejects.
Works against the local broker and MSK (TLS + IAM), chosen by the environment's config.
"""

from __future__ import annotations

import json
import random
import string
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from jobs.config import LakehouseConfig

UIDS = ("513248", "10952", "555655", "795098", "603670", "10001")
FIELDS = ("webpageId", "uid", "productId", "cookieId", "expendTime", "updateTime")
VALID = "valid"
# One generator per reject reason of the ingest job (see jobs/ingest/validation.py).
MALFORMED_KINDS = (
    "not_json",
    "not_object",
    "missing_field",
    "null_field",
    "wrong_type",
    "payload_too_large",
    "not_utf8",
    "update_time_too_old",
    "update_time_in_future",
)
DAY_MS = 24 * 3600 * 1000
FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01: always "more than a day ahead", and deterministic


@dataclass(frozen=True)
class GeneratedRecord:
    payload: bytes
    kind: str  # VALID or one of MALFORMED_KINDS


@dataclass
class ProduceSummary:
    sent: int = 0
    failed: int = 0
    elapsed_seconds: float = 0.0
    # (partition, offset, kind) of every delivered record, when asked for (tests, --manifest).
    delivered: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.sent / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0


def click_event(rng: random.Random, update_time_ms: int) -> dict:
    return {
        "webpageId": rng.randint(10, 99),
        "uid": rng.choice(UIDS),
        "productId": str(rng.randint(0, 19)),
        "cookieId": "".join(rng.choices(string.ascii_letters, k=15)),
        "expendTime": rng.randint(0, 19),
        "updateTime": update_time_ms,
    }


def _json(document: object) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def malformed_payload(kind: str, rng: random.Random, event: dict) -> bytes:
    """A record the ingest must reject with reason `kind` (built from a valid `event`)."""
    name = rng.choice(FIELDS)
    if kind == "not_json":
        return _json(event)[: rng.randint(1, 20)] + b"}}garbage"
    if kind == "not_object":
        return _json(rng.choice([[event], "click", 42, None]))
    if kind == "missing_field":
        return _json({k: v for k, v in event.items() if k != name})
    if kind == "null_field":
        return _json({**event, name: None})
    if kind == "wrong_type":
        wrong = str(event[name]) if isinstance(event[name], int) else rng.choice([7, True, [1], {"x": 1}])
        return _json({**event, name: wrong})
    if kind == "payload_too_large":
        return _json({**event, "padding": "x" * (64 * 1024 + rng.randint(1, 1000))})
    if kind == "not_utf8":
        return _json(event)[:-2] + b'\xff\xfe"}'
    if kind == "update_time_too_old":
        return _json({**event, "updateTime": 946_684_800_000 - rng.randint(1, 10**9)})
    if kind == "update_time_in_future":
        return _json({**event, "updateTime": FAR_FUTURE_MS + rng.randint(0, DAY_MS)})
    raise ValueError(f"unknown malformed kind {kind!r}")


def generate_records(
    count: int, seed: int | None = None, bad_ratio: float = 0.0, start_ms: int | None = None, step_ms: int = 1
) -> Iterator[GeneratedRecord]:
    """`count` records; content is a function of `seed` (and of `start_ms` for event times)."""
    rng = random.Random(seed)
    for i in range(count):
        update_time = start_ms + i * step_ms if start_ms is not None else int(time.time() * 1000)
        event = click_event(rng, update_time)
        if bad_ratio > 0 and rng.random() < bad_ratio:
            kind = MALFORMED_KINDS[rng.randrange(len(MALFORMED_KINDS))]
            yield GeneratedRecord(malformed_payload(kind, rng, event), kind)
        else:
            yield GeneratedRecord(_json(event), VALID)


PRODUCER_LINGER_MS = 100


def producer_config(config: LakehouseConfig, bootstrap: str | None = None) -> dict[str, object]:
    from jobs.common.kafka_client import kafka_client_config

    props = kafka_client_config(config.kafka)
    if bootstrap:
        props["bootstrap.servers"] = bootstrap
    props.update(
        {
            "enable.idempotence": config.kafka.idempotent_producer,
            "acks": "all",
            # Fewer, fuller batches: the local broker stores each produced batch as one object and
            # its reads slow down with the object count (5 ms: ~4.5 records per batch at 2,000/s,
            # 30k records read at 2.1k/s; 100 ms: ~66 per batch, read at 100k/s). At most 0.1 s
            # added to freshness; MSK takes fewer, larger requests too.
            "linger.ms": PRODUCER_LINGER_MS,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
            "compression.type": "lz4",
            # As idempotence would: a few requests in flight per connection (librdkafka's plain
            # default is 1,000,000, which stalled the local broker for 60 s in a demo run).
            "max.in.flight.requests.per.connection": 5,
        }
    )
    return props


def produce(
    producer_props: dict[str, object],
    topic: str,
    records: Iterator[GeneratedRecord],
    count: int,
    rate: float | None = None,
    record_deliveries: bool = False,
    progress: bool = False,
    on_delivered: Callable[[int, int, float], None] | None = None,
    stop: threading.Event | None = None,
) -> ProduceSummary:
    """Send `records` round-robin over the topic's partitions; waits for every delivery report.

    `on_delivered(partition, offset, produced_at)` is called per delivered record (wall-clock time
    of the produce call, for freshness); `stop` ends the run early (what was sent is still flushed).
    """
    from confluent_kafka import KafkaException, Producer

    producer = Producer(producer_props)
    try:
        partitions = sorted(producer.list_topics(topic, timeout=10).topics[topic].partitions)
    except (KafkaException, KeyError) as exc:
        raise SystemExit(
            f"topic {topic!r} not reachable at {producer_props['bootstrap.servers']}: {exc}. "
            "Is the stack up? (`lakehouse local up`)"
        ) from exc
    if not partitions:
        raise SystemExit(f"topic {topic!r} does not exist: run `lakehouse local up` to create it")
    summary = ProduceSummary()

    def delivered(error, message, kind: str, produced_at: float) -> None:
        if error is not None:
            summary.failed += 1
            return
        summary.sent += 1
        if record_deliveries:
            summary.delivered.append((message.partition(), message.offset(), kind))
        if on_delivered is not None:
            on_delivered(message.partition(), message.offset(), produced_at)

    bar = _progress_bar(count) if progress else None
    began = time.monotonic()
    for i, record in enumerate(records):
        if stop is not None and stop.is_set():
            break
        if rate:
            ahead = began + i / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        produced_at = time.time()
        while True:
            try:
                producer.produce(
                    topic,
                    record.payload,
                    partition=partitions[i % len(partitions)],
                    on_delivery=lambda err, msg, k=record.kind, at=produced_at: delivered(err, msg, k, at),
                )
                break
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.05)
        producer.poll(0)
        if bar is not None and i % 1000 == 0:
            bar[0].update(bar[1], completed=i)
    remaining = producer.flush(120)
    summary.failed += remaining
    summary.elapsed_seconds = time.monotonic() - began
    if bar is not None:
        bar[0].update(bar[1], completed=count)
        bar[0].stop()
    return summary


def _progress_bar(total: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn("producing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), transient=True
    )
    progress.start()
    return progress, progress.add_task("produce", total=total)
