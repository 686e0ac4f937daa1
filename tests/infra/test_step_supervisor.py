"""The streaming-step supervisor Lambda: its pure `plan`, and its executor against moto / Stubber.

moto 5.2 implements describe_cluster, list_steps, add_job_flow_steps and add_tags but not
cancel_steps, so the cancel path is tested with botocore's Stubber.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.emr.models import emr_backends

HANDLER = Path(__file__).resolve().parents[2] / "infra" / "lambdas" / "step_supervisor" / "handler.py"
REGION = "eu-west-1"
NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def _load():
    spec = importlib.util.spec_from_file_location("step_supervisor_handler", HANDLER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module while the class is built
    spec.loader.exec_module(module)
    return module


sup = _load()
POLICY = sup.Policy()  # 5 failures/hour, backoff 30 s doubling up to 900 s, 5-minute schedule


def spec(job: str = "ingest", version: str = "v2") -> sup.StepSpec:
    return sup.StepSpec(
        job=job,
        name=f"lakehouse-{job}@{version}",
        version=version,
        args=("spark-submit", "--deploy-mode", "cluster", f"s3://artifacts/{version}/{job}.py"),
    )


_ids = iter(range(1, 10_000))


def step(
    state: str,
    *,
    job: str = "ingest",
    version: str = "v2",
    created_ago: timedelta = timedelta(minutes=30),
    ended_ago: timedelta | None = None,
    step_id: str | None = None,
) -> sup.ObservedStep:
    return sup.ObservedStep(
        job=job,
        step_id=step_id or f"s-{next(_ids):04d}",
        name=f"lakehouse-{job}@{version}",
        version=version,
        state=state,
        created=NOW - created_ago,
        ended=None if ended_ago is None else NOW - ended_ago,
    )


def failures(count: int, *, newest_ago: timedelta, spacing: timedelta = timedelta(minutes=2), **kwargs):
    """`count` failed steps of one job, the newest ending `newest_ago` before NOW."""
    return [
        step(
            "FAILED",
            ended_ago=newest_ago + i * spacing,
            created_ago=newest_ago + i * spacing + timedelta(seconds=40),
            **kwargs,
        )
        for i in range(count)
    ]


def kinds(actions) -> list[str]:
    return [type(action).__name__ for action in actions]


# --- plan --------------------------------------------------------------------------------------


def test_fresh_cluster_starts_every_desired_job():
    desired = [spec("ingest"), spec("cdc-apply")]
    actions = sup.plan(desired, [], "WAITING", NOW, POLICY)
    assert actions == [sup.Start(desired[0], "not running"), sup.Start(desired[1], "not running")]


def test_a_starting_cluster_already_takes_steps():
    assert kinds(sup.plan([spec()], [], "STARTING", NOW, POLICY)) == ["Start"]


def test_healthy_running_step_is_kept_and_nothing_else_happens():
    running = step("RUNNING")
    finished_earlier = step("FAILED", created_ago=timedelta(hours=3), ended_ago=timedelta(minutes=50))
    assert sup.plan([spec()], [running, finished_earlier], "RUNNING", NOW, POLICY) == [
        sup.Keep("ingest", running.step_id)
    ]


def test_new_version_cancels_the_old_step_first_and_starts_only_once_it_is_gone():
    old = step("RUNNING", version="v1")
    actions = sup.plan([spec(version="v2")], [old], "RUNNING", NOW, POLICY)
    assert kinds(actions) == ["Cancel", "Wait"]
    assert actions[0] == sup.Cancel("ingest", old.step_id, "lakehouse-ingest@v1", "replaced by version v2")
    assert actions[1].until is None

    # While the cancel is in flight, nothing new starts and the cancel is not repeated.
    cancelling = sup.ObservedStep(**{**old.__dict__, "state": "CANCEL_PENDING"})
    assert kinds(sup.plan([spec(version="v2")], [cancelling], "RUNNING", NOW, POLICY)) == ["Wait"]

    # The CANCELLED event (or the next schedule) then starts the new version, with no backoff.
    cancelled = sup.ObservedStep(
        **{**old.__dict__, "state": "CANCELLED", "ended": NOW - timedelta(seconds=5)}
    )
    assert sup.plan([spec(version="v2")], [cancelled], "RUNNING", NOW, POLICY) == [
        sup.Start(spec(version="v2"), "not running")
    ]


def test_duplicates_keep_the_longest_running_step_and_cancel_the_newer_extras():
    oldest = step("RUNNING", created_ago=timedelta(hours=2))
    newer = step("RUNNING", created_ago=timedelta(minutes=3))
    queued = step("PENDING", created_ago=timedelta(minutes=1))
    stale = step("PENDING", version="v1", created_ago=timedelta(minutes=2))
    actions = sup.plan([spec()], [queued, newer, oldest, stale], "RUNNING", NOW, POLICY)
    assert actions[0] == sup.Keep("ingest", oldest.step_id)
    assert sorted(a.step_id for a in actions[1:]) == sorted([newer.step_id, queued.step_id, stale.step_id])
    assert all(isinstance(a, sup.Cancel) for a in actions[1:])


def test_the_oldest_duplicate_is_kept_even_when_a_newer_one_already_runs():
    """Only creation time and id decide (never the state, which changes between two listings), so a
    reconcile and a concurrent start's settling agree on the survivor (handler docstring)."""
    pending = step("PENDING", created_ago=timedelta(minutes=10))
    running = step("RUNNING", created_ago=timedelta(minutes=5))
    actions = sup.plan([spec()], [pending, running], "RUNNING", NOW, POLICY)
    assert actions == [
        sup.Keep("ingest", pending.step_id),
        sup.Cancel("ingest", running.step_id, running.name, f"duplicate of {pending.step_id}"),
    ]


