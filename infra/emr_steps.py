"""What an EMR step runs: the spark-submit arguments of each job (pure; used by the CDK constructs).

Every setting a job needs is an argument (`jobs.common.job_args`): nothing is looked up on the node.
The jobs' code and dependencies come from the artifact set of `make package` at
`s3://<artifacts>/emr/<version>/` (`infra/emr_package.py`): `pyenv-<arch>.zip` is unpacked by
YARN as `./pyenv` in every container and put on PYTHONPATH; `emr_step.py <job>` runs the job's `main`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobs.registry import Kind, names

ARTIFACTS_PREFIX = "emr"
BOOTSTRAP_PREFIX = "bootstrap"
STEP_NAME_PREFIX = "lakehouse-"
STREAMING_STEPS_FILE = "streaming-steps.json"  # the step supervisor's desired steps, beside the archive
# A tag on the cluster, valued with its name: the supervisor of a replacing cluster may list, cancel
# and add steps on a cluster carrying its own name (the handover, step_supervisor/handler.py).
SUPERVISED_CLUSTER_TAG = "lakehouse-emr-cluster"
# The step the supervisor adds on a replaced cluster to kill its jobs' applications (the Lambda's
# handler.py has the same name; tests/infra/test_infra_jobs.py checks they agree).
HANDOVER_STEP = "lakehouse-handover-stop"

# Long-running jobs kept alive by the step supervisor, and batch jobs run to completion (jobs/registry.py).
STREAMING_JOBS = names(Kind.STREAMING)
# The same streaming jobs in one Spark application (one step, one driver).
STREAMING_APPLICATION = names(Kind.APPLICATION)
BATCH_JOBS = names(Kind.BATCH)


@dataclass(frozen=True)
class JobArtifacts:
    """Where one build of the jobs lives in the artifacts bucket."""

    bucket_name: str
    version: str
    architecture: str  # x86_64 or aarch64, from the cluster's instance types

    @property
    def prefix(self) -> str:
        return f"s3://{self.bucket_name}/{ARTIFACTS_PREFIX}/{self.version}"

    @property
    def archive_uri(self) -> str:
        return f"{self.prefix}/pyenv-{self.architecture}.zip"

    @property
    def entry_point_uri(self) -> str:
        return f"{self.prefix}/emr_step.py"


def streaming_steps(one_application: bool) -> tuple[str, ...]:
    """The supervisor's streaming steps: one application, or one step per job (each scales and
    restarts alone, at the cost of a driver each)."""
    return STREAMING_APPLICATION if one_application else STREAMING_JOBS


def step_name(job: str, version: str) -> str:
    """`lakehouse-<job>@<version>`: the supervisor recognises a job's steps and their build by it."""
    return f"{STEP_NAME_PREFIX}{job}@{version}"


def environment_args(job_settings: Mapping[str, object]) -> list[str]:
    """The arguments of `jobs.common.job_args.config_from_args` for an AWS environment."""
    flags = (
        ("--env", "env"),
        ("--region", "region"),
        ("--kafka-bootstrap", "kafka_bootstrap"),
        ("--kafka-auth", "kafka_auth"),
        ("--mysql-host", "mysql_host"),
        ("--mysql-port", "mysql_port"),
        ("--mysql-cdc-secret-id", "mysql_cdc_secret_id"),
        ("--mysql-ssl-ca", "mysql_ssl_ca"),
    )
    args: list[str] = []
    for flag, key in flags:
        args += [flag, str(job_settings[key])]
    return args


# Cancelling an EMR step interrupts its spark-submit client, but in cluster mode the YARN
# application (driver and executors) keeps running. So each step first kills any live application
# of the same job (by its YARN name), then execs spark-submit: a replacement step never runs beside
# the step it replaces, and a step whose client died leaves no orphan behind.
REPLACE_RUNNING_APP = (
    'app="$1"; shift; '
    "yarn application -list -appStates NEW,NEW_SAVING,SUBMITTED,ACCEPTED,RUNNING 2>/dev/null "
    "| awk -F '\\t' -v app=\"$app\" "
    '\'{ id = $1; name = $2; gsub(/^[ ]+|[ ]+$/, "", id); gsub(/^[ ]+|[ ]+$/, "", name); '
    "if (name == app && id ~ /^application_/) print id }' "
    '| while read -r id; do echo "stopping $app\'s running YARN application $id" >&2; '
    'yarn application -kill "$id" >&2; done; '
    'exec "$@"'
)


def app_name(job: str) -> str:
    return f"{STEP_NAME_PREFIX}{job}"


def replacing_step_args(job: str, submit: Sequence[str]) -> list[str]:
    """command-runner.jar arguments: stop `job`'s running YARN application, then run `submit`."""
    return ["bash", "-c", REPLACE_RUNNING_APP, "lakehouse-step", app_name(job), *submit]


def spark_submit_args(
    *,
    job: str,
    artifacts: JobArtifacts,
    job_settings: Mapping[str, object],
    job_python: str,
    job_args: Sequence[str] = (),
    spark_conf: Mapping[str, str] | None = None,
) -> list[str]:
    """command-runner.jar arguments of one job's step (cluster mode: the driver runs on YARN, so a
    primary-node restart does not kill it, and the archive reaches the driver too). `spark_conf`:
    the application's size (driver, executors, their cap)."""
    sizes = [arg for key, value in (spark_conf or {}).items() for arg in ("--conf", f"{key}={value}")]
    return [
        "spark-submit",
        "--deploy-mode",
        "cluster",
        "--name",
        app_name(job),
        "--conf",
        f"spark.archives={artifacts.archive_uri}#pyenv",
        "--conf",
        "spark.yarn.appMasterEnv.PYTHONPATH=./pyenv",
        "--conf",
        "spark.executorEnv.PYTHONPATH=./pyenv",
        "--conf",
        f"spark.yarn.appMasterEnv.PYSPARK_PYTHON={job_python}",
        "--conf",
        f"spark.executorEnv.PYSPARK_PYTHON={job_python}",
        # One YARN attempt: a failed job surfaces as a failed step, which the supervisor (streaming)
        # or the state machine (batch) retries with backoff and reports.
        "--conf",
        "spark.yarn.maxAppAttempts=1",
        *sizes,
        artifacts.entry_point_uri,
        job,
        *environment_args(job_settings),
        *job_args,
    ]
