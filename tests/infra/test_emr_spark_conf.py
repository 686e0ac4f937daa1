"""The cluster's spark-defaults (from the synthesized template) and a job's own conf, merged as Spark
merges them on EMR, open the `lakehouse` catalog with real Iceberg code.

The unit twin of the rehearsal (tests/infra/test_rehearsal.py): same rendering and substitutions,
one catalog access instead of the whole pipeline. It caught the bug where the cluster set
`catalog-impl` and the job `type`, which Iceberg refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.common.spark_session import local_spark_jars, spark_conf
from jobs.config import CATALOG_NAME, LakehouseConfig
from lakehouse.local.catalog import ensure_catalog
from lakehouse.rehearsal.assembly import CloudAssembly, Resolver
from lakehouse.rehearsal.emr_node import cluster_configurations, install_iceberg_jars, render_spark_defaults
from lakehouse.rehearsal.glue import glue_namespaces
from lakehouse.rehearsal.substitutions import (
    PSEUDO_PARAMETERS,
    LocalEndpoints,
    Substitutions,
)

OPEN_CATALOG = """
import json, sys
from pyspark.sql import SparkSession
builder = SparkSession.builder.master("local[1]").appName("emr-conf-twin")
for key, value in json.loads(sys.argv[1]).items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
print(sorted(r[0] for r in spark.sql("SHOW NAMESPACES IN lakehouse").collect()))
spark.sql("CREATE TABLE lakehouse.dim_db.twin_probe (id INT) USING iceberg")
print(spark.sql("SELECT count(*) FROM lakehouse.dim_db.twin_probe").collect()[0][0])
"""


def _substitutions(tmp_path: Path) -> Substitutions:
    local = LocalEndpoints(
        s3_root=tmp_path / "s3",
        node_root=tmp_path / "node",
        mysql_host="127.0.0.1",
        mysql_port=3306,
        mysql_ca="/nonexistent/ca.pem",
        kafka_bootstrap="127.0.0.1:9092",
        catalog_jdbc_uri=f"jdbc:sqlite:{tmp_path / 'catalog.db'}",
        spark_master="local[1]",
        executor_memory="1g",
        executor_cores=1,
    )
    return Substitutions(local=local, make_secret=lambda resource: f"arn:secret:{resource.logical_id}")


def job_settings(assembly: CloudAssembly, resolver: Resolver) -> dict:
    """The arguments of LakehouseConfig.aws the deployment publishes (SSM parameter)."""
    (parameter,) = [
        p
        for p in assembly.resources("AWS::SSM::Parameter")
        if p.properties["Name"].endswith("/jobs/settings")
    ]
    return json.loads(resolver.resolve(parameter.stack, parameter.properties["Value"]))


@pytest.mark.timeout(180)
def test_cluster_defaults_and_the_job_conf_open_the_catalog(dev, tmp_path):
    assembly = CloudAssembly(dev.outdir)
    subs = _substitutions(tmp_path)
    resolver = Resolver(assembly, PSEUDO_PARAMETERS, subs.resource_value)
    defaults = render_spark_defaults(
        cluster_configurations(assembly, resolver),
        subs,
        iceberg_classpath=install_iceberg_jars(tmp_path / "node", local_spark_jars()),
        catalog_jdbc_uri=subs.local.catalog_jdbc_uri,
    )
    settings = job_settings(assembly, resolver)
    job = spark_conf(LakehouseConfig.aws(**settings))
    # Spark: what the application sets wins over spark-defaults.conf, key by key.
    merged = {**defaults, **job, "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1"}
    merged.pop("spark.master")
    catalog_keys = sorted(k for k in merged if k.startswith(f"spark.sql.catalog.{CATALOG_NAME}."))
    ensure_catalog(tmp_path / "catalog.db", tmp_path, glue_namespaces(assembly, resolver, subs))

    result = subprocess.run(
        [sys.executable, "-c", OPEN_CATALOG, json.dumps(merged)], capture_output=True, text=True, timeout=170
    )

    assert result.returncode == 0, f"catalog keys {catalog_keys}\n{result.stderr[-3000:]}"
    assert "['ads_behavior', 'dim_db', 'ods_behavior']" in result.stdout
    # The warehouse is the template's bucket, as a folder: the table's files landed there.
    warehouse_bucket = (
        subs.local.s3_root / f"lakehouse-dev-warehouse-{PSEUDO_PARAMETERS['AWS::AccountId']}-eu-west-1"
    )
    assert list(warehouse_bucket.rglob("twin_probe/metadata/*.metadata.json"))