def test_settling_concurrent_starts_keeps_the_oldest_step_of_the_started_version():
    ours = step("PENDING", created_ago=timedelta(seconds=1), step_id="s-B")
    theirs = step("RUNNING", created_ago=timedelta(seconds=2), step_id="s-A")
    same_second = step("PENDING", created_ago=timedelta(seconds=2), step_id="s-C")
    other_version = step("PENDING", version="v1", created_ago=timedelta(seconds=3), step_id="s-OLD")
    leaving = step("CANCEL_PENDING", created_ago=timedelta(seconds=4), step_id="s-GONE")
    other_job = step("RUNNING", job="cdc-apply", created_ago=timedelta(seconds=5))
    live = [ours, theirs, same_second, other_version, leaving, other_job]
    # Seen in any order, by any of the racers: the same survivor (ties on time go by step id).
    for observed in (live, live[::-1]):
        actions = sup.settle_concurrent_starts([spec()], observed)
        assert {a.step_id for a in actions} == {ours.step_id, same_second.step_id, other_version.step_id}
        assert all(a.reason == "started concurrently with s-A" for a in actions)
    # A racer that started the old version keeps its own and cancels ours: both stop, and the next
    # reconcile starts the desired version alone.
    assert {a.step_id for a in sup.settle_concurrent_starts([spec(version="v1")], live)} == {
        ours.step_id, theirs.step_id, same_second.step_id
    }  # fmt: skip
    # Alone, or not yet listed: nothing to settle.
    assert sup.settle_concurrent_starts([spec()], [ours, other_job]) == []
    assert sup.settle_concurrent_starts([spec()], [other_version]) == []


@pytest.mark.parametrize(
    ("count", "backoff"),
    [
        (1, timedelta(seconds=30)),
        (2, timedelta(seconds=60)),
        (3, timedelta(seconds=120)),
        (4, timedelta(seconds=240)),
    ],
)
def test_failures_back_off_exponentially(count, backoff):
    newest_ago = timedelta(seconds=10)
    observed = failures(count, newest_ago=newest_ago)
    actions = sup.plan([spec()], observed, "RUNNING", NOW, POLICY)
    assert kinds(actions) == ["Wait"]
    assert actions[0].until == NOW - newest_ago + backoff

    after_backoff = NOW + backoff
    assert kinds(sup.plan([spec()], observed, "RUNNING", after_backoff, POLICY)) == ["Start"]


def test_backoff_is_capped():
    policy = sup.Policy(max_failures_per_hour=50)
    observed = failures(10, newest_ago=timedelta(seconds=1), spacing=timedelta(minutes=1))
    assert policy.backoff(10) == timedelta(seconds=900)
    assert sup.plan([spec()], observed, "RUNNING", NOW, policy)[0].until == NOW - timedelta(
        seconds=1
    ) + timedelta(seconds=900)


def test_failures_older_than_an_hour_or_of_another_version_do_not_count():
    old = failures(4, newest_ago=timedelta(minutes=61))
    other_version = failures(5, newest_ago=timedelta(seconds=5), version="v1")
    assert kinds(sup.plan([spec(version="v2")], old + other_version, "RUNNING", NOW, POLICY)) == ["Start"]


def test_interrupted_counts_as_a_failure():
    interrupted = step("INTERRUPTED", ended_ago=timedelta(seconds=5))
    assert kinds(sup.plan([spec()], [interrupted], "RUNNING", NOW, POLICY)) == ["Wait"]


def test_cancelled_steps_are_not_failures():
    cancelled = [step("CANCELLED", ended_ago=timedelta(seconds=i + 1)) for i in range(8)]
    assert sup.plan([spec()], cancelled, "RUNNING", NOW, POLICY) == [sup.Start(spec(), "not running")]


def test_a_completed_streaming_step_is_restarted():
    completed = step("COMPLETED", ended_ago=timedelta(seconds=2))
    assert sup.plan([spec()], [completed], "RUNNING", NOW, POLICY) == [sup.Start(spec(), "not running")]


def test_gives_up_after_max_failures_in_an_hour():
    observed = failures(5, newest_ago=timedelta(seconds=20), spacing=timedelta(minutes=3))
    [action] = sup.plan([spec()], observed, "RUNNING", NOW, POLICY)
    assert isinstance(action, sup.GiveUp)
    assert (action.job, action.version, action.failures) == ("ingest", "v2", 5)
    assert action.newest_failure == observed[0]
    # Retries resume once the oldest of the five leaves the one-hour window.
    assert action.retry_after == observed[-1].ended + timedelta(hours=1)


