"""cdk-nag (3.x) wiring: the AwsSolutions pack on the whole app, and reasoned acknowledgements."""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Aws, Stack, Token, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

# Acknowledgement ids are "<plugin>::<rule>"; cdk-nag's AwsSolutions pack reports as this plugin.
NAG_PLUGIN = "AwsSolutions"

LAMBDA_BASIC_EXECUTION_FINDING = (
    "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]"
)
LAMBDA_VPC_EXECUTION_FINDING = (
    "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
    "AWSLambdaVPCAccessExecutionRole]"
)


def acknowledge_custom_resource_function(function, provider, *, in_vpc: bool = False) -> None:
    """The findings every Lambda-backed custom resource (function + CDK Provider) carries."""
    acknowledge(
        function,
        LAMBDA_BASIC_EXECUTION_FINDING,
        "AWS managed AWSLambdaBasicExecutionRole only lets the function write its own logs.",
    )
    if in_vpc:
        acknowledge(
            function,
            LAMBDA_VPC_EXECUTION_FINDING,
            "AWS managed AWSLambdaVPCAccessExecutionRole: the ENI actions a Lambda in a VPC "
            "needs (they do not support resource-level permissions).",
        )
    acknowledge(
        provider,
        LAMBDA_BASIC_EXECUTION_FINDING,
        "CDK Provider framework Lambda; the managed policy only grants writing its own logs.",
    )
    acknowledge(
        provider,
        f"AwsSolutions-IAM5[Resource::<{Stack.of(function).get_logical_id(function.node.default_child)}.Arn>:*]",
        "CDK Provider framework may invoke any version/alias of the one handler function.",
    )


# cdk-nag renders pseudo parameters as <AWS::...>; ARNs built from `aws_arn` keep that rendering
# whether or not the stack is bound to an account/region, so acknowledgement ids stay stable.
_NAG_PSEUDO_RENDERING = {
    Aws.PARTITION: "<AWS::Partition>",
    Aws.REGION: "<AWS::Region>",
    Aws.ACCOUNT_ID: "<AWS::AccountId>",
}


def aws_arn(service: str, resource: str, *, region: bool = True, account: bool = True) -> str:
    """An ARN in this stack's partition/region/account, always as pseudo parameters."""
    return (
        f"arn:{Aws.PARTITION}:{service}:{Aws.REGION if region else ''}:"
        f"{Aws.ACCOUNT_ID if account else ''}:{resource}"
    )


def nag_rendering(value: str) -> str:
    for token, rendered in _NAG_PSEUDO_RENDERING.items():
        value = value.replace(token, rendered)
    return value


def acknowledge_wildcard_resources(scope: IConstruct, resources: list[str], reason: str) -> None:
    """Acknowledge AwsSolutions-IAM5 for each wildcard resource of a grant, with the grant's reason."""
    for resource in resources:
        if "*" in resource:
            acknowledge(scope, f"AwsSolutions-IAM5[Resource::{nag_rendering(resource)}]", reason)


def add_nag_checks(app: App) -> None:
    """Run AwsSolutions on every template at synth; an unacknowledged finding fails the synth."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge one finding (e.g. `AwsSolutions-IAM5[Resource::*]`) on `scope` and its children.

    Every acknowledgement needs a reason a reviewer can check; an empty one is a bug.
    """
    if len(reason.strip()) < 20:
        raise ValueError(f"acknowledging {rule_id} needs a real reason, got {reason!r}")
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{NAG_PLUGIN}::{rule_id}", reason=reason))


def acknowledge_bucket_deployment(deployment, *, destination_bucket_name: str) -> None:
    """The findings of CDK's BucketDeployment: its singleton upload function (runtime, managed logs
    policy) and the S3 actions CDK grants it on the staging and destination buckets."""
    reason = (
        "CDK's BucketDeployment copies the asset from the CDK staging bucket to "
        f"{destination_bucket_name}: its CDK-managed role needs object read/write/delete on both"
    )
    role = deployment.handler_role
    acknowledge(role, LAMBDA_BASIC_EXECUTION_FINDING, "AWS managed policy: the function writes its own logs")
    for action in ("s3:GetBucket*", "s3:GetObject*", "s3:List*", "s3:Abort*", "s3:DeleteObject*"):
        acknowledge(role, f"AwsSolutions-IAM5[Action::{action}]", reason)
    # CDK writes these ARNs with the stack's own partition/account/region: literal when the stack
    # is bound to an environment, pseudo parameters otherwise.
    stack = Stack.of(deployment)

    def rendered(value: str, pseudo: str) -> str:
        return pseudo if Token.is_unresolved(value) else value

    partition = rendered(stack.partition, "<AWS::Partition>")
    account = rendered(stack.account, "<AWS::AccountId>")
    assets = f"cdk-hnb659fds-assets-{account}-{rendered(stack.region, '<AWS::Region>')}"
    for bucket in (destination_bucket_name, assets):
        acknowledge(role, f"AwsSolutions-IAM5[Resource::arn:{partition}:s3:::{bucket}/*]", reason)
    for child in stack.node.children:
        if child.node.id.startswith("Custom::CDKBucketDeployment"):
            acknowledge(
                child,
                "AwsSolutions-L1",
                "The upload function's runtime is chosen and updated by aws-cdk-lib, not by this app",
            )
