"""The upgrade plan's reading of `cdk diff` and its verdicts, on the CLI's own output lines (the
formats of the pinned CLI, aws-cdk 2.1148: `[~] <type> <path> <logical id> <impact>`, colours, an
appended `(OR move ...)`); the diff itself runs in tests/infra/test_upgrade_baseline.py."""

from __future__ import annotations

from collections import Counter

import pytest

from lakehouse.aws.upgrade_plan import PlanError, holds_data, parse_cdk_diff, plan_rows

DIFF = """
Stack Lakehouse-prod-Lake
Parameters
[-] Parameter OldParameter: {"Type":"String"}
Resources
[~] AWS::RDS::DBInstance SourceDatabase/Instance Instance797AD7A6 replace
 └─ [~] StorageEncrypted (requires replacement)
[-] AWS::S3::Bucket Lake/Logs Bucket OldLogs5F21DAB1 orphan (OR move to Lake/Logs via refactoring)
\x1b[31m[-] AWS::Logs::LogGroup Old/Group OldGroup12\x1b[39m
[+] AWS::S3::Bucket Lake/LogsBucket LakeLogsBucket5F21DAB1
[~] AWS::Lambda::Function Jobs/Supervisor Supervisor1A2B
[~] AWS::EMR::Cluster Compute/Cluster Cluster3C4D may be replaced

Outputs
[-] Output OldOutput: {"Value":"x"}
"""


def test_every_resource_line_with_its_impact_and_nothing_else():
    found = Counter((c.resource_type, c.logical_id, c.path, c.impact) for c in parse_cdk_diff("S", DIFF))
    assert found == Counter(  # each line once: a line read twice would double a row
        {
            ("AWS::RDS::DBInstance", "Instance797AD7A6", "SourceDatabase/Instance", "replace"),
            ("AWS::S3::Bucket", "OldLogs5F21DAB1", "Lake/Logs Bucket", "orphan"),
            ("AWS::Logs::LogGroup", "OldGroup12", "Old/Group", "destroy"),  # no word: taken as destroyed
            ("AWS::S3::Bucket", "LakeLogsBucket5F21DAB1", "Lake/LogsBucket", "add"),
            ("AWS::Lambda::Function", "Supervisor1A2B", "Jobs/Supervisor", "update"),
            ("AWS::EMR::Cluster", "Cluster3C4D", "Compute/Cluster", "may be replaced"),
        }
    )


def test_resource_changes_the_parser_cannot_read_are_an_error_not_an_empty_plan():
    with pytest.raises(PlanError, match="does not read"):
        parse_cdk_diff("S", "Resources\n[~] Bucket LakeLogsBucket replace\n")
    assert parse_cdk_diff("S", "There were no differences\n") == []


def test_what_holds_data_by_type_old_type_or_a_keeping_policy():
    assert holds_data("AWS::S3::Bucket", None).startswith("objects")
    assert holds_data("AWS::SNS::Topic", {"Type": "AWS::SNS::Topic"}) is None
    # The logical id now names another type: what the old one held goes.
    assert holds_data("AWS::SNS::Topic", {"Type": "AWS::S3::Bucket"}).startswith("objects")
    for policy in ("DeletionPolicy", "UpdateReplacePolicy"):
        assert holds_data("AWS::Logs::LogGroup", {"Type": "AWS::Logs::LogGroup", policy: "Retain"})
    assert (
        holds_data("AWS::Logs::LogGroup", {"Type": "AWS::Logs::LogGroup", "DeletionPolicy": "Delete"}) is None
    )


def test_rows_refuse_only_what_holds_data_and_goes():
    changes = parse_cdk_diff("S", DIFF)
    old = {"S": {"Resources": {"OldGroup12": {"Type": "AWS::Logs::LogGroup", "DeletionPolicy": "Retain"}}}}
    rows = {r.change.logical_id: r for r in plan_rows(changes, old, "prod")}
    assert set(rows) == {"Instance797AD7A6", "OldLogs5F21DAB1", "OldGroup12", "Cluster3C4D"}  # no add/update
    assert {k for k, r in rows.items() if r.refuses} == {"Instance797AD7A6", "OldLogs5F21DAB1", "OldGroup12"}
    assert "termination protection" in rows["Cluster3C4D"].first
    assert "termination protection" not in plan_rows(changes, old, "dev")[-1].first
