"""`lakehouse aws status|logs|submit|stop`: the deployed pipeline from one command (boto3).

Everything is found from the stacks' outputs (names in infra/stacks.py) and the step names the
supervisor uses (`lakehouse-<job>@<version>`, infra/emr_steps.py). Errors say what to do.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from botocore.exceptions import ClientError

from infra.config import DeploymentConfig
from infra.emr_steps import (  # batch: state machines
    ARTIFACTS_PREFIX,
    BATCH_JOBS,
    STEP_NAME_PREFIX,
    STREAMING_APPLICATION,
    STREAMING_STEPS_FILE,
    streaming_steps,
)
from jobs.cdc.table_selection import DEFAULT_NAMESPACE, STAGING_SUFFIX
from lakehouse.aws import error_code

CONCERNS = ("Network", "Lake", "Streaming", "SourceDatabase", "Compute", "Monitoring", "Jobs")
LIVE_STEP_STATES = ("PENDING", "RUNNING")
TABLES = (
    ("ingest", "ods_behavior.clickevent"),
    ("cdc", "dim_db.products"),
    ("cdc", "dim_db.user_member"),
    ("views", "ads_behavior.product_views"),
)


class OperateError(Exception):
    """The command cannot go on; the message says why and what to do."""


@dataclass
class Status:
    env: str
    stacks: dict[str, str] = field(default_factory=dict)  # stack -> CloudFormation status
    outputs: dict[str, str] = field(default_factory=dict)
    cluster: dict[str, str] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)
    bootstrap_brokers: str | None = None
    tables: dict[str, dict] = field(default_factory=dict)


def stack_outputs(session, config: DeploymentConfig) -> tuple[dict[str, str], dict[str, str]]:
    """(stack -> status, output key -> value) of the env's stacks; an error if none is deployed."""
    cloudformation = session.client("cloudformation")
    statuses, outputs = {}, {}
    for concern in CONCERNS:
        name = config.stack_name(concern)
        try:
            (stack,) = cloudformation.describe_stacks(StackName=name)["Stacks"]
        except ClientError as error:
            if "does not exist" not in str(error):
                raise
            statuses[name] = "NOT DEPLOYED"
            continue
        statuses[name] = stack["StackStatus"]
        outputs.update({o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])})
    if all(status == "NOT DEPLOYED" for status in statuses.values()):
        raise OperateError(
            f"no Lakehouse-{config.env_name} stack in this account/region: deploy with "
            f"`cdk deploy -c env={config.env_name} --all` (or check --region/--profile)"
        )
    return statuses, outputs


def live_cluster(session, config: DeploymentConfig, outputs: dict[str, str]) -> dict:
    """The env's EMR cluster, or an error saying why there is none to work with."""
    cluster_id = outputs.get("EmrClusterId")
    if not cluster_id:
        raise OperateError(
            f"{config.env_name} has no EMR cluster (parked?): `lakehouse aws unpark --env {config.env_name}`"
        )
    cluster = session.client("emr").describe_cluster(ClusterId=cluster_id)["Cluster"]
    state = cluster["Status"]["State"]
    if state.startswith("TERMINAT"):
        reason = cluster["Status"].get("StateChangeReason", {}).get("Message", "")
        raise OperateError(
            f"cluster {cluster_id} is {state} ({reason or 'no reason given'}); a dev cluster ends after "
            f"2 h idle: `lakehouse aws park --env {config.env_name}` then `lakehouse aws unpark "
            f"--env {config.env_name}` creates a new one that resumes every job"
        )
    return cluster


def status(session, config: DeploymentConfig, now: datetime | None = None) -> Status:
    now = now or datetime.now(UTC)
    result = Status(config.env_name)
    result.stacks, result.outputs = stack_outputs(session, config)
    cluster_id = result.outputs.get("EmrClusterId")
    if cluster_id:
        cluster = session.client("emr").describe_cluster(ClusterId=cluster_id)["Cluster"]
        result.cluster = {"id": cluster_id, "name": cluster["Name"], "state": cluster["Status"]["State"]}
        if not result.cluster["state"].startswith("TERMINAT"):
            result.steps = _pipeline_steps(session.client("emr"), cluster_id)
    result.bootstrap_brokers = _bootstrap_brokers(session, config)
    result.tables = _freshness(session.client("cloudwatch"), config, now)
    return result


def _pipeline_steps(emr, cluster_id: str) -> list[dict]:
    steps = []
    for page in emr.get_paginator("list_steps").paginate(ClusterId=cluster_id):
        for step in page["Steps"]:
            if step["Name"].startswith(STEP_NAME_PREFIX):
                job = step["Name"][len(STEP_NAME_PREFIX) :].split("@", 1)[0]
                steps.append(
                    {"job": job, "id": step["Id"], "state": step["Status"]["State"], "name": step["Name"]}
                )
    return steps


