"""`lakehouse demo`: the main job on the embedded stack — bring it up and show the lake answering.

Until the streaming jobs are composed into the full scenario (views, report, maintenance), the
demo starts the stack and runs smoke queries through the same paths the pipeline uses: the MySQL
source, the Kafka topic and the Iceberg catalog (Spark writes, DuckDB reads).
"""

from __future__ import annotations

import time

from rich.console import Console

from lakehouse import adhoc_sql
from lakehouse.config import LakehouseConfig
from lakehouse.local.mariadb import APP_USER
from lakehouse.local.settings import StackSettings
from lakehouse.local.stack import LocalStack

SMOKE_TABLE = "lakehouse.ads_behavior.demo_smoke"


def run_demo(console: Console) -> None:
    began = time.monotonic()
    settings = StackSettings.resolve()
    stack = LocalStack(settings)
    console.rule("1. local stack")
    state = stack.up(progress=lambda msg: console.print(f"  {msg}"))
    config = LakehouseConfig.local(settings.home)

    console.rule("2. source database (MariaDB, binlog on)")
    conn = stack.mariadb.connect(APP_USER, state["mysql"]["password"])
    with conn, conn.cursor() as cur:
        cur.execute("SELECT productId, name, product_price FROM products ORDER BY productId")
        products = cur.fetchall()
    console.print(f"  user_db.products has {len(products)} rows, e.g. {products[0]}")

    console.rule("3. Spark writes an Iceberg table in the local catalog")
    from jobs.spark_session import build_spark

    spark = build_spark(config, "lakehouse-demo")
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {SMOKE_TABLE} (productId string, name string, "
        "product_price decimal(10,4), loaded_at timestamp) USING iceberg "
        "TBLPROPERTIES ('format-version'='2')"
    )
    frame = spark.createDataFrame(
        [(p, n, price) for p, n, price in products],
        "productId string, name string, product_price decimal(10,4)",
    ).selectExpr("*", "current_timestamp() AS loaded_at")
    frame.writeTo(SMOKE_TABLE).overwritePartitions()
    spark.stop()

    console.rule("4. ad-hoc query (DuckDB over the Iceberg metadata: `lakehouse sql`)")
    query = "SELECT productId, name, product_price FROM ads_behavior.demo_smoke ORDER BY productId LIMIT 5"
    console.print(f'  $ lakehouse sql "{query}"')
    result = adhoc_sql.query_duckdb(config, query, settings.home / "duckdb_extensions")
    console.print(adhoc_sql.rich_table(result))
    console.print(
        f"[green]demo done[/] in {time.monotonic() - began:.0f}s; the stack is still up "
        "(`lakehouse local status`, `lakehouse local down`)."
    )
