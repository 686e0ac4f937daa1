"""checkov findings we accept, each with its reason, written where checkov reads them.

checkov (the second scanner beside cdk-nag, run by tests/infra/test_infra_checkov.py) skips a check
on a resource whose template `Metadata.checkov.skip` lists it with a comment. Findings that apply to
every Lambda function of the app are accepted here in one place; a finding about one resource is
accepted beside it with `skip_check`.
"""

from __future__ import annotations

import jsii
from aws_cdk import CfnResource, IAspect
from constructs import IConstruct

# Every function of the app is a CloudFormation custom-resource handler (ours and CDK's provider,
# trigger, bucket-deployment and auto-delete handlers) or the scheduled step supervisor.
LAMBDA_FINDINGS = {
    "CKV_AWS_115": "Runs once per deploy or once per schedule tick: no event source fans out, so "
    "reserved concurrency would only take from the account's pool.",
    "CKV_AWS_116": "Invoked synchronously by CloudFormation (errors go back to the stack operation) "
    "or by a schedule whose next tick repeats the whole reconciliation: a DLQ would stay empty.",
    "CKV_AWS_117": "Calls only AWS APIs (S3, EMR, EC2, CloudFormation, CloudWatch); outside the VPC "
    "it needs no NAT. The one function that talks to the database (seeding) runs in the VPC.",
    "CKV_AWS_173": "The environment holds names and ARNs only, never a secret (passwords are read "
    "from Secrets Manager at run time); Lambda encrypts it at rest with its service key.",
}


def skip_check(construct: IConstruct, check_id: str, reason: str) -> None:
    """Accept one checkov finding on the construct's CloudFormation resource, with the reason."""
    resource = construct if isinstance(construct, CfnResource) else construct.node.default_child
    skips = _skips(resource)
    if not any(entry["id"] == check_id for entry in skips):
        skips.append({"id": check_id, "comment": reason})
        resource.add_metadata("checkov", {"skip": skips})


def _skips(resource: CfnResource) -> list[dict[str, str]]:
    current = resource.get_metadata("checkov")
    return list(current.get("skip", [])) if isinstance(current, dict) else []


@jsii.implements(IAspect)
class AcceptedLambdaFindings:
    def visit(self, node: IConstruct) -> None:
        # CDK's own providers declare theirs as plain CfnResources of this type.
        if isinstance(node, CfnResource) and node.cfn_resource_type == "AWS::Lambda::Function":
            for check_id, reason in LAMBDA_FINDINGS.items():
                skip_check(node, check_id, reason)
