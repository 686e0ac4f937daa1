"""One typed configuration model for the jobs, the CLI and the CDK app.

A `LakehouseConfig` says *where things are* (Kafka, MySQL, the Iceberg catalog, the warehouse) for
one environment. `local` is read from the embedded stack's state file; `dev`/`prod` are built from
the values the CDK deployer passes to EMR steps (bootstrap brokers, secret ids, bucket names).
Nothing here reads hidden context: callers pass values in, or call a named constructor.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

CATALOG_NAME = "lakehouse"
NAMESPACES = ("dim_db", "ods_behavior", "ads_behavior")
CLICK_TOPIC = "clicktopic"
CLICK_TOPIC_PARTITIONS = 3
SOURCE_DATABASE = "user_db"
# Amazon RDS CA certificates (scripts/update-rds-ca-bundle.sh): RDS requires TLS and the jobs verify it.
RDS_CA_BUNDLE = Path(__file__).with_name("rds-ca-bundle.pem")
STATE_FILE = "stack.json"
# How long a local SQLite catalog client waits for another process's lock instead of failing.
SQLITE_BUSY_TIMEOUT_MS = 60_000

EnvName = Literal["local", "dev", "prod"]
ENVIRONMENTS: tuple[str, ...] = ("local", "dev", "prod")
# Files and snapshots accrue per commit (about one a second while clicks flow), not per record: in
# `bench soak` views p95 grew with the click table's files (8.5 s at ~700 files), and one run after
# 15 minutes (~1,000 files) took long enough to push views p95 to 17 s in its window. Every minute
# was measured too: a run costs about as much over one minute of commits as over five (19-41 s), so
# every window had one and views p95 missed 6 s in 4 of the 10 soak windows after the first
# (every 5 minutes: 2 of 10).
LOCAL_STREAMING_MAINTENANCE_MINUTES = 5.0


class ConfigError(RuntimeError):
    """A configuration problem the user can fix; the message says how."""


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str
    topic: str = CLICK_TOPIC
    partitions: int = CLICK_TOPIC_PARTITIONS
    # "plaintext" for the local broker; "iam" for MSK (TLS + SASL/OAUTHBEARER via the MSK signer).
    auth: Literal["plaintext", "iam"] = "plaintext"
    region: str | None = None
    # Producers are idempotent where the broker keeps that promise (MSK). The local broker (tansu
    # 0.6.0) does not: killed mid-request, it acknowledges the retried batch without storing it,
    # and after its storage restarts an idempotent producer fails every later record
    # (tests/test_faults.py). Locally, producers retry plainly: nothing acknowledged is lost, and a
    # crash of the broker can store a retried batch twice.
    idempotent_producer: bool = True

    def client_properties(self) -> dict[str, object]:
        """librdkafka properties for this cluster (without the IAM token callback)."""
        props: dict[str, object] = {"bootstrap.servers": self.bootstrap}
        if self.auth == "iam":
            props.update({"security.protocol": "SASL_SSL", "sasl.mechanisms": "OAUTHBEARER"})
        return props


@dataclass(frozen=True)
class MySqlConfig:
    host: str
    port: int
    database: str = SOURCE_DATABASE
    # Local: credentials come from the stack's state file. AWS: from Secrets Manager by id.
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    cdc_user: str | None = None
    cdc_password: str | None = field(default=None, repr=False)
    secret_id: str | None = None
    cdc_secret_id: str | None = None
    server_id: int = 4201  # replication client id; must differ from the server's own
    # CA certificates the server's certificate is verified against (host name included); None
    # connects without TLS. On AWS: the RDS CA bundle shipped in the jobs package.
    ssl_ca: str | None = None

    def tls_options(self) -> dict[str, object]:
        """PyMySQL connect arguments for this server's TLS (empty without a CA)."""
        if self.ssl_ca is None:
            return {}
        return {"ssl_ca": self.ssl_ca, "ssl_verify_cert": True, "ssl_verify_identity": True}

    def __repr__(self) -> str:  # never leak passwords into logs
        return f"MySqlConfig(host={self.host!r}, port={self.port}, database={self.database!r})"


@dataclass(frozen=True)
class CatalogConfig:
    # Local: the warehouse folder. On EMR None: the cluster's spark-defaults set it with the catalog.
    warehouse: str | None
    name: str = CATALOG_NAME
    # "jdbc-sqlite": Iceberg JdbcCatalog on a SQLite file (local). "glue": AWS Glue Data Catalog.
    kind: Literal["jdbc-sqlite", "glue"] = "jdbc-sqlite"
    sqlite_path: str | None = None

    @property
    def uri(self) -> str | None:
        """SQLAlchemy URI (pyiceberg SqlCatalog) of the local catalog."""
        return f"sqlite:///{self.sqlite_path}" if self.sqlite_path else None

    @property
    def jdbc_uri(self) -> str | None:
        return f"jdbc:sqlite:{self.sqlite_path}" if self.sqlite_path else None


