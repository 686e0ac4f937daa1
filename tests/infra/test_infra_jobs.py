"""The jobs on EMR in the synthesized templates: artifacts and bootstrap scripts uploaded, bootstrap
actions, steps submitted only after the cluster exists (supervisor + state machines), schedules,
alerts and least-privilege IAM."""

from __future__ import annotations

import json
import re
from pathlib import Path

from aws_cdk.assertions import Match

from infra.emr_steps import (
    BATCH_JOBS,
    STREAMING_APPLICATION,
    STREAMING_JOBS,
    JobArtifacts,
    spark_submit_args,
    step_name,
    streaming_steps,
)
from infra.stacks import BOOTSTRAP_DIR

SETTINGS = {
    "env": "dev",
    "region": "us-east-1",
    "kafka_bootstrap": "b-1:9098,b-2:9098",
    "kafka_auth": "iam",
    "mysql_host": "db",
    "mysql_port": 3306,
    "mysql_cdc_secret_id": "arn:secret",
    "mysql_ssl_ca": "rds",
}


def _cluster(env) -> dict:
    (cluster,) = env.template("Compute").find_resources("AWS::EMR::Cluster").values()
    return cluster["Properties"]


def _definition(machine_resource: dict) -> str:
    """A state machine's definition with its CloudFormation tokens flattened to text."""
    return json.dumps(machine_resource["Properties"]["DefinitionString"])


def test_step_arguments_ship_the_archive_and_pass_every_setting():
    artifacts = JobArtifacts("bucket", "abc123", "x86_64")
    args = spark_submit_args(
        job="ingest", artifacts=artifacts, job_settings=SETTINGS,
        job_python="/usr/bin/python3.11", job_args=("--trigger-seconds", "2"),
    )  # fmt: skip
    assert args[:3] == ["spark-submit", "--deploy-mode", "cluster"]
    assert "spark.archives=s3://bucket/emr/abc123/pyenv-x86_64.zip#pyenv" in args
    assert "spark.executorEnv.PYTHONPATH=./pyenv" in args
    assert "spark.yarn.appMasterEnv.PYSPARK_PYTHON=/usr/bin/python3.11" in args
    entry = args.index("s3://bucket/emr/abc123/emr_step.py")
    assert args[entry + 1] == "ingest"  # emr_step.py runs the job of that name (jobs/registry.py)
    job_args = args[entry + 2 :]
    for flag, key in (
        ("--kafka-bootstrap", "kafka_bootstrap"),
        ("--mysql-cdc-secret-id", "mysql_cdc_secret_id"),
    ):
        assert job_args[job_args.index(flag) + 1] == str(SETTINGS[key])
    assert job_args[-2:] == ["--trigger-seconds", "2"]
    assert step_name("ingest", "abc123") == "lakehouse-ingest@abc123"


def test_job_arguments_parse_with_each_jobs_own_parser():
    """The step's job arguments are accepted by the job's own argument parser (no AWS needed)."""
    import importlib

    artifacts = JobArtifacts("bucket", "v1", "x86_64")
    for job in (*STREAMING_JOBS, *STREAMING_APPLICATION, *BATCH_JOBS):
        extra = ("--count", "10") if job == "gendata" else ()
        args = spark_submit_args(
            job=job, artifacts=artifacts, job_settings=SETTINGS, job_python="python3", job_args=extra,
        )  # fmt: skip
        job_args = args[args.index(artifacts.entry_point_uri) + 2 :]
        parsed = importlib.import_module(f"jobs.{job}.__main__").parse_args(job_args)
        parsed = parsed[0] if isinstance(parsed, tuple) else parsed  # cdc also returns its own args
        assert (parsed.env, parsed.kafka_bootstrap, parsed.mysql_port) == ("dev", "b-1:9098,b-2:9098", 3306)


def test_artifacts_and_bootstrap_scripts_are_uploaded(synthesized):
    version = synthesized.stacks.jobs.jobs.artifacts.version
    synthesized.template("Jobs").has_resource_properties(
        "Custom::CDKBucketDeployment",
        {"DestinationBucketKeyPrefix": f"emr/{version}/", "Prune": False},
    )
    synthesized.template("Compute").has_resource_properties(
        "Custom::CDKBucketDeployment", {"DestinationBucketKeyPrefix": "bootstrap/"}
    )


