"""Keeps each long-running streaming job running as exactly one EMR step of the desired version.

Invoked by a 5-minute schedule, by "EMR Step Status Change" events of the cluster (and of the
handover step on a replaced cluster) and once per deploy. Every invocation ignores what the event
says and reconciles all jobs from the cluster's current state, so lost, duplicated or out-of-order
events do no harm.

`plan` decides (pure, no AWS); `reconcile` reads EMR, calls `plan` and executes its actions.

Single flight without reserved concurrency: nothing stops two invocations (a burst of status
events, the schedule and a deploy) from reconciling at once; a reservation of 1 would, but a new
account's concurrency quota (as low as 10, with 100 that must stay unreserved) cannot grant one.
Two racing reconciles can only disagree in one way: both see no live step of a job and both add
one. So after adding steps an invocation lists the live steps again (`settle_concurrent_starts`)
and keeps, of each job it started, only the OLDEST live step of its version (creation time, then
step id), cancelling the rest. That order never changes, so every invocation picks the same
survivor and none cancels it; and whichever of two racers added last lists after both adds, so
the duplicate is always seen. `plan` keeps duplicates by the same rule, so a plain reconcile
running alongside agrees too. A racer deployed with other arguments (an old and a new version
during a deploy) cancels the other's step and the other cancels its own: both stop, and the next
invocation (their CANCELLED events, or the schedule) starts the desired version alone, so two
versions of a job never run side by side. Racing give-ups may alert twice; nothing else repeats.

Handover between clusters (CLUSTER_NAME set): a deploy that replaces the cluster creates the new one
before CloudFormation deletes the old, and prod's old cluster is termination-protected, so it may
run on. Its streaming applications (the previous release's) would write the same tables, topic
offsets and binlog position as this cluster's. Cancelling a step stops only its spark-submit client
(cluster mode: the YARN application runs on), so on every other live cluster of the same name the
supervisor cancels the supervised steps and adds a step of its own, `lakehouse-handover-stop`,
that kills the applications of the supervised jobs there (`yarn application -kill`: every job is
safe against kill -9). Nothing starts here until that step has COMPLETED after the newest
supervised step of that cluster and none is active there. A same-named cluster whose steps this
role may not list (a cluster of a release before the tag `lakehouse-emr-cluster`) holds the start
until an operator terminates it.

Environment: CLUSTER_ID, CLUSTER_NAME (optional: the handover), STREAMING_STEPS_S3_URI (a JSON
list of {job, version, args} in S3; or STREAMING_STEPS inline, with names), ALERT_TOPIC_ARN, and
optionally MAX_FAILURES_PER_HOUR (5), BACKOFF_BASE_SECONDS (30), BACKOFF_MAX_SECONDS (900),
SCHEDULE_PERIOD_SECONDS (300, the schedule's rate).
IAM: elasticmapreduce:DescribeCluster, ListSteps, AddJobFlowSteps, CancelSteps, AddTags on the
cluster; ListClusters, and ListSteps, CancelSteps and AddJobFlowSteps on clusters tagged with its
name (the handover); sns:Publish on the topic.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)

LIVE_CLUSTER_STATES = frozenset({"STARTING", "BOOTSTRAPPING", "RUNNING", "WAITING"})
ACTIVE_STATES = ("PENDING", "RUNNING", "CANCEL_PENDING")
CANCELLABLE_STATES = frozenset({"PENDING", "RUNNING"})  # CANCEL_PENDING is already on its way out
FAILED_STATES = frozenset({"FAILED", "INTERRUPTED"})  # CANCELLED/COMPLETED are never failures
FAILURE_WINDOW = timedelta(hours=1)
STEP_NAME = re.compile(r"^lakehouse-(?P<job>[^@]+)@(?P<version>.+)$")
# Remembers, per job, the failed step whose give-up alert was already sent (see `plan`).
ALERTED_TAG_PREFIX = "lakehouse-supervisor:alerted:"


@dataclass(frozen=True)
class StepSpec:
    job: str
    name: str
    version: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class ObservedStep:
    job: str
    step_id: str
    name: str
    version: str
    state: str
    created: datetime
    ended: datetime | None = None

    @property
    def finished_at(self) -> datetime:
        # A terminal step without an end time is odd; its creation time is the safe stand-in.
        return self.ended or self.created


@dataclass(frozen=True)
class Policy:
    max_failures_per_hour: int = 5
    backoff_base: timedelta = timedelta(seconds=30)
    backoff_max: timedelta = timedelta(seconds=900)
    schedule_period: timedelta = timedelta(minutes=5)

    def backoff(self, failures: int) -> timedelta:
        return min(self.backoff_base * 2 ** max(failures - 1, 0), self.backoff_max)


@dataclass(frozen=True)
class Start:
    spec: StepSpec
    reason: str


@dataclass(frozen=True)
class Cancel:
    job: str
    step_id: str
    name: str
    reason: str
    cluster_id: str | None = None  # None: the supervised cluster; else another cluster (handover)


# The step that stops the supervised jobs' YARN applications on a replaced cluster (the handover).
# Its name has no `@`: never taken for a supervised job's step.
HANDOVER_STEP = "lakehouse-handover-stop"
# Kills each running YARN application named as an argument (the jobs' `--name`, infra/emr_steps.py).
STOP_APPS = (
    'for app in "$@"; do '
    "yarn application -list -appStates NEW,NEW_SAVING,SUBMITTED,ACCEPTED,RUNNING 2>/dev/null "
    "| awk -F '\\t' -v app=\"$app\" "
    '\'{ id = $1; name = $2; gsub(/^[ ]+|[ ]+$/, "", id); gsub(/^[ ]+|[ ]+$/, "", name); '
    "if (name == app && id ~ /^application_/) print id }' "
    '| while read -r id; do echo "handover: stopping $app ($id)" >&2; '
    'yarn application -kill "$id" >&2 || exit 1; done || exit 1; '
    "done"
)


@dataclass(frozen=True)
class OtherCluster:
    """A live cluster with this cluster's name: a replaced one that still runs, typically."""

    cluster_id: str
    steps: tuple[ObservedStep, ...]  # its active supervised steps
    readable: bool = True  # False: this role may not list its steps (it lacks the lakehouse-emr-cluster tag)
    # The newest handover step there, as (state, created); and when its newest supervised step was
    # created (any state), as far as its recent steps show.
    stop: tuple[str, datetime] | None = None
    newest_supervised: datetime | None = None

    @property
    def released(self) -> bool:
        """No supervised step active there, and a handover step completed after the newest one."""
        if not self.readable or any(s.state in ACTIVE_STATES for s in self.steps) or self.stop is None:
            return False
        state, created = self.stop
        return state == "COMPLETED" and (self.newest_supervised is None or created >= self.newest_supervised)

    @property
    def stopping(self) -> bool:
        return self.stop is not None and self.stop[0] in ACTIVE_STATES


