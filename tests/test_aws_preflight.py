"""`lakehouse aws preflight`: the checks against moto (Service Quotas stubbed: moto has no EC2 quotas)."""

from __future__ import annotations

import json
import os

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from s3_answers import S3AsAwsAnswers
from support import run_cli

from infra.config import EMR_TLS_CERTIFICATES_KEY, DeploymentConfig
from jobs.config import ConfigError
from lakehouse.aws import preflight

REGION = "us-east-1"


class QuotaStubbedSession:
    """A boto3 session (moto) whose Service Quotas client answers `vcpus` for the EC2 quota and whose
    Lambda client answers GetAccountSettings with `lambda_concurrency` (limit, unreserved), or with
    AccessDenied when it is None (moto implements neither)."""

    def __init__(self, vcpus: float, lambda_concurrency: tuple[int, int] | None = (1000, 1000)) -> None:
        self._session = boto3.Session(region_name=REGION)
        self.region_name = REGION
        self._vcpus = vcpus
        self._lambda_concurrency = lambda_concurrency

    def client(self, name: str):
        client = self._session.client(name)
        if name == "service-quotas":
            stub = Stubber(client)
            stub.add_response(
                "get_service_quota",
                {"Quota": {"QuotaCode": preflight.ON_DEMAND_STANDARD_VCPUS, "Value": self._vcpus}},
                {"ServiceCode": "ec2", "QuotaCode": preflight.ON_DEMAND_STANDARD_VCPUS},
            )
            stub.activate()
        if name == "lambda":
            stub = Stubber(client)
            if self._lambda_concurrency is None:
                stub.add_client_error("get_account_settings", "AccessDeniedException", http_status_code=403)
            else:
                limit, unreserved = self._lambda_concurrency
                settings = {"ConcurrentExecutions": limit, "UnreservedConcurrentExecutions": unreserved}
                stub.add_response("get_account_settings", {"AccountLimit": settings}, {})
            stub.activate()
        return client


class OperatorSession(QuotaStubbedSession):
    """The operator as the artifacts bucket sees them: allowed to list it, denied every read under
    security/ by its policy (infra/constructs/lake_storage.py, OnlyTheClusterReadsTlsMaterial)."""

    def client(self, name: str):
        client = super().client(name)
        if name == "s3":
            return S3AsAwsAnswers(client, may_list_bucket=True, read_denied_prefixes=("security/",))
        return client


@pytest.fixture
def aws():
    with mock_aws():
        yield


def bootstrap_account() -> None:
    template = {"Resources": {"StagingBucket": {"Type": "AWS::S3::Bucket"}}}
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName="CDKToolkit", TemplateBody=json.dumps(template)
    )


def by_name(checks) -> dict[str, preflight.Check]:
    return {c.name: c for c in checks}


def test_azs_are_chosen_by_zone_id_skipping_what_msk_or_an_endpoint_cannot_use():
    zones = [
        {"ZoneName": "us-east-1a", "ZoneId": "use1-az6"},
        {"ZoneName": "us-east-1b", "ZoneId": "use1-az1"},
        {"ZoneName": "us-east-1e", "ZoneId": "use1-az3"},
        {"ZoneName": "us-east-1c", "ZoneId": "use1-az2"},
        {"ZoneName": "us-east-1d", "ZoneId": "use1-az4"},
    ]
    offered = [
        {"us-east-1a", "us-east-1c", "us-east-1d", "us-east-1e"},
        {"us-east-1a", "us-east-1c", "us-east-1d"},
    ]
    chosen, skipped = preflight.choose_azs(zones, offered, 3)
    assert chosen == ["us-east-1c", "us-east-1d", "us-east-1a"]  # zone-ID order: az2, az4, az6
    assert any("use1-az3" in s and "MSK" in s for s in skipped)
    assert any("use1-az1" in s and "endpoint" in s for s in skipped)


def test_a_ready_account_passes_and_the_azs_are_pinned(aws, tmp_path):
    bootstrap_account()
    config = DeploymentConfig.for_env("dev")
    checks, azs = preflight.run_checks(QuotaStubbedSession(64), "dev", config, "bucket")
    assert all(c.ok for c in checks), checks
    assert len(azs) == config.network.max_azs and "us-east-1e" not in azs  # use1-az3 in moto
    context = tmp_path / "cdk.context.json"
    context.write_text(json.dumps({"other": 1}))
    preflight.pin_azs(context, "123456789012", REGION, azs)
    assert json.loads(context.read_text()) == {
        "other": 1,
        preflight.az_context_key("123456789012", REGION): azs,
    }


