"""Deploy-review findings, checked on both environments' synthesized templates: a fresh account's
Lambda quota, a `cdk destroy` that runs to the end, and the EMR instance profile's name."""

from __future__ import annotations

import json

from aws_cdk import Stack

CONCERNS = ("Network", "Lake", "Streaming", "SourceDatabase", "Compute", "Monitoring", "Jobs")
SUPERVISOR_DESCRIPTION = "Keeps the streaming jobs running as EMR steps"


def _resources(template: dict, resource_type: str) -> dict[str, dict]:
    return {
        logical_id: resource
        for logical_id, resource in template.get("Resources", {}).items()
        if resource["Type"] == resource_type
    }


# ---- (2) no reserved concurrency --------------------------------------------------------------


def test_no_lambda_reserves_concurrency(synthesized):
    """A new account's concurrency quota can be 10, and a reservation must leave 100 unreserved:
    any ReservedConcurrentExecutions rolls the stack back there."""
    functions = {
        f"{concern}/{logical_id}": resource["Properties"]
        for concern, template in synthesized.templates.items()
        for logical_id, resource in _resources(template, "AWS::Lambda::Function").items()
    }
    assert set(synthesized.templates) == set(CONCERNS)
    # The supervisor, which used to reserve one execution, is among the functions looked at.
    assert any(
        SUPERVISOR_DESCRIPTION in props.get("Description", "")
        for name, props in functions.items()
        if name.startswith("Jobs/")
    )
    reserving = {
        name: props["ReservedConcurrentExecutions"]
        for name, props in functions.items()
        if "ReservedConcurrentExecutions" in props
    }
    assert not reserving, reserving


# ---- (3) a teardown that does not stop half-way -------------------------------------------------


def _auto_deleted_buckets(template: dict) -> set[str]:
    """Logical ids of the buckets that CDK's auto-delete custom resource empties on delete."""
    return {
        resource["Properties"]["BucketName"]["Ref"]
        for resource in _resources(template, "Custom::S3AutoDeleteObjects").values()
    }


def _access_log_targets(template: dict) -> dict[str, object]:
    """Bucket logical id -> its LoggingConfiguration's DestinationBucketName, for logging buckets."""
    return {
        logical_id: resource["Properties"]["LoggingConfiguration"]["DestinationBucketName"]
        for logical_id, resource in _resources(template, "AWS::S3::Bucket").items()
        if "LoggingConfiguration" in resource.get("Properties", {})
    }


def _logs_bucket_id(env) -> str:
    lake = env.stacks.lake
    return lake.get_logical_id(lake.lake.logs_bucket.node.default_child)


def test_dev_sends_no_access_logs_into_an_auto_deleted_bucket(dev):
    """Access logs of the auto-delete's own calls arrive after it emptied the target: DeleteBucket
    then fails with BucketNotEmpty and `cdk destroy` stops with the NAT and endpoints still up."""
    assert dev.config.retain_data is False
    checked = 0
    for concern in CONCERNS:
        template = dev.templates[concern]
        auto_deleted = _auto_deleted_buckets(template)
        if concern == "Lake":  # the positive control: dev does auto-delete its logs bucket
            assert _logs_bucket_id(dev) in auto_deleted
        for bucket, target in _access_log_targets(template).items():
            checked += 1
            assert isinstance(target, dict) and set(target) == {"Ref"}, (bucket, target)
            assert target["Ref"] not in auto_deleted, f"{concern}/{bucket} logs into auto-deleted {target}"
    assert checked == 0  # dev's data buckets are auto-deleted too: none of them logs


def test_prod_logs_every_data_bucket_into_the_retained_logs_bucket(prod):
    template = prod.templates["Lake"]
    logs_bucket = _logs_bucket_id(prod)
    buckets = _resources(template, "AWS::S3::Bucket")
    assert buckets[logs_bucket]["DeletionPolicy"] == "Retain"
    assert not _auto_deleted_buckets(template)
    data_buckets = set(buckets) - {logs_bucket}
    assert len(data_buckets) >= 2  # warehouse and artifacts
    assert _access_log_targets(template) == dict.fromkeys(data_buckets, {"Ref": logs_bucket})


def test_network_is_destroyed_before_the_lake(synthesized):
    """`cdk destroy` removes dependents first: with Network depending on Lake, a Lake teardown that
    stops (a bucket that will not empty) no longer leaves the NAT gateway and endpoints billing."""
    manifest = json.loads((synthesized.outdir / "manifest.json").read_text())
    name = synthesized.config.stack_name
    assert name("Lake") in manifest["artifacts"][name("Network")].get("dependencies", [])
    assert name("Network") not in manifest["artifacts"][name("Lake")].get("dependencies", [])
    # The stacks that need the VPC still come after it.
    for concern in ("Streaming", "SourceDatabase", "Compute"):
        assert name("Network") in manifest["artifacts"][name(concern)]["dependencies"], concern


# ---- (6) EMR instance profile named like its role ------------------------------------------------


def test_emr_instance_profile_has_its_roles_name(synthesized):
    """EMR warns that an instance profile named unlike its role can fail with "invalid instance
    profile"; CDK's own EMR task names the profile after the role."""
    compute = synthesized.stacks.compute
    role_id = compute.get_logical_id(compute.compute.instance_role.node.default_child)
    assert Stack.of(compute.compute.instance_role) is compute
    (profile,) = _resources(synthesized.templates["Compute"], "AWS::IAM::InstanceProfile").values()
    props = profile["Properties"]
    assert props["Roles"] == [{"Ref": role_id}]
    assert props.get("InstanceProfileName") == {"Ref": role_id}
