"""Every log group of a stack, the framework's included, follows the environment's removal policy
and is encrypted with the stack's own KMS key.

CDK's own providers (custom resources, BucketDeployment) declare their log groups with
`DeletionPolicy: Retain` and two years' retention: after a dev `cdk destroy` they would stay behind.
This aspect gives each one the environment's removal policy, caps its retention, and points it at
a customer-managed key (checkov CKV_AWS_158) whose policy lets CloudWatch Logs use it for this
account's log groups only.
"""

from __future__ import annotations

import jsii
from aws_cdk import Aws, Duration, IAspect, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import IConstruct

LOGS_KEY_ID = "LogsKey"


@jsii.implements(IAspect)
class LogGroupPolicy:
    def __init__(self, removal_policy: RemovalPolicy, retention_cap_days: int) -> None:
        self._removal_policy = removal_policy
        self._cap_days = retention_cap_days

    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, logs.CfnLogGroup):
            return
        node.apply_removal_policy(self._removal_policy)
        days = node.retention_in_days
        if not isinstance(days, int | float) or days > self._cap_days:
            node.retention_in_days = self._cap_days
        if node.kms_key_id is None:
            node.kms_key_id = self._logs_key(Stack.of(node)).key_arn

    def _logs_key(self, stack: Stack) -> kms.Key:
        existing = stack.node.try_find_child(LOGS_KEY_ID)
        if existing is not None:
            return existing
        key = kms.Key(
            stack,
            LOGS_KEY_ID,
            description=f"{stack.stack_name}: CloudWatch Logs log groups",
            enable_key_rotation=True,
            pending_window=Duration.days(7),
            removal_policy=self._removal_policy,
        )
        key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com")],
                actions=[
                    "kms:Encrypt*",
                    "kms:Decrypt*",
                    "kms:ReEncrypt*",
                    "kms:GenerateDataKey*",
                    "kms:Describe*",
                ],
                resources=["*"],
                conditions={
                    "ArnLike": {
                        "kms:EncryptionContext:aws:logs:arn": (
                            f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:*"
                        )
                    }
                },
            )
        )
        return key
