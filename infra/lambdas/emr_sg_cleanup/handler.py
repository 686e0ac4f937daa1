"""Custom resource: on Delete, revoke the rules EMR added between its managed security groups.

EMR adds rules that make its managed security groups reference each other; CloudFormation then
cannot delete them and `cdk destroy` hangs (aws/aws-cdk#10777). The custom resource is created after
the groups and before the cluster, so on teardown it runs after the cluster is gone and before the
groups are deleted. Only group-to-group rules are revoked; CIDR rules stay for CloudFormation.
Properties: SecurityGroupIds (list).
"""

from __future__ import annotations

import logging

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)
PHYSICAL_ID = "emr-managed-security-group-cleanup"


def group_references(permissions: list[dict]) -> list[dict]:
    """The permissions that reference other security groups, reduced to just those references."""
    kept = []
    for permission in permissions:
        pairs = permission.get("UserIdGroupPairs") or []
        if not pairs:
            continue
        reduced = {key: permission[key] for key in ("IpProtocol", "FromPort", "ToPort") if key in permission}
        reduced["UserIdGroupPairs"] = [
            {key: pair[key] for key in ("GroupId", "UserId") if key in pair} for pair in pairs
        ]
        kept.append(reduced)
    return kept


def on_event(event, context):  # noqa: ARG001 - Lambda signature
    if event["RequestType"] != "Delete":
        return {"PhysicalResourceId": PHYSICAL_ID}

    import boto3  # in the Lambda runtime

    ec2 = boto3.client("ec2")
    group_ids = event["ResourceProperties"]["SecurityGroupIds"]
    for group in ec2.describe_security_groups(GroupIds=group_ids)["SecurityGroups"]:
        ingress = group_references(group.get("IpPermissions", []))
        egress = group_references(group.get("IpPermissionsEgress", []))
        if ingress:
            ec2.revoke_security_group_ingress(GroupId=group["GroupId"], IpPermissions=ingress)
        if egress:
            ec2.revoke_security_group_egress(GroupId=group["GroupId"], IpPermissions=egress)
        LOG.info("%s: revoked %d ingress, %d egress", group["GroupId"], len(ingress), len(egress))
    return {"PhysicalResourceId": PHYSICAL_ID}
