"""The Monitoring stack's dashboard and pipeline alarms, with each threshold per environment."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match


def alarms(env) -> dict[str, dict]:
    """Alarm description prefix -> properties, for the pipeline's alarms."""
    found = {}
    for resource in env.templates["Monitoring"]["Resources"].values():
        if resource["Type"] == "AWS::CloudWatch::Alarm":
            found[resource["Properties"]["AlarmDescription"]] = resource["Properties"]
    return found


def alarm_about(env, text: str) -> dict:
    (found,) = [props for description, props in alarms(env).items() if text in description]
    return found


@pytest.mark.parametrize(
    ("env_name", "freshness", "no_commit_seconds", "rejects", "restarts"),
    [("dev", 600, 900, 0.2, 6), ("prod", 120, 300, 0.05, 3)],
)
def test_each_pipeline_alarm_has_its_environments_threshold(
    request, env_name, freshness, no_commit_seconds, rejects, restarts
) -> None:
    env = request.getfixturevalue(env_name)
    topic = {"Ref": Match.string_like_regexp("AlertsTopic")}
    for table in (
        "ods_behavior.clickevent",
        "dim_db.products",
        "dim_db.user_member",
        "ads_behavior.product_views",
    ):
        props = alarm_about(env, f"{table} is more than {freshness} s behind")
        assert props["Threshold"] == freshness and props["MetricName"] == "LagSeconds"
        assert props["Namespace"] == f"Lakehouse/{env_name}"
        assert props["AlarmActions"][0]["Ref"].startswith("MonitoringAlertsTopic")
    no_commit = alarm_about(env, "had no commit for")
    expressions = json.dumps(no_commit["Metrics"])
    assert "FILL(commits, 0) == 0" in expressions and "BytesInPerSec" in expressions
    assert {m["Id"]: m for m in no_commit["Metrics"]}["commits"]["MetricStat"]["Period"] == no_commit_seconds
    assert alarm_about(env, "of the clicks rejected")["Threshold"] == rejects
    assert alarm_about(env, "restarted failed streaming steps")["Threshold"] == restarts
    lag = alarm_about(env, "the ingest is 84 h behind")
    assert lag["Threshold"] == 168 * 3600 // 2 and lag["MetricName"] == "LagSeconds"
    assert topic  # every alarm above goes to the alerts topic (checked on the freshness ones)


def test_the_dashboard_shows_freshness_events_cdc_lag_restarts_msk_and_rds(synthesized) -> None:
    (dashboard,) = [
        r
        for r in synthesized.templates["Monitoring"]["Resources"].values()
        if r["Type"] == "AWS::CloudWatch::Dashboard"
    ]
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for title in (
        "Freshness per table",
        "Clicks in per minute, rejects",
        "CDC changes applied and lag",
        "Kafka offset lag",
        "Streaming step restarts",
        "MSK bytes in per broker",
        "RDS CPU",
        "Pipeline alarms",
    ):
        assert title in body, title


def test_the_supervisor_counts_restarts_and_the_jobs_may_publish_only_their_namespace(synthesized) -> None:
    namespace = f"Lakehouse/{synthesized.config.env_name}"
    synthesized.template("Jobs").has_resource_properties(
        "AWS::Logs::MetricFilter",
        {
            "FilterPattern": '{ ($.action = "start") && ($.reason = "restart*") }',
            "MetricTransformations": [
                Match.object_like({"MetricName": "StreamingStepRestarts", "MetricNamespace": namespace})
            ],
        },
    )
    synthesized.template("Compute").has_resource_properties(
        "AWS::IAM::Policy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Action": "cloudwatch:PutMetricData",
                                "Condition": {"StringEquals": {"cloudwatch:namespace": namespace}},
                            }
                        )
                    ]
                )
            }
        },
    )
