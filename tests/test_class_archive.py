"""The JVM class archive `make setup` builds (lakehouse/local/class_archive.py): the local jobs' JVM
maps it, and an archive that does not fit costs only the gain, never a job or its stdout."""

from __future__ import annotations

import subprocess
import sys

from jobs.common.spark_session import LOCAL_CLASS_ARCHIVE, class_archive_options
from lakehouse.local import class_archive

MAPPED_RUN = """
import sys
from pathlib import Path
from lakehouse.local.class_archive import exercise, scratch_session

# The jobs' own driver options, with -Xshare:on: a JVM that cannot map the archive does not start.
spark = scratch_session(Path(sys.argv[1]), sys.argv[2] + " -Xshare:on")
exercise(spark)
print("exercised")
spark.stop()
"""


def test_the_local_jobs_jvm_maps_the_archive_setup_built(tmp_path):
    assert LOCAL_CLASS_ARCHIVE.is_file(), f"no {LOCAL_CLASS_ARCHIVE}: `make setup` builds it"
    from jobs.common.spark_session import spark_conf
    from jobs.config import CatalogConfig, KafkaConfig, LakehouseConfig, MySqlConfig, SparkConfig

    local = LakehouseConfig(
        env="local",
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"),
        mysql=MySqlConfig(host="127.0.0.1", port=9),
        catalog=CatalogConfig(
            warehouse=str(tmp_path / "warehouse"), sqlite_path=str(tmp_path / "catalog.db")
        ),
        spark=SparkConfig(),
    )
    options = spark_conf(local)["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={LOCAL_CLASS_ARCHIVE}" in options
    result = subprocess.run(
        [sys.executable, "-c", MAPPED_RUN, str(tmp_path), options],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0 and "exercised" in result.stdout, result.stderr[-3000:]


def test_an_archive_that_does_not_fit_warns_on_stderr_and_the_jvm_runs(tmp_path):
    """The archive on another class path (as after a Spark upgrade, before `make setup`)."""
    result = subprocess.run(
        ["java", *class_archive_options(LOCAL_CLASS_ARCHIVE), "-cp", str(tmp_path), "-version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # jobs print JSON there (`verify --json`)
    assert "Unable to use shared archive" in result.stderr and "openjdk version" in result.stderr
    assert class_archive_options(tmp_path / "missing.jsa") == ()


def test_setup_keeps_an_archive_that_fits(tmp_path, monkeypatch):
    """`make setup` runs on every `make test`: an archive that fits is not dumped again."""
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"dumped earlier")
    (tmp_path / "spark.jsa.fingerprint").write_text("jdk 17.0.15, jars as they were")
    monkeypatch.setattr(class_archive, "fingerprint", lambda: "jdk 17.0.15, jars as they were")
    assert class_archive.ensure(archive, log=lambda _msg: None) is False
    assert archive.read_bytes() == b"dumped earlier"
