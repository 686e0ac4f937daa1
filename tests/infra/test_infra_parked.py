"""A parked dev environment (`-c parked=true`): the cost goes, the data and the identities stay."""

from __future__ import annotations

import json

import pytest
from aws_cdk import App
from cfnlint.api import lint

from infra.lakehouse_app import config_from_context
from jobs.config import ConfigError


def resources_of_type(env, concern: str, resource_type: str) -> dict:
    return {
        logical_id: resource
        for logical_id, resource in env.templates[concern]["Resources"].items()
        if resource["Type"] == resource_type
    }


def all_resource_types(env) -> list[str]:
    return [r["Type"] for template in env.templates.values() for r in template["Resources"].values()]


def test_parked_dev_has_no_cluster_nat_interface_endpoints_or_job_runs(dev, parked_dev):
    running, parked = all_resource_types(dev), all_resource_types(parked_dev)
    for costly in ("AWS::EMR::Cluster", "AWS::EC2::NatGateway", "AWS::EC2::EIP", "AWS::Scheduler::Schedule",
                   "AWS::StepFunctions::StateMachine"):  # fmt: skip
        assert costly in running, costly
        assert costly not in parked, costly
    endpoints = resources_of_type(parked_dev, "Network", "AWS::EC2::VPCEndpoint").values()
    assert [e["Properties"].get("VpcEndpointType", "Gateway") for e in endpoints] == ["Gateway"]
    # Nothing in the VPC routes to the internet except the public subnets' gateway route.
    routes = resources_of_type(parked_dev, "Network", "AWS::EC2::Route").values()
    assert all("GatewayId" in route["Properties"] for route in routes)
    # The artifacts stay current, so `unpark` starts the version the code says.
    assert resources_of_type(parked_dev, "Jobs", "Custom::CDKBucketDeployment")
    assert not resources_of_type(parked_dev, "Jobs", "AWS::Lambda::Function").keys() & {
        k for k in resources_of_type(dev, "Jobs", "AWS::Lambda::Function") if "Supervisor" in k
    }


def test_parking_keeps_the_lake_the_source_the_stream_and_every_subnet(dev, parked_dev):
    # Identical templates: a parked deploy cannot replace or delete anything in them.
    for concern in ("Lake", "Streaming", "SourceDatabase"):
        assert parked_dev.templates[concern] == dev.templates[concern], concern
    # Same subnets (logical IDs and CIDRs): MSK and RDS stay where they are.
    subnets = {
        k: r["Properties"]["CidrBlock"]
        for k, r in resources_of_type(dev, "Network", "AWS::EC2::Subnet").items()
    }
    parked_subnets = resources_of_type(parked_dev, "Network", "AWS::EC2::Subnet")
    assert {k: r["Properties"]["CidrBlock"] for k, r in parked_subnets.items()} == subnets
    # Roles, the security configuration and the job settings stay, so unparking changes nothing else;
    # the cluster's id parameter goes and comes back with the cluster.
    for kept in ("AWS::IAM::Role", "AWS::EMR::SecurityConfiguration", "AWS::SSM::Parameter"):
        following_the_cluster = {
            k for k in resources_of_type(dev, "Compute", kept) if k.startswith("ClusterId")
        }
        assert (
            resources_of_type(parked_dev, "Compute", kept).keys()
            == resources_of_type(dev, "Compute", kept).keys() - following_the_cluster
        )
        assert len(following_the_cluster) == (kept == "AWS::SSM::Parameter")


def test_parked_monitoring_expects_no_data_from_the_stopped_database(parked_dev):
    (alarm,) = [
        a for a in resources_of_type(parked_dev, "Monitoring", "AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") == "FreeStorageSpace"
    ]  # fmt: skip
    assert alarm["Properties"]["TreatMissingData"] == "ignore"
    assert not resources_of_type(parked_dev, "Monitoring", "AWS::Events::Rule")


def test_parked_dev_is_nag_clean(parked_dev):
    assert parked_dev.nag_report is None, parked_dev.nag_report


@pytest.mark.parametrize(
    ("context", "error"),
    [
        ({"env": "prod", "parked": "true"}, "prod cannot be parked"),
        ({"env": "dev", "parked": "yes"}, "-c parked=yes: expected true or false"),
    ],
)
def test_only_dev_parks_and_the_flag_is_checked(context, error):
    with pytest.raises(ConfigError, match=error):
        config_from_context(App(context=context), environ={})


@pytest.mark.parametrize("concern", ["Network", "Compute", "Monitoring", "Jobs"])
def test_parked_templates_pass_cfn_lint(parked_dev, concern):
    matches = lint(json.dumps(parked_dev.templates[concern]), regions=["us-east-1"])
    assert not [f"{m.rule.id} {m.message} ({m.path})" for m in matches if m.rule.id.startswith("E")]