def _bootstrap_brokers(session, config: DeploymentConfig) -> str | None:
    kafka = session.client("kafka")
    try:
        clusters = kafka.list_clusters_v2(ClusterNameFilter=config.resource_name("msk"))["ClusterInfoList"]
        if not clusters:
            return None
        brokers = kafka.get_bootstrap_brokers(ClusterArn=clusters[0]["ClusterArn"])
        return brokers.get("BootstrapBrokerStringSaslIam")
    except (ClientError, NotImplementedError, KeyError):
        return None  # shown as unknown; the rest of the status still helps


def _datapoints(cloudwatch, namespace: str, name: str, dims: list[dict], statistic: str, now: datetime):
    found = cloudwatch.get_metric_statistics(
        Namespace=namespace,
        MetricName=name,
        Dimensions=dims,
        StartTime=now - timedelta(hours=1),
        EndTime=now,
        Period=60,
        Statistics=[statistic],
    )["Datapoints"]
    return sorted(found, key=lambda point: point["Timestamp"])


def _freshness(cloudwatch, config: DeploymentConfig, now: datetime) -> dict[str, dict]:
    """Per table: the last batch's commit minute, records in the last hour and the latest lag."""
    tables = {}
    for job, table in TABLES:
        dims = [{"Name": "Job", "Value": job}, {"Name": "Table", "Value": table}]
        commits = _datapoints(cloudwatch, config.metrics_namespace, "Commits", dims, "Sum", now)
        lag = _datapoints(cloudwatch, config.metrics_namespace, "LagSeconds", dims, "Maximum", now)
        records = _datapoints(cloudwatch, config.metrics_namespace, "RecordsIn", dims, "Sum", now)
        last = commits[-1]["Timestamp"] if commits else None
        tables[table] = {
            "job": job,
            "last_commit_minute": last.isoformat() if last else None,
            "last_commit_age_seconds": round((now - last).total_seconds()) if last else None,
            "records_last_hour": int(sum(point["Sum"] for point in records)),
            "lag_seconds": lag[-1]["Maximum"] if lag else None,
        }
    return tables


# ---- logs, submit, stop ------------------------------------------------------------------------------


def known_jobs(config: DeploymentConfig) -> tuple[str, ...]:
    return (*streaming_steps(config.jobs.one_streaming_application), *BATCH_JOBS)


def _check_job(config: DeploymentConfig, job: str) -> None:
    if job not in known_jobs(config):
        raise OperateError(
            f"unknown job {job!r} in {config.env_name}: one of {', '.join(known_jobs(config))}"
        )


def find_step(session, config: DeploymentConfig, outputs: dict[str, str], job_or_step: str) -> dict:
    """A step by id (s-…) or the newest step of a job."""
    cluster = live_cluster(session, config, outputs)
    emr = session.client("emr")
    if job_or_step.startswith("s-"):
        return emr.describe_step(ClusterId=cluster["Id"], StepId=job_or_step)["Step"]
    _check_job(config, job_or_step)
    steps = [s for s in _pipeline_steps(emr, cluster["Id"]) if s["job"] == job_or_step]
    if not steps:
        raise OperateError(f"no step of {job_or_step!r} on cluster {cluster['Id']} yet")
    return emr.describe_step(ClusterId=cluster["Id"], StepId=steps[0]["id"])["Step"]  # newest first


def step_log(
    session, config: DeploymentConfig, outputs: dict[str, str], job_or_step: str, stream: str
) -> str:
    """The step's stderr (or stdout) as EMR pushed it to the log bucket (gzip, a few minutes late)."""
    step = find_step(session, config, outputs, job_or_step)
    cluster = live_cluster(session, config, outputs)
    log_uri = cluster.get("LogUri", "").replace("s3n://", "s3://")
    if not log_uri.startswith("s3://"):
        raise OperateError(f"cluster {cluster['Id']} has no S3 log URI")
    bucket, _, prefix = log_uri[len("s3://") :].partition("/")
    key = f"{prefix.rstrip('/')}/{cluster['Id']}/steps/{step['Id']}/{stream}.gz".lstrip("/")
    try:
        body = session.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as error:
        if error_code(error) in ("NoSuchKey", "404"):
            raise OperateError(
                f"no {stream} for step {step['Id']} yet at s3://{bucket}/{key}: EMR uploads step logs "
                "every few minutes; try again, or --follow"
            ) from None
        raise
    return gzip.decompress(body).decode("utf-8", errors="replace")


