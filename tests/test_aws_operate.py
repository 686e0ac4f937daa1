"""`lakehouse aws status|logs|submit|stop` against moto: stacks and outputs (CloudFormation), the
cluster and its steps (EMR), step logs (S3), freshness (CloudWatch), state machines (Step Functions),
and every error an operator can meet."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from click.testing import CliRunner
from moto import mock_aws

from infra.config import DeploymentConfig
from jobs.common.metrics import BatchMetrics, metric_data
from lakehouse.aws import operate
from lakehouse.cli import main

REGION = "us-east-1"
DEV = DeploymentConfig.for_env("dev")
LOGS = "lakehouse-dev-logs-test"


def deploy_stack(session, concern: str, outputs: dict[str, str]) -> None:
    template = {
        "Resources": {"Placeholder": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    session.client("cloudformation").create_stack(
        StackName=DEV.stack_name(concern), TemplateBody=json.dumps(template)
    )


@pytest.fixture
def session(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        yield boto3.Session(region_name=REGION)


@pytest.fixture
def deployed(session):
    """dev deployed: a running cluster with the streaming step, a log bucket, the report machine."""
    emr = session.client("emr")
    s3 = session.client("s3")
    s3.create_bucket(Bucket=LOGS)
    cluster_id = emr.run_job_flow(
        Name="lakehouse-dev-emr",
        ReleaseLabel="emr-7.14.0",
        LogUri=f"s3://{LOGS}/emr/",
        Instances={
            "InstanceCount": 1,
            "KeepJobFlowAliveWhenNoSteps": True,
            "MasterInstanceType": "m5.xlarge",
        },
        JobFlowRole="EMR_EC2_DefaultRole",
        ServiceRole="EMR_DefaultRole",
    )["JobFlowId"]
    step = {
        "ActionOnFailure": "CONTINUE",
        "HadoopJarStep": {"Jar": "command-runner.jar", "Args": ["spark-submit"]},
    }
    (step_id,) = emr.add_job_flow_steps(
        JobFlowId=cluster_id, Steps=[{"Name": "lakehouse-streaming@abc123", **step}]
    )["StepIds"]
    s3.put_object(
        Bucket=LOGS,
        Key=f"emr/{cluster_id}/steps/{step_id}/stderr.gz",
        Body=gzip.compress(b"INFO ingest batch 1: records=900\n"),
    )
    machines = {
        name: session.client("stepfunctions").create_state_machine(
            name=name,
            definition=json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}}),
            roleArn="arn:aws:iam::123456789012:role/sfn",
        )["stateMachineArn"]
        for name in ("report", "gendata")
    }
    deploy_stack(session, "Lake", {"WarehouseUri": "s3://w/warehouse"})
    deploy_stack(session, "Compute", {"EmrClusterId": cluster_id})
    deploy_stack(
        session,
        "Jobs",
        {
            "ReportStateMachineArn": machines["report"],
            "GendataStateMachineArn": machines["gendata"],
            "JobsVersion": "abc123",
        },
    )
    return {"cluster_id": cluster_id, "step_id": step_id}


def test_status_shows_stacks_cluster_steps_and_freshness(session, deployed) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    batch = BatchMetrics(
        "ingest",
        "ods_behavior.clickevent",
        900,
        2.0,
        1.0,
        lag_seconds=4.5,
        at=(now - timedelta(minutes=2)).timestamp(),
    )
    session.client("cloudwatch").put_metric_data(Namespace="Lakehouse/dev", MetricData=metric_data(batch))
    found = operate.status(session, DEV, now=now)
    assert found.stacks[DEV.stack_name("Compute")] == "CREATE_COMPLETE"
    assert found.stacks[DEV.stack_name("Network")] == "NOT DEPLOYED"
    assert found.cluster["id"] == deployed["cluster_id"] and found.cluster["state"] in ("WAITING", "RUNNING")
    assert [(s["job"], s["id"]) for s in found.steps] == [("streaming", deployed["step_id"])]
    clicks = found.tables["ods_behavior.clickevent"]
    assert clicks["records_last_hour"] == 900 and clicks["lag_seconds"] == 4.5
    assert 60 <= clicks["last_commit_age_seconds"] <= 180
    assert found.tables["dim_db.products"]["last_commit_age_seconds"] is None


def test_status_cli_prints_json(session, deployed) -> None:
    result = CliRunner().invoke(main, ["aws", "status", "--env", "dev", "--region", REGION, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["cluster"]["id"] == deployed["cluster_id"]


def test_logs_of_a_job_are_its_newest_steps_stderr(session, deployed) -> None:
    _, outputs = operate.stack_outputs(session, DEV)
    assert (
        operate.step_log(session, DEV, outputs, "streaming", "stderr") == "INFO ingest batch 1: records=900\n"
    )
    assert "records=900" in operate.step_log(session, DEV, outputs, deployed["step_id"], "stderr")
    with pytest.raises(operate.OperateError, match="no stdout for step .* yet"):
        operate.step_log(session, DEV, outputs, "streaming", "stdout")


def test_submit_starts_the_batch_jobs_state_machine_and_refuses_streaming_jobs(session, deployed) -> None:
    _, outputs = operate.stack_outputs(session, DEV)
    arn = operate.submit(session, DEV, outputs, "report", {})
    execution = session.client("stepfunctions").describe_execution(executionArn=arn)
    assert json.loads(execution["input"]) == {"reason": "lakehouse aws submit"}
    with pytest.raises(operate.OperateError, match="streaming job, kept running by the step supervisor"):
        operate.submit(session, DEV, outputs, "streaming", {})
    with pytest.raises(operate.OperateError, match="no state machine for maintain"):
        operate.submit(session, DEV, outputs, "maintain", {})


def test_submit_gendata_passes_count_and_rate_to_its_state_machine(session, deployed) -> None:
    args = ["aws", "submit", "gendata", "--env", "dev", "--region", REGION]
    result = CliRunner().invoke(main, [*args, "--count", "100000", "--rate", "500"])
    assert result.exit_code == 0, result.output
    sfn = session.client("stepfunctions")
    (machine,) = [m for m in sfn.list_state_machines()["stateMachines"] if m["name"] == "gendata"]
    (execution,) = sfn.list_executions(stateMachineArn=machine["stateMachineArn"])["executions"]
    started = json.loads(sfn.describe_execution(executionArn=execution["executionArn"])["input"])
    assert started == {"reason": "lakehouse aws submit", "count": "100000", "rate": "500"}
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code != 0 and "gendata needs --count N" in refused.output


def test_gendata_is_refused_in_prod_where_it_is_not_deployed(session) -> None:
    prod = DeploymentConfig.for_env("prod")
    with pytest.raises(operate.OperateError, match="gendata is not deployed in prod"):
        operate.submit(session, prod, {}, "gendata", {"count": "10", "rate": "1"})


class CancelRecordingSession:
    """moto has no EMR CancelSteps: the session's EMR clients record the call instead."""

    def __init__(self, session) -> None:
        self._session, self.cancelled = session, []

    def client(self, name: str):
        client = self._session.client(name)
        if name == "emr":
            client.cancel_steps = lambda **kw: self.cancelled.append(kw)
        return client