def test_one_alert_per_give_up_episode():
    """Replays an episode: the FAILED event's invocation, then a schedule every 5 minutes plus
    unrelated status events, each run seeing the tag the previous alert left."""
    observed = failures(5, newest_ago=timedelta(0), spacing=timedelta(minutes=4))
    newest_end = observed[0].ended
    offsets = [timedelta(seconds=2), timedelta(minutes=1)]  # the FAILED event, another job's event
    offsets += [timedelta(minutes=3) + i * timedelta(minutes=5) for i in range(12)]  # the schedule
    retry_after = observed[-1].ended + timedelta(hours=1)  # the oldest failure leaves the window
    alerted: dict[str, str] = {}
    alerts = []
    for offset in sorted(offsets):
        now = newest_end + offset
        actions = sup.plan([spec()], observed, "RUNNING", now, POLICY, alerted)
        assert kinds(actions) == (["Start"] if now >= retry_after else ["GiveUp"] if not alerts else ["Wait"])
        if isinstance(actions[0], sup.GiveUp):
            alerts.append(actions[0])
            alerted[actions[0].job] = actions[0].newest_failure.step_id  # what the executor tags
    assert len(alerts) == 1
    assert alerts[0].retry_after == retry_after

    # A later episode (new failures of the restarted job) alerts again.
    again = failures(5, newest_ago=timedelta(seconds=3))
    assert kinds(sup.plan([spec()], again, "RUNNING", NOW, POLICY, alerted)) == ["GiveUp"]


def test_without_the_tag_a_stale_give_up_stays_silent():
    observed = failures(5, newest_ago=timedelta(minutes=11))
    [action] = sup.plan([spec()], observed, "RUNNING", NOW, POLICY)
    assert isinstance(action, sup.Wait)
    assert action.until == observed[-1].ended + timedelta(hours=1)


def test_a_terminated_cluster_gets_only_a_note():
    observed = [step("RUNNING"), step("RUNNING", job="retired")]
    for state in ("TERMINATING", "TERMINATED", "TERMINATED_WITH_ERRORS"):
        assert kinds(sup.plan([spec(), spec("cdc-apply")], observed, state, NOW, POLICY)) == ["Note"]


def test_steps_of_jobs_no_longer_deployed_are_cancelled_when_active():
    retired_running = step("RUNNING", job="retired", version="v9")
    retired_done = step("FAILED", job="retired", ended_ago=timedelta(minutes=1))
    running = step("RUNNING")
    actions = sup.plan([spec()], [retired_running, retired_done, running], "RUNNING", NOW, POLICY)
    assert actions == [
        sup.Keep("ingest", running.step_id),
        sup.Cancel("retired", retired_running.step_id, "lakehouse-retired@v9", "job is no longer deployed"),
    ]


def test_jobs_are_planned_independently():
    desired = [spec("ingest"), spec("cdc-apply")]
    observed = [step("RUNNING", job="ingest"), *failures(2, newest_ago=timedelta(seconds=1), job="cdc-apply")]
    assert kinds(sup.plan(desired, observed, "RUNNING", NOW, POLICY)) == ["Keep", "Wait"]


# --- parsing and settings ----------------------------------------------------------------------


def _summary(name: str, state: str = "RUNNING", step_id: str = "s-1") -> dict:
    return {"Id": step_id, "Name": name, "Status": {"State": state, "Timeline": {"CreationDateTime": NOW}}}


def test_only_lakehouse_step_names_are_supervised():
    parsed = sup.observed_step(_summary("lakehouse-cdc-apply@3f2a9c1b"))
    assert (parsed.job, parsed.version, parsed.state, parsed.ended) == (
        "cdc-apply",
        "3f2a9c1b",
        "RUNNING",
        None,
    )
    for odd in ("Setup hadoop debugging", "lakehouse-ingest", "lakehouse-@v1", "ingest@v1", ""):
        assert sup.observed_step(_summary(odd)) is None
    assert sup.observed_step({"Name": "lakehouse-x@1"}) is None  # malformed summary: ignored, no raise


def test_a_requested_resyncs_step_is_left_alone():
    """`lakehouse aws request-resync` adds a step beside the running CDC job: not supervised, so
    never cancelled as "no longer deployed" (a `lakehouse-<job>@<version>` name would be)."""
    from lakehouse.aws.operate import REQUEST_RESYNC_STEP

    assert sup.observed_step(_summary(REQUEST_RESYNC_STEP)) is None


def _environ(**overrides) -> dict:
    steps = [
        {"job": s.job, "name": s.name, "version": s.version, "args": list(s.args)}
        for s in (spec("ingest"), spec("cdc-apply"))
    ]
    return {
        "CLUSTER_ID": "j-1",
        "ALERT_TOPIC_ARN": "arn:aws:sns:eu-west-1:123456789012:alerts",
        "STREAMING_STEPS": json.dumps(steps),
        **overrides,
    }


def test_settings_defaults_and_overrides():
    settings = sup.settings_from_env(_environ())
    assert settings.desired == (spec("ingest"), spec("cdc-apply"))
    assert settings.policy == sup.Policy()
    tuned = sup.settings_from_env(
        _environ(MAX_FAILURES_PER_HOUR="3", BACKOFF_BASE_SECONDS="10", BACKOFF_MAX_SECONDS="60")
    )
    assert tuned.policy.max_failures_per_hour == 3
    assert tuned.policy.backoff(5) == timedelta(seconds=60)


