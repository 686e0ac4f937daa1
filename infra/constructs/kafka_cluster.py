"""The Kafka cluster: MSK provisioned (TLS + IAM auth), the click topic, its bootstrap brokers.

Named for the cluster, not "streaming": the Spark streaming application is `jobs/streaming`.
"""

from __future__ import annotations

from aws_cdk import CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_msk as msk
from aws_cdk import aws_ssm as ssm
from aws_cdk import custom_resources as cr
from constructs import Construct

from infra.cdk_values import log_retention
from infra.config import KafkaSettings
from infra.nag import (
    LAMBDA_BASIC_EXECUTION_FINDING,
    acknowledge,
    acknowledge_wildcard_resources,
    aws_arn,
)
from jobs.config import CLICK_TOPIC, CLICK_TOPIC_PARTITIONS

# MSK's port for SASL/IAM over TLS.
MSK_IAM_PORT = 9098
# Jobs must name their consumer groups with this prefix (Spark: option groupIdPrefix); IAM allows
# only these groups.
CONSUMER_GROUP_PREFIX = "lakehouse-"
# Construct id of the singleton Lambda behind every AwsCustomResource of a stack.
AWS_CUSTOM_RESOURCE_FUNCTION_ID = "AWS679f53fac002430cb0da5b7982bd2287"