@dataclass(frozen=True)
class StopApps:
    """Add the handover step to another cluster: kill the YARN applications named `apps` there."""

    cluster_id: str
    apps: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Keep:
    job: str
    step_id: str


@dataclass(frozen=True)
class Wait:
    job: str
    reason: str
    until: datetime | None = None  # None: until an active step has stopped


@dataclass(frozen=True)
class GiveUp:
    job: str
    version: str
    failures: int
    newest_failure: ObservedStep
    retry_after: datetime  # when enough failures have left the window for retries to resume


@dataclass(frozen=True)
class Note:
    message: str


Action = Start | Cancel | Keep | Wait | GiveUp | Note | StopApps


def plan(
    desired: Sequence[StepSpec],
    observed: Sequence[ObservedStep],
    cluster_state: str,
    now: datetime,
    policy: Policy,
    alerted: Mapping[str, str] | None = None,
    elsewhere: Sequence[OtherCluster] = (),
) -> list[Action]:
    """The actions that bring the cluster's steps to `desired`. `alerted` maps a job to the step
    id of the failure whose give-up alert was already sent (read from the cluster's tags).
    `elsewhere`: the other live clusters of this name (module docstring: handover)."""
    if cluster_state not in LIVE_CLUSTER_STATES:
        return [Note(f"cluster is {cluster_state}: nothing to supervise")]
    alerted = alerted or {}
    actions: list[Action] = []
    for spec in desired:
        steps = [step for step in observed if step.job == spec.job]
        actions += _plan_job(spec, steps, now, policy, alerted.get(spec.job))
    desired_jobs = {spec.job for spec in desired}
    for step in observed:
        if step.job not in desired_jobs and step.state in CANCELLABLE_STATES:
            actions.append(Cancel(step.job, step.step_id, step.name, "job is no longer deployed"))
    seen = {step.job for other in elsewhere for step in other.steps}
    apps = tuple(sorted(f"lakehouse-{job}" for job in desired_jobs | seen))
    return _hand_over(actions, elsewhere, apps)


