"""`lakehouse aws park|unpark --env dev`: stop paying for a dev environment without destroying it.

Parking deploys the app with `-c parked=true` (the EMR cluster, the NAT gateway, the interface
endpoints and the job schedules go; see `DeploymentConfig.parked`), then stops the RDS instance,
which CloudFormation cannot do. The lake, the Glue catalog, MSK (a provisioned cluster cannot be
stopped, and deleting it would drop clicks not yet ingested and restart the topic's offsets) and the
source database's data stay. Unparking starts RDS first (CloudFormation cannot update a stopped
instance), then deploys the app as usual, which creates a new cluster that resumes every job from
the positions stored in the lake.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from botocore.exceptions import ClientError

from infra.config import DeploymentConfig

# AWS starts a stopped RDS instance again after seven days.
RDS_MAX_STOPPED = timedelta(days=7)
DATABASE_TIMEOUT_SECONDS = 30 * 60

CdkRunner = Callable[[Sequence[str]], None]
Log = Callable[[str], None]


class ParkError(Exception):
    """Parking or unparking cannot go on; the message says why and what to do."""


def cdk_deploy_args(config: DeploymentConfig, *, parked: bool) -> list[str]:
    context = ["-c", f"env={config.env_name}"] + (["-c", "parked=true"] if parked else [])
    return ["deploy", *context, "--all", "--require-approval", "never"]


def park(session, config: DeploymentConfig, run_cdk: CdkRunner, log: Log, *, clock=time) -> None:
    parked = DeploymentConfig.for_env(config.env_name, parked=True)  # refuses prod
    _require_deployed(session, parked)
    log("deploying the parked app: the EMR cluster, NAT gateway, endpoints and schedules go")
    run_cdk(cdk_deploy_args(parked, parked=True))
    rds = session.client("rds")
    instance = _database(rds, parked)
    status = _wait_for(rds, instance, ("available", "stopped"), log, clock)
    if status == "available":
        log(f"stopping the RDS instance {instance}")
        rds.stop_db_instance(DBInstanceIdentifier=instance)
        _wait_for(rds, instance, ("stopped",), log, clock)
    restart = datetime.now(UTC) + RDS_MAX_STOPPED
    log(
        f"parked. RDS {instance} is stopped; AWS starts it again by itself on about "
        f"{restart:%Y-%m-%d}: run `lakehouse aws park --env {config.env_name}` again then. "
        f"`lakehouse aws unpark --env {config.env_name}` brings the pipeline back."
    )


def unpark(session, config: DeploymentConfig, run_cdk: CdkRunner, log: Log, *, clock=time) -> None:
    _require_deployed(session, config)
    rds = session.client("rds")
    instance = _database(rds, config)
    status = _wait_for(rds, instance, ("available", "stopped"), log, clock)
    if status == "stopped":
        log(f"starting the RDS instance {instance} (a few minutes)")
        rds.start_db_instance(DBInstanceIdentifier=instance)
        _wait_for(rds, instance, ("available",), log, clock)
    log("deploying the app: a new EMR cluster; the jobs resume from the positions in the lake")
    run_cdk(cdk_deploy_args(config, parked=False))
    log("unparked.")


def _require_deployed(session, config: DeploymentConfig) -> None:
    cloudformation = session.client("cloudformation")
    missing = []
    for concern in ("Network", "SourceDatabase", "Compute"):
        name = config.stack_name(concern)
        try:
            cloudformation.describe_stacks(StackName=name)
        except ClientError as error:
            if "does not exist" not in str(error):
                raise
            missing.append(name)
    if missing:
        raise ParkError(
            f"{', '.join(missing)} not deployed in this account/region: deploy first with "
            f"`cdk deploy -c env={config.env_name} --all` (or check --region/--profile)"
        )


def _database(rds, config: DeploymentConfig) -> str:
    instance = config.resource_name("source-mysql")
    try:
        rds.describe_db_instances(DBInstanceIdentifier=instance)
    except rds.exceptions.DBInstanceNotFoundFault:
        raise ParkError(
            f"the source database {instance} does not exist although its stack does: deploy "
            f"again with `cdk deploy -c env={config.env_name} --all`"
        ) from None
    return instance


def _status(rds, instance: str) -> str:
    (found,) = rds.describe_db_instances(DBInstanceIdentifier=instance)["DBInstances"]
    return found["DBInstanceStatus"]


def _wait_for(rds, instance: str, wanted: tuple[str, ...], log: Log, clock) -> str:
    """Waits while the instance is in a transition (starting, stopping, backing-up, ...)."""
    deadline = clock.monotonic() + DATABASE_TIMEOUT_SECONDS
    status = _status(rds, instance)
    last_logged = None
    while status not in wanted:
        if status in ("failed", "deleting", "storage-full", "incompatible-parameters"):
            raise ParkError(f"RDS {instance} is {status}: fix it in the RDS console, then run again")
        if clock.monotonic() > deadline:
            raise ParkError(f"RDS {instance} still {status} after {DATABASE_TIMEOUT_SECONDS // 60} min")
        if status != last_logged:
            log(f"RDS {instance} is {status}; waiting for {' or '.join(wanted)}")
            last_logged = status
        clock.sleep(15)
        status = _status(rds, instance)
    return status
