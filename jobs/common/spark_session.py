"""The one Spark session factory every job uses: local (SQLite JDBC catalog) or EMR (the cluster's
Glue catalog)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from jobs.config import SQLITE_BUSY_TIMEOUT_MS, ConfigError, LakehouseConfig

ICEBERG_RUNTIME_JAR = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
# Built by `make setup` (scripts/build_iceberg_jars.sh): the relocated Jackson the runtime jar lacks.
JACKSON_RELOCATED_JAR = "iceberg-jackson-relocated-2.15.2.jar"
SQLITE_JDBC_JAR = Path("/usr/share/java/sqlite-jdbc.jar")
# Built by `make setup` (lakehouse/local/class_archive.py): Spark's classes, ready to map.
LOCAL_CLASS_ARCHIVE = Path(sys.prefix) / "share" / "lakehouse" / "jvm" / "spark.jsa"
# G1 allocates an object of more than half a heap region (humongous) straight into old-generation
# regions of its own, and each such allocation may start a concurrent cycle. With the 2 MB regions
# of a 3 GB heap, every hash aggregation's 32 MB page, every broadcast's 4 MB block (one per stage:
# the task binary) and every 1 MB task-result chunk was one; in the streaming application they cost
# 3.9 of 4.5 s of GC pauses in its first 85 s. Regions of 16 MB and pages of 4 MB make them ordinary
# objects (issue 26).
LOCAL_G1_REGION_BYTES = 16 << 20
LOCAL_PAGE_BYTES = 4 << 20
LOCAL_DRIVER_JAVA_OPTIONS = f"-Duser.timezone=UTC -XX:+UseG1GC -XX:G1HeapRegionSize={LOCAL_G1_REGION_BYTES}"


def local_spark_jars() -> tuple[str, ...]:
    """Iceberg runtime (from the PyPI wheel), relocated Jackson (built at setup), SQLite JDBC."""
    spec = importlib.util.find_spec("snowpark_connect_deps_iceberg")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("Iceberg jars not installed: run `make setup`")
    runtime = Path(next(iter(spec.submodule_search_locations))) / "jars" / ICEBERG_RUNTIME_JAR
    jackson = Path(sys.prefix) / "share" / "lakehouse" / "jars" / JACKSON_RELOCATED_JAR
    for jar, fix in (
        (runtime, "reinstall the venv with `make setup`"),
        (jackson, "build it with `make setup`"),
        (SQLITE_JDBC_JAR, "install Debian package libxerial-sqlite-jdbc-java (`make setup`)"),
    ):
        if not jar.exists():
            raise ConfigError(f"missing Spark jar {jar}: {fix}")
    return (str(runtime), str(jackson), str(SQLITE_JDBC_JAR))


def class_archive_options(archive: Path) -> tuple[str, ...]:
    """JVM options that map Spark's classes from `archive` (a CDS archive: a local job starts about
    3 s sooner) when it exists. A JVM that cannot use it (a JDK or Spark upgrade since `make setup`)
    says so on stderr, not stdout (which some jobs print JSON to), and starts as without it."""
    if not archive.is_file():
        return ()
    return (f"-XX:SharedArchiveFile={archive}", "-Xlog:cds*=off", "-Xlog:cds*=warning:stderr")


def spark_conf(config: LakehouseConfig) -> dict[str, str]:
    """Every Spark setting the jobs depend on, derived from the config alone."""
    cat = f"spark.sql.catalog.{config.catalog.name}"
    conf = {
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        cat: "org.apache.iceberg.spark.SparkCatalog",
        # Jobs in other processes commit to the same tables; always read the latest metadata.
        f"{cat}.cache-enabled": "false",
        "spark.sql.defaultCatalog": config.catalog.name,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(config.spark.shuffle_partitions),
    }
    if config.catalog.kind == "jdbc-sqlite":
        conf.update(
            {
                f"{cat}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
                f"{cat}.warehouse": config.catalog.warehouse or "",
                f"{cat}.uri": config.catalog.jdbc_uri or "",
                # Schema created by `lakehouse local up` (see lakehouse/local/catalog.py for why).
                f"{cat}.jdbc.init-catalog-tables": "false",
                # Passed to the SQLite driver: wait for a lock instead of failing the commit.
                f"{cat}.jdbc.busy_timeout": str(SQLITE_BUSY_TIMEOUT_MS),
                # On the class path rather than in `spark.jars` (a loader of Spark's own): the local
                # master runs executors in the driver's JVM, and the class archive holds only
                # classes of the class path.
                "spark.driver.extraClassPath": ":".join(config.spark.jars or local_spark_jars()),
                "spark.driver.memory": config.spark.driver_memory,
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.adaptive.coalescePartitions.enabled": "true",
                # Spark's default page: execution memory / cores / 16, rounded up to a power of two (32 MB for
                # a 3 GB heap on 2 cores); see LOCAL_G1_REGION_BYTES.
                "spark.buffer.pageSize": str(LOCAL_PAGE_BYTES),
                "spark.driver.extraJavaOptions": " ".join(
                    (LOCAL_DRIVER_JAVA_OPTIONS, *class_archive_options(LOCAL_CLASS_ARCHIVE))
                ),
            }
        )
    # On EMR the cluster's classifications own the catalog: `iceberg-defaults` puts the Iceberg jar
    # on the class path and `spark-defaults` defines `lakehouse` (GlueCatalog, S3FileIO, warehouse,
    # region; infra/constructs/emr_compute.py). A job adding its own implementation key would clash
    # with them (Iceberg refuses `type` beside `catalog-impl`), so it adds none.
    return conf


def require_cluster_catalog(spark, config: LakehouseConfig) -> None:
    """On EMR, fail with the fix when the cluster defines no implementation for the catalog."""
    prefix = f"spark.sql.catalog.{config.catalog.name}"
    defined = [key for key in (f"{prefix}.catalog-impl", f"{prefix}.type") if spark.conf.get(key, None)]
    if not defined:
        raise ConfigError(
            f"the cluster's spark-defaults define no `{config.catalog.name}` catalog "
            f"({prefix}.catalog-impl): run the job on the cluster the Compute stack creates "
            "(its spark-defaults classification defines the catalog)"
        )
    if len(defined) > 1:
        raise ConfigError(f"both {defined[0]} and {defined[1]} are set; Iceberg accepts only one of them")


def build_spark(config: LakehouseConfig, app_name: str, extra_conf: Mapping[str, str] | None = None):
    """Create (or reuse) the SparkSession for `config`. Jobs never build sessions themselves."""
    from pyspark.sql import SparkSession

    if config.spark.master and config.spark.master.startswith("local"):
        # Python workers must run this venv's interpreter (confluent-kafka, pyarrow live here);
        # PySpark reads only the env var for that, not `spark.pyspark.python`.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if config.spark.master:
        builder = builder.master(config.spark.master)
    for key, value in {**spark_conf(config), **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not config.is_local:
        require_cluster_catalog(spark, config)
    return spark


def stop_spark(spark) -> None:
    """Stop Spark and py4j's callback server (started for commit properties on SQL writes): its
    threads would otherwise keep the process alive after main returns."""
    gateway = spark.sparkContext._gateway
    if gateway is not None and gateway._callback_server is not None:
        gateway.shutdown_callback_server()
    spark.stop()
