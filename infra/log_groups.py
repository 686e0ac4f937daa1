"""Every log group of a stack, the framework's included, follows the environment's removal policy.

CDK's own providers (custom resources, BucketDeployment) declare their log groups with
`DeletionPolicy: Retain` and two years' retention: after a dev `cdk destroy` they would stay behind.
This aspect gives each one the environment's removal policy and caps its retention.
"""

from __future__ import annotations

import jsii
from aws_cdk import IAspect, RemovalPolicy
from aws_cdk import aws_logs as logs
from constructs import IConstruct


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
