"""Source database: RDS for MySQL 8.0 with row-based binlog, its secrets, and the seeding."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_rds as rds
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import custom_resources as cr
from constructs import Construct

from infra import seed_data
from infra.access import deny_all_but, deployer_role_arn
from infra.bundling import python_function_code
from infra.checkov import skip_check
from infra.config import SourceDatabaseSettings
from infra.nag import acknowledge, acknowledge_custom_resource_function
from jobs.config import RDS_CA_BUNDLE, SOURCE_DATABASE

# Supported, non-deprecated MySQL 8.0 minor available in aws-cdk-lib 2.275.0.
# MySQL 8.4 (LTS): 8.0's standard support ended 2026-07-31, and new 8.0 instances are enrolled in
# paid RDS Extended Support. 8.4 keeps every binlog setting the CDC reader needs.
MYSQL_ENGINE_VERSION = rds.MysqlEngineVersion.VER_8_4_10
MYSQL_PORT = 3306
ADMIN_USER = "lakehouse_admin"
CDC_USER = "cdc_user"
BINLOG_RETENTION_HOURS = 24


# What the CDC reader needs from the server (see ENVIRONMENT.md "binlog"), and TLS for every client.
def seed_version() -> str:
    """A fingerprint of what the seeding runs (its statements and the handler)."""
    import hashlib

    handler = Path(__file__).resolve().parents[1] / "lambdas" / "seed_source_db" / "handler.py"
    digest = hashlib.sha256(Path(seed_data.__file__).read_bytes() + handler.read_bytes())
    return digest.hexdigest()[:16]


SERVER_PARAMETERS = {
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
    "time_zone": "UTC",
    # Every client connects with TLS and verifies the server (jobs/rds-ca-bundle.pem).
    "require_secure_transport": "1",
}
RDS_LOG_EXPORTS = ("error", "slowquery")
PASSWORD_EXCLUDED_CHARACTERS = "\"'@/\\` %:;&"


class SourceDatabase(Construct):
    """RDS MySQL (`user_db`) for CDC: binlog parameters, admin + CDC secrets, seeded on deploy."""

    #: The database the CDC job reads (`user_db`, jobs.config.SOURCE_DATABASE).
    database_name: str
    #: The instance's security group; the Compute stack admits the EMR nodes to it on MYSQL_PORT.
    security_group: ec2.SecurityGroup
    #: The RDS instance (parked: stopped by `lakehouse aws park`, still in the template).
    instance: rds.DatabaseInstance
    #: The endpoint's address and port (deploy-time tokens).
    host: str
    port: str
    #: The KMS key of both secrets: a reader needs it granted too (`grant_cdc_secret_read`).
    secrets_key: kms.Key
    #: The generated admin credentials (only the seeding Lambda reads them).
    admin_secret: secretsmanager.ISecret
    #: The CDC user's credentials, with host, port and dbname: all a CDC job needs is its ARN.
    cdc_secret: secretsmanager.Secret
    #: The seeding custom resource (tables, rows and the CDC user, on every deploy).
    seed: CustomResource

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        instance_identifier: str,
        settings: SourceDatabaseSettings,
        removal_policy: RemovalPolicy,
        cdc_readers: list[str],
    ) -> None:
        super().__init__(scope, construct_id)
        self.database_name = SOURCE_DATABASE

        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, description="RDS MySQL source", allow_all_outbound=False
        )

        # Note: the CDC reader needs row images with column names (binlog_row_metadata=FULL).
        parameters = rds.ParameterGroup(
            self,
            "Parameters",
            engine=rds.DatabaseInstanceEngine.mysql(version=MYSQL_ENGINE_VERSION),
            description="Row-based binlog for CDC",
            parameters=SERVER_PARAMETERS,
        )

        # The exported log groups are ours (not RDS-created), so retention applies and dev teardown
        # removes them; the instance has a fixed identifier so their names are known up front.
        exported_log_groups = [
            logs.LogGroup(
                self,
                f"{log_type.capitalize()}Logs",
                log_group_name=f"/aws/rds/instance/{instance_identifier}/{log_type}",
                retention=logs.RetentionDays.ONE_MONTH,
                removal_policy=removal_policy
                if removal_policy != RemovalPolicy.SNAPSHOT
                else RemovalPolicy.RETAIN,
            )
            for log_type in RDS_LOG_EXPORTS
        ]

        # The secrets' own key (checkov CKV_AWS_149): reading a secret needs both the secret and the
        # key granted, so `grant_read` below is the whole list of readers.
        data_removal = (
            RemovalPolicy.DESTROY if removal_policy == RemovalPolicy.DESTROY else RemovalPolicy.RETAIN
        )
        self.secrets_key = kms.Key(
            self,
            "SecretsKey",
            description=f"Secrets Manager secrets of {SOURCE_DATABASE} (admin, CDC user)",
            enable_key_rotation=True,
            pending_window=Duration.days(7),
            removal_policy=data_removal,
        )
        # Generated admin password, kept in Secrets Manager (never a literal in the template).
        admin_secret = rds.DatabaseSecret(
            self,
            "AdminSecret",
            username=ADMIN_USER,
            encryption_key=self.secrets_key,
            exclude_characters=PASSWORD_EXCLUDED_CHARACTERS,
        )
        admin_secret.apply_removal_policy(data_removal)

        # Note: binlog needs automated backups, so retention is at least 1 day. Storage encrypted;
        # IAM auth on; prod is multi-AZ with deletion protection and leaves a snapshot on delete.
        self.instance = rds.DatabaseInstance(
            self,
            "Instance",
            engine=rds.DatabaseInstanceEngine.mysql(version=MYSQL_ENGINE_VERSION),
            instance_identifier=instance_identifier,
            instance_type=ec2.InstanceType(settings.instance_class),
            vpc=vpc,
            vpc_subnets=subnets,
            security_groups=[self.security_group],
            port=MYSQL_PORT,
            credentials=rds.Credentials.from_secret(admin_secret),
            parameter_group=parameters,
            allocated_storage=settings.allocated_storage_gib,
            max_allocated_storage=settings.max_allocated_storage_gib,
            storage_type=rds.StorageType.GP3,
            storage_encrypted=True,
            iam_authentication=True,
            multi_az=settings.multi_az,
            deletion_protection=settings.deletion_protection,
            backup_retention=Duration.days(settings.backup_retention_days),
            delete_automated_backups=removal_policy != RemovalPolicy.SNAPSHOT,
            cloudwatch_logs_exports=list(RDS_LOG_EXPORTS),
            # OS metrics every minute (CPU steal, memory, disk queue): what CloudWatch's hypervisor
            # view misses on a burstable dev instance and what a prod incident needs.
            monitoring_interval=Duration.seconds(60),
            auto_minor_version_upgrade=True,
            publicly_accessible=False,
            removal_policy=removal_policy,
        )
        for log_group in exported_log_groups:
            self.instance.node.add_dependency(log_group)
        acknowledge(
            self.instance.node.find_child("MonitoringRole"),
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AmazonRDSEnhancedMonitoringRole]",
            "The AWS managed policy for RDS enhanced monitoring: it lets RDS write the OS metrics to "
            "its own RDSOSMetrics log group, nothing else.",
        )
        self.admin_secret = self.instance.secret
        self.host = self.instance.db_instance_endpoint_address
        self.port = self.instance.db_instance_endpoint_port

        # A separate, generated secret for the CDC job (never the admin's); the seeding creates the
        # MySQL user from it. Host and port are in it so the job needs only the secret id.
        self.cdc_secret = secretsmanager.Secret(
            self,
            "CdcSecret",
            description=f"MySQL CDC user of {SOURCE_DATABASE} (binlog reader)",
            encryption_key=self.secrets_key,
            generate_secret_string=secretsmanager.SecretStringGenerator(
                secret_string_template=Stack.of(self).to_json_string(
                    {
                        "username": CDC_USER,
                        "host": self.host,
                        "port": MYSQL_PORT,
                        "dbname": SOURCE_DATABASE,
                    }
                ),
                generate_string_key="password",
                exclude_characters=PASSWORD_EXCLUDED_CHARACTERS,
                password_length=32,
            ),
            removal_policy=data_removal,
        )
        for secret in (admin_secret, self.cdc_secret):
            acknowledge(
                secret,
                "AwsSolutions-SMG4",
                "Not rotated automatically yet: the CDC job holds a long-lived binlog session with "
                "this password and the seeding owns the MySQL user; rotation needs a multi-user "
                "rotation Lambda (follow-up). Both passwords are generated, never literals.",
            )

        self._acknowledge_environment_choices(settings)
        seeder = self._seed(vpc=vpc, subnets=subnets)
        self._guard_secrets(admin_secret, seeder.role, cdc_readers)

    def _guard_secrets(
        self, admin_secret: secretsmanager.Secret, seeder_role: iam.IRole, cdc_readers: list[str]
    ) -> None:
        """Resource policies (infra/access.py): the key's policy leaves decryption to IAM for the
        whole account, so without these any role allowed secretsmanager:GetSecretValue and
        kms:Decrypt on "*" (PowerUserAccess) could read the passwords."""
        deployer = deployer_role_arn(self)
        for secret in (admin_secret, self.cdc_secret):
            # Without this, a role allowed secretsmanager:* (PowerUserAccess) could remove the guard.
            secret.add_to_resource_policy(
                deny_all_but(
                    "OnlyTheDeployChangesTheGuard",
                    ["secretsmanager:PutResourcePolicy", "secretsmanager:DeleteResourcePolicy"],
                    ["*"],
                    [deployer],
                )
            )
            # Or write a value of its own (the seeding function then sets the MySQL user's password
            # to it) or replicate the secret to a region outside these guards.
            secret.add_to_resource_policy(
                deny_all_but(
                    "OnlyTheDeployWritesThePassword",
                    [
                        "secretsmanager:PutSecretValue",
                        "secretsmanager:UpdateSecret",
                        "secretsmanager:UpdateSecretVersionStage",
                        "secretsmanager:ReplicateSecretToRegions",
                    ],
                    ["*"],
                    [deployer],
                )
            )
        admin_secret.add_to_resource_policy(
            deny_all_but(
                "OnlyTheSeedingAndTheDeployReadTheAdminPassword",
                ["secretsmanager:GetSecretValue"],
                ["*"],
                [seeder_role.role_arn, deployer],
            )
        )
        self.cdc_secret.add_to_resource_policy(
            deny_all_but(
                "OnlyTheSeedingAndTheClusterReadTheCdcPassword",
                ["secretsmanager:GetSecretValue"],
                ["*"],
                [seeder_role.role_arn, *cdc_readers],
            )
        )

    def _acknowledge_environment_choices(self, settings: SourceDatabaseSettings) -> None:
        acknowledge(
            self.instance,
            "AwsSolutions-RDS11",
            "MySQL's standard port: the CDC reader and the local stack use it; access is limited "
            "by security groups to the EMR nodes and the seeding Lambda, not by port obscurity.",
        )
        # dev trades availability for cost; prod has both on (no acknowledgement there).
        if not settings.multi_az:
            single_az = (
                "dev only: single-AZ to halve cost; the source data is seed data, recreated on deploy."
            )
            acknowledge(self.instance, "AwsSolutions-RDS3", single_az)
            skip_check(self.instance, "CKV_AWS_157", single_az)
        if not settings.deletion_protection:
            acknowledge(
                self.instance,
                "AwsSolutions-RDS10",
                "dev only: `cdk destroy` must remove everything; prod has deletion protection.",
            )

    def _seed(self, *, vpc: ec2.IVpc, subnets: ec2.SubnetSelection) -> lambda_.Function:
        seeder_sg = ec2.SecurityGroup(
            self, "SeederSecurityGroup", vpc=vpc, description="Source DB seeding Lambda"
        )
        self.security_group.add_ingress_rule(seeder_sg, ec2.Port.tcp(MYSQL_PORT), "seeding Lambda to MySQL")
        # In the VPC because the database is private; PyMySQL is vendored at synth (no Docker).
        seeder = lambda_.Function(
            self,
            "SeedFunction",
            description=f"Seeds {SOURCE_DATABASE} and creates the CDC user",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="handler.on_event",
            code=python_function_code(
                "seed_source_db", packages=("pymysql",), files=(Path(seed_data.__file__), RDS_CA_BUNDLE)
            ),
            timeout=Duration.minutes(2),
            vpc=vpc,
            vpc_subnets=subnets,
            security_groups=[seeder_sg],
            log_group=logs.LogGroup(
                self,
                "SeedFunctionLogs",
                retention=logs.RetentionDays.ONE_MONTH,
                removal_policy=RemovalPolicy.DESTROY,
            ),
        )
        self.admin_secret.grant_read(seeder)
        self.cdc_secret.grant_read(seeder)

        provider = cr.Provider(self, "SeedProvider", on_event_handler=seeder)
        self.seed = CustomResource(
            self,
            "Seed",
            service_token=provider.service_token,
            resource_type="Custom::SourceDatabaseSeed",
            properties={
                "Host": self.host,
                "Port": str(MYSQL_PORT),
                "DatabaseName": SOURCE_DATABASE,
                "AdminSecretArn": self.admin_secret.secret_arn,
                "CdcSecretArn": self.cdc_secret.secret_arn,
                "BinlogRetentionHours": str(BINLOG_RETENTION_HOURS),
                # A changed seed (a new grant, CDC's barrier table) runs the idempotent seeding
                # again on the next deploy; unchanged properties would not call the handler.
                "SeedVersion": seed_version(),
            },
        )
        self.seed.node.add_dependency(self.instance)
        acknowledge_custom_resource_function(seeder, provider, in_vpc=True)
        return seeder

    # ---- grants -------------------------------------------------------------------------------

    def allow_cdc_from(self, peer: ec2.ISecurityGroup, grantee: iam.IGrantable) -> None:
        """Network access to MySQL from `peer` and read access to the CDC secret for `grantee`."""
        # remote_rule=True keeps the rule in the peer's stack, so this stack does not depend on it.
        self.security_group.add_ingress_rule(peer, ec2.Port.tcp(MYSQL_PORT), "CDC reader to MySQL", True)
        self.grant_cdc_secret_read(grantee)

    def grant_cdc_secret_read(self, grantee: iam.IGrantable) -> None:
        """Read the CDC secret, decrypting with its key. Written into the grantee's own policy
        only (the key's policy trusts the account's IAM): a grantee in a later stack then never
        makes this stack depend on it."""
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"],
                resources=[self.cdc_secret.secret_arn],
            )
        )
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["kms:Decrypt"],
                resources=[self.secrets_key.key_arn],
                conditions={
                    "StringEquals": {
                        "kms:ViaService": f"secretsmanager.{Stack.of(self).region}.amazonaws.com"
                    }
                },
            )
        )
