"""The local Iceberg catalog: one SQLite file read and written by Spark, pyiceberg and DuckDB."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from decimal import Decimal

from support import run_cli

from lakehouse.local import catalog

TABLE = "lakehouse.dim_db.catalog_probe"


def test_catalog_runs_in_wal_mode_with_the_project_namespaces(local_stack):
    path = local_stack.settings.catalog_path
    assert catalog.journal_mode(path) == "wal"
    assert set(catalog.namespaces(path)) >= {"dim_db", "ods_behavior", "ads_behavior"}


def test_spark_merge_is_read_back_by_pyiceberg_and_lakehouse_sql(spark, pyiceberg_catalog):
    spark.sql(f"DROP TABLE IF EXISTS {TABLE}")
    spark.sql(
        f"CREATE TABLE {TABLE} (productId string, name string, product_price decimal(10,4)) "
        "USING iceberg TBLPROPERTIES ('format-version'='2')"
    )
    spark.sql(f"INSERT INTO {TABLE} VALUES ('1', 'test01', 11.11), ('2', 'test02', 11.11)")
    spark.sql(
        f"""MERGE INTO {TABLE} t
            USING (SELECT '2' AS productId, 'test02' AS name, CAST(8.1 AS decimal(10,4)) AS product_price
                   UNION ALL SELECT '3', 'test03', CAST(5 AS decimal(10,4))) s
            ON t.productId = s.productId
            WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"""
    )
    expected = [
        ("1", "test01", Decimal("11.1100")),
        ("2", "test02", Decimal("8.1000")),
        ("3", "test03", Decimal("5.0000")),
    ]
    via_spark = [tuple(r) for r in spark.sql(f"SELECT * FROM {TABLE} ORDER BY productId").collect()]
    assert via_spark == expected

    arrow = pyiceberg_catalog.load_table("dim_db.catalog_probe").scan().to_arrow().sort_by("productId")
    assert list(zip(*arrow.to_pydict().values(), strict=True)) == expected

    result = run_cli("sql", "select * from dim_db.catalog_probe order by productId", "--format", "json")
    rows = json.loads(result.stdout)
    assert [(r["productId"], r["name"], Decimal(r["product_price"])) for r in rows] == expected


WRITER = """
import sys
from jobs.config import LakehouseConfig
from jobs.common.spark_session import build_spark
worker, batches = int(sys.argv[1]), int(sys.argv[2])
spark = build_spark(LakehouseConfig.local(), f"writer-{worker}", {"spark.driver.memory": "1g"})
for batch in range(batches):
    spark.sql(f"INSERT INTO lakehouse.ods_behavior.concurrent_commits VALUES ({worker}, {batch})")
"""


def test_concurrent_commits_from_several_processes_all_land(local_stack, spark, tmp_path):
    """Separate Spark processes (as ingest, CDC, views and maintenance are) commit at the same time."""
    table = "lakehouse.ods_behavior.concurrent_commits"
    spark.sql(f"DROP TABLE IF EXISTS {table}")
    spark.sql(
        f"CREATE TABLE {table} (writer int, batch int) USING iceberg "
        "TBLPROPERTIES ('format-version'='2', 'commit.retry.num-retries'='50', "
        "'commit.retry.min-wait-ms'='20')"
    )
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writers, batches = 2, 15
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(w), str(batches)], stderr=subprocess.PIPE, text=True
        )
        for w in range(writers)
    ]
    for batch in range(batches):  # this process commits while the others do
        spark.sql(f"INSERT INTO {table} VALUES (99, {batch})")
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]

    rows = spark.sql(f"SELECT writer, batch FROM {table}").collect()
    got = sorted((r.writer, r.batch) for r in rows)
    want = sorted([(w, b) for w in [*range(writers), 99] for b in range(batches)])
    assert got == want
    snapshots = spark.sql(f"SELECT count(*) FROM {table}.snapshots").collect()[0][0]
    assert snapshots == (writers + 1) * batches
    with sqlite3.connect(local_stack.settings.catalog_path) as conn:  # the catalog is still consistent
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
