"""The stacks of one environment. Each composes constructs; cross-concern grants are wired here.

Deploy order (dependencies): Lake -> Network -> Streaming (Kafka) -> SourceDatabase -> Compute -> Monitoring
-> Jobs. `cdk destroy` removes them in reverse, so the billed network (NAT gateway, interface
endpoints) is gone before the buckets are emptied and deleted.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Annotations, App, Aspects, Aws, CfnOutput, Environment, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from infra.access import NamedRoles
from infra.cdk_values import removal_policy
from infra.checkov import AcceptedLambdaFindings
from infra.config import DeploymentConfig
from infra.constructs.emr_compute import EmrCompute
from infra.constructs.job_deployment import JobDeployment
from infra.constructs.kafka_cluster import MSK_IAM_PORT, KafkaCluster
from infra.constructs.lake_storage import LakeStorage
from infra.constructs.monitoring import Monitoring
from infra.constructs.network import Network
from infra.constructs.pipeline_health import PipelineHealth
from infra.constructs.source_database import MYSQL_PORT, SourceDatabase
from infra.emr_package import architectures_for
from infra.emr_steps import JobArtifacts
from infra.log_groups import LogGroupPolicy
from infra.nag import acknowledge
from infra.retained_guards import RetainedGuards

REPO_ROOT = Path(__file__).resolve().parent.parent
BOOTSTRAP_DIR = REPO_ROOT / "bootstrap"


class _LakehouseStack(Stack):
    def __init__(self, scope: Construct, config: DeploymentConfig, concern: str, description: str):
        env = (
            Environment(account=config.account, region=config.region)
            if config.account and config.region
            else None
        )
        super().__init__(
            scope,
            config.stack_name(concern),
            env=env,
            description=f"Lakehouse {config.env_name}: {description}",
            termination_protection=config.termination_protection,
        )
        self.config = config


class NetworkStack(_LakehouseStack):
    def __init__(self, scope: Construct, config: DeploymentConfig) -> None:
        super().__init__(scope, config, "Network", "VPC, NAT, endpoints, flow logs")
        if config.unpinned_azs_error:
            Annotations.of(self).add_error(config.unpinned_azs_error)
        self.network = Network(
            self,
            "Network",
            settings=config.network,
            availability_zones=config.availability_zones,
            removal_policy=removal_policy(config.removal_policy),
            parked=config.parked,
        )


class LakeStack(_LakehouseStack):
    def __init__(self, scope: Construct, config: DeploymentConfig) -> None:
        super().__init__(scope, config, "Lake", "S3 buckets, Glue databases, Athena workgroup")
        self.lake = LakeStorage(
            self,
            "Lake",
            name_prefix=config.name_prefix,
            settings=config.storage,
            removal_policy=removal_policy(config.removal_policy),
            roles=NamedRoles.of(config),
            access=config.access,
        )
        CfnOutput(self, "WarehouseUri", value=self.lake.warehouse_uri)
        CfnOutput(self, "ArtifactsBucketName", value=self.lake.artifacts_bucket.bucket_name)


class KafkaStack(_LakehouseStack):
    def __init__(self, scope: Construct, config: DeploymentConfig, network: Network) -> None:
        # Note: the stack (Lakehouse-<env>-Streaming) and construct ids keep their first name,
        # "Streaming": renaming either would rename the deployed stack or replace the MSK cluster.
        super().__init__(scope, config, "Streaming", "MSK cluster and clicktopic")
        self.kafka = KafkaCluster(
            self,
            "Streaming",
            vpc=network.vpc,
            subnets=network.private_subnets,
            cluster_name=config.resource_name("msk"),
            bootstrap_parameter_name=f"{config.parameter_prefix}/msk/bootstrap-brokers",
            settings=config.kafka,
            removal_policy=removal_policy(config.removal_policy),
        )


class SourceDatabaseStack(_LakehouseStack):
    def __init__(self, scope: Construct, config: DeploymentConfig, network: Network) -> None:
        super().__init__(scope, config, "SourceDatabase", "RDS MySQL with binlog, seeded")
        self.source_database = SourceDatabase(
            self,
            "SourceDatabase",
            vpc=network.vpc,
            subnets=network.private_subnets,
            instance_identifier=config.resource_name("source-mysql"),
            settings=config.source_database,
            removal_policy=removal_policy(config.database_removal_policy),
            cdc_readers=NamedRoles.of(config).cluster_readers,
        )
        CfnOutput(self, "MySqlHost", value=self.source_database.host)
        CfnOutput(self, "CdcSecretArn", value=self.source_database.cdc_secret.secret_arn)


class ComputeStack(_LakehouseStack):
    def __init__(
        self,
        scope: Construct,
        config: DeploymentConfig,
        *,
        network: Network,
        lake: LakeStorage,
        kafka: KafkaCluster,
        source_database: SourceDatabase,
    ) -> None:
        super().__init__(scope, config, "Compute", "EMR cluster (Spark, Hive, Trino)")
        self.compute = EmrCompute(
            self,
            "Compute",
            vpc=network.vpc,
            subnets=network.private_subnets,
            cluster_name=config.resource_name("emr"),
            settings=config.compute,
            warehouse_uri=lake.warehouse_uri,
            log_uri=lake.emr_log_uri,
            artifacts_bucket_name=lake.artifacts_bucket_name,
            bootstrap_dir=BOOTSTRAP_DIR,
            catalog_region=Aws.REGION,
            roles=NamedRoles.of(config),
            run_cluster=not config.parked,
        )
        role = self.compute.instance_role

        # Grants: the lake (S3 + Glue), the click topic over IAM, the CDC secret; network paths to
        # MSK and MySQL from the nodes that run job code. Rules live in this stack (remote rules),
        # so the data stacks never depend on Compute.
        lake.grant_lake_read_write(role)
        lake.grant_artifacts_read(role)
        lake.grant_emr_logs_write(role)
        kafka.grant_consume(role, produce=config.jobs.deploy_gendata)
        source_database.grant_cdc_secret_read(role)
        # The jobs' per-batch metrics (jobs/common/metrics.py), in this environment's namespace only.
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": config.metrics_namespace}},
            )
        )
        acknowledge(
            role,
            "AwsSolutions-IAM5[Resource::*]",
            "cloudwatch:PutMetricData has no resource-level permissions; the statement is limited to "
            "this environment's namespace by the cloudwatch:namespace condition.",
        )
        for group in self.compute.node_security_groups:
            kafka.security_group.add_ingress_rule(
                group, ec2.Port.tcp(MSK_IAM_PORT), "EMR to MSK (IAM/TLS)", True
            )
            source_database.security_group.add_ingress_rule(
                group, ec2.Port.tcp(MYSQL_PORT), "EMR CDC reader to MySQL", True
            )

        # Seam for the "ship jobs as EMR steps" issue: the arguments of LakehouseConfig.aws(...) in
        # one parameter, so step definitions need no other lookups.
        # The catalog and its warehouse are not among them: the cluster's spark-defaults own them.
        self.job_settings = {
            "env": config.env_name,
            "region": self.region,
            "kafka_bootstrap": kafka.bootstrap_brokers,
            "kafka_auth": "iam",
            "mysql_host": source_database.host,
            "mysql_port": source_database.port,
            "mysql_cdc_secret_id": source_database.cdc_secret.secret_arn,
            "mysql_ssl_ca": "rds",
        }
        self.job_settings_parameter = ssm.StringParameter(
            self,
            "JobSettingsParameter",
            parameter_name=f"{config.parameter_prefix}/jobs/settings",
            string_value=self.to_json_string(self.job_settings),
            description="Arguments of jobs.config.LakehouseConfig.aws for jobs on EMR",
        )
        self.job_settings_parameter.grant_read(role)
        # The cluster's id for the stacks that act on it (Monitoring, Jobs), read by them as an
        # SSM-typed parameter: CloudFormation resolves that again at every update, and the CDK CLI
        # never skips a stack that has one. A cross-stack reference (Fn::GetStackOutput, resolved
        # only when the consumer's template changes; the CLI skips a stack whose template did not)
        # left them on a replaced cluster's id: the supervisor then watched a terminated cluster.
        self.cluster_id_parameter_name = f"{config.parameter_prefix}/emr/cluster-id"
        if self.compute.cluster_id:
            CfnOutput(self, "EmrClusterId", value=self.compute.cluster_id)
            ssm.StringParameter(
                self,
                "ClusterIdParameter",
                parameter_name=self.cluster_id_parameter_name,
                string_value=self.compute.cluster_id,
                description="The EMR cluster's id: the Monitoring and Jobs stacks resolve it at each deploy",
            )
            # The output the last release's Monitoring and Jobs read the id from (CDK named it for
            # the weak reference): kept one release, so a rollback of their update still resolves.
            CfnOutput(self, "PublishOutputRefComputeClusterB3B105D42CE5D001", value=self.compute.cluster_id)
        CfnOutput(self, "JobSettingsParameterName", value=self.job_settings_parameter.parameter_name)

    def cluster_id_for(self, consumer: Stack) -> str | None:
        """The cluster's id in `consumer`, resolved by CloudFormation at each of its deploys (None parked)."""
        if not self.compute.cluster_id:
            return None
        consumer.add_dependency(self)
        return ssm.StringParameter.value_for_string_parameter(consumer, self.cluster_id_parameter_name)


