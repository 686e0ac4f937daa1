"""Network: a VPC with private subnets for MSK, RDS, EMR and the in-VPC Lambdas."""

from __future__ import annotations

from aws_cdk import Aws, Fn, RemovalPolicy, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.cdk_values import log_retention
from infra.config import NetworkSettings
from infra.nag import acknowledge
from infra.trust import service_for_this_account

# EMR's managed policies (AmazonEMRServicePolicy_v2) only act on resources carrying this tag.
EMR_MANAGED_POLICY_TAG = ("for-use-with-amazon-emr-managed-policies", "true")
PRIVATE_SUBNET_GROUP = "private"


class Network(Construct):
    """VPC, NAT, S3 gateway endpoint, interface endpoints for EMR/Secrets Manager/Glue, flow logs."""

    #: The VPC (parked: the same VPC, without NAT gateways and interface endpoints).
    vpc: ec2.Vpc
    #: Where MSK, RDS, EMR and the in-VPC Lambdas go: the private subnet group (isolated when parked).
    private_subnets: ec2.SubnetSelection

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: NetworkSettings,
        availability_zones: tuple[str, ...] | None,
        removal_policy: RemovalPolicy,
        parked: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)

        flow_log_group = logs.LogGroup(
            self,
            "FlowLogs",
            retention=log_retention(settings.flow_log_retention_days),
            removal_policy=removal_policy,
        )
        # The flow-log service may assume this role only for this account's flow logs (confused
        # deputy: AWS's documented trust conditions for vpc-flow-logs).
        flow_logs_role = iam.Role(
            self,
            "FlowLogsRole",
            assumed_by=service_for_this_account("vpc-flow-logs", "ec2", "vpc-flow-log/*"),
        )
        # Note: AZ names are literal when the stack is bound to an account/region (no lookup);
        # otherwise they are Fn::GetAZs picks resolved at deploy time, because an agnostic stack
        # would get only 2 AZs from max_azs and prod needs 3.
        azs = (
            list(availability_zones)
            if availability_zones
            else [Fn.select(index, Fn.get_azs()) for index in range(settings.max_azs)]
        )
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(settings.vpc_cidr),
            availability_zones=azs,
            # Note: parked, the private subnets keep their names (so their logical IDs, CIDRs and
            # everything placed in them) and lose only the NAT route.
            nat_gateways=0 if parked else settings.nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(
                    name=PRIVATE_SUBNET_GROUP,
                    subnet_type=ec2.SubnetType.PRIVATE_ISOLATED
                    if parked
                    else ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=20,
                ),
            ],
            flow_logs={
                "all-traffic": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group, flow_logs_role),
                    traffic_type=ec2.FlowLogTrafficType.ALL,
                )
            },
            # Nothing uses the default security group; restricting it would cost a custom resource.
            restrict_default_security_group=False,
        )
        # EMR's v2 managed service policy acts only on tagged resources: the VPC (it creates groups in
        # it) and the subnets. Not every security group in the VPC: the endpoints' groups stay out
        # of its reach (the EMR-managed groups are tagged where they are made, in EmrCompute).
        Tags.of(self.vpc).add(
            *EMR_MANAGED_POLICY_TAG, include_resource_types=["AWS::EC2::VPC", "AWS::EC2::Subnet"]
        )

        self.private_subnets = ec2.SubnetSelection(subnet_group_name=PRIVATE_SUBNET_GROUP)

        # Note: S3 (warehouse, logs, artifacts) is the bulk of EMR traffic; the gateway endpoint is free.
        self.vpc.add_gateway_endpoint(
            "S3Endpoint",
            service=ec2.GatewayVpcEndpointAwsService.S3,
            subnets=[self.private_subnets],
        )
        # Interface endpoints for the chatty control-plane calls of EMR nodes, the Glue catalog and
        # the secrets the CDC job and the seeding Lambda read; they keep that traffic off the NAT.
        # Parked, nothing in the VPC makes those calls, and each endpoint costs per AZ and hour.
        for endpoint_id, service, resources_here in (
            ()
            if parked
            else (
                # EMR's node agents call the service's own APIs, whose resources need not be ours.
                ("EmrEndpoint", ec2.InterfaceVpcEndpointAwsService.EMR, False),
                ("SecretsManagerEndpoint", ec2.InterfaceVpcEndpointAwsService.SECRETS_MANAGER, True),
                ("GlueEndpoint", ec2.InterfaceVpcEndpointAwsService.GLUE, True),
            )
        ):
            # An endpoint's network interface only answers (security groups are stateful): no egress.
            group = ec2.SecurityGroup(
                self,
                f"{endpoint_id}SecurityGroup",
                vpc=self.vpc,
                description=f"{endpoint_id}: HTTPS from the VPC, no egress",
                allow_all_outbound=False,
            )
            group.add_ingress_rule(
                ec2.Peer.ipv4(self.vpc.vpc_cidr_block), ec2.Port.tcp(443), "HTTPS from the VPC"
            )
            acknowledge(
                group,
                "AwsSolutions-EC23",
                "Endpoint security group admits HTTPS (443) from the VPC's own CIDR only; cdk-nag "
                "cannot resolve the CIDR token and reports it as open.",
            )
            endpoint = self.vpc.add_interface_endpoint(
                endpoint_id,
                service=service,
                subnets=self.private_subnets,
                private_dns_enabled=True,
                security_groups=[group],
                open=False,
            )
            # A data perimeter: through these endpoints only this account's principals pass (a
            # credential of another account does not), and for Secrets Manager and Glue only to
            # this account's secrets and catalog (no copy into another account's). Not on the S3
            # gateway endpoint: EMR nodes fetch AWS-owned buckets (EMR components, package
            # repositories) through it.
            perimeter = {"aws:PrincipalAccount": Aws.ACCOUNT_ID}
            if resources_here:
                perimeter["aws:ResourceAccount"] = Aws.ACCOUNT_ID
            endpoint.add_to_policy(
                iam.PolicyStatement(
                    sid="ThisAccountOnly",
                    principals=[iam.AnyPrincipal()],
                    actions=["*"],
                    resources=["*"],
                    conditions={"StringEquals": perimeter},
                )
            )