def test_settings_reject_a_name_that_does_not_carry_the_version():
    bad = [{"job": "ingest", "name": "lakehouse-ingest@old", "version": "new", "args": ["spark-submit"]}]
    with pytest.raises(ValueError, match="lakehouse-<job>@<version>"):
        sup.settings_from_env(_environ(STREAMING_STEPS=json.dumps(bad)))


# --- executor against moto ---------------------------------------------------------------------


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        emr = boto3.client("emr", region_name=REGION)
        cluster_id = emr.run_job_flow(
            Name="lakehouse",
            ReleaseLabel="emr-7.14.0",
            LogUri="s3://lakehouse-logs/emr/",
            Instances={
                "MasterInstanceType": "m7g.xlarge",
                "SlaveInstanceType": "m7g.xlarge",
                "InstanceCount": 3,
                "KeepJobFlowAliveWhenNoSteps": True,
            },
            StepConcurrencyLevel=4,
            JobFlowRole="EMR_EC2_DefaultRole",
            ServiceRole="EMR_DefaultRole",
        )["JobFlowId"]
        sns = boto3.client("sns", region_name=REGION)
        sqs = boto3.client("sqs", region_name=REGION)
        topic_arn = sns.create_topic(Name="lakehouse-alerts")["TopicArn"]
        queue_url = sqs.create_queue(QueueName="alerts-inbox")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)
        for key, value in _environ(CLUSTER_ID=cluster_id, ALERT_TOPIC_ARN=topic_arn).items():
            monkeypatch.setenv(key, value)
        yield {"emr": emr, "sqs": sqs, "queue_url": queue_url, "cluster_id": cluster_id}


def _alerts(aws) -> list[dict]:
    messages = (
        aws["sqs"].receive_message(QueueUrl=aws["queue_url"], MaxNumberOfMessages=10).get("Messages", [])
    )
    return [json.loads(m["Body"]) for m in messages]


def test_handler_starts_every_desired_step_once(aws):
    emr, cluster_id = aws["emr"], aws["cluster_id"]
    # A step someone added by hand is neither touched nor confused with a supervised job.
    emr.add_job_flow_steps(
        JobFlowId=cluster_id,
        Steps=[
            {
                "Name": "debug shell",
                "ActionOnFailure": "CONTINUE",
                "HadoopJarStep": {"Jar": "command-runner.jar", "Args": ["true"]},
            }
        ],
    )

    first = sup.handler({}, None)
    started = [a for a in first["actions"] if a["action"] == "start"]
    assert sorted(a["name"] for a in started) == ["lakehouse-cdc-apply@v2", "lakehouse-ingest@v2"]

    listed = emr.list_steps(ClusterId=cluster_id)["Steps"]
    assert len(listed) == 3  # the hand-added step, and one step per job: none added twice
    steps = {s["Name"]: s for s in listed}
    for job in ("ingest", "cdc-apply"):
        added = steps[f"lakehouse-{job}@v2"]
        assert added["ActionOnFailure"] == "CONTINUE"
        assert added["Config"]["Jar"] == "command-runner.jar"
        assert added["Config"]["Args"] == list(spec(job).args)
    assert sorted(a["step_id"] for a in started) == sorted(
        steps[n]["Id"] for n in ("lakehouse-ingest@v2", "lakehouse-cdc-apply@v2")
    )

    # The status-change event of those steps, then the schedule: nothing more to do.
    second = sup.handler({"detail-type": "EMR Step Status Change", "detail": {"state": "RUNNING"}}, None)
    third = sup.handler({"reason": "deploy"}, None)
    for summary in (second, third):
        assert [a["action"] for a in summary["actions"]] == ["keep", "keep"]
    assert len(emr.list_steps(ClusterId=cluster_id)["Steps"]) == 3
    json.dumps(third)  # the deploy trigger gets a JSON-ready summary


