"""The Monitoring stack's dashboard and pipeline alarms, with each threshold per environment."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match

GTE, GT, LT = "GreaterThanOrEqualToThreshold", "GreaterThanThreshold", "LessThanThreshold"
CLICKS = {"Job": "ingest", "Table": "ods_behavior.clickevent"}


def metric(namespace: str, name: str, dimensions: dict, stat: str, period: int) -> tuple:
    return (namespace, name, tuple(sorted(dimensions.items())), stat, period)


def alarm_metric(env, props: dict):
    """An alarm's metric, comparable: (namespace, name, dimensions, statistic, period) for a single
    metric; for metric math {id: expression or metric} with "returned" naming what it alarms on."""

    def dimensions(dims: list[dict]) -> dict:
        return {d["Name"]: env.render("Monitoring", d["Value"]) for d in dims}

    if "Metrics" not in props:
        return metric(
            props["Namespace"],
            props["MetricName"],
            dimensions(props.get("Dimensions", [])),
            props["Statistic"],
            props["Period"],
        )
    found = {}
    for query in props["Metrics"]:
        if "Expression" in query:
            found[query["Id"]] = query["Expression"]
        else:
            stat = query["MetricStat"]
            found[query["Id"]] = metric(
                stat["Metric"]["Namespace"],
                stat["Metric"]["MetricName"],
                dimensions(stat["Metric"].get("Dimensions", [])),
                stat["Stat"],
                stat["Period"],
            )
        if query.get("ReturnData", True):
            found["returned"] = query["Id"]
    return found


def expected_alarms(env, freshness, no_commit_seconds, rejects, restarts, free_bytes, disk_percent):
    """Description -> (threshold, comparison, evaluation periods, metric) of every alarm the env has."""
    namespace = f"Lakehouse/{env.config.env_name}"
    cluster = f"lakehouse-{env.config.env_name}-msk"
    brokers = range(1, env.config.kafka.broker_count + 1)
    (instance_id,) = env.resources("SourceDatabase", "AWS::RDS::DBInstance")
    expected = {}
    for job, table in [
        ("ingest", "ods_behavior.clickevent"),
        ("cdc", "dim_db.products"),
        ("cdc", "dim_db.user_member"),
        ("views", "ads_behavior.product_views"),
    ]:
        expected[f"{table} is more than {freshness} s behind its source ({job} job)"] = (
            freshness,
            GTE,
            2,
            metric(namespace, "LagSeconds", {"Job": job, "Table": table}, "Maximum", 300),
        )
    no_commit_minutes = no_commit_seconds // 60
    bytes_in = {
        f"b{i}": metric(
            "AWS/Kafka",
            "BytesInPerSec",
            {"Cluster Name": cluster, "Broker ID": str(broker)},
            "Average",
            no_commit_seconds,
        )
        for i, broker in enumerate(brokers)
    }
    expected[f"MSK receives bytes but ods_behavior.clickevent had no commit for {no_commit_minutes} min"] = (
        1,
        GTE,
        1,
        {
            "expr_1": "IF(bytes > 0 AND FILL(commits, 0) == 0, 1, 0)",
            "returned": "expr_1",
            "commits": metric(namespace, "Commits", CLICKS, "Sum", no_commit_seconds),
            "bytes": " + ".join(f"FILL({b}, 0)" for b in bytes_in),
            **bytes_in,
        },
    )
    expected[
        f"more than {rejects:.0%} of the clicks rejected over 15 min "
        "(see ods_behavior.clickevent_rejects.reject_reason)"
    ] = (
        rejects,
        GTE,
        1,
        {
            "expr_1": "rejects / records",
            "returned": "expr_1",
            "rejects": metric(namespace, "Rejects", CLICKS, "Sum", 900),
            "records": metric(namespace, "RecordsIn", CLICKS, "Sum", 900),
        },
    )
    expected[f"the supervisor restarted failed streaming steps {restarts} or more times in an hour"] = (
        restarts,
        GTE,
        1,
        metric(namespace, "StreamingStepRestarts", {}, "Sum", 3600),
    )
    expected["the ingest is 84 h behind: at 168 h the brokers delete clicks it has not read"] = (
        168 * 3600 // 2,
        GTE,
        1,
        metric(namespace, "LagSeconds", CLICKS, "Maximum", 300),
    )
    expected[
        "`lakehouse verify` found the lake unequal to its sources: ReconcileMismatches per Table says "
        "where; the verify driver's stdout (EMR log bucket, containers/) lists offsets and keys "
        "(docs/operate.md)"
    ] = (1, GTE, 1, metric(namespace, "ReconcileMismatches", {"Job": "verify"}, "Maximum", 6 * 3600))
    expected["Source MySQL is running out of storage"] = (
        free_bytes,
        LT,
        1,
        metric(
            "AWS/RDS",
            "FreeStorageSpace",
            {"DBInstanceIdentifier": f"${{SourceDatabase/{instance_id}}}"},
            "Average",
            300,
        ),
    )
    for broker in brokers:
        expected[f"MSK broker {broker} data disk above {disk_percent}%"] = (
            disk_percent,
            GT,
            2,
            metric(
                "AWS/Kafka",
                "KafkaDataLogsDiskUsed",
                {"Cluster Name": cluster, "Broker ID": str(broker)},
                "Maximum",
                300,
            ),
        )
    return expected


@pytest.mark.parametrize(
    ("env_name", "freshness", "no_commit_seconds", "rejects", "restarts", "free_bytes", "disk_percent"),
    [
        ("dev", 600, 900, 0.2, 6, 2 * 1024**3, 80),
        ("prod", 120, 300, 0.05, 3, 10 * 1024**3, 75),
    ],
)
def test_each_alarm_has_its_environments_threshold_and_metric_and_alerts_the_topic(
    request, env_name, freshness, no_commit_seconds, rejects, restarts, free_bytes, disk_percent
) -> None:
    env = request.getfixturevalue(env_name)
    topic_id = env.logical_id(env.stacks.monitoring.monitoring.topic)
    actual = {}
    for concern in env.templates:
        for logical_id, alarm in env.resources(concern, "AWS::CloudWatch::Alarm").items():
            props = alarm["Properties"]
            # Every alarm, in whichever stack, alerts exactly the alerts topic (when it goes into ALARM).
            actions = [env.resolve(concern, action) for action in props["AlarmActions"]]
            assert [(a.concern, a.logical_id, a.attribute) for a in actions] == [
                ("Monitoring", topic_id, None)
            ], logical_id
            assert "OKActions" not in props and "InsufficientDataActions" not in props, logical_id
            assert props.get("ActionsEnabled", True) is True, logical_id
            description = props["AlarmDescription"]
            assert description not in actual, f"two alarms say {description!r}"
            actual[description] = (
                props["Threshold"],
                props["ComparisonOperator"],
                props["EvaluationPeriods"],
                alarm_metric(env, props),
            )
    expected = expected_alarms(env, freshness, no_commit_seconds, rejects, restarts, free_bytes, disk_percent)
    assert actual.keys() == expected.keys()
    for description, values in expected.items():
        assert actual[description] == values, description


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
        "CDC snapshots: rows copied per minute",
    ):
        assert title in body, title
    # The snapshot graph finds every table's snapshot by the job name the snapshot publishes under.
    separator, parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"]
    widgets = json.loads(separator.join(p if isinstance(p, str) else "ref" for p in parts))["widgets"]
    (snapshots,) = [w for w in widgets if w["properties"].get("title", "").startswith("CDC snapshots")]
    ((search,),) = snapshots["properties"]["metrics"]
    namespace = synthesized.config.metrics_namespace
    assert search["expression"] == (
        f"SEARCH('{{{namespace},Job,Table}} Job=\"cdc-snapshot\" MetricName=\"RecordsIn\"', 'Sum', 60)"
    )
    # Each graph shows exactly its metrics (a title alone passed with a wrong metric behind it).
    from lakehouse.rehearsal.watched_metrics import watched

    shown: dict[str, set] = {}
    for where, (name, dims) in watched(synthesized.templates, namespace):
        if where.startswith("dashboard widget "):
            shown.setdefault(where.removeprefix("dashboard widget ").strip("'"), set()).add(
                (name, tuple(sorted(dims)))
            )

    def metric(name, job, table):
        return (name, (("Job", job), ("Table", table)))

    tables = [
        ("ingest", "ods_behavior.clickevent"),
        ("cdc", "dim_db.products"),
        ("cdc", "dim_db.user_member"),
        ("views", "ads_behavior.product_views"),
    ]
    clicks = ("ingest", "ods_behavior.clickevent")
    cdc = [t for j, t in tables if j == "cdc"]
    assert shown == {
        "Freshness per table (s, max)": {metric("LagSeconds", j, t) for j, t in tables},
        "Clicks in per minute, rejects": {metric("RecordsIn", *clicks), metric("Rejects", *clicks)},
        "CDC changes applied and lag": {
            metric(m, "cdc", t) for m in ("RecordsIn", "LagSeconds") for t in cdc
        },
        "Ingest: Kafka offset lag (records) and commit time (s)": {
            metric("OffsetLag", *clicks),
            metric("CommitDuration", *clicks),
        },
        "Streaming step restarts": {("StreamingStepRestarts", ())},
        "CDC snapshots: rows copied per minute": {("RecordsIn", (("*", "*"), ("Job", "cdc-snapshot")))},
    }


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