def submit(session, config: DeploymentConfig, outputs: dict[str, str], job: str, payload: dict) -> str:
    """Start a batch job's state machine (report, maintain, verify, replay, gendata); returns the ARN.
    Streaming jobs are kept running by the supervisor: `stop` one and it starts it again."""
    _check_job(config, job)
    if job not in BATCH_JOBS:
        raise OperateError(
            f"{job} is a streaming job, kept running by the step supervisor: `lakehouse aws stop {job}` "
            "restarts it (the supervisor starts it again within its period)"
        )
    if job == "gendata" and not config.jobs.deploy_gendata:
        raise OperateError(
            f"gendata is not deployed in {config.env_name}: the test-data generator exists in dev only, "
            "and the cluster may not write clicktopic here"
        )
    live_cluster(session, config, outputs)
    arn = outputs.get(f"{job.capitalize()}StateMachineArn")
    if not arn:
        raise OperateError(f"the Jobs stack has no state machine for {job} (parked, or an old deploy)")
    name = f"cli-{job}-{int(time.time())}"
    return session.client("stepfunctions").start_execution(
        stateMachineArn=arn, name=name, input=json.dumps({"reason": "lakehouse aws submit", **payload})
    )["executionArn"]


def stop(session, config: DeploymentConfig, outputs: dict[str, str], job: str) -> list[str]:
    """Cancel the job's live steps; returns their ids."""
    _check_job(config, job)
    cluster = live_cluster(session, config, outputs)
    emr = session.client("emr")
    live = [
        s["id"]
        for s in _pipeline_steps(emr, cluster["Id"])
        if s["job"] == job and s["state"] in LIVE_STEP_STATES
    ]
    if not live:
        raise OperateError(f"no pending or running step of {job} on cluster {cluster['Id']}")
    emr.cancel_steps(ClusterId=cluster["Id"], StepIds=live)
    return live


# ---- a resync asked of the running CDC job --------------------------------------------------------

# The step's (and its YARN application's) name: not the cdc job's own, whose step would stop the
# running job first (`infra.emr_steps.REPLACE_RUNNING_APP`); no `@version`, so the step supervisor
# leaves it alone, as it does the batch jobs' steps.
REQUEST_RESYNC_STEP = f"{STEP_NAME_PREFIX}cdc-request-resync"
# It sets table properties only (no Spark task): a small driver, at most one executor, not the
# stream's sizes (a third driver must fit beside the stream and a batch job).
_REQUEST_CONF = {"spark.driver.memory": "1g", "spark.dynamicAllocation.maxExecutors": "1"}
# The lake tables CDC writes: `dim_db.<table>` (or `lakehouse.dim_db.<table>`); anything else the job
# refuses with exit 2, a FAILED step the failure rule would alert on.
_CDC_TABLE = re.compile(rf"^(lakehouse\.)?{DEFAULT_NAMESPACE}\.[A-Za-z0-9_]+$")


def _require_cdc_tables(session, tables: list[str]) -> None:
    """Each table is in the Glue catalog and is no copy under way (`<table>__cdc_snapshot_<id>`):
    the job would refuse anything else with exit 2, a FAILED step that alerts (a typo must not)."""
    glue = session.client("glue")
    for table in tables:
        name = table.split(".")[-1]
        if STAGING_SUFFIX in name.lower():
            raise OperateError(f"{table} is a re-snapshot's copy under way, not a table CDC writes")
        try:
            glue.get_table(DatabaseName=DEFAULT_NAMESPACE, Name=name)
        except ClientError as error:
            code = error_code(error)
            if code == "EntityNotFoundException":
                raise OperateError(
                    f"no table {DEFAULT_NAMESPACE}.{name} in the Glue catalog: CDC has not copied it (a "
                    "table the job does not follow yet is copied at its start, or by `--resync` at a start)"
                ) from None
            raise OperateError(
                f"cannot look up {DEFAULT_NAMESPACE}.{name} in the Glue catalog ({code}): this needs "
                f"glue:GetTable on the catalog, database {DEFAULT_NAMESPACE} and its tables"
            ) from None


def request_resync_args(desired: list[dict], tables: list[str]) -> list[str]:
    """command-runner.jar arguments of a step running `cdc --request-resync TABLE…`: the deployed
    CDC step's spark-submit (the supervisor's `streaming-steps.json`: the cdc job's step, or the
    streaming application's), with the cdc job and a name of its own."""
    runs_cdc = ("cdc", *STREAMING_APPLICATION)
    for step in desired:
        args = [str(arg) for arg in step.get("args", [])]
        if "spark-submit" not in args or "--name" not in args:
            continue
        submit = args[args.index("spark-submit") :]
        entry = next((i for i, arg in enumerate(submit) if arg.endswith("/emr_step.py")), None)
        if entry is None or entry + 1 >= len(submit) or submit[entry + 1] not in runs_cdc:
            continue
        submit[submit.index("--name") + 1] = REQUEST_RESYNC_STEP
        for key, value in _REQUEST_CONF.items():  # replaced where the stream sets it, else added
            at = [i for i, arg in enumerate(submit[:entry]) if arg.startswith(f"{key}=")]
            if at:
                submit[at[0]] = f"{key}={value}"
            else:
                submit[entry:entry] = ["--conf", f"{key}={value}"]
                entry += 2
        requests = [arg for table in tables for arg in ("--request-resync", table)]
        # After the job: the environment's arguments, the same for every job (`environment_args`).
        return [*submit[: entry + 1], "cdc", *submit[entry + 2 :], *requests]
    raise OperateError(
        "the deployed streaming steps run no CDC job (streaming-steps.json): deploy this release first"
    )


