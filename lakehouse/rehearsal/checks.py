"""The rehearsal's verdicts: the lake compared with what went in (the topic read back, the source
tables re-read), as multisets. Each check returns the problems it found (empty: it holds)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC
from decimal import Decimal

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

TopicRecords = dict[tuple[int, int], bytes]  # (partition, offset) -> value


def read_topic(bootstrap: str, topic: str, partitions: int, quiet_polls: int = 3) -> TopicRecords:
    """Every record of `topic`. The local broker's watermark is unreliable, so the end is three
    empty one-second polls in a row."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "rehearsal-readback", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    records: TopicRecords = {}
    empty = 0
    try:
        while empty < quiet_polls:
            messages = consumer.consume(num_messages=10_000, timeout=1.0)
            empty = 0 if messages else empty + 1
            for message in messages:
                if message.error() is None:
                    records[(message.partition(), message.offset())] = message.value()
    finally:
        consumer.close()
    return records


def offsets(rows: list[dict]) -> Counter:
    return Counter((r["kafka_partition"], r["kafka_offset"]) for r in rows)


def check_clicks(
    topic: TopicRecords, bad: set[tuple[int, int]], facts: list[dict], rejects: list[dict]
) -> list[str]:
    """Every record of the topic is in exactly one table once: the malformed ones in rejects, the
    rest in facts with the fields they were sent with."""
    problems = []
    fact_offsets, reject_offsets = offsets(facts), offsets(rejects)
    for name, counted in (("facts", fact_offsets), ("rejects", reject_offsets)):
        twice = [k for k, n in counted.items() if n > 1]
        if twice:
            problems.append(f"{len(twice)} record(s) twice in {name}, e.g. {sorted(twice)[:3]}")
    expected_facts = set(topic) - bad
    if set(fact_offsets) != expected_facts:
        missing, extra = expected_facts - set(fact_offsets), set(fact_offsets) - expected_facts
        problems.append(f"facts: {len(missing)} sent record(s) missing, {len(extra)} not from the topic")
    if set(reject_offsets) != bad:
        problems.append(f"rejects hold {sorted(reject_offsets)} instead of the malformed {sorted(bad)}")
    sent = Counter(_sent_fields(json.loads(topic[key])) for key in expected_facts if key in topic)
    landed = Counter(_landed_fields(row) for row in facts)
    if sent != landed:
        problems.append(f"fact fields differ from what was sent: {sum((sent - landed).values())} row(s)")
    return problems


def _sent_fields(event: dict) -> tuple:
    return (event["webpageId"], event["uid"], event["productId"], event["cookieId"], event["expendTime"],
            event["updateTime"])  # fmt: skip


def _landed_fields(row: dict) -> tuple:
    """A fact row as the ClickEvent it came from (eventTime is updateTime, in UTC)."""
    event_time = row["eventTime"]
    if event_time.tzinfo is None:
        event_time = event_time.replace(tzinfo=UTC)
    update_time = round(event_time.timestamp() * 1000)
    return (row["webpageId"], row["uid"], row["productId"], row["cookieId"], row["expendTime"], update_time)


def check_dimension(name: str, source: list[dict], lake: list[dict], columns: tuple[str, ...]) -> list[str]:
    def normalized(rows: list[dict]) -> Counter:
        return Counter(tuple(_plain(r[c]) for c in columns) for r in rows)

    expected, actual = normalized(source), normalized(lake)
    if expected == actual:
        return []
    return [
        f"{name}: {sum((expected - actual).values())} source row(s) not in the lake, "
        f"{sum((actual - expected).values())} lake row(s) not in the source, e.g. "
        f"{list((expected - actual).elements())[:2]} vs {list((actual - expected).elements())[:2]}"
    ]


def _plain(value):
    if isinstance(value, Decimal):
        return value.normalize()
    return None if value is None else str(value) if not isinstance(value, int | float) else value


def check_views(facts: list[dict], views: list[dict]) -> list[str]:
    """product_views counts each product's clicks once: per product, the sum of its groups' views
    equals its clicks in the fact table (itself checked against the topic)."""
    clicks = Counter(str(r["productId"]) for r in facts)
    counted: Counter = Counter()
    for row in views:
        counted[str(row["productId"])] += int(row["views"])
    if clicks == counted:
        return []
    return [f"product_views: {dict(counted - clicks)} counted too often, {dict(clicks - counted)} missing"]


def check_report(facts: list[dict], report: list[dict], days=None) -> list[str]:
    """Each day the report was run for (`days`; None: every day with clicks) reports exactly that
    day's clicks, a day with clicks missing from the report included; no other day is reported."""
    clicks = Counter(r["eventTime"].date() for r in facts)
    reported: Counter = Counter()
    for row in report:
        reported[row["report_date"]] += int(row["events"])
    wanted = set(clicks) if days is None else set(days)
    problems = []
    for day in sorted(wanted | set(reported)):
        if day not in wanted:
            problems.append(f"report {day}: reported, but the report was not run for that day")
        elif day not in reported and clicks[day]:
            problems.append(f"report {day}: missing, {clicks[day]} clicks that day")
        elif reported[day] != clicks[day]:
            problems.append(f"report {day}: {reported[day]} events reported, {clicks[day]} clicks that day")
    if not reported:
        problems.append("the report table is empty")
    return problems