class MonitoringStack(_LakehouseStack):
    def __init__(
        self,
        scope: Construct,
        config: DeploymentConfig,
        *,
        compute: ComputeStack,
        kafka: KafkaCluster,
        source_database: SourceDatabase,
    ) -> None:
        super().__init__(scope, config, "Monitoring", "EMR failure events and storage alarms")
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            settings=config.monitoring,
            emr_cluster_id=compute.cluster_id_for(self),
            database=source_database.instance,
            msk_cluster_name=kafka.cluster_name,
            msk_broker_count=kafka.broker_count,
            database_stopped=config.parked,
        )
        self.pipeline_health = PipelineHealth(
            self,
            "PipelineHealth",
            namespace=config.metrics_namespace,
            settings=config.monitoring.pipeline,
            topic_retention_hours=config.kafka.topic_retention_hours,
            topic=self.monitoring.topic,
            msk_cluster_name=kafka.cluster_name,
            msk_broker_count=kafka.broker_count,
            database=source_database.instance,
        )
        CfnOutput(self, "AlertsTopicArn", value=self.monitoring.topic.topic_arn)
        CfnOutput(self, "DashboardName", value=self.pipeline_health.dashboard.dashboard_name)


class JobsStack(_LakehouseStack):
    def __init__(
        self,
        scope: Construct,
        config: DeploymentConfig,
        *,
        package_dir: Path,
        architecture: str,
        lake: LakeStorage,
        compute: ComputeStack,
        monitoring: Monitoring,
    ) -> None:
        super().__init__(scope, config, "Jobs", "the jobs on EMR: artifacts, step supervisor, schedules")
        self.jobs = JobDeployment(
            self,
            "Jobs",
            package_dir=package_dir,
            artifacts=JobArtifacts(lake.artifacts_bucket_name, package_dir.name, architecture),
            artifacts_bucket=s3.Bucket.from_bucket_name(self, "ArtifactsBucket", lake.artifacts_bucket_name),
            cluster_id=compute.cluster_id_for(self),
            cluster_name=compute.compute.cluster_name,
            job_settings=compute.job_settings,
            job_python=config.compute.job_python,
            alert_topic=monitoring.topic,
            settings=config.jobs,
            removal_policy=removal_policy(config.removal_policy),
            metrics_namespace=config.metrics_namespace,
            upload_role_name=NamedRoles.of(config).jobs_upload,
        )
        CfnOutput(self, "JobsVersion", value=package_dir.name)
        if self.jobs.supervisor is None:
            return  # parked
        CfnOutput(self, "StepSupervisorName", value=self.jobs.supervisor.function_name)
        CfnOutput(self, "StepSupervisorLogGroup", value=self.jobs.supervisor.log_group.log_group_name)
        machines = dict(self.jobs.batch_state_machines)
        if self.jobs.gendata_state_machine is not None:
            machines["gendata"] = self.jobs.gendata_state_machine
        for job, machine in machines.items():
            CfnOutput(self, f"{job.capitalize()}StateMachineArn", value=machine.state_machine_arn)