def _hand_over(
    actions: list[Action], elsewhere: Sequence[OtherCluster], apps: tuple[str, ...]
) -> list[Action]:
    """While another cluster of this name may run supervised jobs, stop them there and start
    nothing here: two releases' jobs on the same tables, offsets and binlog would each stop the
    other's commits (or worse). Steps already running here are left alone. `apps`: the YARN
    application names of the jobs (desired here, or seen there) to stop."""
    holding = [c for c in elsewhere if not c.released]
    if not holding:
        return actions
    handover: list[Action] = []
    reasons = []
    for other in holding:
        if not other.readable:
            reasons.append(
                f"cluster {other.cluster_id} has this cluster's name and its steps cannot be listed (a "
                "release before the tag lakehouse-emr-cluster): terminate it (prod: lift its termination "
                "protection first)"
            )
            continue
        handover += [
            Cancel(step.job, step.step_id, step.name, "handover to the deployed cluster", other.cluster_id)
            for step in other.steps
            if step.state in CANCELLABLE_STATES
        ]
        if other.stopping:
            reasons.append(f"cluster {other.cluster_id}: its jobs' applications are being stopped")
        else:
            reason = f"the supervised jobs' applications on cluster {other.cluster_id}"
            handover.append(StopApps(other.cluster_id, apps, reason))
            reasons.append(f"cluster {other.cluster_id}: stopping its jobs' applications")
    reason = "handover: " + "; ".join(reasons)
    held = [Wait(a.spec.job, reason) if isinstance(a, Start) else a for a in actions]
    return handover + held


