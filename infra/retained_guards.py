"""A retained bucket or secret keeps its resource policy when its stack is deleted.

CDK creates a bucket's `AWS::S3::BucketPolicy` and a secret's `AWS::SecretsManager::ResourcePolicy`
as resources of their own with the default removal policy (delete). Prod retains its buckets and
secrets, so after `cdk destroy` they would stay without their guards: the TLS-only deny, the
table-read and secret-read denies (docs/security.md), and any principal's own IAM permissions
would reach them again. This aspect gives each policy its resource's removal policy.
"""

from __future__ import annotations

import jsii
from aws_cdk import CfnDeletionPolicy, CfnResource, IAspect, RemovalPolicy
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import IConstruct


@jsii.implements(IAspect)
class RetainedGuards:
    def visit(self, node: IConstruct) -> None:
        if isinstance(node, s3.Bucket):
            policy = node.policy
        elif isinstance(node, secretsmanager.Secret):
            policy = node.node.try_find_child("Policy")
        else:
            return
        resource = node.node.default_child
        if policy is None or not isinstance(resource, CfnResource):
            return
        if resource.cfn_options.deletion_policy == CfnDeletionPolicy.RETAIN:
            policy.apply_removal_policy(RemovalPolicy.RETAIN)
