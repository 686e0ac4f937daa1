"""Kafka -> clickevent + rejects: every offset the ingest says it read is in exactly one table, once.

Per partition, the offsets from the first one the lake or the topic holds (whichever is lower) up
to the lower of the two tables' stored offsets (`lakehouse.kafka.offsets`; the rejects commit every
10 s, so their stored offsets may trail the fact table's) must each appear exactly once across the
two tables. Reported as offset ranges: missing (in neither table; split at the earliest offset the
topic still holds, since only those can be read again), duplicate (more than one row), and rows past
their own table's stored offsets (no ingest commit writes those).

Checking below the topic's retention within the lake alone relies on the producers not being
transactional: then every offset is a record, so the lake's offsets are contiguous. A
transactional producer's commit markers (and aborted records) occupy offsets no consumer sees; the
ingest would have to store the ranges it skipped for this check to stay exact past retention.
"""

from __future__ import annotations

import re

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from jobs.verify.clicks_repair import ClicksRepair
from jobs.verify.findings import CheckResult, Finding, ranges_text

Offsets = dict[int, int]  # partition -> offset

LOST_HINT = (
    "the ingest stored these offsets as read but neither table has them; the topic still holds them: "
    "`lakehouse verify --repair` reads them again beside the running ingest (or roll the fact table "
    "back to a snapshot from before the loss, "
    "`CALL lakehouse.system.rollback_to_snapshot('ods_behavior.clickevent', <id>)` with ids in "
    "`ods_behavior.clickevent.history`, and run the ingest again: it resumes from that snapshot's offsets)"
)
DUPLICATE_HINT = (
    "these offsets are stored more than once: below the stored offsets, `lakehouse verify --repair` keeps "
    "each one's first row "
    "(an offset in both tables it leaves to you: delete the row that is wrong by (kafka_partition, "
    "kafka_offset, ingested_at), or roll back to the snapshot before the one that added it, in "
    "`SELECT * FROM ods_behavior.clickevent.snapshots`)"
)
LOST_PROPERTY = "lakehouse.kafka.lost"  # table property `lakehouse.kafka.lost.<topic>.<partition>`
LOST_PAST_RETENTION_HINT = (
    "the ingest stored these offsets as read but neither table has them, and the topic no longer holds "
    "them: they cannot be read again. Find when they went (`ods_behavior.clickevent.snapshots`, the "
    "ingest's logs: `DATA LOST` means they expired before it read them); only the producer's side can "
    f"resend them. To record a loss you accept: `ALTER TABLE lakehouse.ods_behavior.clickevent SET "
    f"TBLPROPERTIES ('{LOST_PROPERTY}.<topic>.<partition>'='<first>-<last>[,…]')`; verify then notes it"
)
BEYOND_HINT = (
    "rows past the offsets their table stored: something other than the ingest appended them; find "
    "its snapshot in the table's `.snapshots` and roll back to the one before it"
)


def not_replayed(rejects: DataFrame, fact: DataFrame) -> DataFrame:
    """Rejects the fact table does not hold as replayed: a fact row with a reject's lineage that was
    ingested after it is its replay (`lakehouse replay-rejects`), and its offset is accounted for
    by that row. One ingested with it or before (one record written to both tables) is not."""
    r, f = rejects.alias("r"), fact.alias("f")
    replayed = (
        (F.col("r.kafka_partition") == F.col("f.kafka_partition"))
        & (F.col("r.kafka_offset") == F.col("f.kafka_offset"))
        & (F.col("f.ingested_at") > F.col("r.ingested_at"))
    )
    return r.join(f.select("kafka_partition", "kafka_offset", "ingested_at"), replayed, "left_anti")


def lineage(fact: DataFrame, rejects: DataFrame | None) -> DataFrame:
    """(kafka_partition, kafka_offset, in_table) of every row of both tables (replayed rejects
    once, as their fact rows)."""
    rows = fact.select("kafka_partition", "kafka_offset", F.lit("clickevent").alias("in_table"))
    if rejects is not None:
        rows = rows.unionByName(
            not_replayed(rejects, fact).select(
                "kafka_partition", "kafka_offset", F.lit("clickevent_rejects").alias("in_table")
            )
        )
    return rows