def _plan_job(
    spec: StepSpec, steps: list[ObservedStep], now: datetime, policy: Policy, alerted_step_id: str | None
) -> list[Action]:
    active = [step for step in steps if step.state in ACTIVE_STATES]
    cancellable = [step for step in active if step.state in CANCELLABLE_STATES]
    current = [step for step in cancellable if step.version == spec.version]
    if current:
        # Keep the oldest; newer duplicates are the extras (the rule `settle_concurrent_starts` uses).
        keeper = _oldest(current)
        extras = [step for step in cancellable if step is not keeper]
        return [Keep(spec.job, keeper.step_id)] + [
            Cancel(spec.job, step.step_id, step.name, f"duplicate of {keeper.step_id}") for step in extras
        ]
    if active:
        # Two instances of a job must never overlap: the new version starts on a later invocation
        # (the CANCELLED status event, or the schedule) once nothing of this job is active.
        reason = f"replaced by version {spec.version}"
        return [Cancel(spec.job, step.step_id, step.name, reason) for step in cancellable] + [
            Wait(spec.job, f"waiting for {', '.join(s.step_id for s in active)} to stop")
        ]

    # Failures of older versions don't count: deploying a fix must be tried at once.
    failures = sorted(
        (
            step
            for step in steps
            if step.version == spec.version
            and step.state in FAILED_STATES
            and now - step.finished_at < FAILURE_WINDOW
        ),
        key=lambda step: step.finished_at,
    )
    if not failures:
        return [Start(spec, "not running")]
    newest = failures[-1]
    if len(failures) >= policy.max_failures_per_hour:
        # Retries resume once the failure count in the window drops below the maximum.
        retry_after = failures[len(failures) - policy.max_failures_per_hour].finished_at + FAILURE_WINDOW
        # One alert per give-up episode: its newest failure is remembered in a cluster tag. The
        # time limit keeps alerts from repeating every schedule if that tag cannot be written.
        fresh = now - newest.finished_at < 2 * policy.schedule_period
        if fresh and alerted_step_id != newest.step_id:
            return [GiveUp(spec.job, spec.version, len(failures), newest, retry_after)]
        reason = f"given up: {len(failures)} failures in the last hour (alerted once per episode)"
        return [Wait(spec.job, reason, retry_after)]
    until = newest.finished_at + policy.backoff(len(failures))
    if now < until:
        return [Wait(spec.job, f"backing off after {len(failures)} failure(s) in the last hour", until)]
    return [Start(spec, f"restart after {len(failures)} failure(s) in the last hour")]


def settle_concurrent_starts(started: Sequence[StepSpec], live: Sequence[ObservedStep]) -> list[Cancel]:
    """After this invocation added the steps of `started`: the cancels that leave each of those jobs
    one live step, the oldest of the started version, whoever added the others (module docstring).
    `live` is a listing made after the adds; a job whose new step it does not show is left alone."""
    actions: list[Cancel] = []
    for spec in started:
        steps = [step for step in live if step.job == spec.job and step.state in CANCELLABLE_STATES]
        own_version = [step for step in steps if step.version == spec.version]
        if not own_version:
            continue
        keeper = _oldest(own_version)
        actions += [
            Cancel(spec.job, step.step_id, step.name, f"started concurrently with {keeper.step_id}")
            for step in steps
            if step is not keeper
        ]
    return actions


def _oldest(steps: Sequence[ObservedStep]) -> ObservedStep:
    """Creation time and id never change, so every invocation picks the same step."""
    return min(steps, key=lambda step: (step.created, step.step_id))


# --- executor -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    cluster_id: str
    alert_topic_arn: str
    desired: tuple[StepSpec, ...]
    policy: Policy = field(default_factory=Policy)
    cluster_name: str | None = None  # set: hand over from other live clusters of this name


def settings_from_env(environ: Mapping[str, str], s3=None) -> Settings:
    """The supervisor's settings. The desired steps come inline (`STREAMING_STEPS`) or, as the CDK
    app deploys it, from a JSON object in S3 (`STREAMING_STEPS_S3_URI`): three full spark-submit
    argument lists would not fit in Lambda's 4 KB of environment."""
    if environ.get("STREAMING_STEPS_S3_URI"):
        items = load_steps_from_s3(s3, environ["STREAMING_STEPS_S3_URI"])
    else:
        items = json.loads(environ["STREAMING_STEPS"])
    desired = tuple(step_spec(item) for item in items)
    if len({spec.job for spec in desired}) != len(desired):
        raise ValueError("STREAMING_STEPS lists a job twice; each job runs as exactly one step")
    policy = Policy(
        max_failures_per_hour=int(environ.get("MAX_FAILURES_PER_HOUR", "5")),
        backoff_base=timedelta(seconds=int(environ.get("BACKOFF_BASE_SECONDS", "30"))),
        backoff_max=timedelta(seconds=int(environ.get("BACKOFF_MAX_SECONDS", "900"))),
        schedule_period=timedelta(seconds=int(environ.get("SCHEDULE_PERIOD_SECONDS", "300"))),
    )
    return Settings(
        environ["CLUSTER_ID"],
        environ["ALERT_TOPIC_ARN"],
        desired,
        policy,
        environ.get("CLUSTER_NAME") or None,
    )


