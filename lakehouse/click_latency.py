"""Click latency (the demo's freshness figure): produced -> visible in the click table, per event.

Each ingest commit's summary carries the Kafka offsets it covers (`lakehouse.kafka.offsets`), so an
event (partition, offset) became visible at the commit time of the first snapshot whose end offset
for its partition is past it. Reading only metadata, this costs nothing per event on the lake side.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque

from jobs.common.lake_tables import OFFSETS_KEY, offsets_from_summary


class ClickLatencyTracker:
    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._pending: dict[int, deque[tuple[int, float]]] = {}
        self._lock = threading.Lock()
        self._seen_snapshots: set[int] = set()
        self.latencies: list[float] = []

    def produced(self, partition: int, offset: int, produced_at: float) -> None:
        """Producer delivery callback: deliveries per partition arrive in offset order."""
        with self._lock:
            self._pending.setdefault(partition, deque()).append((offset, produced_at))

    def observe(self, snapshots) -> None:
        """Feed pyiceberg snapshots (any order, repeats fine) of the click table."""
        fresh = sorted(
            (s for s in snapshots if s.snapshot_id not in self._seen_snapshots), key=lambda s: s.timestamp_ms
        )
        for snapshot in fresh:
            self._seen_snapshots.add(snapshot.snapshot_id)
            value = snapshot.summary.additional_properties.get(OFFSETS_KEY) if snapshot.summary else None
            committed_at = snapshot.timestamp_ms / 1000
            ends = offsets_from_summary(value, self.topic)
            with self._lock:
                for partition, end in ends.items():
                    queue = self._pending.get(partition)
                    while queue and queue[0][0] < end:
                        _, produced_at = queue.popleft()
                        self.latencies.append(max(0.0, committed_at - produced_at))

    @property
    def waiting(self) -> int:
        """Events delivered to Kafka and not yet visible in the table."""
        with self._lock:
            return sum(len(q) for q in self._pending.values())

    def percentiles(self) -> tuple[float, float] | None:
        """(p50, p95) seconds, or None before the first visible event."""
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return statistics.median(ordered), ordered[int(0.95 * (len(ordered) - 1))]
