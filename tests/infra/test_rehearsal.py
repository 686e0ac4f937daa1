"""`make rehearse` on the synthesized dev assembly: the steps the deployment would submit, run on a
Spark standalone cluster from the packaged artifact, checked against what went in."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.stack
@pytest.mark.timeout(900)
def test_the_rehearsal_runs_every_step_of_the_dev_deployment(dev, tmp_path):
    command = ["-m", "lakehouse.rehearsal", "--assembly", str(dev.outdir), "--work-dir", str(tmp_path)]
    result = subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, timeout=880, cwd=tmp_path
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    for step in ("gendata", "streaming", "report", "maintain", "verify"):
        assert any(
            line.startswith(f"step lakehouse-{step}") and ": exit 0 in" in line
            for line in output.splitlines()
        )
    assert "verified: 2000 facts + 3 rejects against 2003 topic records" in output
    # The product's own reconciliation ran on the cluster's terms and found the lake equal to its sources.
    for check in ("kafka -> clicks", "mysql -> dimension dim_db.products", "clicks -> views"):
        assert re.search(rf"verify step: {check}.*: ok, [1-9]\d* compared", output), check
    assert "Iceberg catalog implementation: org.apache.iceberg.aws.glue.GlueCatalog -> " in output
    assert "rehearsal passed" in output
    # Every job was imported from its step's unpacked archive (the rehearsal checks each step's log).
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "steps").glob("*/std*"))
    for job in ("gendata", "streaming", "report", "maintain", "verify"):
        assert f"emr_step: running {job} from {tmp_path}/steps/" in logs


def test_an_alarm_watching_a_metric_no_job_publishes_is_found(dev):
    """The rehearsal's check of what the alarms and the dashboard watch (lakehouse/rehearsal/
    watched_metrics.py), on the dev templates: a job that renames a dimension value, or an alarm that
    names fewer dimensions than the job sends, silences the alarm, and the check says which."""
    import copy

    from lakehouse.rehearsal import watched_metrics

    namespace = "Lakehouse/dev"
    watched = {metric for _, metric in watched_metrics.watched(dev.templates, namespace)}
    assert len(watched) >= 12
    as_published = [
        {"MetricName": name, "Dimensions": [{"Name": k, "Value": v} for k, v in dims if k != "*"]}
        for name, dims in watched
    ]
    assert watched_metrics.unpublished(dev.templates, namespace, as_published) == []

    renamed = [  # a job that started writing the click table's name differently
        {
            **m,
            "Dimensions": [
                {**d, "Value": d["Value"].replace("clickevent", "click_event")} for d in m["Dimensions"]
            ],
        }
        for m in as_published
    ]
    problems = watched_metrics.unpublished(dev.templates, namespace, renamed)
    assert any("alarm PipelineHealthFreshnessodsbehaviorclickevent" in p for p in problems), problems
    assert any("alarm PipelineHealthRejectsRatio" in p for p in problems), problems

    templates = copy.deepcopy(dev.templates)
    for resource in templates["Monitoring"]["Resources"].values():
        if resource["Properties"].get("MetricName") == "ReconcileMismatches":
            resource["Properties"]["Dimensions"].append({"Name": "Table", "Value": "all"})
    problems = watched_metrics.unpublished(templates, namespace, as_published)
    assert len(problems) == 1 and problems[0].startswith("alarm PipelineHealthReconcileMismatches"), problems
    assert "ReconcileMismatches {'Job': 'verify', 'Table': 'all'}, which no job published" in problems[0]