def step_spec(item: Mapping[str, Any]) -> StepSpec:
    """A desired step. Without a given name, the step's version is the build's version plus a digest
    of its arguments, so a deploy that changes only the arguments (brokers, a secret, a flag) also
    replaces the running step."""
    args = tuple(item.get("args") or ())
    if not args:
        raise ValueError(f"STREAMING_STEPS entry {item.get('job')!r} has no args; fix the CDK app's config")
    if "name" not in item:
        digest = hashlib.sha256(json.dumps(args).encode()).hexdigest()[:8]
        version = f"{item['version']}-{digest}"
        return StepSpec(
            job=item["job"], name=f"lakehouse-{item['job']}@{version}", version=version, args=args
        )
    spec = StepSpec(job=item["job"], name=item["name"], version=item["version"], args=args)
    if spec.name != f"lakehouse-{spec.job}@{spec.version}":
        raise ValueError(
            f"STREAMING_STEPS entry {spec.job!r}: name must be 'lakehouse-<job>@<version>' "
            f"(got {spec.name!r}); fix the supervisor's config in the CDK app"
        )
    return spec


def load_steps_from_s3(s3, uri: str) -> list[dict]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def observed_step(summary: Mapping[str, Any]) -> ObservedStep | None:
    """A supervised step from a ListSteps summary; None for steps that are not `lakehouse-<job>@<v>`."""
    match = STEP_NAME.match(summary.get("Name") or "")
    status = summary.get("Status") or {}
    timeline = status.get("Timeline") or {}
    if not match or not summary.get("Id") or "CreationDateTime" not in timeline:
        return None
    return ObservedStep(
        job=match["job"],
        step_id=summary["Id"],
        name=summary["Name"],
        version=match["version"],
        state=status.get("State", "UNKNOWN"),
        created=timeline["CreationDateTime"],
        ended=timeline.get("EndDateTime"),
    )


def list_active_steps(emr, cluster_id: str) -> list[dict]:
    """Pending, running and cancel-pending steps of any age."""
    paginator = emr.get_paginator("list_steps")
    return [
        step
        for page in paginator.paginate(ClusterId=cluster_id, StepStates=list(ACTIVE_STATES))
        for step in page["Steps"]
    ]


def list_relevant_steps(emr, cluster_id: str, created_since: datetime) -> list[dict]:
    """Active steps of any age, plus every step created since `created_since`."""
    paginator = emr.get_paginator("list_steps")
    by_id: dict[str, dict] = {step["Id"]: step for step in list_active_steps(emr, cluster_id)}
    # Unfiltered ListSteps is newest first (a StepStates filter drops that guarantee), so paging
    # can stop at the first older step instead of reading the cluster's whole history.
    for page in paginator.paginate(ClusterId=cluster_id):
        recent = [s for s in page["Steps"] if s["Status"]["Timeline"]["CreationDateTime"] >= created_since]
        by_id.update((step["Id"], step) for step in recent)
        if len(recent) < len(page["Steps"]):
            break
    return list(by_id.values())


