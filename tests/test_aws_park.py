"""`lakehouse aws park|unpark` against moto (CloudFormation, RDS). The CDK deploy itself needs an
account: the tests record the deploy the CLI asks for, and what state RDS is in when it does."""

from __future__ import annotations

import json
import os

import boto3
import pytest
from moto import mock_aws
from support import run_cli

from infra.config import DeploymentConfig
from lakehouse.aws import park

REGION = "us-east-1"
DEV = DeploymentConfig.for_env("dev")
INSTANCE = DEV.resource_name("source-mysql")


class RecordingCdk:
    """Stands in for `cdk deploy` (no account here); records each call and RDS's state at that time."""

    def __init__(self, session, *, fail: bool = False) -> None:
        self.calls: list[tuple[list[str], str]] = []
        self._rds = session.client("rds")
        self._fail = fail

    def __call__(self, args) -> None:
        (instance,) = self._rds.describe_db_instances(DBInstanceIdentifier=INSTANCE)["DBInstances"]
        self.calls.append((list(args), instance["DBInstanceStatus"]))
        if self._fail:
            raise park.ParkError("cdk deploy failed (exit 1): see its output above")


@pytest.fixture
def session():
    with mock_aws():
        yield boto3.Session(region_name=REGION)


def deploy_dev(session, *, database: bool = True) -> None:
    cloudformation = session.client("cloudformation")
    template = json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}})
    for concern in ("Network", "Lake", "Streaming", "SourceDatabase", "Compute", "Monitoring", "Jobs"):
        cloudformation.create_stack(StackName=DEV.stack_name(concern), TemplateBody=template)
    if database:
        session.client("rds").create_db_instance(
            DBInstanceIdentifier=INSTANCE, DBInstanceClass="db.t4g.micro", Engine="mysql",
            MasterUsername="admin", MasterUserPassword="not-a-secret-1", AllocatedStorage=20,
        )  # fmt: skip


def database_status(session) -> str:
    (instance,) = session.client("rds").describe_db_instances(DBInstanceIdentifier=INSTANCE)["DBInstances"]
    return instance["DBInstanceStatus"]


def test_park_deploys_the_parked_app_then_stops_the_database(session):
    deploy_dev(session)
    cdk, log = RecordingCdk(session), []
    park.park(session, DEV, cdk, log.append)
    assert cdk.calls == [
        (
            ["deploy", "-c", "env=dev", "-c", "parked=true", "--all", "--require-approval", "never"],
            "available",
        )
    ]
    assert database_status(session) == "stopped"
    assert "run `lakehouse aws park --env dev` again then" in log[-1]
    # Parking twice is harmless: the database is already stopped.
    park.park(session, DEV, cdk, log.append)
    assert database_status(session) == "stopped" and len(cdk.calls) == 2


def test_unpark_starts_the_database_before_the_deploy(session):
    deploy_dev(session)
    park.park(session, DEV, RecordingCdk(session), lambda _: None)
    cdk = RecordingCdk(session)
    park.unpark(session, DEV, cdk, lambda _: None)
    # CloudFormation cannot update a stopped instance: RDS is up when the deploy runs.
    assert cdk.calls == [(["deploy", "-c", "env=dev", "--all", "--require-approval", "never"], "available")]
    assert database_status(session) == "available"


def test_a_failed_deploy_leaves_the_database_running(session):
    deploy_dev(session)
    with pytest.raises(park.ParkError, match="cdk deploy failed"):
        park.park(session, DEV, RecordingCdk(session, fail=True), lambda _: None)
    assert database_status(session) == "available"


def test_nothing_deployed_is_a_clear_error_and_deploys_nothing(session):
    cdk = RecordingCdk(session)
    with pytest.raises(park.ParkError, match="Lakehouse-dev-Network, Lakehouse-dev-SourceDatabase, "
                       "Lakehouse-dev-Compute not deployed .* `cdk deploy -c env=dev --all`"):  # fmt: skip
        park.park(session, DEV, cdk, lambda _: None)
    assert cdk.calls == []


def test_a_missing_database_is_a_clear_error(session):
    deploy_dev(session, database=False)
    with pytest.raises(park.ParkError, match="source database lakehouse-dev-source-mysql does not exist"):
        park.unpark(session, DEV, RecordingCdk(session), lambda _: None)


def no_credentials() -> dict[str, str]:
    env = {
        **os.environ,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(key, None)
    return env


@pytest.mark.parametrize(
    ("command", "error"),
    [
        (("park", "--env", "prod"), "prod cannot be parked"),  # refused before credentials are asked
        (("unpark", "--env", "dev"), "no AWS credentials"),
    ],
)
def test_cli_errors_are_one_clear_line(command, error):
    result = run_cli("aws", *command, check=False, env=no_credentials(), timeout=120)
    assert result.returncode == 1
    assert error in result.stderr and "Traceback" not in result.stderr
