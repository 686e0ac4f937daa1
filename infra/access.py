"""Who may touch the lake's data, code and secrets, on the resource side.

Identity policies say what a role may do; any other role of the account with broad rights
(ReadOnlyAccess, PowerUserAccess) could do the same. The resource policies built from here deny
everyone else: a bucket prefix or a secret names the roles that may read or write it.

The roles to name are created in later stacks (Compute, Jobs) than the buckets (Lake), so they get
fixed names, derived from the environment's prefix: the Lake stack names them before they exist,
without a cross-stack reference or a dependency cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Aws, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.config import DeploymentConfig


def role_arn(name: str) -> str:
    return f"arn:{Aws.PARTITION}:iam::{Aws.ACCOUNT_ID}:role/{name}"


def deployer_role_arn(scope: Construct) -> str:
    """The exact ARN of CloudFormation's execution role that deploys `scope`'s stack, as its
    synthesizer names it (the bootstrap qualifier included): it changes the guards and resolves the
    RDS password's `{{resolve:secretsmanager:…}}` at deploy. Not a name pattern: anyone allowed
    iam:CreateRole could name a role to match one."""
    arn = Stack.of(scope).synthesizer.cloud_formation_execution_role_arn
    for placeholder, value in (
        ("${AWS::Partition}", Aws.PARTITION),
        ("${AWS::AccountId}", Aws.ACCOUNT_ID),
        ("${AWS::Region}", Aws.REGION),
    ):
        arn = arn.replace(placeholder, value)
    return arn


@dataclass(frozen=True)
class NamedRoles:
    """The fixed names of the roles the resource policies name: `lakehouse-<env>-<role>-<region>`
    (IAM names are account-wide; an environment is per region, like its buckets' names)."""

    name_prefix: str
    compute_stack_name: str

    @classmethod
    def of(cls, config: DeploymentConfig) -> NamedRoles:
        return cls(config.name_prefix, config.stack_name("Compute"))

    def _name(self, role: str) -> str:
        return f"{self.name_prefix}-{role}-{Aws.REGION}"

    @property
    def emr_instance(self) -> str:
        """The EMR nodes' role: the jobs, Trino and Hive read and write the lake with it."""
        return self._name("emr-instance")

    @property
    def legacy_emr_instance_pattern(self) -> str:
        """The nodes' role as deployed before it had a fixed name (CloudFormation named it after
        the Compute stack and its logical id). An upgrade deploys the guards (Lake, SourceDatabase)
        before the Compute stack replaces that role with the named one and the cluster with it: the
        running cluster keeps its access meanwhile instead of failing for the 15-20 minutes a new
        cluster takes. Only CloudFormation's generated name for that one resource matches."""
        return f"{self.compute_stack_name}-ComputeInstanceRole*"

    @property
    def bootstrap_upload(self) -> str:
        """CDK's upload of bootstrap/ (the scripts every new node runs as root)."""
        return self._name("bootstrap-upload")

    @property
    def jobs_upload(self) -> str:
        """CDK's upload of the jobs' artifact set to emr/<version>/."""
        return self._name("jobs-upload")

    @property
    def tls_certificates(self) -> str:
        """The function that generates (dev) or checks (prod) the EMR TLS certificate zip."""
        return self._name("emr-tls")

    @property
    def cluster_readers(self) -> list[str]:
        """ARN patterns of the nodes' role, named and as deployed before (see above)."""
        return [role_arn(self.emr_instance), role_arn(self.legacy_emr_instance_pattern)]


def deny_all_but(
    sid: str, actions: Sequence[str], resources: Sequence[str], principal_arns: Sequence[str]
) -> iam.PolicyStatement:
    """Deny `actions` on `resources` to every IAM principal whose (role) ARN is none of
    `principal_arns` (patterns allowed). AWS services acting on their own (S3's log delivery) are
    not IAM principals of the account and are left alone; a service acting for a caller (Athena)
    carries the caller's ARN."""
    return iam.PolicyStatement(
        sid=sid,
        effect=iam.Effect.DENY,
        principals=[iam.AnyPrincipal()],
        actions=list(actions),
        resources=list(resources),
        conditions={
            "ArnNotLike": {"aws:PrincipalArn": list(principal_arns)},
            "Bool": {"aws:PrincipalIsAWSService": "false"},
        },
    )


def give_role_name(role: iam.IRole, name: str) -> None:
    """Give a role CDK created for us (a function's, an upload's) one of the fixed names."""
    resource = role.node.default_child
    if not isinstance(resource, iam.CfnRole):
        raise TypeError(f"{role.node.path} is not a role created in this app")
    resource.role_name = name
