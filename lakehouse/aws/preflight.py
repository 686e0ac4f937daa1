"""`lakehouse aws preflight --env dev`: checks an account/region before the first `cdk deploy`.

Each check says what it found and, when it fails, what to do. `--pin-azs` also picks the VPC's
availability zones by zone ID (AZ *names* map to different physical zones in every account, and
MSK cannot place brokers in some zone IDs) and pins them in `cdk.context.json`, where the CDK app
reads them (`infra/lakehouse_app.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

from infra.config import DEV_LAKE_READERS_CONTEXT_KEY, az_context_key
from jobs.config import NAMESPACES
from lakehouse.aws import error_code

# Zone IDs where MSK cannot place brokers (AWS MSK docs: "use1-az3" in us-east-1).
MSK_UNSUPPORTED_ZONE_IDS = frozenset({"use1-az3"})
# The interface endpoints the network stack creates (they must exist in every chosen AZ).
ENDPOINT_SERVICES = ("elasticmapreduce", "secretsmanager", "glue")
# EC2 quota code (Service Quotas, service "ec2"): vCPUs of running On-Demand standard
# instances (families A, C, D, H, I, M, R, T, Z).
ON_DEMAND_STANDARD_VCPUS = "L-1216C47A"
CDK_BOOTSTRAP_STACK = "CDKToolkit"
# Lambda quota code (Service Quotas, service "lambda"): concurrent executions of the account/region.
LAMBDA_CONCURRENCY_QUOTA = "L-B99A9384"
# Fewer unreserved executions than this: a new account's reduced quota (10 is seen) or a pool that
# other functions mostly reserve. The stacks reserve none, so it is advice, never a failure.
LOW_UNRESERVED_LAMBDA_CONCURRENCY = 100


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    found: str
    fix: str = ""


def choose_azs(
    zones: Iterable[dict], endpoint_azs: Iterable[set[str]], count: int
) -> tuple[list[str], list[str]]:
    """(chosen AZ names, why others were skipped): available zones, in zone-ID order, that MSK
    supports and every interface endpoint service is offered in."""
    offered = set.intersection(*map(set, endpoint_azs)) if endpoint_azs else None
    chosen, skipped = [], []
    for zone in sorted(zones, key=lambda z: z["ZoneId"]):
        name, zone_id = zone["ZoneName"], zone["ZoneId"]
        if zone.get("State", "available") != "available" or zone.get("ZoneType", "availability-zone") != (
            "availability-zone"
        ):
            continue
        if zone_id in MSK_UNSUPPORTED_ZONE_IDS:
            skipped.append(f"{name} ({zone_id}): MSK cannot place brokers there")
        elif offered is not None and name not in offered:
            skipped.append(f"{name} ({zone_id}): an interface endpoint service is not offered there")
        elif len(chosen) < count:
            chosen.append(name)
    return chosen, skipped


def vcpus_needed(instance_types: Iterable[str], units: int, vcpus_of: dict[str, int]) -> int:
    """Worst case: every capacity unit on the largest of the fleet's instance types."""
    return units * max(vcpus_of[t] for t in instance_types)


