"""The JVM class archive of the local Spark jobs, built by `make setup` (JDK 17 dynamic CDS).

Every local job starts a JVM that loads Spark's classes, one by one from its jars, before it does
any work. A class archive dumped once from a run of the jobs' own code paths (session, Iceberg DDL,
an append, a MERGE, an aggregation, a maintenance procedure) lets each later JVM map those classes
instead. Measured on the 2-core box (`python -m bench jvm_start`): a new job process up to its
first Iceberg statements took 11.0-13.0 s without it and 8.3-8.8 s with it.

The archive fits only the JDK build and the Spark jars it was dumped with. Their fingerprint is kept
beside it, and setup dumps it again when it changes. A JVM given an archive that does not fit warns
on stderr and starts without it: a stale archive costs the gain, never a job.

    python -m lakehouse.local.class_archive           build it unless it is up to date
    python -m lakehouse.local.class_archive --remove  go back to starting without it
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from jobs.common.spark_session import LOCAL_CLASS_ARCHIVE, LOCAL_DRIVER_JAVA_OPTIONS, local_spark_jars
from jobs.config import ConfigError

# What the dump run does: the statements behind the local jobs' first seconds.
EXERCISE = (
    "CREATE TABLE lakehouse.dim_db.class_archive_probe (id INT, name STRING, price DECIMAL(10,2), "
    "at TIMESTAMP) USING iceberg PARTITIONED BY (days(at))",
    "INSERT INTO lakehouse.dim_db.class_archive_probe VALUES (1, 'a', 1.50, TIMESTAMP '2026-01-01 00:00:00')",
    "MERGE INTO lakehouse.dim_db.class_archive_probe t USING (SELECT 1 AS id, 'b' AS name, "
    "CAST(2.5 AS DECIMAL(10,2)) AS price, TIMESTAMP '2026-01-02 00:00:00' AS at) s ON t.id = s.id "
    "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
    "SELECT name, count(*), sum(price) FROM lakehouse.dim_db.class_archive_probe GROUP BY name",
    "SELECT * FROM lakehouse.dim_db.class_archive_probe.snapshots",
    "CALL lakehouse.system.rewrite_data_files(table => 'dim_db.class_archive_probe')",
)


class ArchiveFailed(RuntimeError):
    pass


def fingerprint() -> str:
    """What the archive fits: the JDK build and the class path's jars (the JVM checks each jar's
    size and modification time, so a reinstall of the same version needs a new archive too)."""
    import pyspark

    java = subprocess.run([_java(), "-version"], capture_output=True, text=True, check=True).stderr
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar")) + [
        Path(j) for j in local_spark_jars()
    ]
    described = {"java": java, "jars": [(str(j), j.stat().st_size, j.stat().st_mtime_ns) for j in jars]}
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()


def _java() -> str:
    """The java Spark starts (`spark-class`: `$JAVA_HOME/bin/java`, else the one on PATH)."""
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


def ensure(archive: Path = LOCAL_CLASS_ARCHIVE, log: Callable[[str], None] = print) -> bool:
    """Build `archive` unless the one there fits this JDK and these jars; True when built."""
    key_file = archive.with_name(archive.name + ".fingerprint")
    key = fingerprint()
    if archive.is_file() and key_file.is_file() and key_file.read_text() == key:
        log(f"JVM class archive up to date: {archive}")
        return False
    log("building the JVM class archive of the local Spark jobs (once; about 30 s)")
    began = time.monotonic()
    archive.parent.mkdir(parents=True, exist_ok=True)
    dumped = archive.with_name(f".{archive.name}.{os.getpid()}")
    try:
        with tempfile.TemporaryDirectory(prefix="class-archive-") as scratch:
            child = ["-m", "lakehouse.local.class_archive", "--dump-to", str(dumped), "--scratch", scratch]
            # A session of its own: on a timeout the JVM it started goes too.
            run = subprocess.Popen(
                [sys.executable, *child],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            try:
                _, errors = run.communicate(timeout=600)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                run.communicate()
                raise ArchiveFailed("the dump run took over 10 minutes; stopped") from None
        if run.returncode != 0 or not dumped.is_file():
            raise ArchiveFailed(
                f"the dump run exited {run.returncode}; local jobs still work, only start slower:\n"
                f"{errors[-3000:]}"
            )
        # A rename: JVMs running now keep the file they mapped.
        dumped.replace(archive)
        key_file.write_text(key)
    finally:
        dumped.unlink(missing_ok=True)
    log(f"  {archive} ({archive.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - began:.0f} s")
    return True


def remove(archive: Path = LOCAL_CLASS_ARCHIVE) -> None:
    archive.unlink(missing_ok=True)
    archive.with_name(archive.name + ".fingerprint").unlink(missing_ok=True)


def scratch_session(scratch: Path, java_options: str):
    """A local Spark session on a fresh catalog in `scratch`, its driver JVM run with `java_options`."""
    from jobs.common.spark_session import build_spark
    from jobs.config import CatalogConfig, KafkaConfig, LakehouseConfig, MySqlConfig, SparkConfig
    from lakehouse.local.catalog import ensure_catalog

    catalog, warehouse = scratch / "catalog.db", scratch / "warehouse"
    ensure_catalog(catalog, warehouse)
    config = LakehouseConfig(
        env="local",
        # Never contacted: only the scratch catalog is used.
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"),
        mysql=MySqlConfig(host="127.0.0.1", port=9),
        catalog=CatalogConfig(warehouse=str(warehouse), sqlite_path=str(catalog)),
        spark=SparkConfig(master="local[2]"),
        checkpoint_dir=str(scratch / "checkpoints"),
    )
    return build_spark(config, "class-archive", {"spark.driver.extraJavaOptions": java_options})


def exercise(spark) -> None:
    for statement in EXERCISE:
        spark.sql(statement).collect()
    spark.createDataFrame([(2, "c")], "id INT, name STRING").toPandas()  # the jobs' Arrow path


def dump_run(target: Path, scratch: Path) -> None:
    """The run whose loaded classes the JVM writes to `target` as it exits (a child of `ensure`)."""
    from jobs.common.spark_session import stop_spark

    spark = scratch_session(scratch, f"{LOCAL_DRIVER_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={target}")
    jvm = spark.sparkContext._gateway.proc  # spark-submit execs the JVM: this is its process
    try:
        exercise(spark)
    finally:
        stop_spark(spark)
    # The JVM exits when its stdin closes and writes the archive as it exits: wait for it.
    jvm.stdin.close()
    if jvm.wait(timeout=300) != 0:
        raise SystemExit(f"the JVM exited {jvm.returncode} while writing the archive")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lakehouse.local.class_archive", description=__doc__)
    parser.add_argument("--remove", action="store_true", help="delete the archive: jobs start without it")
    parser.add_argument("--dump-to", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump_to:
        dump_run(args.dump_to, args.scratch)
        return 0
    if args.remove:
        remove()
        return 0
    try:
        ensure()
    except (ArchiveFailed, ConfigError, OSError, subprocess.SubprocessError) as exc:
        print(f"warning: no JVM class archive: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