def _islands(offsets: DataFrame) -> DataFrame:
    """Consecutive offsets per partition -> (kafka_partition, first, last)."""
    order = Window.partitionBy("kafka_partition").orderBy("kafka_offset")
    return (
        offsets.withColumn("island", F.col("kafka_offset") - F.row_number().over(order))
        .groupBy("kafka_partition", "island")
        .agg(F.min("kafka_offset").alias("first"), F.max("kafka_offset").alias("last"))
        .drop("island")
    )


def duplicate_ranges(rows: DataFrame) -> DataFrame:
    """Offsets with more than one row (either table), as ranges."""
    repeated = rows.groupBy("kafka_partition", "kafka_offset").count().where("count > 1")
    return _islands(repeated.select("kafka_partition", "kafka_offset"))


def bounds_frame(spark: SparkSession, low: Offsets, high: Offsets) -> DataFrame:
    pairs = [(p, low.get(p, 0), high[p]) for p in sorted(high) if high[p] > low.get(p, 0)]
    return spark.createDataFrame(pairs, "kafka_partition int, low long, high long")


def missing_ranges(rows: DataFrame, bounds: DataFrame) -> DataFrame:
    """Offsets in [low, high) per partition that no row has, as ranges (two sentinels per partition
    mark the bounds, so gaps at either end show as well)."""
    present = (
        rows.join(bounds, "kafka_partition")
        .where((F.col("kafka_offset") >= F.col("low")) & (F.col("kafka_offset") < F.col("high")))
        .select("kafka_partition", "kafka_offset")
        .distinct()
    )
    sentinels = bounds.select("kafka_partition", (F.col("low") - 1).alias("kafka_offset")).unionByName(
        bounds.select("kafka_partition", F.col("high").alias("kafka_offset"))
    )
    order = Window.partitionBy("kafka_partition").orderBy("kafka_offset")
    return (
        present.unionByName(sentinels)
        .withColumn("next", F.lead("kafka_offset").over(order))
        .where(F.col("next") > F.col("kafka_offset") + 1)
        .select(
            "kafka_partition", (F.col("kafka_offset") + 1).alias("first"), (F.col("next") - 1).alias("last")
        )
    )


def beyond_stored(table_rows: DataFrame, stored: Offsets) -> DataFrame:
    """Rows of one table at or past that table's own stored offset (or of a partition it never stored)."""
    known = list(stored)
    condition = ~F.col("kafka_partition").isin(known) if known else F.lit(True)
    for partition, end in stored.items():
        condition = condition | ((F.col("kafka_partition") == partition) & (F.col("kafka_offset") >= end))
    return _islands(table_rows.where(condition).select("kafka_partition", "kafka_offset").distinct())


def _collect(ranges: DataFrame) -> list[tuple[int, int, int]]:
    return sorted((r["kafka_partition"], r["first"], r["last"]) for r in ranges.collect())


def _count(ranges: list[tuple[int, int, int]]) -> int:
    return sum(last - first + 1 for _, first, last in ranges)