def other_clusters(emr, name: str, own_id: str) -> list[OtherCluster]:
    """The live clusters named `name` other than `own_id`, each with its active supervised steps."""
    found = []
    paginator = emr.get_paginator("list_clusters")
    for page in paginator.paginate(ClusterStates=sorted(LIVE_CLUSTER_STATES)):
        for cluster in page["Clusters"]:
            if cluster.get("Name") != name or cluster["Id"] == own_id:
                continue
            try:
                summaries = list_active_steps(emr, cluster["Id"])
            except Exception as error:
                code = (getattr(error, "response", None) or {}).get("Error", {}).get("Code", "")
                if not code.startswith("AccessDenied"):
                    raise
                found.append(OtherCluster(cluster["Id"], (), readable=False))
                continue
            steps = tuple(step for step in map(observed_step, summaries) if step is not None)
            # Newest first (unfiltered ListSteps): the first page holds the newest of each kind.
            recent = emr.list_steps(ClusterId=cluster["Id"]).get("Steps", [])
            stops = [s for s in recent if s.get("Name") == HANDOVER_STEP]
            stop = None
            if stops:
                newest = max(stops, key=lambda s: s["Status"]["Timeline"]["CreationDateTime"])
                stop = (newest["Status"]["State"], newest["Status"]["Timeline"]["CreationDateTime"])
            supervised = [s.created for s in map(observed_step, [*recent, *summaries]) if s is not None]
            found.append(OtherCluster(cluster["Id"], steps, True, stop, max(supervised, default=None)))
    return found


def reconcile(settings: Settings, emr, sns, now: datetime) -> dict:
    cluster = emr.describe_cluster(ClusterId=settings.cluster_id)["Cluster"]
    cluster_state = cluster["Status"]["State"]
    alerted = {
        tag["Key"][len(ALERTED_TAG_PREFIX) :]: tag["Value"]
        for tag in cluster.get("Tags", [])
        if tag["Key"].startswith(ALERTED_TAG_PREFIX)
    }
    observed: list[ObservedStep] = []
    if cluster_state in LIVE_CLUSTER_STATES:
        since = now - FAILURE_WINDOW - settings.policy.schedule_period
        summaries = list_relevant_steps(emr, settings.cluster_id, since)
        observed = [step for step in map(observed_step, summaries) if step is not None]
    elsewhere: list[OtherCluster] = []
    if settings.cluster_name and cluster_state in LIVE_CLUSTER_STATES:
        elsewhere = other_clusters(emr, settings.cluster_name, settings.cluster_id)

    results, errors = [], []

    def execute(actions: Sequence[Action]) -> list[Action]:
        """Runs every action, recording each; returns those that succeeded."""
        done = []
        for action in actions:
            # One job's API error must not keep the other jobs from being reconciled.
            try:
                result = _execute(action, settings, cluster, emr, sns)
                done.append(action)
            except Exception as error:  # noqa: BLE001 - re-raised below, after the other actions
                result = {"action": type(action).__name__.lower(), **_flat(action), "error": repr(error)}
                errors.append(error)
            LOG.info(json.dumps(result, default=str))
            results.append(result)
        return done

    actions = plan(settings.desired, observed, cluster_state, now, settings.policy, alerted, elsewhere)
    done = execute(actions)
    started = [action.spec for action in done if isinstance(action, Start)]
    if started:
        # Another invocation may have started the same jobs meanwhile: converge on one step each.
        live = map(observed_step, list_active_steps(emr, settings.cluster_id))
        execute(settle_concurrent_starts(started, [step for step in live if step is not None]))
    if errors:
        # A failed invocation shows in the Lambda's error metric; the next one retries.
        message = f"{len(errors)} supervisor action(s) failed; their log lines carry the errors"
        raise RuntimeError(message) from errors[0]
    return {"cluster_id": settings.cluster_id, "cluster_state": cluster_state, "actions": results}


