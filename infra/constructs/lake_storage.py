"""Lake storage and catalog: S3 buckets, the Glue databases of the Iceberg catalog, Athena."""

from __future__ import annotations

from aws_cdk import Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_athena as athena
from aws_cdk import aws_glue as glue
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.access import NamedRoles, deny_all_but, deployer_role_arn, role_arn
from infra.checkov import skip_check
from infra.config import AccessSettings, StorageSettings
from infra.emr_steps import ARTIFACTS_PREFIX, BOOTSTRAP_PREFIX
from infra.nag import acknowledge, acknowledge_wildcard_resources, aws_arn
from jobs.config import NAMESPACES

WAREHOUSE_PREFIX = "warehouse"
ATHENA_RESULTS_PREFIX = "athena-results"
EMR_LOGS_PREFIX = "emr"
CHECKPOINTS_PREFIX = "checkpoints"
SECURITY_PREFIX = "security"  # the EMR TLS certificate zip (infra.config.EMR_TLS_CERTIFICATES_KEY)

# Exact S3 actions (no wildcards) for objects under a prefix and for listing the bucket.
OBJECT_READ_ACTIONS = ("s3:GetObject", "s3:GetObjectVersion")
OBJECT_WRITE_ACTIONS = ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")
BUCKET_READ_ACTIONS = ("s3:ListBucket", "s3:GetBucketLocation")
# What the guards deny to all but the roles they name: the plain actions and those replication
# reads and writes objects with (a role allowed s3:* has them too). Granted to nobody.
GUARDED_READ_ACTIONS = (*OBJECT_READ_ACTIONS, "s3:GetObjectVersionForReplication")
GUARDED_WRITE_ACTIONS = ("s3:PutObject", "s3:ReplicateObject")
# Only the deploy changes a guarded bucket's policy, versioning, lifecycle and replication.
GUARDED_BUCKET_ACTIONS = (
    "s3:PutBucketPolicy",
    "s3:DeleteBucketPolicy",
    "s3:PutBucketVersioning",
    "s3:PutLifecycleConfiguration",
    "s3:PutReplicationConfiguration",
)

# Glue actions an Iceberg writer (Spark GlueCatalog, Hive/Trino on Glue) needs on its databases.
GLUE_READ_ACTIONS = (
    "glue:GetDatabase",
    "glue:GetDatabases",
    "glue:GetTable",
    "glue:GetTables",
    "glue:GetTableVersion",
    "glue:GetTableVersions",
    "glue:GetPartition",
    "glue:GetPartitions",
    "glue:BatchGetPartition",
)
GLUE_WRITE_ACTIONS = (
    "glue:CreateTable",
    "glue:UpdateTable",
    "glue:DeleteTable",
    "glue:BatchDeleteTable",
    "glue:DeleteTableVersion",
    "glue:BatchDeleteTableVersion",
    "glue:CreatePartition",
    "glue:BatchCreatePartition",
    "glue:UpdatePartition",
    "glue:DeletePartition",
    "glue:BatchDeletePartition",
)