@dataclass(frozen=True)
class SparkConfig:
    master: str | None = "local[*]"  # None on EMR: YARN decides
    driver_memory: str = "3g"
    shuffle_partitions: int = 4
    jars: tuple[str, ...] = ()


@dataclass(frozen=True)
class LakehouseConfig:
    env: str
    kafka: KafkaConfig
    mysql: MySqlConfig
    catalog: CatalogConfig
    spark: SparkConfig
    region: str | None = None
    checkpoint_dir: str | None = None  # scratch space for jobs (local state dir or S3 prefix)
    # Table maintenance inside the streaming application, every this many minutes; 0 = never. On AWS
    # a state machine runs `maintain` hourly; the local stack has nothing else to schedule it.
    streaming_maintenance_minutes: float = 0.0

    @property
    def is_local(self) -> bool:
        return self.env == "local"

    def table(self, namespace: str, name: str) -> str:
        """Fully qualified Spark identifier: `lakehouse.ns.table`."""
        return f"{self.catalog.name}.{namespace}.{name}"

    # ---- constructors -------------------------------------------------------------------------

    @classmethod
    def local(cls, home: str | os.PathLike[str] | None = None) -> LakehouseConfig:
        """Config of the running embedded stack, read from `$LAKEHOUSE_HOME/stack.json`."""
        home_path = local_home(home)
        state_path = home_path / STATE_FILE
        if not state_path.exists():
            raise ConfigError(f"no local stack state at {state_path}: run `lakehouse local up` first")
        state = json.loads(state_path.read_text())
        return cls.from_local_state(state)

    @classmethod
    def from_local_state(cls, state: dict) -> LakehouseConfig:
        m = state["mysql"]
        return cls(
            env="local",
            kafka=KafkaConfig(
                bootstrap=state["kafka"]["bootstrap"],
                topic=state["kafka"]["topic"],
                idempotent_producer=False,
            ),
            mysql=MySqlConfig(
                host=m["host"],
                port=int(m["port"]),
                database=m["database"],
                user=m["user"],
                password=m["password"],
                cdc_user=m["cdc_user"],
                cdc_password=m["cdc_password"],
                ssl_ca=m.get("ssl_ca"),
            ),
            catalog=CatalogConfig(
                warehouse=state["catalog"]["warehouse"],
                sqlite_path=state["catalog"]["sqlite_path"],
            ),
            spark=SparkConfig(jars=tuple(state.get("spark_jars", ()))),
            checkpoint_dir=state.get("checkpoint_dir"),
            streaming_maintenance_minutes=LOCAL_STREAMING_MAINTENANCE_MINUTES,
        )

    @classmethod
    def aws(
        cls,
        *,
        env: str,
        region: str,
        kafka_bootstrap: str,
        mysql_host: str,
        mysql_port: int = 3306,
        mysql_cdc_secret_id: str,
        kafka_auth: str = "iam",
        mysql_ssl_ca: str = "rds",
    ) -> LakehouseConfig:
        """Config on EMR: values come from the deployer (CDK step arguments). The Iceberg catalog
        and its warehouse are the cluster's (spark-defaults), not the job's.

        `kafka_auth`: "iam" (MSK: TLS + SASL/OAUTHBEARER) or "plaintext". `mysql_ssl_ca`: "rds" (the
        Amazon RDS CA bundle shipped with the jobs) or the path of a PEM file of CA certificates."""
        if env not in ("dev", "prod"):
            raise ConfigError(f"unknown AWS environment {env!r}: use dev or prod")
        if kafka_auth not in ("iam", "plaintext"):
            raise ConfigError(f"unknown Kafka authentication {kafka_auth!r}: use iam or plaintext")
        ssl_ca = RDS_CA_BUNDLE if mysql_ssl_ca == "rds" else Path(mysql_ssl_ca)
        if not ssl_ca.is_file():
            raise ConfigError(f"MySQL CA bundle {ssl_ca} does not exist: pass rds or a PEM file")
        return cls(
            env=env,
            region=region,
            kafka=KafkaConfig(bootstrap=kafka_bootstrap, auth=kafka_auth, region=region),  # type: ignore[arg-type]
            mysql=MySqlConfig(
                host=mysql_host, port=int(mysql_port), cdc_secret_id=mysql_cdc_secret_id, ssl_ca=str(ssl_ca)
            ),
            catalog=CatalogConfig(warehouse=None, kind="glue"),
            spark=SparkConfig(master=None, driver_memory="4g", shuffle_partitions=32),
        )

    def to_dict(self) -> dict:
        return asdict(self)


def local_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The local state directory: explicit argument, else `$LAKEHOUSE_HOME`, else `./.lakehouse`."""
    raw = home if home is not None else os.environ.get("LAKEHOUSE_HOME", ".lakehouse")
    return Path(raw).expanduser().resolve()
