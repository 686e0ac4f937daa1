"""Deployment of the jobs onto the EMR cluster, after the cluster exists.

- The artifact set of `make package` is uploaded to `s3://<artifacts>/emr/<version>/`; old versions
  stay (a running step keeps reading its own archive until it is replaced).
- The streaming jobs (CDC, ingest, views) run as long-lived steps kept alive by the step supervisor
  Lambda (`infra/lambdas/step_supervisor`): invoked every few minutes, on every step status change of
  this cluster (best-effort events, hence the schedule too) and once per deploy. A new version
  cancels the old step first and starts the new one once it is gone; exactly-once resume makes that
  safe. Failed steps are resubmitted with backoff, up to a cap per hour, then the topic is alerted.
- Batch jobs (report daily, maintain hourly) run through a state machine each: add the step, wait
  for it (`.sync`), retry with backoff, alert the topic on failure. EventBridge Scheduler starts them.
- gendata (dev only, `JobSettings.deploy_gendata`) runs on demand through its own state machine
  (input: `{"count": "1000", "rate": "200"}`).

Never the cluster's `Steps` property or `AWS::EMR::Step`: both are create-only and cannot cancel a
running step.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from aws_cdk import Annotations, Aws, Duration, RemovalPolicy, Size, Stack, triggers
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as event_targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3deploy
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as scheduler_targets
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from infra.access import give_role_name
from infra.bundling import python_function_code
from infra.cdk_values import log_retention
from infra.config import JobSettings
from infra.constructs.pipeline_health import STEP_RESTARTS_METRIC
from infra.emr_steps import (
    ARTIFACTS_PREFIX,
    BATCH_JOBS,
    HANDOVER_STEP,
    STREAMING_STEPS_FILE,
    SUPERVISED_CLUSTER_TAG,
    JobArtifacts,
    replacing_step_args,
    spark_submit_args,
    streaming_steps,
)
from infra.nag import (
    LAMBDA_BASIC_EXECUTION_FINDING,
    acknowledge,
    acknowledge_bucket_deployment,
    aws_arn,
    nag_rendering,
)
from infra.trust import service_for_this_account

# The states in which a step has ended (EMR's StepStatus.State values, less the active ones).
STEP_ENDED_STATES = ("COMPLETED", "CANCELLED", "FAILED", "INTERRUPTED")


class JobDeployment(Construct):
    """The jobs' artifacts in S3, the step supervisor, the batch state machines and their schedules.

    Parked (`cluster_id=None`), only the artifacts are uploaded: `supervisor` and
    `gendata_state_machine` are None and `batch_state_machines` is empty.
    """

    #: Where this build of the jobs lives in the artifacts bucket (version, archive, entry point).
    artifacts: JobArtifacts
    #: The CloudWatch namespace of the supervisor's restart metric (`Lakehouse/<env>`).
    metrics_namespace: str
    #: The cluster's ARN, built from its id (the supervisor and state machines act on it alone).
    cluster_arn: str
    #: The supervisor's desired streaming steps ({"job", "version", "args"} each), and their S3 key
    #: beside the archive (`emr/<version>/streaming-steps.json`).
    streaming_steps: list[dict[str, object]]
    streaming_steps_key: str
    #: The upload of the artifact set and streaming-steps.json to `s3://<artifacts>/emr/<version>/`.
    upload: s3deploy.BucketDeployment
    #: The step supervisor Lambda; None when parked.
    supervisor: lambda_.Function | None
    #: The state machine of each scheduled batch job (report, maintain); empty when parked.
    batch_state_machines: dict[str, sfn.StateMachine]
    #: The on-demand test-data generator's state machine; None when parked or not deployed (prod).
    gendata_state_machine: sfn.StateMachine | None

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        package_dir: Path,
        artifacts: JobArtifacts,
        artifacts_bucket: s3.IBucket,
        cluster_id: str | None,
        cluster_name: str,
        job_settings: Mapping[str, object],
        job_python: str,
        alert_topic: sns.ITopic,
        settings: JobSettings,
        removal_policy: RemovalPolicy,
        metrics_namespace: str,
        upload_role_name: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.artifacts = artifacts
        self.metrics_namespace = metrics_namespace
        self.cluster_arn = aws_arn("elasticmapreduce", f"cluster/{cluster_id}")

        def submit_args(job: str, *extra: str) -> list[str]:
            streaming = job in streaming_steps(settings.one_streaming_application)
            resources = settings.streaming_resources if streaming else settings.batch_resources
            return spark_submit_args(
                job=job,
                artifacts=artifacts,
                job_settings=job_settings,
                job_python=job_python,
                job_args=extra,
                spark_conf=resources.submit_conf(),
            )

        # The supervisor's desired steps live next to the archive (`streaming-steps.json`): three
        # full argument lists do not fit in a Lambda's 4 KB of environment. It names each step
        # `lakehouse-<job>@<version>-<digest of its args>`.
        self.streaming_steps = [
            {
                "job": job,
                "version": artifacts.version,
                "args": replacing_step_args(job, submit_args(job)),
            }
            for job in streaming_steps(settings.one_streaming_application)
        ]
        self.streaming_steps_key = f"{ARTIFACTS_PREFIX}/{artifacts.version}/{STREAMING_STEPS_FILE}"

        # Note: the archive is ~110 MB; the upload handler needs the memory and disk to unzip it.
        self.upload = s3deploy.BucketDeployment(
            self,
            "UploadJobArtifacts",
            sources=[
                s3deploy.Source.asset(str(package_dir), exclude=["wheelhouse-*"]),
                s3deploy.Source.json_data(STREAMING_STEPS_FILE, self.streaming_steps),
            ],
            destination_bucket=artifacts_bucket,
            destination_key_prefix=f"{ARTIFACTS_PREFIX}/{artifacts.version}/",
            prune=False,
            memory_limit=2048,
            ephemeral_storage_size=Size.gibibytes(2),
        )
        # The artifacts bucket lets only this role write emr/ (infra/access.py).
        give_role_name(self.upload.handler_role, upload_role_name)
        acknowledge_bucket_deployment(
            self.upload, destination_bucket_name=nag_rendering(artifacts.bucket_name)
        )
        self.supervisor = None
        self.batch_state_machines = {}
        self.gendata_state_machine = None
        if cluster_id is None:
            return  # parked (dev): the artifacts stay current; nothing runs.
        retention = log_retention(settings.log_retention_days)
        self.supervisor = self._supervisor(cluster_id, cluster_name, alert_topic, settings, removal_policy)

        repair = ("--repair",) if settings.verify_repairs else ()
        self.batch_state_machines = {
            job: self._batch_state_machine(
                job,
                cluster_id,
                replacing_step_args(job, submit_args(job, *(repair if job == "verify" else ()))),
                alert_topic,
                retention,
                removal_policy,
            )
            for job in BATCH_JOBS
            if job != "gendata"
        }
        daily = scheduler.ScheduleExpression.cron(hour=str(settings.report_hour_utc), minute="30")
        for job, expression in (
            ("report", daily),
            ("verify", scheduler.ScheduleExpression.cron(hour=str(settings.verify_hour_utc), minute="15")),
            ("maintain", scheduler.ScheduleExpression.rate(Duration.hours(settings.maintain_every_hours))),
        ):
            scheduler.Schedule(
                self,
                f"{job.capitalize()}Schedule",
                description=f"Run the {job} job on the EMR cluster",
                schedule=expression,
                target=scheduler_targets.StepFunctionsStartExecution(self.batch_state_machines[job]),
            )
        if settings.deploy_gendata:
            # gendata: count and rate come from the execution input, so the step's arguments are
            # built at run time (States.Array) and the step reads them from the state.
            gendata_args = sfn.JsonPath.array(
                *submit_args("gendata"),
                "--count",
                sfn.JsonPath.string_at("$.count"),
                "--rate",
                sfn.JsonPath.string_at("$.rate"),
            )
            self.gendata_state_machine = self._batch_state_machine(
                "gendata", cluster_id, None, alert_topic, retention, removal_policy, retries=0,
                args_at_run_time=gendata_args,
            )  # fmt: skip
        # Nothing may start a step of this version before its archive is in S3.
        for dependent in (self.supervisor, self.gendata_state_machine, *self.batch_state_machines.values()):
            if dependent is not None:
                dependent.node.add_dependency(self.upload)

    # ---- streaming: the supervisor -------------------------------------------------------------

    def _supervisor(
        self, cluster_id, cluster_name: str, alert_topic, settings: JobSettings, removal_policy
    ) -> lambda_.Function:
        log_group = logs.LogGroup(
            self,
            "SupervisorLogs",
            retention=log_retention(settings.log_retention_days),
            removal_policy=removal_policy,
        )
        every = Duration.minutes(settings.supervisor_every_minutes)
        # Each restart of a failed streaming step is one log line {"action": "start", "reason":
        # "restart after N failure(s) ..."}: counted for the restarts alarm (pipeline_health.py).
        logs.MetricFilter(
            self,
            "StepRestarts",
            log_group=log_group,
            metric_namespace=self.metrics_namespace,
            metric_name=STEP_RESTARTS_METRIC,
            filter_pattern=logs.FilterPattern.all(
                logs.FilterPattern.string_value("$.action", "=", "start"),
                logs.FilterPattern.string_value("$.reason", "=", "restart*"),
            ),
            metric_value="1",
        )
        function = lambda_.Function(
            self,
            "StepSupervisor",
            description="Keeps the streaming jobs running as EMR steps (start, replace, resubmit, alert)",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="handler.handler",
            code=python_function_code("step_supervisor"),
            timeout=Duration.minutes(1),
            memory_size=256,
            # No reserved concurrency: a new account's quota cannot spare one. Concurrent reconciles
            # converge on one step per job by themselves (handler.py's docstring).
            log_group=log_group,
            environment={
                "CLUSTER_ID": cluster_id,
                "CLUSTER_NAME": cluster_name,
                "STREAMING_STEPS_S3_URI": f"s3://{self.artifacts.bucket_name}/{self.streaming_steps_key}",
                "ALERT_TOPIC_ARN": alert_topic.topic_arn,
                "MAX_FAILURES_PER_HOUR": str(settings.max_failures_per_hour),
                "SCHEDULE_PERIOD_SECONDS": str(int(every.to_seconds())),
            },
        )
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=[
                    "elasticmapreduce:DescribeCluster",
                    "elasticmapreduce:ListSteps",
                    "elasticmapreduce:DescribeStep",
                    "elasticmapreduce:AddJobFlowSteps",
                    "elasticmapreduce:CancelSteps",
                    # Marks a give-up as alerted on the cluster, so each episode alerts once.
                    "elasticmapreduce:AddTags",
                ],
                resources=[self.cluster_arn],
            )
        )
        # The handover: a replaced cluster of this name that still runs (prod's is termination-
        # protected) gets its streaming steps cancelled and their applications killed (a step the
        # supervisor adds there) before this cluster starts its own.
        # ListClusters has no resource type; the others only on a cluster tagged with this name.
        function.add_to_role_policy(
            iam.PolicyStatement(actions=["elasticmapreduce:ListClusters"], resources=["*"])
        )
        function.add_to_role_policy(
            iam.PolicyStatement(
                # AddJobFlowSteps: the step that kills the replaced cluster's applications there.
                actions=[
                    "elasticmapreduce:ListSteps",
                    "elasticmapreduce:CancelSteps",
                    "elasticmapreduce:AddJobFlowSteps",
                ],
                resources=[aws_arn("elasticmapreduce", "cluster/*")],
                conditions={
                    "StringEquals": {f"elasticmapreduce:ResourceTag/{SUPERVISED_CLUSTER_TAG}": cluster_name}
                },
            )
        )
        alert_topic.grant_publish(function)
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[
                    f"arn:{Aws.PARTITION}:s3:::{self.artifacts.bucket_name}/{self.streaming_steps_key}"
                ],
            )
        )
        Annotations.of(function).acknowledge_warning(
            "@aws-cdk/aws-lambda:addPermissionsToVersionOrAlias",
            "Invoked unqualified (schedule, events, deploy trigger): no permission on a version is needed",
        )
        acknowledge(
            function, LAMBDA_BASIC_EXECUTION_FINDING, "AWS managed policy: the function writes its own logs"
        )
        acknowledge(
            function,
            "AwsSolutions-IAM5[Resource::*]",
            "elasticmapreduce:ListClusters has no resource type (service authorization reference); the "
            "handover finds a replaced cluster by name with it",
        )
        acknowledge(
            function,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:elasticmapreduce:<AWS::Region>:<AWS::AccountId>:cluster/*]",
            "ListSteps, CancelSteps, AddJobFlowSteps on a replaced cluster (id unknown at deploy time): only "
            f"clusters tagged {SUPERVISED_CLUSTER_TAG}=<this cluster's name> (elasticmapreduce:ResourceTag)",
        )
        acknowledge(
            function,
            "AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
            "Publishing to the KMS-encrypted alerts topic: CDK's grant on that one key",
        )

        # As CDK's own scheduler target roles: only this account's default schedule group.
        schedule_role = iam.Role(
            self,
            "SupervisorScheduleRole",
            assumed_by=service_for_this_account("scheduler", "scheduler", "schedule-group/default"),
        )
        acknowledge(
            schedule_role,
            f"AwsSolutions-IAM5[Resource::<{Stack.of(self).get_logical_id(function.node.default_child)}.Arn>:*]",
            "lambda:InvokeFunction on the supervisor and its versions (CDK's grantInvoke), nothing else",
        )
        scheduler.Schedule(
            self,
            "SupervisorSchedule",
            description="Reconcile the streaming steps (step status events are best-effort)",
            schedule=scheduler.ScheduleExpression.rate(every),
            target=scheduler_targets.LambdaInvoke(
                function,
                input=scheduler.ScheduleTargetInput.from_object({"reason": "schedule"}),
                role=schedule_role,
            ),
        )
        # A step of this cluster ending; and the handover's end on a replaced cluster (another cluster
        # id): the start waits for it, so it need not wait for the schedule too.
        for rule_id, description, step in (
            ("StepStatusChange", "Reconcile when a step of this cluster ends", {"clusterId": [cluster_id]}),
            ("HandoverStepEnded", "Reconcile when a replaced cluster's handover step ends",
             {"name": [HANDOVER_STEP]}),
        ):  # fmt: skip
            events.Rule(
                self,
                rule_id,
                description=description,
                event_pattern=events.EventPattern(
                    source=["aws.emr"],
                    detail_type=["EMR Step Status Change"],
                    detail={**step, "state": list(STEP_ENDED_STATES)},
                ),
                targets=[event_targets.LambdaFunction(function)],
            )
        # Once per deploy whose streaming steps changed (new version or arguments): replace them now.
        reconcile = triggers.Trigger(
            self,
            "ReconcileOnDeploy",
            handler=function,
            execute_on_handler_change=True,
            invocation_type=triggers.InvocationType.EVENT,
        )
        reconcile.execute_after(self.upload)
        return function

    # ---- batch: one state machine per job --------------------------------------------------------

    def _batch_state_machine(
        self,
        job: str,
        cluster_id: str,
        args: list[str] | None,
        alert_topic: sns.ITopic,
        retention: logs.RetentionDays,
        removal_policy,
        retries: int = 2,
        args_at_run_time: str | None = None,
    ) -> sfn.StateMachine:
        """Add the step, wait for it to finish (`addStep.sync`), retry, alert the topic on failure."""
        scope = Construct(self, f"{job.capitalize()}Job")
        jar_step: dict[str, object] = {"Jar": "command-runner.jar"}
        first: sfn.IChainable | None = None
        if args_at_run_time is None:
            jar_step["Args"] = args
        else:
            first = sfn.Pass(scope, "BuildArgs", parameters={"args": args_at_run_time}, result_path="$.step")
            jar_step["Args.$"] = "$.step.args"
        # A custom state, not tasks.EmrAddStep: that one grants its actions on every cluster
        # (`cluster/*`); this role may add, describe and cancel steps on this cluster only.
        run = sfn.CustomState(
            scope,
            "RunStep",
            state_json={
                "Type": "Task",
                "Resource": f"arn:{Aws.PARTITION}:states:::elasticmapreduce:addStep.sync",
                "Parameters": {
                    "ClusterId": cluster_id,
                    "Step": {
                        "Name": f"lakehouse-{job}",
                        "ActionOnFailure": "CONTINUE",
                        "HadoopJarStep": jar_step,
                    },
                },
                "ResultPath": None,
            },
        )
        if retries:
            run.add_retry(
                errors=["States.ALL"], max_attempts=retries, interval=Duration.minutes(2), backoff_rate=2
            )
        alert = tasks.SnsPublish(
            scope,
            "Alert",
            topic=alert_topic,
            subject=f"lakehouse {job} job failed",
            message=sfn.TaskInput.from_object(
                {
                    "job": job,
                    "cluster": cluster_id,
                    "error": sfn.JsonPath.string_at("$.error.Error"),
                    "cause": sfn.JsonPath.string_at("$.error.Cause"),
                    "next": "read the step's stderr in the EMR log bucket; rerun: start this state machine",
                }
            ),
            result_path=sfn.JsonPath.DISCARD,
        )
        failed = sfn.Fail(scope, "Failed", cause=f"{job} step failed")
        run.add_catch(alert.next(failed), result_path="$.error")
        log_group = logs.LogGroup(scope, "Logs", retention=retention, removal_policy=removal_policy)
        machine = sfn.StateMachine(
            scope,
            "StateMachine",
            definition_body=sfn.DefinitionBody.from_chainable(
                (first.next(run) if first else run).next(sfn.Succeed(scope, "Done"))
            ),
            timeout=Duration.hours(6),
            tracing_enabled=True,
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=False),
        )
        machine.add_to_role_policy(
            iam.PolicyStatement(
                actions=[
                    "elasticmapreduce:AddJobFlowSteps",
                    "elasticmapreduce:DescribeStep",
                    "elasticmapreduce:CancelSteps",
                ],
                resources=[self.cluster_arn],
            )
        )
        # SnsPublish grants sns:Publish only; the topic is KMS-encrypted, so without the key grant
        # the failure alert itself would fail (KMS access denied) and nobody would hear of it.
        alert_topic.grant_publish(machine)
        # `.sync` on EMR steps waits through this Step Functions-managed rule.
        machine.add_to_role_policy(
            iam.PolicyStatement(
                actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
                resources=[aws_arn("events", "rule/StepFunctionsGetEventForEMRAddJobFlowStepsRule")],
            )
        )
        acknowledge(
            machine,
            "AwsSolutions-IAM5[Resource::*]",
            "CDK's standard grants for state machine log delivery and X-Ray tracing: those actions "
            "support no resource-level permissions",
        )
        acknowledge(
            machine,
            "AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
            "Publishing to the KMS-encrypted alerts topic: CDK's grant on that one key",
        )
        return machine