class LakeStorage(Construct):
    """Warehouse, artifacts and logs buckets; Glue databases in the warehouse; an Athena workgroup.

    Other stacks reach the buckets by name (deterministic, see `bucket_name`), never by reference.
    """

    #: The buckets' names: logs (access logs, EMR logs), warehouse (Iceberg tables, checkpoints,
    #: Athena results) and artifacts (job code, bootstrap scripts, EMR TLS certificates).
    logs_bucket_name: str
    warehouse_bucket_name: str
    artifacts_bucket_name: str
    #: The buckets themselves, in this stack.
    logs_bucket: s3.Bucket
    warehouse_bucket: s3.Bucket
    artifacts_bucket: s3.Bucket
    #: `s3://<warehouse bucket>/warehouse`: the Iceberg catalog's warehouse.
    warehouse_uri: str
    #: `s3://<logs bucket>/emr/`: the EMR cluster's log URI.
    emr_log_uri: str
    #: `s3://<warehouse bucket>/checkpoints`: the streaming jobs' checkpoints.
    checkpoint_uri: str
    #: The Iceberg namespaces (jobs.config.NAMESPACES), one Glue database each, by namespace.
    database_names: tuple[str, ...]
    databases: dict[str, glue.CfnDatabase]
    #: The Athena workgroup for ad-hoc SQL (`lakehouse-<env>-adhoc`), results in the warehouse bucket.
    athena_workgroup: athena.CfnWorkGroup

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name_prefix: str,
        settings: StorageSettings,
        removal_policy: RemovalPolicy,
        roles: NamedRoles,
        access: AccessSettings,
    ) -> None:
        super().__init__(scope, construct_id)
        auto_delete = removal_policy == RemovalPolicy.DESTROY
        # Note: bucket names are deterministic (prefix, purpose, account, region) so that grants in
        # other stacks are built from names, not cross-stack references, and read clearly in IAM.
        self.logs_bucket_name = bucket_name(name_prefix, "logs")
        self.warehouse_bucket_name = bucket_name(name_prefix, "warehouse")
        self.artifacts_bucket_name = bucket_name(name_prefix, "artifacts")

        # Note: the logs bucket is the target of the other buckets' access logs and of EMR logs, so it
        # cannot log to itself; old logs expire to keep the bill flat.
        self.logs_bucket = s3.Bucket(
            self,
            "LogsBucket",
            bucket_name=self.logs_bucket_name,
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-logs",
                    expiration=Duration.days(settings.access_log_expiration_days),
                    abort_incomplete_multipart_upload_after=Duration.days(7),
                )
            ],
            removal_policy=removal_policy,
            auto_delete_objects=auto_delete,
        )
        acknowledge(
            self.logs_bucket,
            "AwsSolutions-S1",
            "This is the access-log target bucket itself; logging it into itself would loop.",
        )
        skip_check(
            self.logs_bucket,
            "CKV_AWS_18",
            "This is the access-log target bucket itself; logging it into itself would loop.",
        )
        skip_check(
            self.logs_bucket,
            "CKV_AWS_21",
            "Logs are written once by AWS services and expire; nothing overwrites them to undo.",
        )
        versions = (
            Duration.days(settings.noncurrent_version_expiration_days)
            if settings.noncurrent_version_expiration_days is not None
            else None
        )
        # Note: access logs arrive minutes to hours late, so the logs of the auto-delete's own calls
        # land in an auto-deleted logs bucket after it was emptied: DeleteBucket then fails with
        # BucketNotEmpty and `cdk destroy` stops. Only a retained logs bucket receives access logs.
        access_logs = not auto_delete
        no_access_logs = (
            "dev: demo data that `cdk destroy` deletes with the logs bucket; access logs delivered "
            "into that auto-deleted bucket after it was emptied would make its deletion fail "
            "(BucketNotEmpty). prod, whose logs bucket is retained, logs every data bucket."
        )

        def data_bucket(bucket_id: str, name: str, log_prefix: str, lifecycle_rules=()) -> s3.Bucket:
            keep_versions = [
                s3.LifecycleRule(id="expire-noncurrent-versions", noncurrent_version_expiration=versions)
            ]
            bucket = s3.Bucket(
                self,
                bucket_id,
                bucket_name=name,
                encryption=s3.BucketEncryption.S3_MANAGED,
                block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                enforce_ssl=True,
                object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
                server_access_logs_bucket=self.logs_bucket if access_logs else None,
                server_access_logs_prefix=f"s3-access/{log_prefix}/" if access_logs else None,
                removal_policy=removal_policy,
                auto_delete_objects=auto_delete,
                versioned=versions is not None,
                lifecycle_rules=[*lifecycle_rules, *(keep_versions if versions is not None else [])] or None,
            )
            if not access_logs:
                acknowledge(bucket, "AwsSolutions-S1", no_access_logs)
                skip_check(bucket, "CKV_AWS_18", no_access_logs)
            if versions is None:
                skip_check(
                    bucket,
                    "CKV_AWS_21",
                    "dev: demo data that `cdk destroy` deletes; versions would only slow the teardown "
                    "and bill old Iceberg files. prod keeps noncurrent versions (StorageSettings).",
                )
            return bucket

        # Iceberg data and metadata of every table; Athena's query results in their own prefix.
        self.warehouse_bucket = data_bucket(
            "WarehouseBucket",
            self.warehouse_bucket_name,
            "warehouse",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-athena-results",
                    prefix=f"{ATHENA_RESULTS_PREFIX}/",
                    expiration=Duration.days(settings.athena_results_expiration_days),
                )
            ],
        )
        # Job code, bootstrap scripts and the EMR TLS certificates (shipped by the jobs issue).
        self.artifacts_bucket = data_bucket("ArtifactsBucket", self.artifacts_bucket_name, "artifacts")

        self.warehouse_uri = f"s3://{self.warehouse_bucket_name}/{WAREHOUSE_PREFIX}"
        self.emr_log_uri = f"s3://{self.logs_bucket_name}/{EMR_LOGS_PREFIX}/"
        # Streaming checkpoints of the jobs (state, not table data).
        self.checkpoint_uri = f"s3://{self.warehouse_bucket_name}/{CHECKPOINTS_PREFIX}"

        # Glue databases must exist before Spark creates Iceberg tables; each is located in the
        # warehouse where Iceberg's GlueCatalog would put it by default (<warehouse>/<db>.db).
        self.database_names = NAMESPACES
        self.databases = {}
        for namespace in NAMESPACES:
            database = glue.CfnDatabase(
                self,
                f"Database-{namespace}",
                catalog_id=Aws.ACCOUNT_ID,
                database_input=glue.CfnDatabase.DatabaseInputProperty(
                    name=namespace,
                    description=f"Iceberg namespace {namespace} of the lakehouse",
                    location_uri=f"{self.warehouse_uri}/{namespace}.db",
                ),
            )
            database.apply_removal_policy(removal_policy)
            self.databases[namespace] = database

        # Ad-hoc SQL over the same Glue tables; results encrypted, settings enforced on every query.
        self.athena_workgroup = athena.CfnWorkGroup(
            self,
            "AthenaWorkGroup",
            name=f"{name_prefix}-adhoc",
            description="Ad-hoc queries over the lakehouse Iceberg tables",
            recursive_delete_option=auto_delete,
            state="ENABLED",
            work_group_configuration=athena.CfnWorkGroup.WorkGroupConfigurationProperty(
                enforce_work_group_configuration=True,
                publish_cloud_watch_metrics_enabled=True,
                result_configuration=athena.CfnWorkGroup.ResultConfigurationProperty(
                    output_location=(f"s3://{self.warehouse_bucket_name}/{ATHENA_RESULTS_PREFIX}/"),
                    encryption_configuration=athena.CfnWorkGroup.EncryptionConfigurationProperty(
                        encryption_option="SSE_S3"
                    ),
                ),
            ),
        )
        self.athena_workgroup.apply_removal_policy(removal_policy)
        self._guard(roles, access)

    def _guard(self, roles: NamedRoles, access: AccessSettings) -> None:
        """Resource-side guards (infra/access.py): the tables, the TLS key and the code every node
        runs are read or written only by the roles named here, whatever else IAM grants.

        Deletes are not guarded: dev's teardown empties the buckets with CDK's own role, and a
        deleted object fails loudly (a missing table file, a cluster that will not start) where a
        read leaks and a write plants code. prod keeps noncurrent versions of both buckets."""
        instance = roles.cluster_readers
        warehouse = bucket_arn(self.warehouse_bucket_name)
        tables = [f"{warehouse}/{WAREHOUSE_PREFIX}/*", f"{warehouse}/{CHECKPOINTS_PREFIX}/*"]
        self.warehouse_bucket.add_to_resource_policy(
            deny_all_but(
                "OnlyTheLakeReadersReadTables",
                GUARDED_READ_ACTIONS,
                [*tables, f"{warehouse}/{ATHENA_RESULTS_PREFIX}/*"],
                [*instance, *access.lake_readers],
            )
        )
        self.warehouse_bucket.add_to_resource_policy(
            deny_all_but("OnlyTheJobsWriteTables", GUARDED_WRITE_ACTIONS, tables, instance)
        )
        artifacts = bucket_arn(self.artifacts_bucket_name)
        security = f"{artifacts}/{SECURITY_PREFIX}/*"
        tls = role_arn(roles.tls_certificates)
        for sid, prefix, writer in (
            ("OnlyTheBootstrapUploadWritesBootstrap", BOOTSTRAP_PREFIX, role_arn(roles.bootstrap_upload)),
            ("OnlyTheJobsUploadWritesJobCode", ARTIFACTS_PREFIX, role_arn(roles.jobs_upload)),
        ):
            self.artifacts_bucket.add_to_resource_policy(
                deny_all_but(sid, GUARDED_WRITE_ACTIONS, [f"{artifacts}/{prefix}/*"], [writer])
            )
        self.artifacts_bucket.add_to_resource_policy(
            deny_all_but(
                "OnlyTheClusterReadsTlsMaterial",
                GUARDED_READ_ACTIONS,
                [security],
                [*instance, tls, *access.security_admins],
            )
        )
        self.artifacts_bucket.add_to_resource_policy(
            deny_all_but(
                "OnlyTlsAdminsWriteTlsMaterial",
                GUARDED_WRITE_ACTIONS,
                [security],
                [tls, *access.security_admins],
            )
        )
        # Without this, a role allowed s3:* (PowerUserAccess) could delete the guards first.
        # CloudFormation changes them on deploy; dev's teardown denies writes before emptying.
        policy_changers = [deployer_role_arn(self)]
        auto_delete = Stack.of(self).node.try_find_child("Custom::S3AutoDeleteObjectsCustomResourceProvider")
        if auto_delete is not None:
            policy_changers.append(auto_delete.role_arn)
        for bucket, name in (
            (self.warehouse_bucket, self.warehouse_bucket_name),
            (self.artifacts_bucket, self.artifacts_bucket_name),
        ):
            bucket.add_to_resource_policy(
                deny_all_but(
                    "OnlyTheDeployChangesTheGuards",
                    GUARDED_BUCKET_ACTIONS,
                    [bucket_arn(name)],
                    policy_changers,
                )
            )

    # ---- grants -------------------------------------------------------------------------------

    def glue_arns(self) -> list[str]:
        """The catalog, the project's databases and the tables in them (created later by jobs)."""
        arns = [aws_arn("glue", "catalog")]
        for name in self.database_names:
            arns += [aws_arn("glue", f"database/{name}"), aws_arn("glue", f"table/{name}/*")]
        return arns

    def grant_lake_read_write(self, grantee: iam.IGrantable) -> None:
        """Read/write the warehouse and checkpoint prefixes and the Glue databases (the jobs)."""
        principal = grantee.grant_principal
        warehouse = bucket_arn(self.warehouse_bucket_name)
        objects = [f"{warehouse}/{WAREHOUSE_PREFIX}/*", f"{warehouse}/{CHECKPOINTS_PREFIX}/*"]
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="WarehouseObjects",
                actions=[*OBJECT_READ_ACTIONS, *OBJECT_WRITE_ACTIONS],
                resources=objects,
            )
        )
        acknowledge_wildcard_resources(
            grantee,
            objects,
            "Iceberg data/metadata and checkpoint files are created by the jobs at run time; the "
            "grant is limited to the warehouse/ and checkpoints/ prefixes of the warehouse bucket.",
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="WarehouseBucket", actions=list(BUCKET_READ_ACTIONS), resources=[warehouse]
            )
        )
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="GlueLakehouseDatabases",
                actions=[*GLUE_READ_ACTIONS, *GLUE_WRITE_ACTIONS],
                resources=self.glue_arns(),
            )
        )
        acknowledge_wildcard_resources(
            grantee,
            self.glue_arns(),
            "Tables are created by the jobs at run time; the grant covers only tables inside the "
            "project's own Glue databases (dim_db, ods_behavior, ads_behavior).",
        )
        # Spark's and Hive's Glue clients look up the `default` database when they start.
        principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="GlueDefaultDatabaseLookup",
                actions=["glue:GetDatabase", "glue:GetDatabases"],
                resources=[aws_arn("glue", "catalog"), aws_arn("glue", "database/default")],
            )
        )

    def grant_artifacts_read(self, grantee: iam.IGrantable) -> None:
        """Job code, bootstrap scripts and the EMR TLS certificates."""
        artifacts = bucket_arn(self.artifacts_bucket_name)
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ArtifactsRead",
                actions=list(OBJECT_READ_ACTIONS),
                resources=[f"{artifacts}/*"],
            )
        )
        acknowledge_wildcard_resources(
            grantee,
            [f"{artifacts}/*"],
            "Read-only on the project's artifacts bucket: job code, bootstrap scripts and the EMR "
            "TLS certificates, whose keys are chosen when jobs are shipped.",
        )
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ArtifactsBucket", actions=list(BUCKET_READ_ACTIONS), resources=[artifacts]
            )
        )

    def grant_emr_logs_write(self, grantee: iam.IGrantable) -> None:
        emr_logs = f"{bucket_arn(self.logs_bucket_name)}/{EMR_LOGS_PREFIX}/*"
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(sid="EmrLogsWrite", actions=["s3:PutObject"], resources=[emr_logs])
        )
        acknowledge_wildcard_resources(
            grantee,
            [emr_logs],
            "Write-only under emr/ of the logs bucket: EMR names log objects by cluster, node and step ids.",
        )


def bucket_name(name_prefix: str, purpose: str) -> str:
    return f"{name_prefix}-{purpose}-{Aws.ACCOUNT_ID}-{Aws.REGION}"


def bucket_arn(name: str) -> str:
    return aws_arn("s3", name, region=False, account=False)
