"""Monitoring: failed EMR steps/clusters and storage alarms, all to one encrypted SNS topic."""

from __future__ import annotations

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_rds as rds
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from infra.config import MonitoringSettings

EMR_FAILURE_STATES = ("FAILED", "TERMINATED_WITH_ERRORS")


class Monitoring(Construct):
    """EventBridge rule on EMR step/cluster failure; alarms on RDS free storage and MSK disk use."""

    #: The alerts topic (KMS-encrypted): every alarm and failure rule of the pipeline publishes here.
    topic: sns.Topic
    #: The rule on failed EMR steps and clusters; None when parked (no cluster).
    emr_failure_rule: events.Rule | None
    #: The source database's free storage alarm (missing data ignored while parked and stopped).
    rds_free_storage_alarm: cloudwatch.Alarm
    #: One disk-used alarm per MSK broker.
    msk_disk_alarms: list[cloudwatch.Alarm]

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: MonitoringSettings,
        emr_cluster_id: str | None,
        database: rds.IDatabaseInstance,
        msk_cluster_name: str,
        msk_broker_count: int,
        database_stopped: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)

        # Note: EventBridge and CloudWatch publish to an encrypted topic only if the key lets them.
        key = kms.Key(
            self,
            "AlertsKey",
            description="Lakehouse alerts topic",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        for service in ("events.amazonaws.com", "cloudwatch.amazonaws.com"):
            key.grant(iam.ServicePrincipal(service), "kms:Decrypt", "kms:GenerateDataKey*")
        self.topic = sns.Topic(
            self, "AlertsTopic", display_name="Lakehouse alerts", master_key=key, enforce_ssl=True
        )
        # A topic policy replaces SNS's default one, so every service that publishes needs its own
        # statement: EventBridge gets one from its target (and takes no Condition block there); CloudWatch
        # alarms get this one, limited to this account's alarms (tests/infra/aws_behaviour.py).
        alarms = f"arn:{Aws.PARTITION}:cloudwatch:{Aws.REGION}:{Aws.ACCOUNT_ID}:alarm:*"
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsPublish",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={"ArnLike": {"aws:SourceArn": alarms}},
            )
        )
        if settings.alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(settings.alarm_email))

        # A failed step (a job died) or a cluster that terminated with errors (none when parked).
        self.emr_failure_rule = emr_cluster_id and events.Rule(
            self,
            "EmrFailureRule",
            description="EMR step FAILED or cluster TERMINATED_WITH_ERRORS",
            event_pattern=events.EventPattern(
                source=["aws.emr"],
                detail_type=["EMR Step Status Change", "EMR Cluster State Change"],
                detail={"clusterId": [emr_cluster_id], "state": list(EMR_FAILURE_STATES)},
            ),
            targets=[targets.SnsTopic(self.topic)],
        )

        alarm_action = cw_actions.SnsAction(self.topic)
        # The binlog and the tables share the instance's storage; running out stops CDC.
        self.rds_free_storage_alarm = cloudwatch.Alarm(
            self,
            "RdsFreeStorageAlarm",
            alarm_description="Source MySQL is running out of storage",
            metric=database.metric_free_storage_space(period=Duration.minutes(5)),
            threshold=settings.rds_free_storage_alarm_bytes,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=1,
            # A stopped (parked) instance publishes nothing; a running one always does.
            treat_missing_data=cloudwatch.TreatMissingData.IGNORE
            if database_stopped
            else cloudwatch.TreatMissingData.BREACHING,
        )
        self.rds_free_storage_alarm.add_alarm_action(alarm_action)

        # MSK publishes disk use per broker; a full broker disk stops the click stream.
        self.msk_disk_alarms = []
        for broker_id in range(1, msk_broker_count + 1):
            alarm = cloudwatch.Alarm(
                self,
                f"MskDiskUsedBroker{broker_id}Alarm",
                alarm_description=f"MSK broker {broker_id} data disk above "
                f"{settings.msk_disk_used_alarm_percent}%",
                metric=cloudwatch.Metric(
                    namespace="AWS/Kafka",
                    metric_name="KafkaDataLogsDiskUsed",
                    dimensions_map={"Cluster Name": msk_cluster_name, "Broker ID": str(broker_id)},
                    statistic="Maximum",
                    period=Duration.minutes(5),
                ),
                threshold=settings.msk_disk_used_alarm_percent,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=2,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            alarm.add_alarm_action(alarm_action)
            self.msk_disk_alarms.append(alarm)
