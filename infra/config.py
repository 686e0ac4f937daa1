"""Per-environment deployment configuration of the CDK app.

`app.py` reads `-c env=dev|prod` once and builds a `DeploymentConfig`; constructs receive typed values
from it and never read CDK context themselves. dev and prod differ only by the values below.
Values are plain Python (days, hours, a `Removal` choice), never CDK types: `lakehouse aws ...` reads
this config, and importing aws_cdk would start Node for every operator command. The constructs turn
them into CDK types where they use them (`infra/cdk_values.py`).
Shared names (catalog, namespaces, topic, source database) come from `jobs.config`, the model the
jobs use, so the cluster and the jobs cannot disagree about them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import StrEnum

from infra.capacity import CapacityTarget, plan_capacity
from jobs.config import ConfigError

DEPLOYABLE_ENVIRONMENTS: tuple[str, ...] = ("dev", "prod")

# Python the jobs run with on EMR 7.x (see pyproject: requires-python 3.11).
EMR_JOB_PYTHON = "/usr/bin/python3.11"
# Latest EMR on EC2 7.x release confirmed (Spark 3.5, Iceberg 1.10.1-amzn, Hive, Trino).
EMR_RELEASE_LABEL = "emr-7.14.0"
# MSK's topic API (AWS::MSK::Topic) needs Kafka >= 3.6 on a provisioned cluster; 3.8.x is MSK's
# recommended version.
KAFKA_VERSION = "3.8.x"
# Where the EMR in-transit encryption certificates (a PEM zip) are expected in the artifacts bucket.
EMR_TLS_CERTIFICATES_KEY = "security/emr-tls-certificates.zip"


# dev only: the roles `lakehouse aws preflight --env dev --pin-azs` pinned as lake readers (the person who
# deploys dev is the one who queries it with Athena, which reads as the caller).
DEV_LAKE_READERS_CONTEXT_KEY = "lakehouse:dev-lake-readers"


def az_context_key(account: str, region: str) -> str:
    """The cdk.context.json key under which `lakehouse aws preflight --pin-azs` pins the AZs it chose
    for an account/region; `infra/lakehouse_app.py` reads them from there."""
    return f"lakehouse:availability-zones:account={account}:region={region}"


class Removal(StrEnum):
    """What `cdk destroy` (or a replacement) does to a resource that holds data: CDK's RemovalPolicy
    as a plain value (`infra.cdk_values.removal_policy` converts it)."""

    DESTROY = "destroy"
    RETAIN = "retain"
    SNAPSHOT = "snapshot"  # RDS: a final snapshot, then delete


@dataclass(frozen=True)
class NetworkSettings:
    vpc_cidr: str
    max_azs: int
    nat_gateways: int
    flow_log_retention_days: int  # a CloudWatch Logs retention (1, 3, 5, 7, 14, 30, 60, 90, ...)


@dataclass(frozen=True)
class StorageSettings:
    access_log_expiration_days: int
    athena_results_expiration_days: int
    # prod keeps every overwritten or deleted object (warehouse, artifacts) this long as a
    # noncurrent version: the undo window for a bad job or a mistaken delete. dev keeps none, so
    # `cdk destroy` empties the buckets in one pass and the demo pays for no old versions.
    noncurrent_version_expiration_days: int | None


@dataclass(frozen=True)
class KafkaSettings:
    """The MSK cluster (infra/constructs/kafka_cluster.py)."""

    kafka_version: str
    broker_instance_type: str
    broker_count: int
    broker_volume_gib: int
    topic_replication_factor: int
    min_insync_replicas: int
    broker_log_retention_days: int
    # How long the brokers keep records (log.retention.hours): an ingest that falls further behind
    # loses data, so its lag alarms at half of it.
    topic_retention_hours: int
    # DEFAULT already has KafkaDataLogsDiskUsed (the disk alarm); PER_BROKER adds paid metrics.
    enhanced_monitoring: str
    # From the capacity model (infra/capacity.py). Raising it on a deployed topic adds partitions
    # in place (MSK updates a topic's partition count without recreating it); Kafka cannot remove
    # any. Keys hash to other partitions from then on, and the ingest reads the new ones from
    # offset 0 at its next batch (it asks the broker for the partitions every batch).
    click_topic_partitions: int


@dataclass(frozen=True)
class SourceDatabaseSettings:
    instance_class: str  # e.g. "t4g.micro" -> db.t4g.micro
    allocated_storage_gib: int
    max_allocated_storage_gib: int
    backup_retention_days: int
    multi_az: bool
    deletion_protection: bool


@dataclass(frozen=True)
class ComputeSettings:
    release_label: str
    primary_instance_types: tuple[str, ...]
    worker_instance_types: tuple[str, ...]
    core_units: int
    task_on_demand_units: int
    task_spot_units: int
    max_capacity_units: int
    ebs_volume_gib: int
    step_concurrency_level: int
    # None: the cluster runs until deleted (prod runs the streaming jobs around the clock).
    idle_timeout_hours: int | None
    # dev generates a self-signed certificate for in-transit encryption at deploy time; prod
    # requires the operator's own and fails fast if it is missing.
    generate_tls_certificates: bool
    # prod: EMR refuses to terminate the cluster (by API, console or a CloudFormation delete or
    # replacement) until protection is turned off. dev: off, it is parked and auto-terminates.
    termination_protected: bool
    job_python: str = EMR_JOB_PYTHON


@dataclass(frozen=True)
class SparkResources:
    """What one Spark application may take from YARN. EMR turns dynamic allocation on with no upper
    bound: an uncapped streaming application grows onto every node, and managed scaling then adds
    (and holds) task nodes for the batch jobs beside it."""

    driver_memory: str
    executor_memory: str
    executor_cores: int
    max_executors: int

    def submit_conf(self) -> dict[str, str]:
        return {
            "spark.driver.memory": self.driver_memory,
            "spark.executor.memory": self.executor_memory,
            "spark.executor.cores": str(self.executor_cores),
            "spark.dynamicAllocation.maxExecutors": str(self.max_executors),
        }


@dataclass(frozen=True)
class JobSettings:
    """How the jobs run on the cluster (infra/constructs/job_deployment.py)."""

    report_hour_utc: int  # the daily report runs at HH:30 UTC (for the day so far)
    verify_hour_utc: int  # the daily reconciliation (`verify`) runs at HH:15 UTC
    maintain_every_hours: int
    supervisor_every_minutes: int  # how often the step supervisor reconciles without an event
    max_failures_per_hour: int  # a streaming job failing more often is given up and alerted
    log_retention_days: int
    # dev: CDC, ingest and views in one step (`jobs/streaming`: one driver on a small cluster);
    # prod: a step each, so each restarts and scales alone.
    one_streaming_application: bool
    # Per streaming application (dev: the one; prod: each job's) and per batch job.
    streaming_resources: SparkResources
    batch_resources: SparkResources
    # dev: the test-data generator is deployed (a state machine; the cluster may write clicktopic).
    # prod: not deployed, and the cluster may only read clicktopic: real clicks come from the site.
    deploy_gendata: bool
    # The scheduled verify step also repairs the click and dimension tables it finds wrong (`verify --repair`;
    # `-c verify_repair=true`). Off by default: a repair is a write, and the alarm fires either way.
    verify_repairs: bool = False


@dataclass(frozen=True)
class PipelineAlarmSettings:
    """Thresholds of the pipeline's own alarms (infra/constructs/pipeline_health.py)."""

    freshness_seconds: int  # a table's lag (now - newest record applied) above this alarms
    no_click_commit_minutes: int  # no click-table commit this long while MSK receives bytes
    rejects_ratio: float  # rejects / records in, over 15 minutes
    max_step_restarts_per_hour: int  # the supervisor restarting streaming steps more often


