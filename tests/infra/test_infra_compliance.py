"""cdk-nag, cfn-lint, IAM scoping and secrets hygiene over every synthesized template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_s3 as s3
from cfn import as_list
from cfnlint.api import lint

from infra.nag import add_nag_checks

# Statements that must use Resource "*", each with the reason (keyed by their action set).
EXPLAINED_STAR_RESOURCES = {
    frozenset({"ec2:DescribeSecurityGroups"}): (
        "EMR security-group cleanup Lambda: Describe* does not support resource-level permissions"
    ),
    frozenset(
        {
            "logs:CreateLogDelivery", "logs:DeleteLogDelivery", "logs:DescribeLogGroups",
            "logs:DescribeResourcePolicies", "logs:GetLogDelivery", "logs:ListLogDeliveries",
            "logs:PutResourcePolicy", "logs:UpdateLogDelivery", "xray:GetSamplingRules",
            "xray:GetSamplingTargets", "xray:PutTelemetryRecords", "xray:PutTraceSegments",
        }
    ): "Step Functions log delivery and X-Ray tracing (CDK's grants): no resource-level permissions",
    frozenset({"cloudwatch:PutMetricData"}): (
        "the jobs' metrics: no resource-level permissions; a cloudwatch:namespace condition limits it"
    ),
    frozenset(
        {
            "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
            "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel",
        }
    ): "Session Manager's session channels on the nodes: ssmmessages has no resource-level permissions",
    frozenset({"elasticmapreduce:ListClusters"}): (
        "the supervisor finds a replaced cluster of its name (handover): ListClusters has no resource type"
    ),
}  # fmt: skip
# Resource policies (key, bucket, topic, secret policies) are not identity grants: "*" there means
# "this resource". They are checked by cdk-nag instead.
IDENTITY_POLICY_TYPES = ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::IAM::Role")


def test_cdk_nag_has_no_unacknowledged_findings(synthesized):
    assert synthesized.nag_report is None, f"cdk-nag findings:\n{synthesized.nag_report}"
    # Clean because cdk-nag ran on this app and found only acknowledged findings, not because it
    # never ran: its report is there, successful, and lists the acknowledged ones.
    nag = synthesized.nag_plugin_report()
    assert nag["conclusion"] == "success" and nag["violations"] == []
    suppressed = {v["ruleName"].split("[")[0] for v in nag["suppressedViolations"]}
    assert {"AwsSolutions-IAM4", "AwsSolutions-IAM5", "AwsSolutions-SMG4"} <= suppressed


def test_cdk_nag_reports_the_known_findings_of_a_canary_stack(tmp_path):
    """The positive control of the test above: the same checks (add_nag_checks) fail the synth of a
    one-bucket app whose bucket has no access logs (AwsSolutions-S1) and no TLS-only policy (-S10)."""
    context = json.loads((Path(__file__).resolve().parents[2] / "cdk.json").read_text())["context"]
    app = App(context=context, outdir=str(tmp_path))
    s3.Bucket(Stack(app, "NagCanary"), "Bucket")
    add_nag_checks(app)
    with pytest.raises(RuntimeError):  # jsii surfaces the failed validation as RuntimeError
        app.synth()
    reports = json.loads((tmp_path / "validation-report.json").read_text())["pluginReports"]
    (nag,) = [r for r in reports if r["pluginName"] == "AwsSolutions"]
    assert nag["conclusion"] == "failure"
    found = {(v["ruleName"], c["constructPath"]) for v in nag["violations"] for c in v["violatingConstructs"]}
    assert {
        ("AwsSolutions-S1", "NagCanary/Bucket/Resource"),
        ("AwsSolutions-S10", "NagCanary/Bucket/Resource"),
    } <= found


def test_every_acknowledgement_has_a_reason(synthesized):
    acknowledgements = synthesized.acknowledgements()
    nag = [a for a in acknowledgements if a[1].startswith("AwsSolutions::AwsSolutions-")]
    assert nag, "expected the documented AwsSolutions acknowledgements"
    for path, rule, reason in acknowledgements:
        assert reason and len(reason.strip()) >= 20, f"{path}: {rule} has no real reason"


@pytest.mark.parametrize(
    "concern", ["Network", "Lake", "Streaming", "SourceDatabase", "Compute", "Monitoring", "Jobs"]
)
def test_cfn_lint_has_no_errors(synthesized, concern):
    matches = lint(json.dumps(synthesized.templates[concern]), regions=["us-east-1"])
    errors = [f"{m.rule.id} {m.message} ({m.path})" for m in matches if m.rule.id.startswith("E")]
    assert not errors, "\n".join(errors)


def _statements(template: dict) -> Iterator[tuple[str, dict]]:
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] not in IDENTITY_POLICY_TYPES:
            continue
        props = resource.get("Properties", {})
        documents = [props["PolicyDocument"]] if "PolicyDocument" in props else []
        documents += [p["PolicyDocument"] for p in props.get("Policies", [])]
        for document in documents:
            for statement in document["Statement"]:
                yield logical_id, statement


def test_every_star_resource_is_explained(synthesized):
    unexplained = []
    for concern, template in synthesized.templates.items():
        for logical_id, statement in _statements(template):
            if "*" in as_list(statement.get("Resource", [])):
                actions = frozenset(as_list(statement["Action"]))
                if actions not in EXPLAINED_STAR_RESOURCES:
                    unexplained.append(f"{concern}/{logical_id}: {sorted(actions)}")
    assert not unexplained, "Resource '*' without a reason:\n" + "\n".join(unexplained)


def test_emr_instance_role_is_scoped_to_project_resources(synthesized):
    template = synthesized.templates["Compute"]
    env = synthesized.config.env_name
    role_policies = [
        s for logical_id, s in _statements(template) if logical_id.startswith("ComputeInstanceRole")
    ]
    assert role_policies
    project_markers = (
        f"lakehouse-{env}-",  # buckets, MSK cluster
        "elasticmapreduce/*",  # EMR's own regional bucket
        ":glue:",  # catalog + the project's databases, checked below
        "/lakehouse/",  # SSM parameters (by name)
        "JobSettingsParameter",  # the job settings parameter (a reference)
        "Secret",  # the CDC secret (a reference)
        "Key",  # the EMR disk key (a reference)
        "InstanceRole",  # PassRole on itself
        ":instance/*",  # Session Manager's agent registers the instance it runs on
    )
    actions_seen = set()
    for statement in role_policies:
        assert statement["Effect"] == "Allow"
        actions_seen |= set(as_list(statement["Action"]))
        for resource in as_list(statement["Resource"]):
            rendered = json.dumps(resource)
            if rendered == '"*"' and statement.get("Sid") == "SessionManagerChannels":
                assert all(a.startswith("ssmmessages:") for a in as_list(statement["Action"]))
                continue
            if rendered == '"*"':
                # Otherwise only the metrics grant, and only inside this environment's namespace.
                assert statement["Action"] == "cloudwatch:PutMetricData", statement
                namespace = {"StringEquals": {"cloudwatch:namespace": f"Lakehouse/{env}"}}
                assert statement["Condition"] == namespace
                continue
            assert any(marker in rendered for marker in project_markers), rendered
            if ":glue:" in rendered:
                assert any(
                    part in rendered
                    for part in (":catalog", "dim_db", "ods_behavior", "ads_behavior", "database/default")
                ), rendered
    assert {
        "kafka-cluster:Connect",
        "kafka-cluster:ReadData",
        "secretsmanager:GetSecretValue",
        "glue:CreateTable",
        "s3:PutObject",
    } <= actions_seen
    assert not any(a.endswith(":*") or a == "*" for a in actions_seen)


# ---- no literal passwords -------------------------------------------------------------------


def _is_password_key(key: str) -> bool:
    # SecretString is a secret's literal value; SecretStringTemplate (non-secret fields) is fine.
    return "password" in key.lower() or "passwd" in key.lower() or key == "SecretString"


def literal_passwords(node, path: str = "") -> list[str]:
    """Paths of password-like keys whose value is a literal, not a reference or dynamic lookup."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}/{key}"
            if _is_password_key(key) and isinstance(value, str):
                if not value.startswith("{{resolve:"):
                    found.append(here)
            found += literal_passwords(value, here)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += literal_passwords(value, f"{path}[{index}]")
    return found


def test_password_detector_catches_literals():
    bad = {
        "Resources": {
            "Db": {"Properties": {"MasterUserPassword": "hunter2"}},
            "Fn": {"Properties": {"Environment": {"Variables": {"DB_PASSWORD": "x"}}}},
            "S": {"Properties": {"SecretString": '{"password": "x"}'}},
        }
    }
    assert len(literal_passwords(bad)) == 3
    good = {
        "MasterUserPassword": "{{resolve:secretsmanager:arn:secret:SecretString:password}}",
        "MasterUserPasswordRef": {"Fn::Join": ["", ["{{resolve:secretsmanager:", "x", "}}"]]},
    }
    assert literal_passwords(good) == []


def test_no_template_holds_a_literal_password(synthesized):
    for concern, template in synthesized.templates.items():
        assert literal_passwords(template) == [], concern