def run_checks(
    session, env_name: str, config, artifacts_bucket: str | None, warehouse_bucket: str | None = None
) -> tuple[list[Check], list[str]]:
    """All checks for `config` (an infra DeploymentConfig) in `session`'s account/region; also the
    AZ names chosen by zone ID."""
    checks: list[Check] = []
    region = session.region_name
    cfn, ec2, emr = session.client("cloudformation"), session.client("ec2"), session.client("emr")

    def guarded(name: str, action) -> None:
        try:
            checks.append(action())
        except (ClientError, BotoCoreError) as error:
            checks.append(
                Check(name, False, f"could not check: {error}", "check the credentials' permissions")
            )

    def bootstrap() -> Check:
        try:
            (stack,) = cfn.describe_stacks(StackName=CDK_BOOTSTRAP_STACK)["Stacks"]
        except ClientError:
            return Check("CDK bootstrap", False, "no CDKToolkit stack", "node_modules/.bin/cdk bootstrap")
        healthy = stack["StackStatus"].endswith("_COMPLETE") and "ROLLBACK" not in stack["StackStatus"]
        return Check(
            "CDK bootstrap", healthy, stack["StackStatus"], "" if healthy else "re-run cdk bootstrap"
        )

    guarded("CDK bootstrap", bootstrap)

    chosen: list[str] = []

    def availability_zones() -> Check:
        zones = ec2.describe_availability_zones()["AvailabilityZones"]
        services = [f"com.amazonaws.{region}.{s}" for s in ENDPOINT_SERVICES]
        details = ec2.describe_vpc_endpoint_services(ServiceNames=services)["ServiceDetails"]
        endpoint_azs = [set(d.get("AvailabilityZones", [])) for d in details]
        names, skipped = choose_azs(zones, endpoint_azs, config.network.max_azs)
        chosen.extend(names)
        ok = len(names) == config.network.max_azs
        found = f"{', '.join(names) or 'none'}" + (f"; skipped {'; '.join(skipped)}" if skipped else "")
        return Check("availability zones", ok, found, "" if ok else "use another region")

    guarded("availability zones", availability_zones)

    def emr_release() -> Check:
        release = config.compute.release_label
        labels = emr.list_release_labels(Filters={"Prefix": release.rsplit(".", 1)[0]})["ReleaseLabels"]
        ok = release in labels
        return Check("EMR release", ok, release if ok else f"{release} not offered", "pick another region")

    guarded("EMR release", emr_release)

    def vcpu_quota() -> Check:
        compute = config.compute
        types = set(compute.primary_instance_types) | set(compute.worker_instance_types)
        offered = ec2.describe_instance_types(InstanceTypes=sorted(types))["InstanceTypes"]
        vcpus_of = {t["InstanceType"]: t["VCpuInfo"]["DefaultVCpus"] for t in offered}
        on_demand_units = 1 + compute.core_units + compute.task_on_demand_units
        needed = vcpus_needed(compute.primary_instance_types, 1, vcpus_of) + vcpus_needed(
            compute.worker_instance_types, on_demand_units - 1, vcpus_of
        )
        quotas = session.client("service-quotas")
        limit = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=ON_DEMAND_STANDARD_VCPUS)["Quota"][
            "Value"
        ]
        ok = limit >= needed
        return Check(
            "EC2 On-Demand vCPUs",
            ok,
            f"quota {limit:.0f}, EMR fleets need up to {needed}",
            "" if ok else f"request {ON_DEMAND_STANDARD_VCPUS} >= {needed} in Service Quotas",
        )

    guarded("EC2 On-Demand vCPUs", vcpu_quota)

    def lambda_concurrency() -> Check:
        # Information only: a permission error here must not fail the preflight either.
        try:
            limits = session.client("lambda").get_account_settings()["AccountLimit"]
        except (ClientError, BotoCoreError) as error:
            return Check("Lambda concurrency", True, f"not checked: {error}")
        limit, unreserved = limits["ConcurrentExecutions"], limits["UnreservedConcurrentExecutions"]
        found = f"quota {limit}, {unreserved} unreserved (the stacks reserve none)"
        fix = ""
        if unreserved < LOW_UNRESERVED_LAMBDA_CONCURRENCY:
            fix = (
                "information only: the deploy's custom resources and the step supervisor share these "
                "executions with the account's other functions; if they are throttled, request "
                f"{LAMBDA_CONCURRENCY_QUOTA} (Lambda concurrent executions) >= 1000 in Service Quotas"
            )
        return Check("Lambda concurrency", True, found, fix)

    checks.append(lambda_concurrency())
    if warehouse_bucket:
        guarded("Glue databases", lambda: glue_databases_free(session, warehouse_bucket))

    if env_name == "prod":
        from infra.config import EMR_TLS_CERTIFICATES_KEY

        def certificate() -> Check:
            uri = f"s3://{artifacts_bucket}/{EMR_TLS_CERTIFICATES_KEY}"
            # Listed, not read: the bucket denies reads under security/ to all but the cluster, the
            # TLS function and `security_admins`, so a HEAD as the operator answers 403 either way.
            try:
                listed = session.client("s3").list_objects_v2(
                    Bucket=artifacts_bucket, Prefix=EMR_TLS_CERTIFICATES_KEY, MaxKeys=1
                )
            except ClientError as error:
                if error_code(error) != "NoSuchBucket":
                    raise  # `guarded` reports it as "could not check"
                listed = {}
            if EMR_TLS_CERTIFICATES_KEY not in [o["Key"] for o in listed.get("Contents", [])]:
                fix = "infra/README.md, 'Deploy (prod)'"
                return Check("prod TLS certificate", False, f"missing: {uri}", fix)
            return Check("prod TLS certificate", True, uri)

        guarded("prod TLS certificate", certificate)
        guarded("prod alerts reach someone", lambda: alert_subscribers(session, config))
    return checks, chosen