@dataclass(frozen=True)
class MonitoringSettings:
    rds_free_storage_alarm_bytes: int
    msk_disk_used_alarm_percent: int
    pipeline: PipelineAlarmSettings
    alarm_email: str | None = None


ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+")


@dataclass(frozen=True)
class AccessSettings:
    """Principals (IAM role ARNs) the resource policies allow beside the pipeline's own roles."""

    # Read the tables' files and Athena's results: analysts' roles querying through Athena (the
    # jobs, Trino and Hive read as the EMR instance role).
    lake_readers: tuple[str, ...] = ()
    # Read and upload the EMR TLS certificate zip (security/ in the artifacts bucket): prod's
    # operator, who uploads the organisation's certificate before the Compute stack.
    security_admins: tuple[str, ...] = ()

    @classmethod
    def from_context(cls, lake_readers: object, security_admins: object) -> AccessSettings:
        """From `-c name=arn1,arn2` (or a list in cdk.json's context)."""

        def role_arns(option: str, value: object) -> tuple[str, ...]:
            items = value if isinstance(value, list | tuple) else str(value or "").split(",")
            arns = tuple(str(a).strip() for a in items if str(a).strip())
            for arn in arns:
                if not ROLE_ARN.fullmatch(arn):
                    raise ConfigError(
                        f"-c {option}={value}: {arn!r} is not an IAM role ARN "
                        "(arn:aws:iam::<account>:role/<name>); a bucket policy names roles, not users"
                    )
            return arns

        return cls(role_arns("lake_readers", lake_readers), role_arns("security_admins", security_admins))


