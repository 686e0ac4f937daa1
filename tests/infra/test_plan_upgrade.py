"""`lakehouse aws plan-upgrade`: the synthesized app over the templates CloudFormation holds (moto).

moto cannot create the app's own stacks (it fails on their templates), so each case deploys a small
stack under one of the app's stack names, as an older version could have left it: the command reads
it back with GetTemplate, diffs it with the CDK CLI and says what goes.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from moto import mock_aws

from lakehouse.cli import main

pytestmark = [pytest.mark.synth, pytest.mark.timeout(600)]


@pytest.fixture
def aws(monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        import boto3

        yield boto3.client("cloudformation", region_name="us-east-1")


def deploy(cloudformation, stack: str, resources: dict) -> None:
    cloudformation.create_stack(StackName=stack, TemplateBody=json.dumps({"Resources": resources}))


def plan(dev, *extra: str):
    return CliRunner().invoke(
        main, ["aws", "plan-upgrade", "--env", "dev", "--assembly", str(dev.outdir), *extra]
    )


def planned(dev) -> tuple[int, dict]:
    result = plan(dev, "--json")
    return result.exit_code, json.loads(result.stdout)


def test_a_bucket_the_deployed_stack_has_and_this_version_drops_is_refused(dev, aws):
    deploy(aws, "Lakehouse-dev-Lake", {"WarehouseOfAnOlderVersion": {"Type": "AWS::S3::Bucket"}})
    code, found = planned(dev)
    assert code == 1, found
    (row,) = found["rows"]
    assert (row["logical_id"], row["impact"], row["refuses"]) == (
        "WarehouseOfAnOlderVersion",
        "destroy",
        True,
    )
    assert row["holds"].startswith("objects")
    # The other six stacks are not deployed in this account: created, nothing to diff.
    assert len(found["not_deployed"]) == 6 and "Lakehouse-dev-Lake" not in found["not_deployed"]
    table = plan(dev)
    assert table.exit_code == 1 and "refused" in table.output


def test_a_resource_that_holds_nothing_may_go(dev, aws):
    deploy(aws, "Lakehouse-dev-Monitoring", {"TopicOfAnOlderVersion": {"Type": "AWS::SNS::Topic"}})
    code, found = planned(dev)
    assert code == 0, found
    (row,) = found["rows"]
    assert (row["logical_id"], row["impact"], row["holds"]) == ("TopicOfAnOlderVersion", "destroy", None)
    table = plan(dev)
    assert table.exit_code == 0 and "nothing holding data is replaced or removed" in table.output


def test_without_credentials_it_says_what_to_do(dev, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = plan(dev)
    assert result.exit_code == 2  # no plan: not a refusal
    assert "no AWS credentials" in result.output


def test_a_deployed_stack_this_version_no_longer_has_is_read_too(dev, aws):
    """`cdk deploy --all` leaves a stack the app dropped deployed and unmanaged: what it keeps is
    named (a Retain log group refuses, a topic does not)."""
    deploy(
        aws,
        "Lakehouse-dev-Archive",
        {
            "KeptLogs": {"Type": "AWS::Logs::LogGroup", "DeletionPolicy": "Retain"},
            "Scratch": {"Type": "AWS::SNS::Topic"},
        },
    )
    code, found = planned(dev)
    assert code == 1, found
    rows = {r["logical_id"]: (r["stack"], r["impact"], r["refuses"]) for r in found["rows"]}
    assert rows == {
        "KeptLogs": ("Lakehouse-dev-Archive", "orphan", True),
        "Scratch": ("Lakehouse-dev-Archive", "orphan", False),
    }


def test_an_assembly_of_another_environment_makes_no_plan(dev, aws):
    result = CliRunner().invoke(main, ["aws", "plan-upgrade", "--env", "prod", "--assembly", str(dev.outdir)])
    assert result.exit_code == 2
    assert "synthesized for another env" in result.output