def test_what_is_missing_is_reported_with_the_fix(aws):
    config = DeploymentConfig.for_env("prod")
    checks = by_name(preflight.run_checks(QuotaStubbedSession(16), "prod", config, "bucket")[0])
    assert not checks["CDK bootstrap"].ok and "cdk bootstrap" in checks["CDK bootstrap"].fix
    vcpus = checks["EC2 On-Demand vCPUs"]
    assert not vcpus.ok and vcpus.fix.startswith(f"request {preflight.ON_DEMAND_STANDARD_VCPUS} >= ")
    certificate = checks["prod TLS certificate"]
    assert not certificate.ok and EMR_TLS_CERTIFICATES_KEY in certificate.found
    assert checks["EMR release"].ok and checks["availability zones"].ok


def test_a_present_certificate_is_found_although_the_operator_may_not_read_it(aws):
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="bucket")
    config = DeploymentConfig.for_env("prod")
    missing = by_name(preflight.run_checks(OperatorSession(64), "prod", config, "bucket")[0])
    assert not missing["prod TLS certificate"].ok
    assert missing["prod TLS certificate"].found.startswith("missing: ")
    s3.put_object(Bucket="bucket", Key=EMR_TLS_CERTIFICATES_KEY, Body=b"zip")
    present = by_name(preflight.run_checks(OperatorSession(64), "prod", config, "bucket")[0])
    assert present["prod TLS certificate"].ok, present["prod TLS certificate"]


@pytest.mark.parametrize(
    ("concurrency", "advice"),
    [((1000, 1000), False), ((10, 10), True), ((1000, 40), True), (None, False)],
    ids=["default quota", "new account", "mostly reserved by others", "not allowed to look"],
)
def test_lambda_concurrency_is_reported_and_never_fails_the_preflight(aws, concurrency, advice):
    """A new account's Lambda quota can be 10; the stacks reserve no concurrency, so it is
    information (with advice when low), never a reason to stop."""
    bootstrap_account()
    config = DeploymentConfig.for_env("dev")
    session = QuotaStubbedSession(64, lambda_concurrency=concurrency)
    checks = by_name(preflight.run_checks(session, "dev", config, "bucket")[0])
    check = checks["Lambda concurrency"]
    assert check.ok and all(c.ok for c in checks.values()), checks
    if concurrency is None:
        assert check.found.startswith("not checked") and "AccessDenied" in check.found
    else:
        limit, unreserved = concurrency
        assert f"quota {limit}, {unreserved} unreserved" in check.found
    assert bool(check.fix) == advice
    if advice:
        assert preflight.LAMBDA_CONCURRENCY_QUOTA in check.fix


def test_no_credentials_is_one_clear_error():
    env = {
        **os.environ,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",  # never ask an instance metadata service
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(key, None)
    result = run_cli("aws", "preflight", "--env", "dev", check=False, env=env, timeout=120)
    assert result.returncode == 1
    assert "no AWS credentials" in result.stderr and "Traceback" not in result.stderr


def deploy_monitoring_stack(config: DeploymentConfig) -> str:
    """The deployed Monitoring stack as the preflight sees it: its alerts topic as an output."""
    topic = boto3.client("sns", region_name=REGION).create_topic(Name="alerts")["TopicArn"]
    template = {
        "Resources": {"Placeholder": {"Type": "AWS::S3::Bucket"}},
        "Outputs": {"AlertsTopicArn": {"Value": topic}},
    }
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName=config.stack_name("Monitoring"), TemplateBody=json.dumps(template)
    )
    return topic