@dataclass(frozen=True)
class DeploymentConfig:
    env_name: str
    account: str | None
    region: str | None
    availability_zones: tuple[str, ...] | None
    # prod keeps data on `cdk destroy` (buckets, Glue databases, an RDS snapshot); dev deletes it all.
    retain_data: bool
    network: NetworkSettings
    storage: StorageSettings
    kafka: KafkaSettings
    source_database: SourceDatabaseSettings
    compute: ComputeSettings
    monitoring: MonitoringSettings
    jobs: JobSettings
    # The longest any log group keeps its events, the framework's too (CDK's providers default to
    # two years); with `removal_policy`, dev teardown leaves no log group behind.
    log_retention_cap_days: int
    # Who besides the pipeline's own roles may read the lake and handle its TLS material
    # (`-c lake_readers=…`, `-c security_admins=…`; infra/access.py).
    access: AccessSettings = field(default_factory=lambda: AccessSettings())
    # dev only (`-c parked=true`, driven by `lakehouse aws park`): no EMR cluster, no NAT gateway, no
    # interface endpoints, no job schedules; the lake, the catalog, MSK and RDS stay (RDS is stopped
    # by the CLI: CloudFormation cannot stop an instance).
    parked: bool = False

    @property
    def unpinned_azs_error(self) -> str | None:
        """Why an account-bound synth cannot be deployed yet, or None. AZ names map to different
        physical zones per account (and MSK cannot use some zone IDs), so names are never guessed:
        they come pinned from the preflight, or -c azs=. Not raised at synth: `cdk bootstrap` in this
        folder synthesizes the app too, before the preflight can pin anything; the Network stack
        carries it as an error, which stops `cdk deploy` and `cdk synth` but not the bootstrap."""
        if not self.region or self.availability_zones:
            return None
        return (
            f"no availability zones chosen for account {self.account} in {self.region}: run "
            f"`lakehouse aws preflight --env {self.env_name} --pin-azs` (picks them by zone ID and pins "
            "them in cdk.context.json), or pass -c azs=<az1>,<az2>[,<az3>]"
        )

    @property
    def removal_policy(self) -> Removal:
        return Removal.RETAIN if self.retain_data else Removal.DESTROY

    @property
    def termination_protection(self) -> bool:
        """CloudFormation refuses to delete an environment that keeps data (prod) until an operator
        turns the stacks' termination protection off: `cdk destroy` there is a procedure, not a
        command (infra/README.md, "Destroy")."""
        return self.retain_data

    @property
    def database_removal_policy(self) -> Removal:
        return Removal.SNAPSHOT if self.retain_data else Removal.DESTROY

    @property
    def metrics_namespace(self) -> str:
        """Where the jobs and the supervisor publish (jobs/common/metrics.py uses the same form)."""
        return f"Lakehouse/{self.env_name}"

    def stack_name(self, concern: str) -> str:
        return f"Lakehouse-{self.env_name}-{concern}"

    @property
    def name_prefix(self) -> str:
        return f"lakehouse-{self.env_name}"

    def resource_name(self, suffix: str) -> str:
        """Physical names for things people look up by name (MSK cluster, EMR cluster, workgroup)."""
        return f"{self.name_prefix}-{suffix}"

    @property
    def parameter_prefix(self) -> str:
        return f"/lakehouse/{self.env_name}"

    @classmethod
    def for_env(
        cls,
        env_name: str,
        *,
        account: str | None = None,
        region: str | None = None,
        availability_zones: tuple[str, ...] | None = None,
        parked: bool = False,
        alert_email: str | None = None,
        access: AccessSettings | None = None,
        verify_repair: bool = False,
    ) -> DeploymentConfig:
        """The configuration of `env_name`; account/region only when the CLI knows them."""
        if env_name not in _ENVIRONMENTS:
            raise ConfigError(
                f"unknown environment {env_name!r}: pass -c env=dev or -c env=prod "
                f"(one of {', '.join(DEPLOYABLE_ENVIRONMENTS)})"
            )
        config = _ENVIRONMENTS[env_name]
        if parked and config.retain_data:
            raise ConfigError(
                f"{env_name} cannot be parked: parking removes the cluster and the NAT gateway that "
                "keep its pipeline running; only dev is parked (`lakehouse aws park --env dev`)"
            )
        if bool(account) != bool(region):
            # Half an environment would make CDK do lookups for the other half: stay agnostic.
            account = region = None
        azs = availability_zones
        if alert_email is not None and not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", alert_email):
            raise ConfigError(f"-c alert_email={alert_email}: not an e-mail address")
        if alert_email:
            config = replace(config, monitoring=replace(config.monitoring, alarm_email=alert_email))
        if verify_repair:
            config = replace(config, jobs=replace(config.jobs, verify_repairs=True))
        if azs and len(azs) < config.network.max_azs:
            raise ConfigError(
                f"{env_name} needs {config.network.max_azs} availability zones, got {list(azs)}: "
                "pass -c azs=<az1>,<az2>[,<az3>]"
            )
        return replace(
            config,
            account=account or None,
            region=region or None,
            availability_zones=tuple(azs[: config.network.max_azs]) if azs and region else None,
            parked=parked,
            access=access or AccessSettings(),
        )


