"""Compute: an EMR on EC2 7.x cluster (Spark, Hive, Trino) on the Glue Iceberg catalog.

What the jobs need from it: `cluster_id` and `instance_role` (the Compute stack adds the grants and
`job_settings`, the arguments of `jobs.config.LakehouseConfig.aws`). Steps are not defined here:
CloudFormation EMR steps are create-only, so jobs are submitted after the cluster exists
(infra/constructs/job_deployment.py), with ActionOnFailure=CONTINUE because the step concurrency
level is above 1.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Aws, CustomResource, Duration, RemovalPolicy, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_emr as emr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3deploy
from aws_cdk import custom_resources as cr
from constructs import Construct

from infra.access import NamedRoles, give_role_name
from infra.bundling import python_function_code, python_function_code_with_wheels
from infra.config import EMR_TLS_CERTIFICATES_KEY, ComputeSettings
from infra.constructs.network import EMR_MANAGED_POLICY_TAG
from infra.emr_steps import BOOTSTRAP_PREFIX, SUPERVISED_CLUSTER_TAG
from infra.nag import (
    acknowledge,
    acknowledge_bucket_deployment,
    acknowledge_custom_resource_function,
    acknowledge_wildcard_resources,
    aws_arn,
    nag_rendering,
)
from infra.trust import service_for_this_account
from jobs.config import CATALOG_NAME

APPLICATIONS = ("Spark", "Hive", "Trino")
KMS_DATA_KEY_ACTIONS = (
    "kms:Encrypt",
    "kms:Decrypt",
    "kms:ReEncryptFrom",
    "kms:ReEncryptTo",
    "kms:GenerateDataKey",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:DescribeKey",
)
GLUE_HIVE_CLIENT_FACTORY = "com.amazonaws.glue.catalog.metastore.AWSGlueDataCatalogHiveClientFactory"


def emr_configurations(*, warehouse_uri: str, job_python: str, region: str) -> list[dict]:
    """EMR classifications: Iceberg on, Spark catalog `lakehouse` on Glue, Hive/Trino on Glue.

    The `lakehouse` catalog is defined here and only here: the jobs add no implementation key of
    their own (Iceberg refuses `type` beside `catalog-impl`), and `spark-sql` on the primary node
    sees the same catalog as the jobs."""
    catalog = f"spark.sql.catalog.{CATALOG_NAME}"
    return [
        {"Classification": "iceberg-defaults", "Properties": {"iceberg.enabled": "true"}},
        {
            "Classification": "spark-defaults",
            "Properties": {
                "spark.sql.extensions": ("org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"),
                catalog: "org.apache.iceberg.spark.SparkCatalog",
                f"{catalog}.catalog-impl": "org.apache.iceberg.aws.glue.GlueCatalog",
                f"{catalog}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
                f"{catalog}.warehouse": warehouse_uri,
                f"{catalog}.client.region": region,
            },
        },
        {
            "Classification": "hive-site",
            "Properties": {"hive.metastore.client.factory.class": GLUE_HIVE_CLIENT_FACTORY},
        },
        {
            "Classification": "trino-connector-iceberg",
            "Properties": {
                "connector.name": "iceberg",
                "iceberg.catalog.type": "glue",
                # EMR 7.7+ Trino reads S3 through its native file system only with this set.
                "fs.native-s3.enabled": "true",
            },
        },
        {
            "Classification": "spark-env",
            "Properties": {},
            "Configurations": [
                {
                    "Classification": "export",
                    "Properties": {
                        "PYSPARK_PYTHON": job_python,
                        "PYSPARK_DRIVER_PYTHON": job_python,
                    },
                }
            ],
        },
    ]


def _to_cfn_configuration(config: dict) -> emr.CfnCluster.ConfigurationProperty:
    return emr.CfnCluster.ConfigurationProperty(
        classification=config["Classification"],
        configuration_properties=config.get("Properties") or None,
        configurations=[_to_cfn_configuration(c) for c in config.get("Configurations", [])] or None,
    )


class EmrCompute(Construct):
    """EMR cluster, its roles, security configuration and the managed-SG cleanup on teardown.

    Parked (`run_cluster=False`), everything but the cluster stays: `cluster` and `cluster_id` are None.
    Also offered: `node_security_groups` (a property, below), the groups of the nodes that run job code.
    """

    #: The EMR-managed security groups of the primary node and of the core/task nodes (their rules
    #: are EMR's), and of EMR's service access; `managed_security_groups` is all three.
    primary_security_group: ec2.SecurityGroup
    worker_security_group: ec2.SecurityGroup
    service_access_security_group: ec2.SecurityGroup
    managed_security_groups: tuple[ec2.SecurityGroup, ...]
    #: The nodes' role: the Compute stack grants it the lake, MSK, the CDC secret and metrics.
    instance_role: iam.Role
    #: The nodes' instance profile, named like `instance_role`.
    instance_profile: iam.CfnInstanceProfile
    #: EMR's service role (AmazonEMRServicePolicy_v2).
    service_role: iam.Role
    #: The KMS key of the nodes' local disks and EBS volumes.
    disk_key: kms.Key
    #: Where the in-transit TLS certificate zip is (`s3://<artifacts>/security/...`), and the custom
    #: resource that generates it (dev) or requires it (prod) before the cluster is created.
    tls_certificates_uri: str
    tls_certificates: CustomResource
    #: The security configuration: at-rest and in-transit encryption, IMDSv2 only.
    security_configuration: emr.CfnSecurityConfiguration
    #: The upload of bootstrap/ to `s3://<artifacts>/bootstrap/` (done before the cluster starts).
    bootstrap_upload: s3deploy.BucketDeployment
    #: The cluster's physical name (`lakehouse-<env>-emr`), set even when parked.
    cluster_name: str
    #: The cluster and its id (a deploy-time token); None when parked.
    cluster: emr.CfnCluster | None
    cluster_id: str | None

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        cluster_name: str,
        settings: ComputeSettings,
        warehouse_uri: str,
        log_uri: str,
        artifacts_bucket_name: str,
        bootstrap_dir: Path,
        catalog_region: str,
        roles: NamedRoles,
        run_cluster: bool = True,
    ) -> None:
        super().__init__(scope, construct_id)

        # ---- security groups: EMR manages their rules; the cleanup below undoes them on delete.
        self.primary_security_group = ec2.SecurityGroup(
            self, "PrimarySecurityGroup", vpc=vpc, description="EMR-managed primary node group"
        )
        self.worker_security_group = ec2.SecurityGroup(
            self, "WorkerSecurityGroup", vpc=vpc, description="EMR-managed core/task node group"
        )
        self.service_access_security_group = ec2.SecurityGroup(
            self,
            "ServiceAccessSecurityGroup",
            vpc=vpc,
            description="EMR service access (private subnets)",
            allow_all_outbound=False,
        )
        self.managed_security_groups = (
            self.primary_security_group,
            self.worker_security_group,
            self.service_access_security_group,
        )
        for group in self.managed_security_groups:
            Tags.of(group).add(*EMR_MANAGED_POLICY_TAG)

        # ---- roles
        # Note: the instance role starts with only EMR's regional bootstrap bucket; the stack adds
        # the lake, logs, artifacts, MSK and CDC-secret grants.
        # Named: the lake's and the secrets' resource policies name it (infra/access.py).
        self.instance_role = iam.Role(
            self,
            "InstanceRole",
            role_name=roles.emr_instance,
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="EMR EC2 instance profile role of the lakehouse cluster",
        )
        # Note: SSM Session Manager is how operators reach the primary node (Trino CLI, logs): no
        # SSH key, no inbound port. Only what Session Manager needs (AWS's documented minimal
        # policy), not AmazonSSMManagedInstanceCore: that one also grants ssm:GetParameter(s) on
        # every parameter of the account, other teams' SecureStrings included.
        instances = aws_arn("ec2", "instance/*")
        self.instance_role.add_to_policy(
            iam.PolicyStatement(
                sid="SessionManagerAgent", actions=["ssm:UpdateInstanceInformation"], resources=[instances]
            )
        )
        self.instance_role.add_to_policy(
            iam.PolicyStatement(
                sid="SessionManagerChannels",
                actions=[
                    "ssmmessages:CreateControlChannel",
                    "ssmmessages:CreateDataChannel",
                    "ssmmessages:OpenControlChannel",
                    "ssmmessages:OpenDataChannel",
                ],
                resources=["*"],
            )
        )
        acknowledge_wildcard_resources(
            self.instance_role,
            [instances, "*"],
            "Session Manager's agent: it registers the instance it runs on (whose id is only known "
            "at launch) and opens its session channels (ssmmessages has no resource-level permissions).",
        )
        emr_regional_bucket = aws_arn("s3", f"{Aws.REGION}.elasticmapreduce/*", region=False, account=False)
        self.instance_role.add_to_policy(
            iam.PolicyStatement(
                sid="EmrRegionalArtifacts", actions=["s3:GetObject"], resources=[emr_regional_bucket]
            )
        )
        acknowledge_wildcard_resources(
            self.instance_role,
            [emr_regional_bucket],
            "Read-only on EMR's own regional bucket (<region>.elasticmapreduce), from which nodes "
            "fetch EMR components and scripts during provisioning.",
        )
        # Named like its role, as CDK's own EMR task does: EMR can reject a profile whose name differs
        # from its role's ("invalid instance profile").
        self.instance_profile = iam.CfnInstanceProfile(
            self,
            "InstanceProfile",
            roles=[self.instance_role.role_name],
            instance_profile_name=self.instance_role.role_name,
        )

        # EMR's v2 service policy acts only on resources tagged for-use-with-amazon-emr-managed-policies.
        self.service_role = iam.Role(
            self,
            "ServiceRole",
            # Only EMR acting for this account's clusters (AWS's documented confused-deputy guard).
            assumed_by=service_for_this_account("elasticmapreduce", "elasticmapreduce", "*"),
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name("service-role/AmazonEMRServicePolicy_v2")
            ],
            description="EMR service role of the lakehouse cluster",
        )
        self.instance_role.grant_pass_role(self.service_role)
        acknowledge(
            self.service_role,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AmazonEMRServicePolicy_v2]",
            "AWS's recommended EMR service policy; v2 only acts on resources tagged "
            "for-use-with-amazon-emr-managed-policies=true, which only this project's VPC, subnets "
            "and EMR security groups carry.",
        )

        # ---- encryption at rest of local disks and EBS volumes
        self.disk_key = kms.Key(
            self,
            "LocalDiskKey",
            description="EMR local disk and EBS encryption",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        self.disk_key.grant(self.instance_role, *KMS_DATA_KEY_ACTIONS)
        # EMR attaches encrypted EBS volumes on the cluster's behalf, which needs grants.
        self.disk_key.grant(
            self.service_role,
            *KMS_DATA_KEY_ACTIONS,
            "kms:CreateGrant",
            "kms:ListGrants",
            "kms:RevokeGrant",
        )

        # ---- security configuration: encryption at rest and in transit, IMDSv2 only.
        # In-transit TLS needs certificates: a PEM zip (privateKey.pem, certificateChain.pem,
        # trustedCertificates.pem) in the artifacts bucket before the cluster is created. dev
        # generates one at deploy time; prod requires the operator's and fails fast without it.
        self.tls_certificates_uri = f"s3://{artifacts_bucket_name}/{EMR_TLS_CERTIFICATES_KEY}"
        self.tls_certificates = self._tls_certificates(
            artifacts_bucket_name, settings, roles.tls_certificates
        )
        # Note: no fixed name. Any change to the configuration replaces it, and CloudFormation creates
        # the new one before deleting the old: a fixed name would still be taken and fail the update.
        self.security_configuration = emr.CfnSecurityConfiguration(
            self,
            "SecurityConfiguration",
            security_configuration={
                "EncryptionConfiguration": {
                    "EnableAtRestEncryption": True,
                    "EnableInTransitEncryption": True,
                    "AtRestEncryptionConfiguration": {
                        "S3EncryptionConfiguration": {"EncryptionMode": "SSE-S3"},
                        "LocalDiskEncryptionConfiguration": {
                            "EncryptionKeyProviderType": "AwsKms",
                            "AwsKmsKey": self.disk_key.key_arn,
                            "EnableEbsEncryption": True,
                        },
                    },
                    "InTransitEncryptionConfiguration": {
                        "TLSCertificateConfiguration": {
                            "CertificateProviderType": "PEM",
                            "S3Object": self.tls_certificates_uri,
                        }
                    },
                },
                "InstanceMetadataServiceConfiguration": {
                    "MinimumInstanceMetadataServiceVersion": 2,
                    "HttpPutResponseHopLimit": 2,
                },
            },
        )

        # ---- bootstrap scripts (bootstrap/): uploaded before the cluster exists, at a stable key, so
        # changing a script never changes the cluster's (create-only) BootstrapActions.
        self.bootstrap_upload = s3deploy.BucketDeployment(
            self,
            "UploadBootstrapScripts",
            sources=[s3deploy.Source.asset(str(bootstrap_dir), exclude=["*.md"])],
            destination_bucket=s3.Bucket.from_bucket_name(self, "ArtifactsBucket", artifacts_bucket_name),
            destination_key_prefix=f"{BOOTSTRAP_PREFIX}/",
        )
        give_role_name(self.bootstrap_upload.handler_role, roles.bootstrap_upload)  # infra/access.py
        acknowledge_bucket_deployment(
            self.bootstrap_upload, destination_bucket_name=nag_rendering(artifacts_bucket_name)
        )
        scripts = f"s3://{artifacts_bucket_name}/{BOOTSTRAP_PREFIX}"
        bootstrap_actions = [
            emr.CfnCluster.BootstrapActionConfigProperty(
                name=name,
                script_bootstrap_action=emr.CfnCluster.ScriptBootstrapActionConfigProperty(
                    path=f"{scripts}/{script}", args=args
                ),
            )
            for name, script, args in (
                ("node-setup", "node-setup.sh", ["--python", settings.job_python]),
                (
                    "configure-catalogs",
                    "configure-catalogs.sh",
                    ["--catalog", CATALOG_NAME, "--region", catalog_region],
                ),
            )
        ]

        self.security_configuration.node.add_dependency(self.tls_certificates)
        self._managed_security_group_cleanup()
        self.cluster_name = cluster_name
        # Parked (dev): everything the cluster needs stays, the cluster goes.
        self.cluster = None
        self.cluster_id = None
        if run_cluster:
            self._cluster(vpc, subnets, cluster_name, settings, warehouse_uri, log_uri, bootstrap_actions)

    def _cluster(
        self, vpc, subnets, cluster_name, settings, warehouse_uri, log_uri, bootstrap_actions
    ) -> None:
        subnet_ids = vpc.select_subnets(subnet_group_name=subnets.subnet_group_name).subnet_ids

        def fleet(name: str, types: tuple[str, ...], on_demand: int, spot: int):
            return emr.CfnCluster.InstanceFleetConfigProperty(
                name=name,
                target_on_demand_capacity=on_demand,
                target_spot_capacity=spot,
                instance_type_configs=[
                    emr.CfnCluster.InstanceTypeConfigProperty(
                        instance_type=instance_type,
                        weighted_capacity=1,
                        ebs_configuration=emr.CfnCluster.EbsConfigurationProperty(
                            ebs_block_device_configs=[
                                emr.CfnCluster.EbsBlockDeviceConfigProperty(
                                    volume_specification=emr.CfnCluster.VolumeSpecificationProperty(
                                        size_in_gb=settings.ebs_volume_gib, volume_type="gp3"
                                    ),
                                    volumes_per_instance=1,
                                )
                            ]
                        ),
                    )
                    for instance_type in types
                ],
                launch_specifications=emr.CfnCluster.InstanceFleetProvisioningSpecificationsProperty(
                    spot_specification=emr.CfnCluster.SpotProvisioningSpecificationProperty(
                        timeout_action="SWITCH_TO_ON_DEMAND",
                        timeout_duration_minutes=10,
                        allocation_strategy="capacity-optimized",
                    )
                )
                if spot
                else None,
            )

        # Note: one long-running cluster for the streaming jobs (step concurrency > 1); Spot task
        # capacity in dev, managed scaling between the core size and the max, idle termination in
        # dev only (prod runs around the clock).
        self.cluster = emr.CfnCluster(
            self,
            "Cluster",
            name=cluster_name,
            release_label=settings.release_label,
            applications=[emr.CfnCluster.ApplicationProperty(name=name) for name in APPLICATIONS],
            bootstrap_actions=bootstrap_actions,
            configurations=[
                _to_cfn_configuration(c)
                for c in emr_configurations(
                    warehouse_uri=warehouse_uri, job_python=settings.job_python, region=Aws.REGION
                )
            ],
            instances=emr.CfnCluster.JobFlowInstancesConfigProperty(
                ec2_subnet_ids=subnet_ids,
                emr_managed_master_security_group=self.primary_security_group.security_group_id,
                emr_managed_slave_security_group=self.worker_security_group.security_group_id,
                service_access_security_group=(self.service_access_security_group.security_group_id),
                keep_job_flow_alive_when_no_steps=True,
                termination_protected=settings.termination_protected,
                master_instance_fleet=fleet("primary", settings.primary_instance_types, 1, 0),
                core_instance_fleet=fleet("core", settings.worker_instance_types, settings.core_units, 0),
                task_instance_fleets=[
                    fleet(
                        "task",
                        settings.worker_instance_types,
                        settings.task_on_demand_units,
                        settings.task_spot_units,
                    )
                ],
            ),
            job_flow_role=self.instance_profile.ref,
            service_role=self.service_role.role_arn,
            security_configuration=self.security_configuration.ref,
            log_uri=log_uri,
            step_concurrency_level=settings.step_concurrency_level,
            managed_scaling_policy=emr.CfnCluster.ManagedScalingPolicyProperty(
                compute_limits=emr.CfnCluster.ComputeLimitsProperty(
                    unit_type="InstanceFleetUnits",
                    minimum_capacity_units=settings.core_units,
                    maximum_capacity_units=settings.max_capacity_units,
                    maximum_core_capacity_units=settings.core_units,
                    maximum_on_demand_capacity_units=(settings.core_units + settings.task_on_demand_units),
                )
            ),
            auto_termination_policy=emr.CfnCluster.AutoTerminationPolicyProperty(
                idle_timeout=settings.idle_timeout_hours * 3600
            )
            if settings.idle_timeout_hours
            else None,
            scale_down_behavior="TERMINATE_AT_TASK_COMPLETION",
            visible_to_all_users=True,
            tags=[
                {"key": EMR_MANAGED_POLICY_TAG[0], "value": EMR_MANAGED_POLICY_TAG[1]},
                {"key": SUPERVISED_CLUSTER_TAG, "value": cluster_name},
            ],
        )
        # The cluster must not start before its roles carry their policies (grants added later by
        # the stack land in these roles' default policies, which the dependency includes).
        self.cluster.node.add_dependency(self.instance_role)
        self.cluster.node.add_dependency(self.service_role)
        self.cluster.add_resource_dependency(self.security_configuration)
        self.cluster.node.add_dependency(self.bootstrap_upload)
        self.cluster.node.add_dependency(self._security_group_cleanup)
        self.cluster_id = self.cluster.ref
        for rule_id, what in (("AwsSolutions-EMR4", "local disk"), ("AwsSolutions-EMR5", "in-transit")):
            acknowledge(
                self.cluster,
                rule_id,
                f"The security configuration does enable {what} encryption (asserted in "
                "tests/infra); cdk-nag looks for the flags at the JSON's top level while EMR's "
                "schema nests them under EncryptionConfiguration.",
            )
        acknowledge(
            self.cluster,
            "AwsSolutions-EMR6",
            "No SSH key pair and no Kerberos: nobody logs in to the nodes (private subnets, no "
            "bastion); work arrives as EMR steps and is debugged from the EMR logs in S3.",
        )

    def _tls_certificates(
        self, bucket_name: str, settings: ComputeSettings, role_name: str
    ) -> CustomResource:
        """The certificate zip exists before the cluster: generated (dev) or required (prod)."""
        function = lambda_.Function(
            self,
            "TlsCertificatesFunction",
            description="Generates (dev) or requires (prod) the EMR in-transit TLS certificate zip",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="handler.on_event",
            code=python_function_code_with_wheels("emr_tls_certificates", python_version="3.14"),
            timeout=Duration.minutes(2),
            memory_size=256,
            log_group=logs.LogGroup(self, "TlsCertificatesLogs", retention=logs.RetentionDays.ONE_MONTH),
        )
        give_role_name(function.role, role_name)  # the only writer of security/ (infra/access.py)
        object_arn = aws_arn("s3", f"{bucket_name}/{EMR_TLS_CERTIFICATES_KEY}", region=False, account=False)
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject"], resources=[object_arn]
            )
        )
        # HeadObject on a missing key answers 403 instead of 404 without ListBucket.
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[aws_arn("s3", bucket_name, region=False, account=False)],
                conditions={"StringEquals": {"s3:prefix": [EMR_TLS_CERTIFICATES_KEY]}},
            )
        )
        provider = cr.Provider(self, "TlsCertificatesProvider", on_event_handler=function)
        acknowledge_custom_resource_function(function, provider)
        return CustomResource(
            self,
            "TlsCertificates",
            service_token=provider.service_token,
            resource_type="Custom::EmrTlsCertificates",
            properties={
                "Bucket": bucket_name,
                "Key": EMR_TLS_CERTIFICATES_KEY,
                "Region": Aws.REGION,
                "Mode": "generate" if settings.generate_tls_certificates else "require",
            },
        )

    def _managed_security_group_cleanup(self) -> None:
        """Revoke EMR's cross-referencing rules on delete (aws/aws-cdk#10777)."""
        stack = Stack.of(self)
        function = lambda_.Function(
            self,
            "SecurityGroupCleanupFunction",
            description="Revokes EMR-added rules between the EMR-managed security groups on delete",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="handler.on_event",
            code=python_function_code("emr_sg_cleanup"),
            timeout=Duration.minutes(2),
            log_group=logs.LogGroup(
                self,
                "SecurityGroupCleanupLogs",
                retention=logs.RetentionDays.ONE_MONTH,
                removal_policy=RemovalPolicy.DESTROY,
            ),
        )
        # Describe calls do not support resource-level permissions; revokes are scoped to the groups.
        function.add_to_role_policy(
            iam.PolicyStatement(
                sid="DescribeSecurityGroups",
                actions=["ec2:DescribeSecurityGroups"],
                resources=["*"],
            )
        )
        function.add_to_role_policy(
            iam.PolicyStatement(
                sid="RevokeEmrManagedRules",
                actions=["ec2:RevokeSecurityGroupIngress", "ec2:RevokeSecurityGroupEgress"],
                resources=[
                    stack.format_arn(
                        service="ec2",
                        resource="security-group",
                        resource_name=group.security_group_id,
                    )
                    for group in self.managed_security_groups
                ],
            )
        )
        provider = cr.Provider(self, "SecurityGroupCleanupProvider", on_event_handler=function)
        cleanup = CustomResource(
            self,
            "SecurityGroupCleanup",
            service_token=provider.service_token,
            resource_type="Custom::EmrManagedSecurityGroupCleanup",
            properties={"SecurityGroupIds": [g.security_group_id for g in self.managed_security_groups]},
        )
        # Created after the groups, deleted before them; the cluster is deleted before it.
        for group in self.managed_security_groups:
            cleanup.node.add_dependency(group)
        self._security_group_cleanup = cleanup
        acknowledge_custom_resource_function(function, provider)
        acknowledge(
            function,
            "AwsSolutions-IAM5[Resource::*]",
            "ec2:DescribeSecurityGroups does not support resource-level permissions; the revoke "
            "actions in the same policy are scoped to the three EMR-managed groups.",
        )

    # ---- attributes for other constructs -------------------------------------------------------

    @property
    def node_security_groups(self) -> tuple[ec2.ISecurityGroup, ...]:
        """Groups of the nodes that run job code (drivers on primary, executors on core/task)."""
        return (self.primary_security_group, self.worker_security_group)
