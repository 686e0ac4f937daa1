"""The pipeline's own health: a dashboard and alarms on the jobs' metrics (jobs/common/metrics.py,
namespace `Lakehouse/<env>`), MSK and RDS. Alarms go to the alerts topic; docs/operate.md says
what each means and what to do."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_rds as rds
from aws_cdk import aws_sns as sns
from constructs import Construct

from infra.config import PipelineAlarmSettings
from jobs.verify.findings import RECONCILE_METRIC

# (job, table) pairs the jobs report; the click table is the one the clickstream alarms watch.
CLICKS = ("ingest", "ods_behavior.clickevent")
TABLES = (
    CLICKS,
    ("cdc", "dim_db.products"),
    ("cdc", "dim_db.user_member"),
    ("views", "ads_behavior.product_views"),
)
# The supervisor's log line for a restart of a failed streaming step (infra/lambdas/step_supervisor).
STEP_RESTARTS_METRIC = "StreamingStepRestarts"


class PipelineHealth(Construct):
    """Alarms on freshness, uncommitted clicks, rejects, step restarts and ingest lag; a dashboard."""

    #: The CloudWatch namespace of the jobs' and the supervisor's metrics (`Lakehouse/<env>`).
    namespace: str
    #: Every alarm of the pipeline by construct id (`Freshness-<table>`, `ClicksNotCommitted`, ...).
    alarms: dict[str, cloudwatch.Alarm]
    #: The ingest lag that alarms: half the brokers' retention, in seconds.
    half_retention_seconds: int
    #: The pipeline's dashboard (freshness, clicks, CDC, ingest, restarts, MSK, RDS, alarms).
    dashboard: cloudwatch.Dashboard

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        namespace: str,
        settings: PipelineAlarmSettings,
        topic_retention_hours: int,
        topic: sns.ITopic,
        msk_cluster_name: str,
        msk_broker_count: int,
        database: rds.IDatabaseInstance,
    ) -> None:
        super().__init__(scope, construct_id)
        self.namespace = namespace

        def job_metric(name: str, job: str, table: str, statistic: str, period: Duration | None = None):
            return cloudwatch.Metric(
                namespace=namespace,
                metric_name=name,
                dimensions_map={"Job": job, "Table": table},
                statistic=statistic,
                period=period or Duration.minutes(1),
            )

        bytes_in = [
            cloudwatch.Metric(
                namespace="AWS/Kafka",
                metric_name="BytesInPerSec",
                dimensions_map={"Cluster Name": msk_cluster_name, "Broker ID": str(broker)},
                statistic="Average",
                period=Duration.minutes(1),
            )
            for broker in range(1, msk_broker_count + 1)
        ]
        action = cw_actions.SnsAction(topic)
        self.alarms: dict[str, cloudwatch.Alarm] = {}

        def alarm(alarm_id: str, description: str, metric, threshold: float, periods: int, missing) -> None:
            created = cloudwatch.Alarm(
                self,
                alarm_id,
                alarm_description=description,
                metric=metric,
                threshold=threshold,
                evaluation_periods=periods,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=missing,
            )
            created.add_alarm_action(action)
            self.alarms[alarm_id] = created

        not_breaching = cloudwatch.TreatMissingData.NOT_BREACHING
        for job, table in TABLES:
            name = table.replace(".", "-").replace("_", "-")
            alarm(
                f"Freshness-{name}",
                f"{table} is more than {settings.freshness_seconds} s behind its source ({job} job)",
                job_metric("LagSeconds", job, table, "Maximum", Duration.minutes(5)),
                settings.freshness_seconds,
                2,
                not_breaching,  # no batch, no figure: the no-commit alarm covers a stopped stream
            )

        # Every step RUNNING, yet nothing lands: clicks arrive but the click table gets no commit.
        window = Duration.minutes(settings.no_click_commit_minutes)
        alarm(
            "ClicksNotCommitted",
            f"MSK receives bytes but {CLICKS[1]} had no commit for {settings.no_click_commit_minutes} min",
            cloudwatch.MathExpression(
                expression="IF(bytes > 0 AND FILL(commits, 0) == 0, 1, 0)",
                using_metrics={
                    "commits": job_metric("Commits", *CLICKS, "Sum", window),
                    "bytes": cloudwatch.MathExpression(
                        expression=" + ".join(f"FILL(b{i}, 0)" for i in range(len(bytes_in))),
                        using_metrics={f"b{i}": m.with_(period=window) for i, m in enumerate(bytes_in)},
                        period=window,
                    ),
                },
                period=window,
                label="clicks arriving, none committed",
            ),
            1,
            1,
            not_breaching,
        )
        alarm(
            "RejectsRatio",
            f"more than {settings.rejects_ratio:.0%} of the clicks rejected over 15 min "
            "(see ods_behavior.clickevent_rejects.reject_reason)",
            cloudwatch.MathExpression(
                # No clicks in a window: 0 / 0, a data point CloudWatch drops ("divide by zero ... the
                # data point is dropped", metric math reference), and missing data does not breach.
                expression="rejects / records",
                using_metrics={
                    "rejects": job_metric("Rejects", *CLICKS, "Sum", Duration.minutes(15)),
                    "records": job_metric("RecordsIn", *CLICKS, "Sum", Duration.minutes(15)),
                },
                period=Duration.minutes(15),
                label="rejects / records in",
            ),
            settings.rejects_ratio,
            1,
            not_breaching,
        )
        alarm(
            "StreamingStepRestarts",
            f"the supervisor restarted failed streaming steps {settings.max_step_restarts_per_hour} or more "
            "times in an hour",
            cloudwatch.Metric(
                namespace=namespace,
                metric_name=STEP_RESTARTS_METRIC,
                statistic="Sum",
                period=Duration.hours(1),
            ),
            settings.max_step_restarts_per_hour,
            1,
            not_breaching,
        )
        # The classic way a Kafka-fed lake loses data: the consumer falls behind until the brokers
        # delete what it never read. Alarm at half the retention, long before.
        self.half_retention_seconds = topic_retention_hours * 3600 // 2
        alarm(
            "IngestLagHalfRetention",
            f"the ingest is {topic_retention_hours // 2} h behind: at {topic_retention_hours} h the brokers "
            "delete clicks it has not read",
            job_metric("LagSeconds", *CLICKS, "Maximum", Duration.minutes(5)),
            self.half_retention_seconds,
            1,
            not_breaching,
        )

        # The daily reconciliation found the lake unequal to a source (exit 1 also fails its state
        # machine, which alerts; this alarm names the metric to read per table).
        alarm(
            "ReconcileMismatches",
            "`lakehouse verify` found the lake unequal to its sources: ReconcileMismatches per Table says "
            "where; the verify driver's stdout (EMR log bucket, containers/) lists offsets and keys "
            "(docs/operate.md)",
            cloudwatch.Metric(
                namespace=namespace,
                metric_name=RECONCILE_METRIC,
                dimensions_map={"Job": "verify"},
                statistic="Maximum",
                period=Duration.hours(6),
            ),
            1,
            1,
            not_breaching,
        )

        def graph(
            title: str, left: list, right: list | None = None, width: int = 12
        ) -> cloudwatch.GraphWidget:
            return cloudwatch.GraphWidget(title=title, left=left, right=right or [], width=width)

        cdc_tables = [table for job, table in TABLES if job == "cdc"]
        restarts = cloudwatch.Metric(namespace=namespace, metric_name=STEP_RESTARTS_METRIC, statistic="Sum")
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", default_interval=Duration.hours(3))
        self.dashboard.add_widgets(
            graph(
                "Freshness per table (s, max)",
                [job_metric("LagSeconds", job, table, "Maximum").with_(label=table) for job, table in TABLES],
            ),
            graph(
                "Clicks in per minute, rejects",
                [job_metric("RecordsIn", *CLICKS, "Sum")],
                [job_metric("Rejects", *CLICKS, "Sum")],
            ),
        )
        self.dashboard.add_widgets(
            graph(
                "CDC changes applied and lag",
                [job_metric("RecordsIn", "cdc", table, "Sum") for table in cdc_tables],
                [job_metric("LagSeconds", "cdc", table, "Maximum") for table in cdc_tables],
                width=8,
            ),
            graph(
                "Ingest: Kafka offset lag (records) and commit time (s)",
                [job_metric("OffsetLag", *CLICKS, "Maximum")],
                [job_metric("CommitDuration", *CLICKS, "Average")],
                width=8,
            ),
            graph("Streaming step restarts", [restarts], width=8),
        )
        # Any table's snapshot (whole-database sync picks tables up at run time): rows committed per
        # minute, per table, found by SEARCH rather than listed.
        snapshot_rows = cloudwatch.MathExpression(
            expression=(
                f'SEARCH(\'{{{namespace},Job,Table}} Job="cdc-snapshot" MetricName="RecordsIn"\', '
                "'Sum', 60)"
            ),
            using_metrics={},
            label="",
            period=Duration.minutes(1),
        )
        self.dashboard.add_widgets(graph("CDC snapshots: rows copied per minute", [snapshot_rows], width=24))
        self.dashboard.add_widgets(
            graph("MSK bytes in per broker", bytes_in),
            graph(
                "RDS CPU (%) and free storage",
                [database.metric_cpu_utilization()],
                [database.metric_free_storage_space()],
            ),  # fmt: skip
            cloudwatch.AlarmStatusWidget(
                title="Pipeline alarms", alarms=list(self.alarms.values()), width=24
            ),
        )