def test_bootstrap_actions_point_at_the_uploaded_scripts(synthesized):
    listed = _cluster(synthesized)["BootstrapActions"]
    assert len(listed) == 2  # each script once
    actions = {a["Name"]: a["ScriptBootstrapAction"] for a in listed}
    assert set(actions) == {"node-setup", "configure-catalogs"}
    for action in actions.values():
        script = Path(json.dumps(action["Path"]).split("/bootstrap/")[1].split('"')[0])
        assert (BOOTSTRAP_DIR / script).is_file(), script
    assert actions["configure-catalogs"]["Args"][:2] == ["--catalog", "lakehouse"]
    assert actions["node-setup"]["Args"] == ["--python", synthesized.config.compute.job_python]
    # The cluster waits for the scripts to be in S3.
    (cluster_id,) = synthesized.template("Compute").find_resources("AWS::EMR::Cluster")
    cluster = synthesized.templates["Compute"]["Resources"][cluster_id]
    assert any("CustomCDKBucketDeployment" in d or "UploadBootstrap" in d for d in cluster["DependsOn"])


def test_no_steps_on_the_cluster_and_no_cloudformation_steps(synthesized):
    assert "Steps" not in _cluster(synthesized)
    for template in synthesized.templates.values():
        assert not [r for r in template["Resources"].values() if r["Type"] == "AWS::EMR::Step"]


def test_step_concurrency_leaves_room_for_a_batch_step(synthesized):
    assert _cluster(synthesized)["StepConcurrencyLevel"] >= len(STREAMING_JOBS) + 1


def test_dev_runs_one_streaming_application_and_prod_a_step_per_job(dev, prod):
    assert [s["job"] for s in dev.stacks.jobs.jobs.streaming_steps] == ["streaming"]
    assert [s["job"] for s in prod.stacks.jobs.jobs.streaming_steps] == list(STREAMING_JOBS)


def test_the_supervisor_runs_every_streaming_job_of_this_version(synthesized):
    deployment = synthesized.stacks.jobs.jobs
    steps = {s["job"]: s for s in deployment.streaming_steps}
    expected = streaming_steps(synthesized.config.jobs.one_streaming_application)
    assert set(steps) == set(expected)
    for job in expected:
        args = steps[job]["args"]
        assert steps[job]["version"] == deployment.artifacts.version
        # The step first stops the job's running YARN application, then runs spark-submit.
        assert args[:2] == ["bash", "-c"] and args[4] == f"lakehouse-{job}"
        assert args[5:8] == ["spark-submit", "--deploy-mode", "cluster"]
        assert args[args.index(deployment.artifacts.entry_point_uri) + 1] == job
    template = synthesized.template("Jobs")
    # The desired steps travel beside the archive, not in the Lambda's (4 KB) environment.
    prefix = {"Properties": {"DestinationBucketKeyPrefix": f"emr/{deployment.artifacts.version}/"}}
    (upload,) = template.find_resources("Custom::CDKBucketDeployment", prefix).values()
    assert len(upload["Properties"]["SourceObjectKeys"]) == 2  # the package and streaming-steps.json
    supervisor_only = {
        "Properties": {"Description": Match.string_like_regexp("^Keeps the streaming jobs running")}
    }
    (supervisor,) = template.find_resources("AWS::Lambda::Function", supervisor_only).values()
    variables = supervisor["Properties"]["Environment"]["Variables"]
    assert set(variables) >= {"CLUSTER_ID", "STREAMING_STEPS_S3_URI", "ALERT_TOPIC_ARN"}
    assert "STREAMING_STEPS" not in variables
    steps_key = f"emr/{deployment.artifacts.version}/streaming-steps.json"
    assert steps_key in json.dumps(variables["STREAMING_STEPS_S3_URI"])
    assert len(json.dumps(variables)) < 2048  # far from Lambda's 4 KB, whatever the tokens become
    every = synthesized.config.jobs.supervisor_every_minutes
    template.has_resource_properties(
        "AWS::Scheduler::Schedule", {"ScheduleExpression": f"rate({every} minutes)"}
    )
    template.has_resource_properties(
        "AWS::Events::Rule",
        {"EventPattern": Match.object_like({"detail-type": ["EMR Step Status Change"]})},
    )
    # A replaced cluster's handover step ending (its own cluster id) also wakes the supervisor: the
    # "EMR Step Status Change" event's detail names the step (`name`) and its cluster (`clusterId`),
    # https://docs.aws.amazon.com/emr/latest/ManagementGuide/emr-manage-cloudwatch-events.html
    from infra.emr_steps import HANDOVER_STEP

    (handover,) = template.find_resources(
        "AWS::Events::Rule", {"Properties": {"EventPattern": {"detail": {"name": [HANDOVER_STEP]}}}}
    ).values()
    assert "clusterId" not in handover["Properties"]["EventPattern"]["detail"]
    assert "COMPLETED" in handover["Properties"]["EventPattern"]["detail"]["state"]
    template.resource_count_is("Custom::Trigger", 1)  # reconcile once per deploy
    assert {"StepSupervisorName", "StepSupervisorLogGroup"} <= set(synthesized.templates["Jobs"]["Outputs"])


