"""Role trusts for AWS services that pass their caller's context (the confused-deputy guard)."""

from __future__ import annotations

from aws_cdk import Aws
from aws_cdk import aws_iam as iam

from infra.nag import aws_arn


def service_for_this_account(service: str, source_service: str, source_resource: str) -> iam.ServicePrincipal:
    """`service` may assume the role only for this account (`aws:SourceAccount`) and its own
    `source_service` resources matching `source_resource` (`aws:SourceArn`), as AWS documents for
    EMR, EventBridge Scheduler, Step Functions and VPC flow logs."""
    return iam.ServicePrincipal(
        f"{service}.amazonaws.com",
        conditions={
            "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
            "ArnLike": {"aws:SourceArn": aws_arn(source_service, source_resource)},
        },
    )