class KafkaCluster(Construct):
    """MSK cluster with `clicktopic`; exposes the IAM bootstrap string as an attribute and in SSM.

    Its construct id stays "Streaming" (infra/stacks.py): the id is part of every logical id under it.
    """

    #: The brokers' security group; the Compute stack admits the EMR nodes to it on MSK_IAM_PORT.
    security_group: ec2.SecurityGroup
    #: The MSK cluster resource.
    cluster: msk.CfnCluster
    #: The cluster's ARN (a deploy-time token; grants use names instead, see `_arn`).
    cluster_arn: str
    #: The cluster's physical name (`lakehouse-<env>-msk`): alarms and IAM ARNs are built from it.
    cluster_name: str
    #: How many brokers (one disk alarm and one bytes-in metric each).
    broker_count: int
    #: The click topic resource (AWS::MSK::Topic).
    topic: msk.CfnTopic
    #: The click topic's name (`clicktopic`, from jobs.config).
    topic_name: str
    #: The SASL/IAM bootstrap string (a deploy-time token), read from MSK by a custom resource.
    bootstrap_brokers: str
    #: The SSM parameter holding the bootstrap string, and its name.
    bootstrap_parameter: ssm.StringParameter
    bootstrap_parameter_name: str

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        cluster_name: str,
        bootstrap_parameter_name: str,
        settings: KafkaSettings,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)

        self.security_group = ec2.SecurityGroup(
            self, "BrokerSecurityGroup", vpc=vpc, description="MSK brokers", allow_all_outbound=False
        )
        broker_logs = logs.LogGroup(
            self,
            "BrokerLogs",
            retention=log_retention(settings.broker_log_retention_days),
            removal_policy=removal_policy,
        )

        # Topics are created explicitly (AWS::MSK::Topic below); durability follows the env's size.
        # The name (required, unique) carries the Kafka version: a version change replaces the
        # configuration, and a new resource under the old name would fail the update.
        configuration = msk.CfnConfiguration(
            self,
            "BrokerConfiguration",
            name=f"{cluster_name}-config-{settings.kafka_version.replace('.', '-')}",
            kafka_versions_list=[settings.kafka_version],
            server_properties="\n".join(
                [
                    "auto.create.topics.enable=false",
                    f"default.replication.factor={settings.topic_replication_factor}",
                    f"min.insync.replicas={settings.min_insync_replicas}",
                    # Only for auto-created topics (off). Kept: a changed configuration is a new
                    # revision, which restarts every broker.
                    f"num.partitions={CLICK_TOPIC_PARTITIONS}",
                    f"log.retention.hours={settings.topic_retention_hours}",
                ]
            ),
        )

        # Note: clients authenticate with IAM over TLS only (no plaintext, no unauthenticated access);
        # storage is encrypted at rest with the MSK-managed key; broker logs go to CloudWatch.
        self.cluster = msk.CfnCluster(
            self,
            "Cluster",
            cluster_name=cluster_name,
            kafka_version=settings.kafka_version,
            number_of_broker_nodes=settings.broker_count,
            broker_node_group_info=msk.CfnCluster.BrokerNodeGroupInfoProperty(
                instance_type=settings.broker_instance_type,
                client_subnets=vpc.select_subnets(subnet_group_name=subnets.subnet_group_name).subnet_ids,
                security_groups=[self.security_group.security_group_id],
                storage_info=msk.CfnCluster.StorageInfoProperty(
                    ebs_storage_info=msk.CfnCluster.EBSStorageInfoProperty(
                        volume_size=settings.broker_volume_gib
                    )
                ),
            ),
            client_authentication=msk.CfnCluster.ClientAuthenticationProperty(
                sasl=msk.CfnCluster.SaslProperty(iam=msk.CfnCluster.IamProperty(enabled=True)),
                unauthenticated=msk.CfnCluster.UnauthenticatedProperty(enabled=False),
            ),
            encryption_info=msk.CfnCluster.EncryptionInfoProperty(
                encryption_in_transit=msk.CfnCluster.EncryptionInTransitProperty(
                    client_broker="TLS", in_cluster=True
                ),
            ),
            configuration_info=msk.CfnCluster.ConfigurationInfoProperty(
                arn=configuration.attr_arn, revision=1
            ),
            enhanced_monitoring=settings.enhanced_monitoring,
            logging_info=msk.CfnCluster.LoggingInfoProperty(
                broker_logs=msk.CfnCluster.BrokerLogsProperty(
                    cloud_watch_logs=msk.CfnCluster.CloudWatchLogsProperty(
                        enabled=True, log_group=broker_logs.log_group_name
                    )
                )
            ),
        )
        # prod retains the cluster (also on a replacement): its topic holds clicks not yet ingested,
        # up to the retention. A retained cluster keeps its subnets in use, so destroying prod is a
        # procedure: drain, delete the cluster by hand, then destroy (infra/README.md, "Destroy").
        self.cluster.apply_removal_policy(removal_policy)
        self.cluster_arn = self.cluster.attr_arn
        self.cluster_name = cluster_name
        self.broker_count = settings.broker_count

        # MSK's topic API (Kafka >= 3.6, provisioned) creates the topic at deploy time: no admin
        # client, no Lambda in the VPC.
        self.topic = msk.CfnTopic(
            self,
            "ClickTopic",
            cluster_arn=self.cluster_arn,
            topic_name=CLICK_TOPIC,
            partition_count=settings.click_topic_partitions,
            replication_factor=settings.topic_replication_factor,
        )
        self.topic.apply_removal_policy(removal_policy)  # deleting the topic would delete its clicks
        self.topic_name = CLICK_TOPIC

        # The IAM bootstrap string only exists once the brokers run: read it at deploy time.
        brokers_call = cr.AwsSdkCall(
            service="Kafka",
            action="getBootstrapBrokers",
            parameters={"ClusterArn": self.cluster_arn},
            physical_resource_id=cr.PhysicalResourceId.of(f"{cluster_name}-bootstrap-brokers"),
        )
        bootstrap_lookup = cr.AwsCustomResource(
            self,
            "BootstrapBrokersLookup",
            on_create=brokers_call,
            on_update=brokers_call,
            policy=cr.AwsCustomResourcePolicy.from_sdk_calls(resources=[self.cluster_arn]),
            install_latest_aws_sdk=False,
        )
        bootstrap_lookup.node.add_dependency(self.cluster)
        # The lookup's Lambda is a stack-wide singleton CDK creates beside this construct.
        lookup_function = Stack.of(self).node.try_find_child(AWS_CUSTOM_RESOURCE_FUNCTION_ID)
        if lookup_function is not None:
            acknowledge(
                lookup_function,
                LAMBDA_BASIC_EXECUTION_FINDING,
                "CDK's AwsCustomResource Lambda; AWSLambdaBasicExecutionRole only grants writing "
                "its own CloudWatch logs.",
            )
        self.bootstrap_brokers = bootstrap_lookup.get_response_field("BootstrapBrokerStringSaslIam")

        self.bootstrap_parameter_name = bootstrap_parameter_name
        self.bootstrap_parameter = ssm.StringParameter(
            self,
            "BootstrapBrokersParameter",
            parameter_name=bootstrap_parameter_name,
            string_value=self.bootstrap_brokers,
            description="MSK bootstrap brokers (SASL/IAM over TLS, port 9098)",
        )
        CfnOutput(self, "BootstrapBrokers", value=self.bootstrap_brokers)
        CfnOutput(self, "BootstrapBrokersParameterName", value=bootstrap_parameter_name)

    # ---- grants -------------------------------------------------------------------------------

    def _arn(self, kind: str, name: str = "") -> str:
        """ARN of this cluster or of a topic/group in it, by cluster name (the uuid wildcarded).

        Built from the name, not the cluster's ARN, so grants in other stacks carry no cross-stack
        reference; cluster names are unique per account and region.
        """
        suffix = f"/{name}" if name else ""
        return aws_arn("kafka", f"{kind}/{self.cluster_name}/*{suffix}")

    def grant_consume(self, grantee: iam.IGrantable, *, produce: bool) -> None:
        """IAM (kafka-cluster:*) access to read `clicktopic` and the project's consumer groups; with
        `produce`, to write it too (the test-data generator)."""
        principal = grantee.grant_principal
        # WriteDataIdempotently: the producer (gendata) uses an idempotent producer.
        writes_cluster = ["kafka-cluster:WriteDataIdempotently"] if produce else []
        writes_topic = ["kafka-cluster:WriteData"] if produce else []
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="MskConnect",
                actions=["kafka-cluster:Connect", "kafka-cluster:DescribeCluster", *writes_cluster],
                resources=[self._arn("cluster")],
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="MskClickTopic",
                actions=["kafka-cluster:DescribeTopic", "kafka-cluster:ReadData", *writes_topic],
                resources=[self._arn("topic", self.topic_name)],
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="MskLakehouseGroups",
                actions=["kafka-cluster:DescribeGroup", "kafka-cluster:AlterGroup"],
                resources=[self._arn("group", f"{CONSUMER_GROUP_PREFIX}*")],
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="BootstrapBrokersParameter",
                actions=["ssm:GetParameter"],
                resources=[aws_arn("ssm", f"parameter{self.bootstrap_parameter_name}")],
            )
        )
        acknowledge_wildcard_resources(
            grantee,
            [self._arn("cluster"), self._arn("topic", self.topic_name)],
            "The cluster uuid in MSK ARNs is only known after deploy; the wildcard stands for it "
            "alone, under this environment's cluster name (unique per account and region).",
        )
        acknowledge_wildcard_resources(
            grantee,
            [self._arn("group", f"{CONSUMER_GROUP_PREFIX}*")],
            "Consumer groups are created by the jobs at run time; only groups named "
            f"{CONSUMER_GROUP_PREFIX}* on this environment's cluster are allowed.",
        )