def test_stop_cancels_the_jobs_live_step(session, deployed) -> None:
    _, outputs = operate.stack_outputs(session, DEV)
    recording = CancelRecordingSession(session)
    assert operate.stop(recording, DEV, outputs, "streaming") == [deployed["step_id"]]
    assert recording.cancelled == [{"ClusterId": deployed["cluster_id"], "StepIds": [deployed["step_id"]]}]
    with pytest.raises(operate.OperateError, match="no pending or running step of report"):
        operate.stop(recording, DEV, outputs, "report")


def test_an_unknown_job_names_the_known_ones(session, deployed) -> None:
    result = CliRunner().invoke(main, ["aws", "stop", "ingestt", "--env", "dev", "--region", REGION])
    assert result.exit_code == 1
    unknown = "unknown job 'ingestt' in dev: one of streaming, report, maintain, verify, replay, gendata"
    assert unknown in " ".join(result.output.split())


def test_a_terminated_cluster_says_how_to_get_a_new_one(session, deployed) -> None:
    session.client("emr").terminate_job_flows(JobFlowIds=[deployed["cluster_id"]])
    _, outputs = operate.stack_outputs(session, DEV)
    with pytest.raises(operate.OperateError, match=r"TERMINAT.*lakehouse aws park --env dev.*unpark"):
        operate.stop(session, DEV, outputs, "streaming")


def test_nothing_deployed_says_how_to_deploy(session) -> None:
    result = CliRunner().invoke(main, ["aws", "status", "--env", "dev", "--region", REGION])
    assert result.exit_code == 1
    assert (
        "no Lakehouse-dev stack in this account/region: deploy with `cdk deploy -c env=dev --all`"
        in " ".join(result.output.split())
    )