def _execute(action: Action, settings: Settings, cluster: Mapping[str, Any], emr, sns) -> dict:
    """Carries out one action; returns its JSON-ready record (API errors propagate)."""
    record = {"action": type(action).__name__.lower(), **_flat(action)}
    if isinstance(action, Start):
        step = {
            "Name": action.spec.name,
            # CONTINUE: the cluster runs several steps at once (StepConcurrencyLevel > 1).
            "ActionOnFailure": "CONTINUE",
            "HadoopJarStep": {"Jar": "command-runner.jar", "Args": list(action.spec.args)},
        }
        response = emr.add_job_flow_steps(JobFlowId=settings.cluster_id, Steps=[step])
        record["step_id"] = response["StepIds"][0]
    elif isinstance(action, Cancel):
        # SEND_INTERRUPT lets the streaming query stop at a batch boundary.
        response = emr.cancel_steps(
            ClusterId=action.cluster_id or settings.cluster_id,
            StepIds=[action.step_id],
            StepCancellationOption="SEND_INTERRUPT",
        )
        info = (response.get("CancelStepsInfoList") or [{}])[0]
        record["cancel_status"] = info.get("Status")
        if info.get("Status") == "FAILED":  # e.g. the step ended meanwhile: the next run re-reads it
            record["cancel_reason"] = info.get("Reason")
    elif isinstance(action, StopApps):
        step = {
            "Name": HANDOVER_STEP,
            "ActionOnFailure": "CONTINUE",
            "HadoopJarStep": {
                "Jar": "command-runner.jar",
                "Args": ["bash", "-c", STOP_APPS, HANDOVER_STEP, *action.apps],
            },
        }
        response = emr.add_job_flow_steps(JobFlowId=action.cluster_id, Steps=[step])
        record["step_id"] = response["StepIds"][0]
    elif isinstance(action, GiveUp):
        subject, message = give_up_alert(action, settings, cluster)
        sns.publish(TopicArn=settings.alert_topic_arn, Subject=subject, Message=message)
        emr.add_tags(
            ResourceId=settings.cluster_id,
            Tags=[{"Key": ALERTED_TAG_PREFIX + action.job, "Value": action.newest_failure.step_id}],
        )
    return record


def _flat(action: Action) -> dict:
    fields = asdict(action)
    if isinstance(action, Start):
        fields = {"job": action.spec.job, "name": action.spec.name, "reason": action.reason}
    elif isinstance(action, GiveUp):
        fields["newest_failure"] = action.newest_failure.step_id
    return {key: value.isoformat() if isinstance(value, datetime) else value for key, value in fields.items()}


def give_up_alert(action: GiveUp, settings: Settings, cluster: Mapping[str, Any]) -> tuple[str, str]:
    step = action.newest_failure
    cluster_id = settings.cluster_id
    log_uri = (cluster.get("LogUri") or "s3://<cluster log bucket>/").rstrip("/")
    subject = f"lakehouse: streaming job {action.job} stopped after {action.failures} failures"
    message = "\n".join(
        [
            f"The streaming job '{action.job}' (version {action.version}) failed {action.failures} times "
            f"in the last hour on EMR cluster {cluster_id}. The supervisor has stopped restarting it.",
            f"Newest failure: step {step.step_id} ({step.state}) ended {step.finished_at.isoformat()}.",
            "",
            "What to do:",
            f"1. Read the step's output: {log_uri}/{cluster_id}/steps/{step.step_id}/stderr.gz "
            f"(the Spark driver's log is under {log_uri}/{cluster_id}/containers/).",
            f"2. aws emr list-steps --cluster-id {cluster_id} --step-states FAILED INTERRUPTED",
            f"   aws emr describe-step --cluster-id {cluster_id} --step-id {step.step_id}",
            "3. Deploy a fixed version: it is started at once (failures are counted per version).",
            f"   Otherwise the supervisor retries by itself after {action.retry_after.isoformat()}.",
        ]
    )
    return subject[:100], message


def handler(event, context):  # noqa: ARG001 - Lambda signature; the event is deliberately unused
    import boto3  # in the Lambda runtime
    from botocore.config import Config

    config = Config(retries={"mode": "standard"})
    settings = settings_from_env(os.environ, boto3.client("s3", config=config))
    emr = boto3.client("emr", config=config)
    sns = boto3.client("sns", config=config)
    return reconcile(settings, emr, sns, datetime.now(UTC))