class LakehouseStacks:
    """All stacks of one environment, in deploy order."""

    def __init__(self, app: App, config: DeploymentConfig, *, job_package: Path) -> None:
        self.network = NetworkStack(app, config)
        self.lake = LakeStack(app, config)
        # `cdk destroy` removes dependents first: the NAT gateway and endpoints go before the lake,
        # so a lake teardown that stops (a bucket that will not empty) leaves nothing billing.
        self.network.add_stack_dependency(self.lake)
        self.kafka = KafkaStack(app, config, self.network.network)
        self.source_database = SourceDatabaseStack(app, config, self.network.network)
        self.compute = ComputeStack(
            app,
            config,
            network=self.network.network,
            lake=self.lake.lake,
            kafka=self.kafka.kafka,
            source_database=self.source_database.source_database,
        )
        # Compute refers to the lake and MSK by name (no cross-stack reference): order explicitly.
        self.compute.add_stack_dependency(self.lake)
        self.compute.add_stack_dependency(self.kafka)
        self.monitoring = MonitoringStack(
            app,
            config,
            compute=self.compute,
            kafka=self.kafka.kafka,
            source_database=self.source_database.source_database,
        )
        (architecture,) = architectures_for(
            (*config.compute.primary_instance_types, *config.compute.worker_instance_types)
        )
        self.jobs = JobsStack(
            app,
            config,
            package_dir=job_package,
            architecture=architecture,
            lake=self.lake.lake,
            compute=self.compute,
            monitoring=self.monitoring.monitoring,
        )
        self.jobs.add_stack_dependency(self.lake)
        for stack in self.all:
            Aspects.of(stack).add(
                LogGroupPolicy(removal_policy(config.removal_policy), config.log_retention_cap_days)
            )
            Aspects.of(stack).add(AcceptedLambdaFindings())
            Aspects.of(stack).add(RetainedGuards())
            Tags.of(stack).add("project", "lakehouse")
            Tags.of(stack).add("environment", config.env_name)

    @property
    def all(self) -> tuple[Stack, ...]:
        return (
            self.network,
            self.lake,
            self.kafka,
            self.source_database,
            self.compute,
            self.monitoring,
            self.jobs,
        )