def check_clicks(
    spark: SparkSession,
    fact: DataFrame,
    rejects: DataFrame | None,
    fact_stored: Offsets,
    rejects_stored: Offsets,
    earliest: Offsets,
    table: str,
    accepted: dict[int, list[tuple[int, int]]] | None = None,
    repairs: list[ClicksRepair] | None = None,
) -> CheckResult:
    """Compare the two tables' lineage with the offsets the ingest stored and the topic holds.
    `accepted`: ranges recorded as lost for good (`lost_ranges`), noted rather than found. With
    `repairs`, what a repair can mend (missing offsets the topic holds, duplicates) is appended."""
    result = CheckResult("kafka -> clicks", table)
    if rejects is None:  # no rejects table (none ever committed): the fact table's offsets bound it
        rejects_stored = fact_stored
    partitions = set(fact_stored) | set(rejects_stored)
    high = {p: min(fact_stored.get(p, 0), rejects_stored.get(p, 0)) for p in partitions}
    held = {p: max(earliest.get(p, 0), 0) for p in partitions}  # the topic's earliest offset
    rows = lineage(fact, rejects).cache()
    try:
        oldest = {r[0]: r[1] for r in rows.groupBy("kafka_partition").agg(F.min("kafka_offset")).collect()}
        start = {p: min(held[p], oldest.get(p, held[p])) for p in partitions}
        missing = _collect(missing_ranges(rows, bounds_frame(spark, start, high)))
        duplicates = _collect(duplicate_ranges(rows))
        beyond = _collect(beyond_stored(rows.where("in_table = 'clickevent'"), fact_stored))
        if rejects is not None:
            beyond += _collect(beyond_stored(rows.where("in_table = 'clickevent_rejects'"), rejects_stored))
    finally:
        rows.unpersist()
    gone, readable = split_at(missing, held)
    gone, known = without(gone, accepted or {})
    # Doubled offsets at or past the stored ones are not the ingest's to have written (or not checked
    # yet): a repair there would also stop the ingest, which validates past commits below its offsets.
    below_stored, _ = split_at(duplicates, {p: high.get(p, 0) for p, _, _ in duplicates})
    if repairs is not None and (readable or below_stored):
        repairs.append(ClicksRepair(readable, below_stored))
    for p, first, last in known:
        result.notes.append(
            f"partition {p}: offsets {first}-{last} recorded as lost ({LOST_PROPERTY}); not counted"
        )
    result.compared = sum(max(0, high[p] - start[p]) for p in partitions)
    for kind, ranges, hint in (
        ("missing offsets no longer in the topic", gone, LOST_PAST_RETENTION_HINT),
        ("missing offsets", readable, LOST_HINT),
        ("duplicate offsets", duplicates, DUPLICATE_HINT),
        ("offsets past the stored ones", sorted(beyond), BEYOND_HINT),
    ):
        if ranges:
            result.findings.append(Finding(kind, _count(ranges), ranges_text(ranges), hint))
    for p in sorted(partitions):
        if start[p] < held[p]:
            result.notes.append(
                f"partition {p}: offsets {start[p]}-{held[p] - 1} are no longer in the topic; "
                "checked within the lake (each once, no gap)"
            )
        if start[p] > 0 and high[p] > 0:
            result.notes.append(
                f"partition {p}: offsets before {start[p]} are in neither the topic nor the lake; "
                "not compared"
            )
        if fact_stored.get(p, 0) > high[p]:
            result.notes.append(
                f"partition {p}: offsets {high[p]}-{fact_stored[p] - 1} wait for the rejects' next commit "
                "(every 10 s); checked from the next run on"
            )
    return result


def split_at(ranges: list[tuple[int, int, int]], at: Offsets) -> tuple[list, list]:
    """(partition, first, last) ranges -> (those below `at[partition]`, those at or above it)."""
    below, above = [], []
    for p, first, last in ranges:
        if first < at[p]:
            below.append((p, first, min(last, at[p] - 1)))
        if last >= at[p]:
            above.append((p, max(first, at[p]), last))
    return below, above


def without(ranges: list[tuple[int, int, int]], accepted: dict[int, list[tuple[int, int]]]):
    """(the parts of `ranges` outside `accepted`, the parts inside), as (partition, first, last)."""
    outside, inside = [], []
    for p, first, last in ranges:
        pieces = [(first, last)]
        for low, high in sorted(accepted.get(p, [])):
            kept = []
            for a, b in pieces:
                if b < low or a > high:
                    kept.append((a, b))
                    continue
                inside.append((p, max(a, low), min(b, high)))
                kept += [(a, low - 1)] if a < low else []
                kept += [(high + 1, b)] if b > high else []
            pieces = kept
        outside += [(p, a, b) for a, b in pieces]
    return sorted(outside), sorted(inside)


def lost_ranges(properties: dict[str, str], topic: str) -> dict[int, list[tuple[int, int]]]:
    """`{partition: [(first, last), …]}` from the table properties `lakehouse.kafka.lost.<topic>.<p>`
    = `first-last[,first-last…]`; a malformed value raises ValueError naming the property."""
    prefix = f"{LOST_PROPERTY}.{topic}."
    found: dict[int, list[tuple[int, int]]] = {}
    for key, value in properties.items():
        suffix = key.removeprefix(prefix)
        if not key.startswith(prefix) or not suffix.isdigit():  # another topic's (`clicks.v2`)
            continue
        for part in value.split(","):
            bounds = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
            first, last = (
                (int(bounds.group(1)), int(bounds.group(2) or bounds.group(1))) if bounds else (1, 0)
            )
            if first > last:
                raise ValueError(
                    f"table property {key}={value!r}: expected <first>-<last>[,…], first <= last"
                )
            found.setdefault(int(suffix), []).append((first, last))
    return found
