"""Upgrading in place from the last release (`git pull && cdk deploy`) keeps every data-holding resource.

Today's templates are diffed against the release baseline (tests/infra/baselines/, `make baseline`)
with the CDK CLI's own diff, offline (`cdk diff --template`): the engine and the CloudFormation
replacement rules a deploy plans with. A data-holding resource replaced, deleted or orphaned fails.
The controls mutate the baseline the way real changes would (a construct rename moving a bucket's
logical id, a create-only RDS property) and must be refused; a cluster replacement must not be.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from lakehouse.aws.upgrade_plan import cdk_runner, diff_assembly, plan_rows
from lakehouse.release import REPO, current_baseline

pytestmark = [pytest.mark.synth, pytest.mark.timeout(600)]

CDK = REPO / "node_modules" / ".bin" / "cdk"


def _plan(synthesized, old_templates, tmp_path: Path):
    run = cdk_runner(CDK, REPO)
    changes = diff_assembly(run, synthesized.outdir, old_templates, tmp_path)
    return plan_rows(changes, old_templates, synthesized.config.env_name)


def _table(rows) -> str:
    return "\n".join(
        f"{r.change.stack} {r.change.resource_type} {r.change.logical_id} {r.change.impact}"
        f"{' HOLDS ' + r.holds if r.holds else ''}"
        for r in rows
    )


def test_todays_templates_keep_every_data_holding_resource_of_the_last_release(synthesized, tmp_path):
    baseline = current_baseline()
    old = baseline.templates(synthesized.config.env_name)
    assert len(old) == 7, f"{baseline.directory}: {sorted(old)}"
    rows = _plan(synthesized, old, tmp_path)
    refused = [r for r in rows if r.refuses]
    assert not refused, (
        f"upgrading {synthesized.config.env_name} from release {baseline.commit[:12]} would lose data:\n"
        f"{_table(refused)}\n(every replacement:\n{_table(rows)})"
    )


def test_a_moved_bucket_and_a_replaced_database_are_refused_a_replaced_cluster_is_not(prod, tmp_path):
    """Positive control: the baseline mutated as real changes would make it."""
    mutated = ("Lake", "SourceDatabase", "Compute")  # only these stacks are diffed: the others are new
    old = {
        k: copy.deepcopy(t)
        for k, t in current_baseline().templates("prod").items()
        if k.split("-")[-1] in mutated
    }
    lake, database, compute = (
        old[f"Lakehouse-prod-{c}"]["Resources"] for c in ("Lake", "SourceDatabase", "Compute")
    )
    (warehouse,) = [
        k for k in lake if k.startswith("LakeWarehouseBucket") and lake[k]["Type"] == "AWS::S3::Bucket"
    ]
    lake["Old" + warehouse] = lake.pop(warehouse)  # the construct had another id in the release
    (instance,) = [k for k, r in database.items() if r["Type"] == "AWS::RDS::DBInstance"]
    database[instance]["Properties"]["StorageEncrypted"] = False  # create-only: a new, empty instance
    (cluster,) = [k for k, r in compute.items() if r["Type"] == "AWS::EMR::Cluster"]
    compute[cluster]["Properties"]["ReleaseLabel"] = "emr-7.0.0"  # a release change: a new cluster

    rows = {(r.change.stack, r.change.logical_id): r for r in _plan(prod, old, tmp_path)}
    moved = rows[("Lakehouse-prod-Lake", "Old" + warehouse)]
    assert (moved.change.impact, moved.refuses) == ("orphan", True), _table(rows.values())
    replaced = rows[("Lakehouse-prod-SourceDatabase", instance)]
    assert (replaced.change.impact, replaced.refuses) == ("replace", True)
    assert "re-snapshot" in replaced.first
    new_cluster = rows[("Lakehouse-prod-Compute", cluster)]
    assert (new_cluster.change.impact, new_cluster.refuses) == ("replace", False)
    assert "termination protection" in new_cluster.first
    assert {r.change.stack for r in rows.values() if r.refuses} == {
        "Lakehouse-prod-Lake",
        "Lakehouse-prod-SourceDatabase",
    }


def test_a_stack_the_release_had_and_today_lacks_loses_what_it_held(dev, tmp_path):
    old = {
        "Lakehouse-dev-Archive": {
            "Resources": {"Kept": {"Type": "AWS::S3::Bucket", "DeletionPolicy": "Retain"}}
        }
    }
    (row,) = _plan(dev, old, tmp_path)
    assert (row.change.impact, row.refuses) == ("orphan", True)


def test_every_output_of_the_last_release_is_still_there(synthesized):
    """Operators' scripts and `lakehouse aws` read the stacks' outputs: an upgrade keeps each one."""
    old = current_baseline().templates(synthesized.config.env_name)
    for concern, template in synthesized.templates.items():
        stack = synthesized.config.stack_name(concern)
        lost = set(old[stack].get("Outputs", {})) - set(template.get("Outputs", {}))
        assert not lost, f"{stack} no longer has the outputs {sorted(lost)}"