def glue_databases_free(session, warehouse_bucket: str) -> Check:
    """The Glue databases keep the source system's names (dim_db, ...) in both environments, and a
    catalog is per account and region: one environment per account/region. A database of that name
    whose location is not this environment's warehouse belongs to another one."""
    glue = session.client("glue")
    own, foreign = [], []
    for namespace in NAMESPACES:
        try:
            location = glue.get_database(Name=namespace)["Database"].get("LocationUri", "")
        except ClientError as error:
            if error_code(error) == "EntityNotFoundException":
                continue
            raise
        if location.startswith(f"s3://{warehouse_bucket}/"):
            own.append(namespace)
        else:
            foreign.append(f"{namespace} ({location or 'no location'})")
    if foreign:
        return Check(
            "Glue databases",
            False,
            f"another environment's: {', '.join(foreign)}",
            "deploy each environment to its own account or region: the databases keep the source "
            "system's names in dev and prod",
        )
    return Check("Glue databases", True, f"this environment's: {', '.join(own)}" if own else "none yet")


def alert_subscribers(session, config) -> Check:
    """prod's failures and alarms go to an SNS topic: someone must be subscribed to it. Before the
    first deploy, a reminder; once deployed, a failure while nobody has confirmed a subscription."""
    name = "prod alerts reach someone"
    fix = (
        "deploy with -c alert_email=you@example.com and confirm the e-mail, or subscribe your "
        "on-call tool to the AlertsTopicArn output"
    )
    try:
        (stack,) = session.client("cloudformation").describe_stacks(
            StackName=config.stack_name("Monitoring")
        )["Stacks"]
    except ClientError:
        return Check(name, True, "not deployed yet", fix)
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    topic = outputs.get("AlertsTopicArn")
    if topic is None:
        return Check(name, False, f"{config.stack_name('Monitoring')} has no AlertsTopicArn output", fix)
    subscriptions = session.client("sns").list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
    confirmed = [s for s in subscriptions if s["SubscriptionArn"].startswith("arn:")]
    pending = len(subscriptions) - len(confirmed)
    found = f"{len(confirmed)} confirmed subscription(s)" + (f", {pending} pending" if pending else "")
    return Check(name, bool(confirmed), found, "" if confirmed else fix)


def pin_azs(context_file: Path, account: str, region: str, names: list[str]) -> None:
    """Write the chosen AZ names into cdk.context.json (kept in git, so every synth agrees)."""
    context = json.loads(context_file.read_text()) if context_file.exists() else {}
    context[az_context_key(account, region)] = names
    context_file.write_text(json.dumps(context, indent=2, sort_keys=True) + "\n")


def caller_role_arn(session) -> tuple[str | None, str]:
    """(the caller's role ARN as a bucket policy sees it, or None; why not). aws:PrincipalArn is the
    role with its path, never the session: an ARN without the path would never match a role that has
    one (IAM Identity Center's live under /aws-reserved/sso.amazonaws.com/)."""
    arn = session.client("sts").get_caller_identity()["Arn"]
    if ":assumed-role/" not in arn:
        return (arn, "") if ":role/" in arn else (None, "you are not an IAM role")
    name = arn.split(":assumed-role/", 1)[1].split("/", 1)[0]
    iam = session.client("iam")
    try:
        return iam.get_role(RoleName=name)["Role"]["Arn"], ""  # with the role's path
    except (ClientError, BotoCoreError):
        pass
    try:  # GetRole denied (PowerUserAccess): ListRoles is allowed there
        for page in iam.get_paginator("list_roles").paginate():
            for role in page["Roles"]:
                if role["RoleName"] == name:
                    return role["Arn"], ""
    except (ClientError, BotoCoreError):
        pass
    return None, f"could not read the path of your role {name} (iam:GetRole and iam:ListRoles denied)"


def pin_lake_reader(context_file: Path, role_arn: str) -> None:
    """Add a role to dev's lake readers in cdk.context.json (the app merges them into `lake_readers`)."""
    context = json.loads(context_file.read_text()) if context_file.exists() else {}
    context[DEV_LAKE_READERS_CONTEXT_KEY] = sorted({*context.get(DEV_LAKE_READERS_CONTEXT_KEY, []), role_arn})
    context_file.write_text(json.dumps(context, indent=2, sort_keys=True) + "\n")