def test_no_credentials_is_one_clear_line(monkeypatch, tmp_path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = CliRunner().invoke(main, ["aws", "status", "--env", "dev", "--region", REGION])
    assert result.exit_code == 1
    assert "no AWS credentials" in result.output


def test_sql_runs_in_the_envs_athena_workgroup_and_prints_the_rows(session, deployed) -> None:
    import requests

    session.client("athena").create_work_group(Name="lakehouse-dev-adhoc")
    columns = [{"Name": name, "Type": "varchar"} for name in ("productId", "views")]
    rows = [
        {"Data": [{"VarCharValue": v} for v in row]}
        for row in (["productId", "views"], ["1", "917"], ["2", "31"])
    ]
    requests.post(
        "http://motoapi.amazonaws.com/moto-api/static/athena/query-results",
        json={
            "account_id": "123456789012",
            "region": REGION,
            "results": [{"rows": rows, "column_info": columns}],
        },
        timeout=10,
    )
    result = CliRunner().invoke(
        main,
        ["aws", "sql", "SELECT productId, views FROM ads_behavior.product_views", "--env", "dev",
         "--region", REGION, "--format", "csv"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["productId,views", "1,917", "2,31"]
    executions = session.client("athena").list_query_executions(WorkGroup="lakehouse-dev-adhoc")
    assert len(executions["QueryExecutionIds"]) == 1


def test_a_query_the_lake_refuses_says_how_to_become_a_reader() -> None:
    from lakehouse.aws.operate import OperateError, athena_query

    class RefusingAthena:
        def start_query_execution(self, **_):
            return {"QueryExecutionId": "q1"}

        def get_query_execution(self, **_):
            reason = "Access denied when writing output to url: s3://lakehouse-prod-warehouse/athena-results/"
            return {"QueryExecution": {"Status": {"State": "FAILED", "StateChangeReason": reason}}}

    class Session:
        def client(self, name):
            assert name == "athena"
            return RefusingAthena()

    with pytest.raises(OperateError) as raised:
        athena_query(Session(), DeploymentConfig.for_env("prod"), "SELECT 1", poll=lambda _: None)
    assert "Access denied when writing output" in str(raised.value)
    assert "context value lake_readers: add your role's ARN there" in str(raised.value)


def test_request_resync_adds_a_step_of_the_deployed_cdc_job_beside_the_running_one(session, deployed) -> None:
    """The step runs `cdc --request-resync` with the deployed streaming step's spark-submit (the
    supervisor's streaming-steps.json beside the archive), under a name of its own (a step of the
    job's own name would stop the running job first); each error is one line saying what to do."""
    from infra.emr_steps import JobArtifacts, replacing_step_args, spark_submit_args

    artifacts = JobArtifacts("lakehouse-dev-artifacts", "abc123", "x86_64")
    settings = {"env": "dev", "region": REGION, "kafka_bootstrap": "b-1:9098", "kafka_auth": "iam",
                "mysql_host": "db", "mysql_port": 3306, "mysql_cdc_secret_id": "arn:s",
                "mysql_ssl_ca": "rds"}  # fmt: skip
    submit = spark_submit_args(
        job="streaming", artifacts=artifacts, job_settings=settings, job_python="python3"
    )
    desired = [{"job": "streaming", "version": "abc123", "args": replacing_step_args("streaming", submit)}]
    args = ["aws", "request-resync", "dim_db.products", "--env", "dev", "--region", REGION]
    not_uploaded = CliRunner().invoke(main, args)
    assert not_uploaded.exit_code == 1 and "ArtifactsBucketName" in not_uploaded.output
    s3 = session.client("s3")
    s3.create_bucket(Bucket=artifacts.bucket_name)
    session.client("cloudformation").delete_stack(StackName=DEV.stack_name("Lake"))
    deploy_stack(
        session, "Lake", {"WarehouseUri": "s3://w/warehouse", "ArtifactsBucketName": artifacts.bucket_name}
    )
    glue = session.client("glue")
    no_table = CliRunner().invoke(main, args)  # a typo: the job would exit 2, a FAILED step that alerts
    assert no_table.exit_code == 1 and "no table dim_db.products in the Glue catalog" in no_table.output
    glue.create_database(DatabaseInput={"Name": "dim_db"})
    for name in ("products", "products__cdc_snapshot_0a1b2c3d"):
        glue.create_table(DatabaseName="dim_db", TableInput={"Name": name})
    copy = CliRunner().invoke(main, [*args[:2], "dim_db.products__cdc_snapshot_0a1b2c3d", *args[3:]])
    assert copy.exit_code == 1 and "a re-snapshot's copy under way" in copy.output, copy.output
    no_steps = CliRunner().invoke(main, args)
    assert no_steps.exit_code == 1 and "emr/abc123/streaming-steps.json" in no_steps.output
    s3.put_object(
        Bucket=artifacts.bucket_name, Key="emr/abc123/streaming-steps.json", Body=json.dumps(desired)
    )
    for name in ("products; rm", "user_db.products", "ads_behavior.product_views"):  # the job would refuse
        bad = CliRunner().invoke(main, ["aws", "request-resync", name, "--env", "dev", "--region", REGION])
        assert bad.exit_code == 1 and "dim_db.<table>" in bad.output, bad.output
    assert len(session.client("emr").list_steps(ClusterId=deployed["cluster_id"])["Steps"]) == 1  # none added

    result = CliRunner().invoke(main, args)

    assert result.exit_code == 0, result.output
    emr = session.client("emr")
    (added,) = [
        s for s in emr.list_steps(ClusterId=deployed["cluster_id"])["Steps"] if s["Id"] != deployed["step_id"]
    ]
    assert added["Id"] in result.output and added["Name"] == operate.REQUEST_RESYNC_STEP
    step_args = added["Config"]["Args"]
    assert (
        step_args[0] == "spark-submit"
        and step_args[step_args.index("--name") + 1] == operate.REQUEST_RESYNC_STEP
    )
    entry = step_args.index(artifacts.entry_point_uri)
    assert step_args[entry + 1] == "cdc" and step_args[-2:] == ["--request-resync", "dim_db.products"]
    status = operate.status(session, DEV)  # listed among the pipeline's steps, as its own job
    assert ("cdc-request-resync", added["Id"]) in [(s["job"], s["id"]) for s in status.steps]