def request_resync(session, config: DeploymentConfig, outputs: dict[str, str], tables: list[str]) -> str:
    """Add a step that marks `tables` for a re-snapshot by the running CDC job, as `lakehouse run cdc
    --request-resync` does locally (Athena cannot set the table property); returns its id."""
    bad = [table for table in tables if not _CDC_TABLE.match(table)]
    if not tables or bad:
        raise OperateError(
            f"name the lake tables CDC writes, {DEFAULT_NAMESPACE}.<table> (got {', '.join(bad) or 'none'})"
        )
    cluster = live_cluster(session, config, outputs)
    bucket, version = outputs.get("ArtifactsBucketName"), outputs.get("JobsVersion")
    if not bucket or not version:
        raise OperateError(
            "the Lake and Jobs stacks name no ArtifactsBucketName and JobsVersion: deploy this release first"
        )
    _require_cdc_tables(session, tables)
    key = f"{ARTIFACTS_PREFIX}/{version}/{STREAMING_STEPS_FILE}"
    try:
        desired = json.loads(session.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())
    except ClientError as error:
        code = error_code(error)
        if code in ("NoSuchKey", "404"):
            raise OperateError(f"no s3://{bucket}/{key}: the Jobs stack's upload did not finish") from None
        raise OperateError(  # (S3 answers AccessDenied for a missing key to a caller without s3:ListBucket)
            f"cannot read s3://{bucket}/{key} ({code}): this needs s3:GetObject on it (and the key to exist)"
        ) from None
    step = {
        "Name": REQUEST_RESYNC_STEP,
        "ActionOnFailure": "CONTINUE",
        "HadoopJarStep": {"Jar": "command-runner.jar", "Args": request_resync_args(desired, tables)},
    }
    try:
        (step_id,) = session.client("emr").add_job_flow_steps(JobFlowId=cluster["Id"], Steps=[step])[
            "StepIds"
        ]
    except ClientError as error:
        code = error_code(error)
        raise OperateError(
            f"EMR refused the step ({code}): this needs elasticmapreduce:AddJobFlowSteps on cluster "
            f"{cluster['Id']}"
        ) from None
    return step_id


# ---- sql -----------------------------------------------------------------------------------------


def athena_query(session, config: DeploymentConfig, query: str, *, timeout: float = 300, poll=time.sleep):
    """Run `query` in the env's Athena workgroup (Glue catalog); returns (columns, rows)."""
    athena = session.client("athena")
    workgroup = f"{config.name_prefix}-adhoc"
    try:
        execution = athena.start_query_execution(QueryString=query, WorkGroup=workgroup)["QueryExecutionId"]
    except ClientError as error:
        raise OperateError(f"Athena refused the query in workgroup {workgroup}: {error}") from None
    waited = 0.0
    while True:
        state = athena.get_query_execution(QueryExecutionId=execution)["QueryExecution"]["Status"]
        if state["State"] == "SUCCEEDED":
            break
        if state["State"] in ("FAILED", "CANCELLED"):
            reason = state.get("StateChangeReason", "no reason given")
            if "access denied" in reason.lower() or "accessdenied" in reason.lower():
                # The warehouse bucket lets only named roles read the tables (docs/security.md).
                reason += (
                    "; the lake lets in only the pipeline and the roles deployed in the context value "
                    "lake_readers: add your role's ARN there (cdk.json) and deploy "
                    f"(`cdk deploy -c env={config.env_name} --all`)"
                )
            raise OperateError(f"query {state['State']}: {reason}")
        if waited >= timeout:
            athena.stop_query_execution(QueryExecutionId=execution)
            raise OperateError(f"query still running after {timeout:.0f} s: stopped ({execution})")
        poll(1.0)
        waited += 1.0
    columns, rows = None, []
    for page in athena.get_paginator("get_query_results").paginate(QueryExecutionId=execution):
        if columns is None:
            columns = [c["Name"] for c in page["ResultSet"]["ResultSetMetadata"]["ColumnInfo"]]
        rows += [[cell.get("VarCharValue") for cell in row["Data"]] for row in page["ResultSet"]["Rows"]]
    if rows and rows[0] == columns:  # Athena repeats the header as the first row of a SELECT
        rows = rows[1:]
    return columns or [], rows
