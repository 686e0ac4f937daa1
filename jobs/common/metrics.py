"""Per-batch job metrics, the same on both sides: CloudWatch (namespace `Lakehouse/<env>`,
dimensions Job and Table) on AWS, a JSON file in the stack's home locally (`lakehouse local status`).

A sink never fails a job: whatever it raises is logged at most once a minute and the figures are
dropped (counted). The CloudWatch sink sends from a background thread, batched, so a slow or
unreachable CloudWatch never holds a batch back.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

FLUSH_SECONDS = 20.0
MAX_DATA_PER_CALL = 1000  # PutMetricData's limit per request
MAX_QUEUED = 20_000  # beyond this (CloudWatch away for long) the oldest figures are dropped


@dataclass(frozen=True)
class BatchMetrics:
    job: str  # cdc | ingest | views
    table: str  # the table the batch committed to (namespace.name)
    records_in: int
    batch_seconds: float
    commit_seconds: float
    rejects: int = 0
    # now minus the newest event/change time applied; None when the batch had no timed record
    lag_seconds: float | None = None
    # ingest only: Kafka end offset minus the committed offset, per partition
    offset_lag: dict[int, int] = field(default_factory=dict)
    at: float = field(default_factory=time.time)


class MetricsSink(Protocol):
    def record(self, batch: BatchMetrics) -> None: ...

    def close(self) -> None: ...


class _Quiet:
    """Logs a sink's failures at most once a minute, with how many batches were dropped."""

    def __init__(self, what: str) -> None:
        self.what, self.dropped, self._last = what, 0, 0.0

    def failed(self, exc: BaseException, dropped: int = 1) -> None:
        self.dropped += dropped
        now = time.monotonic()
        if now - self._last >= 60:
            self._last = now
            log.warning("%s failed (%s); %d batches' figures dropped so far", self.what, exc, self.dropped)


class NoMetrics:
    def record(self, batch: BatchMetrics) -> None:
        pass

    def close(self) -> None:
        pass


NO_METRICS = NoMetrics()


class _Guarded:
    """Any sink, made safe for a job's batch loop: what it raises is logged, never propagated."""

    def __init__(self, sink: MetricsSink) -> None:
        self._sink = sink
        self._quiet = _Quiet(f"metrics sink {type(sink).__name__}")

    def record(self, batch: BatchMetrics) -> None:
        try:
            self._sink.record(batch)
        except Exception as exc:  # noqa: BLE001 - figures never fail the job
            self._quiet.failed(exc)

    def close(self) -> None:
        try:
            self._sink.close()
        except Exception as exc:  # noqa: BLE001
            self._quiet.failed(exc, dropped=0)


def guarded(sink: MetricsSink) -> MetricsSink:
    return sink if isinstance(sink, _Guarded | NoMetrics) else _Guarded(sink)


def metric_data(batch: BatchMetrics) -> list[dict]:
    """CloudWatch MetricData for one batch (names, units and dimensions the dashboard and the
    alarms of infra/constructs/monitoring.py read)."""
    dimensions = [{"Name": "Job", "Value": batch.job}, {"Name": "Table", "Value": batch.table}]
    at = batch.at

    def datum(name: str, value: float, unit: str, dims: list[dict] = dimensions) -> dict:
        return {"MetricName": name, "Dimensions": dims, "Timestamp": at, "Value": float(value), "Unit": unit}

    data = [
        datum("RecordsIn", batch.records_in, "Count"),
        datum("Rejects", batch.rejects, "Count"),
        datum("BatchDuration", batch.batch_seconds, "Seconds"),
        datum("CommitDuration", batch.commit_seconds, "Seconds"),
        datum("Commits", 1, "Count"),
    ]
    if batch.lag_seconds is not None:
        data.append(datum("LagSeconds", batch.lag_seconds, "Seconds"))
    if batch.offset_lag:
        data.append(datum("OffsetLag", max(batch.offset_lag.values()), "Count"))
        data += [
            datum("PartitionOffsetLag", lag, "Count", [*dimensions, {"Name": "Partition", "Value": str(p)}])
            for p, lag in sorted(batch.offset_lag.items())
        ]
    return data


class CloudWatchSink:
    """PutMetricData from a background thread, every FLUSH_SECONDS, up to 1000 data per call."""

    def __init__(self, namespace: str, region: str | None, client=None, flush_seconds: float = FLUSH_SECONDS):
        self.namespace = namespace
        self._client, self._region = client, region
        self._queue: queue.Queue[dict] = queue.Queue(MAX_QUEUED)
        self._quiet = _Quiet(f"PutMetricData to {namespace}")
        self._stop = threading.Event()
        self._flush_seconds = flush_seconds
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)
        self._thread.start()

    def record(self, batch: BatchMetrics) -> None:
        try:
            for datum in metric_data(batch):
                self._queue.put_nowait(datum)
        except queue.Full as exc:
            self._quiet.failed(exc)
        except Exception as exc:  # noqa: BLE001 - figures never fail the job
            self._quiet.failed(exc)

    def _run(self) -> None:
        while not self._stop.wait(self._flush_seconds):
            self.flush()
        self.flush()

    def flush(self) -> None:
        data: list[dict] = []
        while True:
            try:
                data.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for start in range(0, len(data), MAX_DATA_PER_CALL):
            chunk = data[start : start + MAX_DATA_PER_CALL]
            try:
                if self._client is None:
                    import boto3

                    self._client = boto3.client("cloudwatch", region_name=self._region)
                self._client.put_metric_data(Namespace=self.namespace, MetricData=chunk)
            except Exception as exc:  # noqa: BLE001 - CloudWatch away: drop, say so, keep going
                self._quiet.failed(exc, dropped=len(chunk))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


class LocalFileSink:
    """The latest figures per table, in one JSON file (written atomically) for `local status`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._quiet = _Quiet(f"writing {path}")

    def record(self, batch: BatchMetrics) -> None:
        try:
            with self._lock:
                latest = read_local_metrics(self.path)
                # A snapshot's commits beside the table's own job, not over its figures.
                key = batch.table if batch.job != "cdc-snapshot" else f"{batch.table} (snapshot)"
                latest[key] = {
                    **asdict(batch),
                    "offset_lag": {str(p): n for p, n in batch.offset_lag.items()},
                }
                scratch = self.path.with_suffix(f".{os.getpid()}.tmp")
                scratch.write_text(json.dumps(latest, indent=1, sort_keys=True))
                scratch.replace(self.path)
        except Exception as exc:  # noqa: BLE001 - figures never fail the job
            self._quiet.failed(exc)

    def close(self) -> None:
        pass


def read_local_metrics(path: Path) -> dict[str, dict]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def metrics_sink_for(config) -> MetricsSink:
    """The sink of the job's environment: CloudWatch on AWS, the stack's metrics file locally."""
    if config.env == "local":  # beside the catalog file, in the stack's home
        return LocalFileSink(Path(config.catalog.sqlite_path).with_name("metrics.json"))
    return CloudWatchSink(f"Lakehouse/{config.env}", config.region)
