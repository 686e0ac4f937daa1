"""The products dimension the ingest joins with: `lakehouse.dim_db.products`, owned by the CDC job.

If the ingest starts before the CDC job ever loaded it, the ingest creates it (with the CDC job's
exact schema) and loads it once from MySQL, so events are enriched from the first batch.
"""

from __future__ import annotations

import json
import logging
from decimal import Decimal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, StringType, StructField, StructType, TimestampType

from jobs.common.lake_tables import products_table_ddl
from jobs.config import LakehouseConfig, MySqlConfig

log = logging.getLogger(__name__)

PRODUCTS_SCHEMA = StructType(
    [
        StructField("productId", StringType(), False),
        StructField("name", StringType(), True),
        StructField("description", StringType(), True),
        StructField("product_price", DecimalType(10, 4), True),
        StructField("update_time", TimestampType(), True),
    ]
)


def read_products(spark: SparkSession, table: str) -> DataFrame:
    """The dimension as of now (the catalog cache is off, so every call sees the latest snapshot)."""
    return spark.table(table)


def _mysql_credentials(mysql: MySqlConfig, region: str | None) -> tuple[str, str]:
    if mysql.user and mysql.password:
        return mysql.user, mysql.password
    if mysql.cdc_secret_id:
        import boto3

        secret = boto3.client("secretsmanager", region_name=region).get_secret_value(
            SecretId=mysql.cdc_secret_id
        )
        values = json.loads(secret["SecretString"])
        return values["username"], values["password"]
    raise RuntimeError(
        "no MySQL credentials in the config: run `lakehouse local up` (local) or pass "
        "--mysql-cdc-secret-id (AWS)"
    )


def fetch_source_products(config: LakehouseConfig) -> list[tuple]:
    import pymysql

    user, password = _mysql_credentials(config.mysql, config.region)
    try:
        connection = pymysql.connect(
            host=config.mysql.host,
            port=config.mysql.port,
            user=user,
            password=password,
            database=config.mysql.database,
            connect_timeout=10,
            **config.mysql.tls_options(),
        )
    except pymysql.err.OperationalError as exc:
        raise RuntimeError(
            f"MySQL at {config.mysql.host}:{config.mysql.port} unreachable ({exc}): "
            "run `lakehouse local up` (local) or check the database"
        ) from exc
    with connection, connection.cursor() as cursor:
        cursor.execute("SELECT productId, name, description, product_price, update_time FROM products")
        return [
            (str(pid), name, desc, None if price is None else Decimal(price), updated)
            for pid, name, desc, price, updated in cursor.fetchall()
        ]


def ensure_products_dimension(spark: SparkSession, config: LakehouseConfig, table: str) -> None:
    """Create and load the dimension from MySQL if nobody has written it yet.

    The CDC job may be loading it at the same moment (its initial snapshot). The load therefore
    commits only while the table has never been written: a serializable overwrite with no starting
    snapshot fails validation if any commit landed meanwhile, and then the CDC job's load stands.
    """
    if spark.catalog.tableExists(table) and _has_snapshot(spark, table):
        return
    for statement in products_table_ddl(table):
        spark.sql(statement)
    if _has_snapshot(spark, table):
        return
    rows = fetch_source_products(config)
    load = spark.createDataFrame(rows, PRODUCTS_SCHEMA).writeTo(table)
    try:
        load.option("isolation-level", "serializable").overwrite(F.lit(True))
    except Exception as exc:  # noqa: BLE001 - py4j wraps Iceberg's ValidationException
        if "Found conflicting files" not in str(exc):
            raise
        log.info("%s was loaded by another job (the CDC job) meanwhile; using that", table)
        return
    log.info("created %s and loaded %d products from MySQL (the CDC job keeps it current)", table, len(rows))


def _has_snapshot(spark: SparkSession, table: str) -> bool:
    return bool(spark.sql(f"SELECT 1 FROM {table}.snapshots LIMIT 1").collect())
