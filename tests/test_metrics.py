"""Job metrics: the CloudWatch payload a batch produces, the batched sink against moto's CloudWatch,
the local file `lakehouse local status` reads, and sinks that fail without failing the job."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from jobs.common.metrics import (
    MAX_DATA_PER_CALL,
    BatchMetrics,
    CloudWatchSink,
    LocalFileSink,
    guarded,
    metric_data,
    read_local_metrics,
)

INGEST = BatchMetrics(
    job="ingest",
    table="ods_behavior.clickevent",
    records_in=900,
    rejects=12,
    batch_seconds=2.5,
    commit_seconds=1.25,
    lag_seconds=3.0,
    offset_lag={0: 10, 1: 0, 2: 4},
    at=1_700_000_000.0,
)


def test_a_batch_is_these_metrics_with_job_and_table_dimensions() -> None:
    data = {
        (d["MetricName"], tuple((x["Name"], x["Value"]) for x in d["Dimensions"])): d
        for d in metric_data(INGEST)
    }
    base = (("Job", "ingest"), ("Table", "ods_behavior.clickevent"))
    expected = {
        "RecordsIn": (900, "Count"),
        "Rejects": (12, "Count"),
        "BatchDuration": (2.5, "Seconds"),
        "CommitDuration": (1.25, "Seconds"),
        "Commits": (1, "Count"),
        "LagSeconds": (3.0, "Seconds"),
        "OffsetLag": (10, "Count"),
    }
    for name, (value, unit) in expected.items():
        datum = data[(name, base)]
        assert (datum["Value"], datum["Unit"], datum["Timestamp"]) == (value, unit, INGEST.at)
    for partition, lag in INGEST.offset_lag.items():
        assert data[("PartitionOffsetLag", (*base, ("Partition", str(partition))))]["Value"] == lag
    assert len(data) == len(expected) + 3


def test_a_batch_without_timed_records_reports_no_lag() -> None:
    names = {
        d["MetricName"] for d in metric_data(BatchMetrics("views", "ads_behavior.product_views", 5, 1.0, 0.5))
    }
    assert "LagSeconds" not in names and "OffsetLag" not in names


@mock_aws
def test_the_cloudwatch_sink_sends_batched_figures_to_the_env_namespace() -> None:
    client = boto3.client("cloudwatch", region_name="us-east-1")
    sink = CloudWatchSink("Lakehouse/dev", "us-east-1", client=client, flush_seconds=3600)
    for _ in range(120):  # 120 batches x 10 data: more than one PutMetricData call
        sink.record(INGEST)
    calls = []
    real_put = client.put_metric_data
    client.put_metric_data = lambda **kw: (calls.append(len(kw["MetricData"])), real_put(**kw))
    sink.close()
    assert sum(calls) == 1200 and max(calls) <= MAX_DATA_PER_CALL and len(calls) == 2
    listed = client.list_metrics(Namespace="Lakehouse/dev", MetricName="RecordsIn")["Metrics"]
    assert listed[0]["Dimensions"] == [
        {"Name": "Job", "Value": "ingest"},
        {"Name": "Table", "Value": "ods_behavior.clickevent"},
    ]


def test_cloudwatch_away_drops_the_figures_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    class Unreachable:
        def put_metric_data(self, **_):
            raise ConnectionError("could not connect to the endpoint URL")

    sink = CloudWatchSink("Lakehouse/dev", "us-east-1", client=Unreachable(), flush_seconds=3600)
    sink.record(INGEST)
    sink.close()
    assert "PutMetricData to Lakehouse/dev failed" in caplog.text
    assert caplog.text.count("failed") == 1


def test_the_local_file_keeps_the_latest_batch_per_table(tmp_path) -> None:
    sink = LocalFileSink(tmp_path / "metrics.json")
    sink.record(INGEST)
    sink.record(BatchMetrics("cdc", "dim_db.products", 3, 0.4, 0.3, lag_seconds=1.5, at=1_700_000_010.0))
    sink.record(BatchMetrics("cdc", "dim_db.products", 7, 0.5, 0.2, lag_seconds=0.5, at=1_700_000_020.0))
    # A (re-)snapshot's commits of the same table do not hide the CDC job's lag.
    sink.record(BatchMetrics("cdc-snapshot", "dim_db.products", 200_000, 2.0, 1.2, at=1_700_000_030.0))
    latest = read_local_metrics(tmp_path / "metrics.json")
    assert set(latest) == {"ods_behavior.clickevent", "dim_db.products", "dim_db.products (snapshot)"}
    assert latest["dim_db.products"]["lag_seconds"] == 0.5
    assert latest["dim_db.products (snapshot)"]["records_in"] == 200_000
    assert latest["dim_db.products"]["records_in"] == 7 and latest["dim_db.products"]["at"] == 1_700_000_020.0
    assert latest["ods_behavior.clickevent"]["offset_lag"] == {"0": 10, "1": 0, "2": 4}


def test_a_raising_sink_is_logged_once_and_never_propagates(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def record(self, batch):
            raise RuntimeError("disk full")

        def close(self):
            raise RuntimeError("disk full")

    sink = guarded(Broken())
    for _ in range(5):
        sink.record(INGEST)
    sink.close()
    assert caplog.text.count("disk full") == 1


@pytest.mark.stack
def test_the_ingest_keeps_committing_when_its_metrics_sink_raises(
    spark, lake_config, pyiceberg_catalog, tmp_path
):
    """Every batch reports to a sink that raises, then to a file: the clicks all land once, and the
    file holds the last batch's figures."""
    from ingest_case import Case, assert_exactly_once, run_until_idle

    from jobs.ingest.job import ClickstreamIngest, IngestSettings
    from jobs.ingest.kafka_source import FetchSettings

    class RaisesThenWrites:
        def __init__(self) -> None:
            self.calls, self.file = 0, LocalFileSink(tmp_path / "metrics.json")

        def record(self, batch):
            self.calls += 1
            if self.calls % 2:
                raise RuntimeError("CloudWatch throttled")
            self.file.record(batch)

        def close(self):
            pass

    case = Case(lake_config, "metrics_raise")
    delivered = case.produce_generated(3000, seed=81, bad_ratio=0.05)
    sink = RaisesThenWrites()
    settings = IngestSettings(
        topic=case.topic,
        fact_table=f"lakehouse.{case.fact}",
        rejects_table=f"lakehouse.{case.rejects}",
        products_table=lake_config.table("dim_db", "products"),
        fetch=FetchSettings(max_records_per_partition=300),
    )
    ingest = ClickstreamIngest(spark, lake_config, settings, metrics=sink)
    ingest.prepare()
    assert run_until_idle(ingest) == 3000
    assert sink.calls == ingest.batches >= 3
    assert_exactly_once(case, pyiceberg_catalog, delivered)
    figures = read_local_metrics(tmp_path / "metrics.json")[case.fact]
    assert figures["job"] == "ingest" and figures["records_in"] > 0 and figures["lag_seconds"] is not None


def test_local_status_shows_each_tables_freshness_from_the_jobs_last_batch(tmp_path) -> None:
    from rich.console import Console

    from lakehouse.cli import freshness_table, table_freshness

    sink = LocalFileSink(tmp_path / "metrics.json")
    sink.record(INGEST)
    sink.record(BatchMetrics("cdc", "dim_db.products", 2, 0.4, 0.3, lag_seconds=1.25, at=1_700_000_010.0))
    tables = table_freshness(tmp_path / "metrics.json", now=1_700_000_030.0)
    assert tables == {
        "dim_db.products": {
            "job": "cdc",
            "last_commit_age_seconds": 20.0,
            "records_last_batch": 2,
            "lag_seconds": 1.2,
            "offset_lag": None,
        },
        "ods_behavior.clickevent": {
            "job": "ingest",
            "last_commit_age_seconds": 30.0,
            "records_last_batch": 900,
            "lag_seconds": 3.0,
            "offset_lag": 14,
        },
    }
    console = Console(record=True, width=120)
    console.print(freshness_table(tables))
    text = console.export_text()
    assert "ods_behavior.clickevent" in text and "30s ago" in text and "14" in text
    assert table_freshness(tmp_path / "absent.json", now=0) == {}