# The capacity targets (infra/capacity.py; docs/capacity.md): the values below derive from them.
DEV_CAPACITY = CapacityTarget(
    sustained_clicks_per_second=200,
    outage_minutes=60,
    catch_up_minutes=30,
    headroom=1.5,
    why="the data generator's demo rate; a parked or idle-terminated cluster catches up within the demo",
)
PROD_CAPACITY = CapacityTarget(
    sustained_clicks_per_second=20_000,
    outage_minutes=60,
    catch_up_minutes=20,
    headroom=2.0,
    why=(
        "a large retailer's peak hour (~1.7 billion clicks a day at that rate); an hour's outage (a "
        "cluster replaced, a bad deploy rolled back) is read back within 20 minutes, inside the "
        "freshness alarm's patience for a planned change, with twice the need for bursts"
    ),
)
_DEV_BROKERS, _DEV_EXECUTOR_CORES = 2, 2
_PROD_BROKERS, _PROD_EXECUTOR_CORES = 3, 4
DEV_PLAN = plan_capacity(DEV_CAPACITY, _DEV_BROKERS, _DEV_EXECUTOR_CORES)
PROD_PLAN = plan_capacity(PROD_CAPACITY, _PROD_BROKERS, _PROD_EXECUTOR_CORES)

_DEV = DeploymentConfig(
    env_name="dev",
    account=None,
    region=None,
    availability_zones=None,
    retain_data=False,
    network=NetworkSettings(
        vpc_cidr="10.40.0.0/16",
        max_azs=2,
        nat_gateways=1,
        flow_log_retention_days=30,
    ),
    storage=StorageSettings(
        access_log_expiration_days=30,
        athena_results_expiration_days=7,
        noncurrent_version_expiration_days=None,
    ),
    kafka=KafkaSettings(
        kafka_version=KAFKA_VERSION,
        broker_instance_type="kafka.t3.small",
        broker_count=_DEV_BROKERS,
        broker_volume_gib=10,
        topic_replication_factor=2,
        min_insync_replicas=1,
        broker_log_retention_days=7,
        topic_retention_hours=168,
        enhanced_monitoring="DEFAULT",
        click_topic_partitions=DEV_PLAN.partitions,
    ),
    source_database=SourceDatabaseSettings(
        instance_class="t4g.micro",
        allocated_storage_gib=20,
        max_allocated_storage_gib=50,
        backup_retention_days=1,
        multi_az=False,
        deletion_protection=False,
    ),
    compute=ComputeSettings(
        release_label=EMR_RELEASE_LABEL,
        primary_instance_types=("m5.xlarge", "m6i.xlarge"),
        worker_instance_types=("m5.xlarge", "m5a.xlarge", "m6i.xlarge"),
        core_units=1,
        task_on_demand_units=0,
        task_spot_units=1,
        max_capacity_units=4,
        ebs_volume_gib=64,
        step_concurrency_level=4,
        generate_tls_certificates=True,
        termination_protected=False,
        idle_timeout_hours=2,
    ),
    monitoring=MonitoringSettings(
        rds_free_storage_alarm_bytes=2 * 1024**3,
        msk_disk_used_alarm_percent=80,
        # dev: a demo idles and restarts often; alarms only for what needs a look the same day
        pipeline=PipelineAlarmSettings(
            freshness_seconds=600,
            no_click_commit_minutes=15,
            rejects_ratio=0.2,
            max_step_restarts_per_hour=6,
        ),
    ),
    jobs=JobSettings(
        report_hour_utc=23,
        verify_hour_utc=4,
        maintain_every_hours=1,
        supervisor_every_minutes=5,
        max_failures_per_hour=5,
        log_retention_days=7,
        one_streaming_application=True,
        # m5.xlarge: 4 vCPU, ~12 GiB for YARN per node; core + one Spot task node = 8 vCPU, 24 GiB.
        # Streaming: driver (~2.4 GiB with overhead) + 2 x 2.4 GiB; batch jobs beside it: the same
        # again, so both fit on the two nodes and managed scaling has no reason to add more.
        streaming_resources=SparkResources("2g", "2g", _DEV_EXECUTOR_CORES, max_executors=2),
        batch_resources=SparkResources("2g", "2g", 2, max_executors=2),
        deploy_gendata=True,
    ),
    log_retention_cap_days=30,
)

