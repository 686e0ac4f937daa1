"""The lake's tables that more than one job touches: their ids, the shared DDL, the Kafka lineage
the click tables carry (each row's partition and offset; the ingest's progress key), and how a job
reaches any table's Iceberg metadata in the driver."""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from jobs.common import progress_keys

FACT_TABLE = ("ods_behavior", "clickevent")  # written by ingest, read by views and report
REJECTS_TABLE = ("ods_behavior", "clickevent_rejects")
PRODUCTS_TABLE = ("dim_db", "products")  # written by cdc, read by ingest and report
MEMBERS_TABLE = ("dim_db", "user_member")  # written by cdc, read by report
VIEWS_TABLE = ("ads_behavior", "product_views")  # written by views
REPORT_TABLE = ("ads_behavior", "member_daily_report")  # written by report


def load_iceberg_table(spark, ident: str):
    """The Iceberg Java table `ident` (org.apache.iceberg.Table), freshly loaded: the catalogs cache
    no tables, so its metadata is the latest committed. Reads of it (snapshots, summaries, schema)
    run in the driver, with no Spark job."""
    return spark.sparkContext._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
        spark._jsparkSession, ident
    )


# Snapshot-summary key holding `{"<topic>": {"<partition>": next_offset, ...}}`.
OFFSETS_KEY = progress_keys.KAFKA_OFFSETS
# Summary key of a fact-table commit by `jobs/replay` (rejects that pass now): its id, records and
# reasons. Lineage, not progress: not a `lakehouse.` key, so expiry treats it as any data commit.
# The views job counts what such a commit appended below its watermark.
REPLAY_KEY = "lineage.replay"
# Summary key of a commit by `lakehouse verify --repair` (a dimension's keys; in the click tables,
# offsets re-read from the topic and duplicates removed). On a click table it names the offset
# ranges it touched (`ranges`) and their bounds (`below`): the views job counts the difference the
# commit made below its watermark, and the ingest validates past it like a replay.
REPAIR_KEY = "lineage.verify-repair"
BELOW_OFFSETS_KEYS = (REPLAY_KEY, REPAIR_KEY)


def replayed_below(summary: dict, offsets: dict[int, int]) -> bool:
    """A replay or click repair commit whose rows all lie below `offsets` (its `below`: partition ->
    highest offset + 1), so an ingest at `offsets` can never read them again."""
    if OFFSETS_KEY in summary:
        return False
    for key in BELOW_OFFSETS_KEYS:
        lineage = json.loads(summary.get(key) or "null")
        if isinstance(lineage, dict) and lineage.get("below"):
            return all(int(end) <= offsets.get(int(p), 0) for p, end in lineage["below"].items())
    return False


def offsets_from_summary(value: str | None, topic: str) -> dict[int, int]:
    """The value under OFFSETS_KEY -> {partition: next offset} for `topic` ({} when unset)."""
    if not value:
        return {}
    return {int(p): int(o) for p, o in json.loads(value).get(topic, {}).items()}


def offsets_summary(topic: str, offsets: dict[int, int]) -> str:
    return json.dumps({topic: {str(p): offsets[p] for p in sorted(offsets)}}, separators=(",", ":"))


# Applies to both tables: metadata files are cleaned up on commit, and several writers (this job,
# compaction, the CDC and view jobs) may race, so commits retry more than the default 4 times.
COMMON_PROPERTIES = {
    "format-version": "2",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
    "commit.retry.num-retries": "20",
    "commit.retry.min-wait-ms": "50",
    "write.parquet.compression-codec": "zstd",
}


def _properties_sql(properties: dict[str, str]) -> str:
    return ", ".join(f"'{k}'='{v}'" for k, v in properties.items())


def fact_table_ddl(table: str) -> list[str]:
    # Note: partitioned by the event's own day (not processing day) so late events land where
    # queries look for them; sorted by productId then time within each file for pruning.
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
              webpageId int, uid string, productId string, cookieId string, expendTime int,
              eventTime timestamp, name string, product_price decimal(10,4), dt string,
              kafka_partition int, kafka_offset bigint, ingested_at timestamp)
            USING iceberg
            PARTITIONED BY (days(eventTime))
            TBLPROPERTIES ({_properties_sql(COMMON_PROPERTIES)})""",
        f"ALTER TABLE {table} WRITE LOCALLY ORDERED BY productId, eventTime",
    ]


def rejects_table_ddl(table: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
              raw_payload string, payload_is_base64 boolean, reason string,
              kafka_partition int, kafka_offset bigint, ingested_at timestamp)
            USING iceberg
            PARTITIONED BY (days(ingested_at))
            TBLPROPERTIES ({_properties_sql(COMMON_PROPERTIES)})""",
    ]


def products_table_ddl(table: str) -> list[str]:
    # Owned by the CDC job (issue 4); created here only when missing, with exactly its schema.
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
              productId string NOT NULL, name string, description string,
              product_price decimal(10,4), update_time timestamp)
            USING iceberg
            TBLPROPERTIES ('format-version'='2')""",
        f"ALTER TABLE {table} SET IDENTIFIER FIELDS productId",
    ]


def offsets_at_or_after(starts: dict[int, int]) -> Column:
    """Rows whose offset is at or after their partition's start (drops what a table already has)."""
    condition = F.lit(False)
    for partition, start in starts.items():
        condition = condition | ((F.col("kafka_partition") == partition) & (F.col("kafka_offset") >= start))
    return condition


def in_offset_ranges(rows: DataFrame, ranges: list[tuple[int, int, int]]) -> DataFrame:
    """The click rows whose (kafka_partition, kafka_offset) lies in one of `ranges` ((partition,
    first, last)): a join with the ranges as a small broadcast table (thousands of scattered pieces
    would make one filter expression too deep to plan), after a coarse filter Iceberg can prune
    data files by (the partitions and the offsets' overall bounds)."""
    if not ranges:
        return rows.where(F.lit(False))
    spark = rows.sparkSession
    pieces = spark.createDataFrame(
        [(p, first, last) for p, first, last in ranges], "_p int, _first long, _last long"
    )
    coarse = F.col("kafka_partition").isin(sorted({p for p, _, _ in ranges})) & F.col("kafka_offset").between(
        min(first for _, first, _ in ranges), max(last for _, _, last in ranges)
    )
    within = (
        (F.col("kafka_partition") == F.col("_p"))
        & (F.col("kafka_offset") >= F.col("_first"))
        & (F.col("kafka_offset") <= F.col("_last"))
    )
    return rows.where(coarse).join(F.broadcast(pieces), within, "left_semi")