class RacingEmr:
    """One invocation's EMR client: every racer must have listed the steps before any adds one, so
    all of them plan to start every job. moto has no CancelSteps: it is applied to moto's steps here
    the way EMR does it (a pending step is cancelled, a running one is interrupted)."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self._client = boto3.client("emr", region_name=REGION)
        self._barrier = barrier
        self._waited = False

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    def add_job_flow_steps(self, **kwargs):
        if not self._waited:
            self._waited = True
            self._barrier.wait(timeout=30)
        return self._client.add_job_flow_steps(**kwargs)

    def cancel_steps(self, ClusterId, StepIds, StepCancellationOption):  # noqa: N803 - boto3's names
        assert StepCancellationOption == "SEND_INTERRUPT"
        infos = []
        for fake in emr_backends[DEFAULT_ACCOUNT_ID][REGION].clusters[ClusterId].steps:
            if fake.id in StepIds:
                if fake.state in ("PENDING", "RUNNING"):
                    fake.state = "CANCELLED" if fake.state == "PENDING" else "CANCEL_PENDING"
                    infos.append({"StepId": fake.id, "Status": "SUBMITTED"})
                else:
                    infos.append({"StepId": fake.id, "Status": "FAILED", "Reason": f"step is {fake.state}"})
        return {"CancelStepsInfoList": infos}


@pytest.mark.parametrize("racers", [2, 3])
def test_racing_reconciles_leave_one_live_step_per_job(aws, racers):
    """No reserved concurrency: a burst of status events can run reconciles at once (handler
    docstring). Each adds a step per job; afterwards exactly one of each job is left."""
    emr, cluster_id = aws["emr"], aws["cluster_id"]
    settings = sup.settings_from_env(os.environ)
    sns = boto3.client("sns", region_name=REGION)
    barrier = threading.Barrier(racers)
    with ThreadPoolExecutor(racers) as pool:
        runs = [pool.submit(sup.reconcile, settings, RacingEmr(barrier), sns, datetime.now(UTC))
                for _ in range(racers)]  # fmt: skip
        summaries = [run.result(timeout=60) for run in runs]

    steps = emr.list_steps(ClusterId=cluster_id)["Steps"]
    for job in ("ingest", "cdc-apply"):
        of_job = [s for s in steps if s["Name"] == f"lakehouse-{job}@v2"]
        # The race happened: every racer added its own step of the job.
        assert len(of_job) == racers
        live = [s for s in of_job if s["Status"]["State"] in ("PENDING", "RUNNING")]
        assert len(live) == 1, [(s["Id"], s["Status"]["State"]) for s in of_job]
        # The survivor is the oldest; every other step of the job was cancelled by a racer.
        oldest = min(of_job, key=lambda s: (s["Status"]["Timeline"]["CreationDateTime"], s["Id"]))
        assert live[0]["Id"] == oldest["Id"]
        cancelled = {a["step_id"] for summary in summaries for a in summary["actions"]
                     if a["action"] == "cancel" and a["job"] == job}  # fmt: skip
        assert cancelled == {s["Id"] for s in of_job} - {oldest["Id"]}

    # Settled: the next reconcile finds one step per job and leaves it alone.
    after = sup.reconcile(settings, RacingEmr(threading.Barrier(1)), sns, datetime.now(UTC))
    assert [a["action"] for a in after["actions"]] == ["keep", "keep"]


def test_handler_gives_up_with_exactly_one_alert(aws, monkeypatch):
    emr, cluster_id = aws["emr"], aws["cluster_id"]
    monkeypatch.setenv(
        "STREAMING_STEPS",
        json.dumps(
            [
                {
                    "job": "ingest",
                    "name": "lakehouse-ingest@v2",
                    "version": "v2",
                    "args": ["spark-submit", "ingest.py"],
                }
            ]
        ),
    )
    jar = {"Jar": "command-runner.jar", "Args": ["spark-submit", "ingest.py"]}
    emr.add_job_flow_steps(
        JobFlowId=cluster_id,
        Steps=[{"Name": "lakehouse-ingest@v2", "ActionOnFailure": "CONTINUE", "HadoopJarStep": jar}] * 5,
    )
    # moto never runs steps: fail them in its backend, the newest a few seconds ago.
    now = datetime.now(UTC).replace(tzinfo=None)
    for i, fake in enumerate(emr_backends[DEFAULT_ACCOUNT_ID][REGION].clusters[cluster_id].steps):
        fake.state = "FAILED"
        fake.end_date_time = now - timedelta(minutes=2 * i, seconds=5)

    first = sup.handler({}, None)
    assert [a["action"] for a in first["actions"]] == ["giveup"]
    assert first["actions"][0]["failures"] == 5

    second = sup.handler({}, None)
    assert [a["action"] for a in second["actions"]] == ["wait"]

    [alert] = _alerts(aws)
    assert alert["Subject"] == "lakehouse: streaming job ingest stopped after 5 failures"
    newest = first["actions"][0]["newest_failure"]
    assert f"s3://lakehouse-logs/emr/{cluster_id}/steps/{newest}/stderr.gz" in alert["Message"]
    assert f"aws emr list-steps --cluster-id {cluster_id}" in alert["Message"]
    tags = {t["Key"]: t["Value"] for t in emr.describe_cluster(ClusterId=cluster_id)["Cluster"]["Tags"]}
    assert tags["lakehouse-supervisor:alerted:ingest"] == newest


def test_handler_on_a_terminated_cluster_does_nothing(aws):
    emr, cluster_id = aws["emr"], aws["cluster_id"]
    emr.terminate_job_flows(JobFlowIds=[cluster_id])
    summary = sup.handler({}, None)
    assert summary["cluster_state"] == "TERMINATED"
    assert [a["action"] for a in summary["actions"]] == ["note"]


# --- handover between clusters (a replaced cluster that still runs) --------------------------


APPS = ("lakehouse-cdc", "lakehouse-ingest", "lakehouse-views")


def test_another_cluster_s_jobs_are_stopped_there_and_nothing_starts_until_its_stop_step_completed():
    """Cancelling a step stops its spark-submit client only (the YARN application runs on): the
    jobs' applications there are killed by a step the supervisor adds to that cluster."""
    old_ingest = step("RUNNING", version="v1")
    old_views = step("PENDING", job="views", version="v1")
    elsewhere = [sup.OtherCluster("j-OLD", (old_ingest, old_views), newest_supervised=old_ingest.created)]
    actions = sup.plan([spec("ingest"), spec("cdc")], [], "WAITING", NOW, POLICY, elsewhere=elsewhere)
    assert kinds(actions) == ["Cancel", "Cancel", "StopApps", "Wait", "Wait"]
    assert [(a.cluster_id, a.step_id) for a in actions[:2]] == [
        ("j-OLD", old_ingest.step_id),
        ("j-OLD", old_views.step_id),
    ]
    assert (actions[2].cluster_id, actions[2].apps) == ("j-OLD", APPS)  # desired here and seen there
    assert all("j-OLD" in a.reason for a in actions[3:])

    # The stop step runs: nothing is cancelled or added twice, and still nothing starts here.
    cancelling = sup.ObservedStep(**{**old_ingest.__dict__, "state": "CANCEL_PENDING"})
    running = sup.OtherCluster(
        "j-OLD", (cancelling,), stop=("RUNNING", NOW), newest_supervised=old_ingest.created
    )
    assert kinds(sup.plan([spec("ingest")], [], "WAITING", NOW, POLICY, elsewhere=[running])) == ["Wait"]

    # Completed after the newest supervised step there, none active: this cluster starts.
    done = sup.OtherCluster("j-OLD", (), stop=("COMPLETED", NOW), newest_supervised=old_ingest.created)
    assert kinds(sup.plan([spec("ingest")], [], "WAITING", NOW, POLICY, elsewhere=[done])) == ["Start"]