def test_prod_alerts_must_reach_someone(aws):
    """Before the first deploy a reminder; deployed with nobody subscribed, a failure with the fix;
    one confirmed subscription passes. dev is not asked."""
    config = DeploymentConfig.for_env("prod")
    before = preflight.alert_subscribers(boto3.Session(region_name=REGION), config)
    assert before.ok and "alert_email" in before.fix and before.found == "not deployed yet"

    topic = deploy_monitoring_stack(config)
    checks = by_name(preflight.run_checks(QuotaStubbedSession(64), "prod", config, "bucket")[0])
    alerts = checks["prod alerts reach someone"]
    assert not alerts.ok and alerts.found == "0 confirmed subscription(s)"
    assert "-c alert_email=" in alerts.fix and "AlertsTopicArn" in alerts.fix

    boto3.client("sns", region_name=REGION).subscribe(
        TopicArn=topic, Protocol="email", Endpoint="oncall@example.com"
    )
    checks = by_name(preflight.run_checks(QuotaStubbedSession(64), "prod", config, "bucket")[0])
    assert checks["prod alerts reach someone"].ok
    dev = by_name(
        preflight.run_checks(QuotaStubbedSession(64), "dev", DeploymentConfig.for_env("dev"), "b")[0]
    )
    assert "prod alerts reach someone" not in dev


def test_an_alert_email_is_checked_and_subscribed_through_the_config():
    config = DeploymentConfig.for_env("prod", alert_email="oncall@example.com")
    assert config.monitoring.alarm_email == "oncall@example.com"
    assert DeploymentConfig.for_env("prod").monitoring.alarm_email is None
    with pytest.raises(ConfigError, match="not an e-mail address"):
        DeploymentConfig.for_env("prod", alert_email="oncall")


def test_the_glue_databases_of_another_environment_stop_the_deploy(aws):
    """dev and prod keep the source system's database names; a catalog is per account and region."""
    glue = boto3.client("glue", region_name=REGION)
    session = boto3.Session(region_name=REGION)
    prod_warehouse, dev_warehouse = "lakehouse-prod-warehouse-1-r", "lakehouse-dev-warehouse-1-r"
    assert preflight.glue_databases_free(session, prod_warehouse).found == "none yet"
    glue.create_database(
        DatabaseInput={"Name": "dim_db", "LocationUri": f"s3://{prod_warehouse}/warehouse/dim_db.db"}
    )
    again = preflight.glue_databases_free(session, prod_warehouse)
    assert again.ok and again.found == "this environment's: dim_db"
    glue.create_database(
        DatabaseInput={"Name": "ods_behavior", "LocationUri": f"s3://{dev_warehouse}/warehouse/x.db"}
    )
    bootstrap_account()
    config = DeploymentConfig.for_env("prod")
    checks = preflight.run_checks(QuotaStubbedSession(64), "prod", config, "bucket", prod_warehouse)[0]
    clash = by_name(checks)["Glue databases"]
    assert not clash.ok and "ods_behavior (s3://lakehouse-dev-warehouse-1-r/" in clash.found
    assert "own account or region" in clash.fix


def test_the_dev_preflight_pins_the_caller_s_role_with_its_path_as_a_lake_reader(aws, tmp_path):
    from infra.config import DEV_LAKE_READERS_CONTEXT_KEY

    iam = boto3.client("iam", region_name=REGION)
    statement = {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"AWS": "123456789012"}}
    trust = {"Version": "2012-10-17", "Statement": [statement]}
    role = iam.create_role(RoleName="Admin", Path="/team/", AssumeRolePolicyDocument=json.dumps(trust))[
        "Role"
    ]
    credentials = boto3.client("sts", region_name=REGION).assume_role(
        RoleArn=role["Arn"], RoleSessionName="me@example.com"
    )["Credentials"]
    session = boto3.Session(
        region_name=REGION,
        aws_access_key_id=credentials["AccessKeyId"],
        aws_secret_access_key=credentials["SecretAccessKey"],
        aws_session_token=credentials["SessionToken"],
    )
    arn, _ = preflight.caller_role_arn(session)
    assert arn == "arn:aws:iam::123456789012:role/team/Admin"  # the role with its path, not the session
    context = tmp_path / "cdk.context.json"
    context.write_text(json.dumps({"other": 1}))
    preflight.pin_lake_reader(context, arn)
    preflight.pin_lake_reader(context, arn)  # again: once
    assert json.loads(context.read_text()) == {"other": 1, DEV_LAKE_READERS_CONTEXT_KEY: [arn]}
    # moto's default caller is an IAM user: no role, nothing to pin
    assert preflight.caller_role_arn(boto3.Session(region_name=REGION)) == (None, "you are not an IAM role")
