"""Data in transit and at rest, on the synthesized templates: TLS required by RDS, customer-managed
keys for log groups and secrets, prod's versioned buckets, RDS enhanced monitoring."""

from __future__ import annotations

import ssl

import pytest
from aws_cdk.assertions import Match

from infra.constructs.source_database import SERVER_PARAMETERS
from jobs.config import RDS_CA_BUNDLE, LakehouseConfig


def resources(env, concern: str, kind: str) -> dict[str, dict]:
    return {k: r for k, r in env.templates[concern]["Resources"].items() if r["Type"] == kind}


def test_rds_requires_tls_from_every_client(synthesized) -> None:
    synthesized.template("SourceDatabase").has_resource_properties(
        "AWS::RDS::DBParameterGroup",
        {"Family": "mysql8.4", "Parameters": Match.object_like({"require_secure_transport": "1"})},
    )
    assert SERVER_PARAMETERS["binlog_row_metadata"] == "FULL"


def test_the_jobs_verify_rds_against_the_shipped_ca_bundle() -> None:
    config = LakehouseConfig.aws(
        env="dev",
        region="us-east-1",
        kafka_bootstrap="b:9098",
        mysql_host="db.example.us-east-1.rds.amazonaws.com",
        mysql_port=3306,
        mysql_cdc_secret_id="arn:secret",
    )
    assert config.mysql.tls_options() == {
        "ssl_ca": str(RDS_CA_BUNDLE),
        "ssl_verify_cert": True,
        "ssl_verify_identity": True,
    }
    # A real bundle: the certificates load, among them the current RDS root CAs.
    context = ssl.create_default_context(cafile=str(RDS_CA_BUNDLE))
    subjects = {dict(x[0] for x in cert["subject"]).get("commonName") for cert in context.get_ca_certs()}
    assert len(subjects) > 50
    assert "Amazon RDS us-east-1 Root CA RSA2048 G1" in subjects


def test_the_seeding_lambda_bundles_the_ca(synthesized) -> None:
    stage = next(synthesized.outdir.glob("asset.*/rds-ca-bundle.pem"), None)
    assert stage is not None, "the seeding function's asset has no rds-ca-bundle.pem"
    assert stage.read_bytes() == RDS_CA_BUNDLE.read_bytes()


@pytest.mark.parametrize("concern", ["Network", "Streaming", "SourceDatabase", "Compute", "Jobs"])
def test_every_log_group_is_encrypted_with_the_stacks_key(synthesized, concern: str) -> None:
    groups = resources(synthesized, concern, "AWS::Logs::LogGroup")
    keys = resources(synthesized, concern, "AWS::KMS::Key")
    assert groups
    (logs_key,) = [k for k in keys if k.startswith("LogsKey")]
    for name, group in groups.items():
        assert group["Properties"]["KmsKeyId"] == {"Fn::GetAtt": [logs_key, "Arn"]}, name
    statements = keys[logs_key]["Properties"]["KeyPolicy"]["Statement"]
    logs_statement = next(s for s in statements if "Service" in s["Principal"])
    assert "kms:EncryptionContext:aws:logs:arn" in logs_statement["Condition"]["ArnLike"]
    assert keys[logs_key]["Properties"]["EnableKeyRotation"] is True


def test_secrets_use_their_own_key_and_only_granted_roles_decrypt(synthesized) -> None:
    secrets = resources(synthesized, "SourceDatabase", "AWS::SecretsManager::Secret")
    assert len(secrets) == 2
    for name, secret in secrets.items():
        assert secret["Properties"]["KmsKeyId"]["Fn::GetAtt"][0].startswith("SourceDatabaseSecretsKey"), name
    synthesized.template("Compute").has_resource_properties(
        "AWS::IAM::Policy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Action": "kms:Decrypt", "Condition": Match.any_value()})]
                )
            }
        },
    )


def test_prod_keeps_noncurrent_versions_for_30_days_and_dev_none(dev, prod) -> None:
    for bucket in ("LakeWarehouseBucket", "LakeArtifactsBucket"):
        (prod_bucket,) = [
            r for k, r in resources(prod, "Lake", "AWS::S3::Bucket").items() if k.startswith(bucket)
        ]
        assert prod_bucket["Properties"]["VersioningConfiguration"] == {"Status": "Enabled"}
        rules = prod_bucket["Properties"]["LifecycleConfiguration"]["Rules"]
        assert {"Id": "expire-noncurrent-versions", "NoncurrentVersionExpiration": {"NoncurrentDays": 30},
                "Status": "Enabled"} in rules  # fmt: skip
        (dev_bucket,) = [
            r for k, r in resources(dev, "Lake", "AWS::S3::Bucket").items() if k.startswith(bucket)
        ]
        assert "VersioningConfiguration" not in dev_bucket["Properties"]


def test_rds_has_enhanced_monitoring_every_minute(synthesized) -> None:
    synthesized.template("SourceDatabase").has_resource_properties(
        "AWS::RDS::DBInstance", {"MonitoringInterval": 60, "MonitoringRoleArn": Match.any_value()}
    )