@pytest.mark.parametrize(
    ("stop", "newest_supervised"),
    [
        (None, None),  # an idle cluster of this name: its applications are stopped once anyway
        (("FAILED", NOW), NOW - timedelta(minutes=30)),  # the stop step failed: another one
        (("COMPLETED", NOW - timedelta(minutes=10)), NOW - timedelta(minutes=1)),  # jobs started since
    ],
)
def test_a_cluster_without_a_stop_step_completed_after_its_jobs_gets_one(stop, newest_supervised):
    elsewhere = [sup.OtherCluster("j-OLD", (), stop=stop, newest_supervised=newest_supervised)]
    actions = sup.plan([spec("ingest")], [], "WAITING", NOW, POLICY, elsewhere=elsewhere)
    assert kinds(actions) == ["StopApps", "Wait"]


def test_a_same_named_cluster_whose_steps_cannot_be_listed_holds_the_start():
    actions = sup.plan(
        [spec()], [], "WAITING", NOW, POLICY, elsewhere=[sup.OtherCluster("j-OLD", (), readable=False)]
    )
    assert kinds(actions) == ["Wait"]
    assert "terminate it" in actions[0].reason and "j-OLD" in actions[0].reason


def test_the_handover_keeps_what_already_runs_here():
    mine = step("RUNNING")
    theirs = step("RUNNING", version="v1")
    actions = sup.plan(
        [spec()], [mine], "RUNNING", NOW, POLICY, elsewhere=[sup.OtherCluster("j-OLD", (theirs,))]
    )
    assert actions[0] == sup.Cancel(
        "ingest", theirs.step_id, theirs.name, "handover to the deployed cluster", "j-OLD"
    )
    assert kinds(actions) == ["Cancel", "StopApps", "Keep"]