_PROD = replace(
    _DEV,
    env_name="prod",
    retain_data=True,
    network=NetworkSettings(
        vpc_cidr="10.41.0.0/16",
        max_azs=3,
        nat_gateways=3,
        flow_log_retention_days=365,
    ),
    storage=StorageSettings(
        access_log_expiration_days=365,
        athena_results_expiration_days=30,
        noncurrent_version_expiration_days=30,
    ),
    kafka=KafkaSettings(
        kafka_version=KAFKA_VERSION,
        broker_instance_type="kafka.m7g.large",
        broker_count=_PROD_BROKERS,
        broker_volume_gib=200,
        topic_replication_factor=3,
        min_insync_replicas=2,
        broker_log_retention_days=90,
        topic_retention_hours=168,
        enhanced_monitoring="PER_BROKER",
        click_topic_partitions=PROD_PLAN.partitions,
    ),
    source_database=SourceDatabaseSettings(
        instance_class="m7g.large",
        allocated_storage_gib=100,
        max_allocated_storage_gib=500,
        backup_retention_days=7,
        multi_az=True,
        deletion_protection=True,
    ),
    compute=ComputeSettings(
        release_label=EMR_RELEASE_LABEL,
        primary_instance_types=("m5.2xlarge", "m6i.2xlarge"),
        worker_instance_types=("m5.2xlarge", "m5a.2xlarge", "m6i.2xlarge"),
        core_units=3,
        task_on_demand_units=1,
        task_spot_units=0,
        max_capacity_units=12,
        ebs_volume_gib=256,
        step_concurrency_level=10,
        generate_tls_certificates=False,
        termination_protected=True,
        idle_timeout_hours=None,
    ),
    monitoring=MonitoringSettings(
        rds_free_storage_alarm_bytes=10 * 1024**3,
        msk_disk_used_alarm_percent=75,
        pipeline=PipelineAlarmSettings(
            freshness_seconds=120,
            no_click_commit_minutes=5,
            rejects_ratio=0.05,
            max_step_restarts_per_hour=3,
        ),
    ),
    jobs=JobSettings(
        report_hour_utc=23,
        verify_hour_utc=4,
        maintain_every_hours=1,
        supervisor_every_minutes=2,
        max_failures_per_hour=10,
        log_retention_days=90,
        one_streaming_application=False,
        # m5.2xlarge: 8 vCPU, ~24 GiB for YARN per node; 3 core + 1 task = 32 vCPU, 96 GiB. Three
        # streaming applications at up to N x (4 cores, 8 GiB) each (N: what the capacity model
        # gives the ingest), batch jobs up to 3 executors.
        streaming_resources=SparkResources(
            "4g", "8g", _PROD_EXECUTOR_CORES, max_executors=PROD_PLAN.ingest_executors
        ),
        batch_resources=SparkResources("4g", "8g", 4, max_executors=3),
        deploy_gendata=False,
    ),
    log_retention_cap_days=731,
)

_ENVIRONMENTS: dict[str, DeploymentConfig] = {"dev": _DEV, "prod": _PROD}