def test_a_step_stops_the_jobs_running_yarn_application_before_it_starts(tmp_path):
    """The wrapper run for real with a stand-in `yarn`: it kills exactly the running application
    with the job's name, then execs the command it was given."""
    import subprocess

    import yarn_stand_in

    from infra.emr_steps import replacing_step_args

    env, killed = yarn_stand_in.install(
        tmp_path,
        [
            ("application_1700000000000_0007", "     lakehouse-ingest"),
            ("application_1700000000000_0008", "        lakehouse-cdc"),
            ("application_1700000000000_0009", "lakehouse-ingest-old "),
        ],
    )
    args = replacing_step_args("ingest", ["echo", "spark-submit", "started"])
    result = subprocess.run(args, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert killed.read_text().split() == ["application_1700000000000_0007"]
    assert result.stdout.strip() == "spark-submit started"
    assert "stopping lakehouse-ingest's running YARN application" in result.stderr


def test_batch_jobs_run_on_schedule_through_state_machines_that_alert(synthesized):
    template = synthesized.template("Jobs")
    machines = template.find_resources("AWS::StepFunctions::StateMachine")
    definitions = [_definition(m) for m in machines.values()]
    deployed = [job for job in BATCH_JOBS if job != "gendata" or synthesized.config.jobs.deploy_gendata]

    def runs(job: str, definition: str) -> bool:  # the step's arguments: ... emr_step.py <job> ...
        return re.search(rf"emr_step\.py\W+{job}\W", definition) is not None

    for job in deployed:
        (definition,) = [d for d in definitions if runs(job, d)]
        assert "elasticmapreduce:addStep.sync" in definition
        assert "sns:publish" in definition  # the catch alerts the topic
    gendata = [d for d in definitions if runs("gendata", d)]
    assert len(gendata) == (1 if synthesized.config.jobs.deploy_gendata else 0)  # dev only
    for definition in gendata:
        assert "States.Array" in definition and "$.count" in definition and "$.rate" in definition
    hour = synthesized.config.jobs.report_hour_utc
    template.has_resource_properties(
        "AWS::Scheduler::Schedule", {"ScheduleExpression": f"cron(30 {hour} * * ? *)"}
    )
    template.has_resource_properties("AWS::Scheduler::Schedule", {"ScheduleExpression": "rate(1 hour)"})
    verify_hour = synthesized.config.jobs.verify_hour_utc
    template.has_resource_properties(
        "AWS::Scheduler::Schedule", {"ScheduleExpression": f"cron(15 {verify_hour} * * ? *)"}
    )


def test_the_verify_step_repairs_only_when_the_context_says_so(dev, prod, prod_with_context):
    """`-c verify_repair=true`: the scheduled verify step runs `verify --repair` (issue 51); by
    default it only reports, and no other step gets the flag."""

    def repairing(env) -> list[str]:
        machines = env.template("Jobs").find_resources("AWS::StepFunctions::StateMachine")
        found = []
        for definition in map(_definition, machines.values()):
            job = re.search(r"emr_step\.py\W+(\w+)\W", definition)
            if job and "--repair" in definition:
                found.append(job.group(1))
        return found

    assert repairing(dev) == repairing(prod) == []
    assert repairing(prod_with_context) == ["verify"]


def test_step_functions_and_the_supervisor_touch_steps_of_this_cluster_only(synthesized):
    template = synthesized.templates["Jobs"]
    emr_statements = []
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if any(a.startswith("elasticmapreduce:") for a in actions):
                emr_statements.append(statement)
    # The supervisor's handover (step_supervisor/handler.py): finding a replaced cluster of its name,
    # and listing and interrupting steps only on a cluster tagged with that name.
    handover = [s for s in emr_statements if "Condition" in s or s["Resource"] == "*"]
    emr_statements = [s for s in emr_statements if s not in handover]
    assert sorted(json.dumps(s["Action"]) for s in handover) == [
        '"elasticmapreduce:ListClusters"',
        '["elasticmapreduce:AddJobFlowSteps", "elasticmapreduce:CancelSteps", "elasticmapreduce:ListSteps"]',
    ]
    (tagged,) = [s for s in handover if "Condition" in s]
    name = synthesized.config.resource_name("emr")
    assert tagged["Condition"] == {
        "StringEquals": {"elasticmapreduce:ResourceTag/lakehouse-emr-cluster": name}
    }
    # supervisor + report, maintain, verify, replay (+ gendata in dev)
    assert len(emr_statements) == 5 + synthesized.config.jobs.deploy_gendata
    for statement in emr_statements:
        resource = json.dumps(statement["Resource"])
        assert "cluster/*" not in resource and "cluster/" in resource
        # The cluster's own id: the ARN's last part resolves to the Compute stack's cluster.
        (arn,) = [statement["Resource"]] if isinstance(statement["Resource"], dict) else statement["Resource"]
        target = synthesized.resolve("Jobs", arn["Fn::Join"][1][-1])
        assert (target.concern, target.type) == ("Compute", "AWS::EMR::Cluster")
        assert {"elasticmapreduce:AddJobFlowSteps"} <= set(statement["Action"])


def test_every_step_caps_its_executors(synthesized):
    """EMR's dynamic allocation has no upper bound: each step says how big it may grow."""
    resources = synthesized.config.jobs
    machines = synthesized.template("Jobs").find_resources("AWS::StepFunctions::StateMachine")
    definitions = [_definition(m) for m in machines.values() if "addStep.sync" in _definition(m)]
    # report, maintain, verify, replay (+ gendata in dev)
    assert len(definitions) == 4 + resources.deploy_gendata
    for definition in definitions:
        for key, value in resources.batch_resources.submit_conf().items():
            assert f"{key}={value}" in definition
    streaming = synthesized.stacks.jobs.jobs.streaming_steps
    for step in streaming:
        for key, value in resources.streaming_resources.submit_conf().items():
            assert f"{key}={value}" in step["args"]


def test_dev_streaming_and_a_batch_job_fit_on_the_core_and_one_task_node(dev):
    """infra/README.md's dev cost assumes two m5.xlarge nodes (YARN ~12 GiB each): the capped streaming
    application plus one batch job fit there, so managed scaling need not hold more Spot nodes."""

    def gib(size: str) -> float:
        return float(size.removesuffix("g")) * 1.1 + 0.4  # + YARN's executor memory overhead

    def footprint(resources) -> float:
        return gib(resources.driver_memory) + resources.max_executors * gib(resources.executor_memory)

    jobs, compute = dev.config.jobs, dev.config.compute
    nodes = compute.core_units + compute.task_spot_units + compute.task_on_demand_units
    assert footprint(jobs.streaming_resources) + footprint(jobs.batch_resources) <= nodes * 12


def test_a_resync_requested_on_aws_runs_the_deployed_cdc_step_beside_the_running_job(synthesized):
    """`lakehouse aws request-resync` (lakehouse/aws/operate.py) adds a step built from the deployed
    streaming steps: the CDC job's own spark-submit (the application's in dev), its job `cdc` with
    `--request-resync`, under a name of its own: a step named as the job would stop the running job
    first (REPLACE_RUNNING_APP), and one named `lakehouse-<job>@<version>` the supervisor would cancel."""
    import importlib

    from lakehouse.aws.operate import REQUEST_RESYNC_STEP, request_resync_args

    deployment = synthesized.stacks.jobs.jobs
    args = request_resync_args(deployment.streaming_steps, ["dim_db.products", "dim_db.user_member"])
    assert args[:3] == ["spark-submit", "--deploy-mode", "cluster"]  # no `bash -c` stopping the job
    assert args[args.index("--name") + 1] == REQUEST_RESYNC_STEP
    assert REQUEST_RESYNC_STEP not in {
        f"lakehouse-{job}" for job in (*STREAMING_JOBS, *STREAMING_APPLICATION)
    }
    assert f"spark.archives={deployment.artifacts.archive_uri}#pyenv" in args
    assert "spark.dynamicAllocation.maxExecutors=1" in args and "spark.driver.memory=1g" in args
    assert len([a for a in args if a.startswith("spark.driver.memory=")]) == 1  # replaced, not added
    entry = args.index(deployment.artifacts.entry_point_uri)
    assert args[entry + 1] == "cdc"
    resolved = ["1" if "${Token[" in arg else arg for arg in args[entry + 2 :]]  # (deploy-time values)
    env_args, _ = importlib.import_module("jobs.cdc.__main__").parse_args(resolved)
    assert env_args.request_resync == ["dim_db.products", "dim_db.user_member"]
    (deployed,) = [
        s["args"] for s in deployment.streaming_steps if s["job"] in ("cdc", *STREAMING_APPLICATION)
    ]
    environment = deployed[deployed.index(deployment.artifacts.entry_point_uri) + 2 :]
    assert args[entry + 2 : entry + 2 + len(environment)] == environment  # the same source, catalog, region