def test_the_stop_step_kills_exactly_the_named_applications(tmp_path):
    """The handover step's command run for real with a stand-in `yarn`."""
    import subprocess

    import yarn_stand_in

    apps = [
        ("application_1700000000000_0007", "     lakehouse-ingest"),
        ("application_1700000000000_0008", "        lakehouse-cdc"),
        ("application_1700000000000_0009", "lakehouse-ingest-old "),
        ("application_1700000000000_0010", "     lakehouse-report"),
    ]
    env, killed = yarn_stand_in.install(tmp_path, apps)
    args = ["bash", "-c", sup.STOP_APPS, sup.HANDOVER_STEP, "lakehouse-cdc", "lakehouse-ingest"]
    result = subprocess.run(args, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert killed.read_text().split() == ["application_1700000000000_0008", "application_1700000000000_0007"]
    # A kill that fails fails the step: the supervisor adds another on its next run.
    env, _ = yarn_stand_in.install(tmp_path, apps, kill_fails=True)
    assert subprocess.run(args, capture_output=True, text=True, env=env).returncode != 0


class HandoverEmr:
    """moto's EMR plus CancelSteps (moto has none), applied to moto's steps the way EMR does it, and
    an AccessDenied on ListSteps of the clusters named in `denied` (as the role's tag condition does)."""

    def __init__(self, denied: frozenset[str] = frozenset()) -> None:
        self._client = boto3.client("emr", region_name=REGION)
        self._denied = denied

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    def get_paginator(self, name: str):
        paginator = self._client.get_paginator(name)
        if name != "list_steps":
            return paginator
        denied = self._denied

        class Guarded:
            def paginate(self, **kwargs):
                if kwargs["ClusterId"] in denied:
                    error = {"Error": {"Code": "AccessDeniedException", "Message": "not authorized"}}
                    raise ClientError(error, "ListSteps")
                return paginator.paginate(**kwargs)

        return Guarded()

    def cancel_steps(self, ClusterId, StepIds, StepCancellationOption):  # noqa: N803 - boto3's names
        return RacingEmr.cancel_steps(self, ClusterId, StepIds, StepCancellationOption)


def _second_cluster(emr, name: str) -> str:
    return emr.run_job_flow(
        Name=name,
        ReleaseLabel="emr-7.14.0",
        Instances={
            "MasterInstanceType": "m7g.xlarge",
            "InstanceCount": 1,
            "KeepJobFlowAliveWhenNoSteps": True,
        },
        JobFlowRole="EMR_EC2_DefaultRole",
        ServiceRole="EMR_DefaultRole",
    )["JobFlowId"]


def test_a_replaced_cluster_hands_its_steps_over(aws, monkeypatch):
    """The deploy replaced the cluster; the old one (termination-protected in prod) still runs the last
    release's jobs. The new cluster's supervisor cancels their steps, kills their applications there
    with a step of its own, and starts its jobs once that step completed."""
    emr, new_id = aws["emr"], aws["cluster_id"]
    monkeypatch.setenv("CLUSTER_NAME", "lakehouse")
    old_id = _second_cluster(emr, "lakehouse")
    other_env = _second_cluster(emr, "lakehouse-other")  # another environment's cluster: not touched
    jar = {"Jar": "command-runner.jar", "Args": ["spark-submit", "old.py"]}
    for cluster in (old_id, other_env):
        emr.add_job_flow_steps(
            JobFlowId=cluster,
            Steps=[{"Name": f"lakehouse-{job}@v1", "ActionOnFailure": "CONTINUE", "HadoopJarStep": jar}
                   for job in ("ingest", "cdc-apply")],
        )  # fmt: skip
    backend = emr_backends[DEFAULT_ACCOUNT_ID][REGION]
    for fake in backend.clusters[old_id].steps:
        fake.state = "RUNNING"
    settings = sup.settings_from_env(os.environ)
    sns = boto3.client("sns", region_name=REGION)

    first = sup.reconcile(settings, HandoverEmr(), sns, datetime.now(UTC))
    assert [(a["action"], a.get("cluster_id")) for a in first["actions"]] == [
        ("cancel", old_id), ("cancel", old_id), ("stopapps", old_id), ("wait", None), ("wait", None)
    ]  # fmt: skip
    assert emr.list_steps(ClusterId=new_id)["Steps"] == []
    old_steps = {s["Name"]: s for s in emr.list_steps(ClusterId=old_id)["Steps"]}
    assert {old_steps[f"lakehouse-{job}@v1"]["Status"]["State"] for job in ("ingest", "cdc-apply")} == {
        "CANCEL_PENDING"
    }
    stop = old_steps[sup.HANDOVER_STEP]
    assert stop["Config"]["Args"][:4] == ["bash", "-c", sup.STOP_APPS, sup.HANDOVER_STEP]
    assert stop["Config"]["Args"][4:] == ["lakehouse-cdc-apply", "lakehouse-ingest"]
    # moto runs the first step it gets; neither is cancelled.
    assert {s["Status"]["State"] for s in emr.list_steps(ClusterId=other_env)["Steps"]} <= {
        "PENDING",
        "RUNNING",
    }

    # Still stopping: no second cancel or stop step, no start.
    second = sup.reconcile(settings, HandoverEmr(), sns, datetime.now(UTC))
    assert [a["action"] for a in second["actions"]] == ["wait", "wait"]

    for fake in backend.clusters[old_id].steps:  # the steps' clients gone, then the applications
        fake.state = "CANCELLED" if fake.name != sup.HANDOVER_STEP else "RUNNING"
    assert [
        a["action"] for a in sup.reconcile(settings, HandoverEmr(), sns, datetime.now(UTC))["actions"]
    ] == [
        "wait",
        "wait",
    ]
    for fake in backend.clusters[old_id].steps:
        if fake.name == sup.HANDOVER_STEP:
            fake.state = "COMPLETED"
    third = sup.reconcile(settings, HandoverEmr(), sns, datetime.now(UTC))
    assert [a["action"] for a in third["actions"]] == ["start", "start"]
    assert len(emr.list_steps(ClusterId=new_id)["Steps"]) == 2


def test_an_old_cluster_without_the_environment_tag_holds_the_start_until_it_is_terminated(aws, monkeypatch):
    emr = aws["emr"]
    monkeypatch.setenv("CLUSTER_NAME", "lakehouse")
    old_id = _second_cluster(emr, "lakehouse")
    settings = sup.settings_from_env(os.environ)
    sns = boto3.client("sns", region_name=REGION)
    held = sup.reconcile(settings, HandoverEmr(denied=frozenset({old_id})), sns, datetime.now(UTC))
    assert [a["action"] for a in held["actions"]] == ["wait", "wait"]
    assert "terminate it" in held["actions"][0]["reason"]
    emr.terminate_job_flows(JobFlowIds=[old_id])
    after = sup.reconcile(settings, HandoverEmr(denied=frozenset({old_id})), sns, datetime.now(UTC))
    assert [a["action"] for a in after["actions"]] == ["start", "start"]


def test_other_errors_listing_another_cluster_fail_the_invocation(aws, monkeypatch):
    monkeypatch.setenv("CLUSTER_NAME", "lakehouse")
    old_id = _second_cluster(aws["emr"], "lakehouse")

    class Throttled(HandoverEmr):
        def get_paginator(self, name):
            if name == "list_steps":
                raise ClientError(
                    {"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "ListSteps"
                )
            return super().get_paginator(name)

    settings = sup.settings_from_env(os.environ)
    with pytest.raises(ClientError, match="Throttling"):
        sup.other_clusters(Throttled(), settings.cluster_name, settings.cluster_id)
    assert old_id


# --- executor with Stubber (cancel_steps is not in moto; API failures) ------------------------


def _stubbed(cluster_state: str = "RUNNING"):
    emr = boto3.client("emr", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    sns = boto3.client("sns", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    return emr, Stubber(emr), sns, Stubber(sns)


def _describe(stub: Stubber, state: str = "RUNNING") -> None:
    cluster = {"Id": "j-1", "Status": {"State": state}, "Tags": [], "LogUri": "s3://logs/"}
    stub.add_response("describe_cluster", {"Cluster": cluster}, {"ClusterId": "j-1"})


def _list_steps(stub: Stubber, summaries: list[dict]) -> None:
    active = [s for s in summaries if s["Status"]["State"] in sup.ACTIVE_STATES]
    stub.add_response(
        "list_steps", {"Steps": active}, {"ClusterId": "j-1", "StepStates": list(sup.ACTIVE_STATES)}
    )
    stub.add_response("list_steps", {"Steps": summaries}, {"ClusterId": "j-1"})


def test_a_new_version_is_rolled_out_by_interrupting_the_old_step():
    emr, emr_stub, sns, sns_stub = _stubbed()
    settings = sup.settings_from_env(
        _environ(
            STREAMING_STEPS=json.dumps(
                [{"job": "ingest", "name": "lakehouse-ingest@v2", "version": "v2", "args": ["a"]}]
            )
        )
    )
    old = {**_summary("lakehouse-ingest@v1", step_id="s-OLD")}
    _describe(emr_stub)
    _list_steps(emr_stub, [old])
    emr_stub.add_response(
        "cancel_steps",
        {"CancelStepsInfoList": [{"StepId": "s-OLD", "Status": "SUBMITTED"}]},
        {"ClusterId": "j-1", "StepIds": ["s-OLD"], "StepCancellationOption": "SEND_INTERRUPT"},
    )
    with emr_stub, sns_stub:
        summary = sup.reconcile(settings, emr, sns, NOW)
        emr_stub.assert_no_pending_responses()
    assert [(a["action"], a.get("step_id")) for a in summary["actions"]] == [
        ("cancel", "s-OLD"),
        ("wait", None),
    ]
    assert summary["actions"][0]["cancel_status"] == "SUBMITTED"


def test_an_emr_api_failure_fails_the_invocation():
    emr, emr_stub, sns, sns_stub = _stubbed()
    emr_stub.add_client_error("describe_cluster", "ThrottlingException", "Rate exceeded")
    with emr_stub, sns_stub, pytest.raises(ClientError):
        sup.reconcile(sup.settings_from_env(_environ()), emr, sns, NOW)


def test_one_failed_start_does_not_block_the_other_job_but_fails_the_invocation():
    emr, emr_stub, sns, sns_stub = _stubbed()
    settings = sup.settings_from_env(_environ())
    _describe(emr_stub)
    _list_steps(emr_stub, [])
    emr_stub.add_client_error("add_job_flow_steps", "ValidationException", "bad step")
    emr_stub.add_response("add_job_flow_steps", {"StepIds": ["s-NEW"]})
    # The started job's steps are listed again (settle_concurrent_starts): it is alone.
    _list_active = {"ClusterId": "j-1", "StepStates": list(sup.ACTIVE_STATES)}
    emr_stub.add_response(
        "list_steps", {"Steps": [_summary("lakehouse-cdc-apply@v2", "PENDING", "s-NEW")]}, _list_active
    )
    with emr_stub, sns_stub, pytest.raises(RuntimeError, match="1 supervisor action"):
        sup.reconcile(settings, emr, sns, NOW)
    emr_stub.assert_no_pending_responses()


def test_steps_come_from_s3_and_an_argument_change_is_a_new_version():
    import boto3
    from moto import mock_aws

    steps = [{"job": "ingest", "version": "v7", "args": ["bash", "-c", "...", "spark-submit", "--x", "1"]}]
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="artifacts")
        s3.put_object(Bucket="artifacts", Key="emr/v7/streaming-steps.json", Body=json.dumps(steps))
        environ = {**_environ(), "STREAMING_STEPS_S3_URI": "s3://artifacts/emr/v7/streaming-steps.json"}
        (first,) = sup.settings_from_env(environ, s3).desired
        steps[0]["args"][-1] = "2"  # same build, one argument changed (say, the broker list)
        s3.put_object(Bucket="artifacts", Key="emr/v7/streaming-steps.json", Body=json.dumps(steps))
        (second,) = sup.settings_from_env(environ, s3).desired
    assert first.name.startswith("lakehouse-ingest@v7-") and first.args[-1] == "1"
    assert second.name != first.name and sup.STEP_NAME.match(second.name)["job"] == "ingest"


def test_the_handover_step_is_named_as_the_rule_that_wakes_the_supervisor_expects():
    from infra.emr_steps import HANDOVER_STEP

    assert sup.HANDOVER_STEP == HANDOVER_STEP  # the Lambda is bundled alone: two copies of the name
