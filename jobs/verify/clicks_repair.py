"""`lakehouse verify --repair` for the click tables: missing offsets read again, duplicates removed.

What the `kafka -> clicks` check found, repaired beside the running ingest:

- **Missing offsets the topic still holds** are read again with the ingest's own reader (exact
  ranges: a short read fails) and classified by the ingest's validator: the valid ones become fact
  rows (enriched with today's products), the others rejects.
- **Duplicates within one table** (an offset stored twice) keep the row ingested first.
- **One MERGE commit per table** deletes every row of a duplicated offset and inserts the one kept,
  with the rows read again. Its summary carries `lineage.verify-repair`: the offsets it touched
  (`ranges`) and their bounds (`below`). The ingest validates past it like a replay (every offset it
  touches is below the ingest's own); the views job counts the difference it made below its
  watermark (its rows in those ranges minus its parent's).
- **Snapshot isolation for the MERGE.** Serializable (Iceberg's default) would lose to every
  ingest append that lands while it runs (the ingest commits every second or so): the repair sets
  `write.merge.isolation-level=snapshot` on the click tables, which still fails on a concurrent
  delete of the files it rewrites (a compaction's) and retries. Only this repair MERGEs into the
  click tables.

Not repaired, and said: offsets the topic no longer holds (nothing can read them again), an offset
in both tables (a fact row and a reject that is not its replay: which one is right is a judgement,
see `lakehouse replay-rejects`), rows at or past the stored offsets (not the ingest's, or not
checked yet), and more than MAX_REPAIR_RANGES separate ranges.

One repair at a time: a MERGE that only inserts deletes no file, so snapshot isolation lets two
repairs at once both insert a missing offset. The next check (this run's next round, or the next
run) finds the doubled offset and removes it; the view follows the table either way.

A reject read again gets its record's Kafka time as `ingested_at`: `replay-rejects` bounds a
record's updateTime by it.

Exactly once: every round starts from the check, so a repair killed between the two tables' commits
(or after both) is finished by the next run, never done twice.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from jobs.common.fault_injection import crash_point
from jobs.common.lake_tables import REPAIR_KEY, in_offset_ranges, load_iceberg_table
from jobs.common.snapshot_progress import (
    find_lineage,
    main_snapshot,
    retry_commit,
    with_snapshot_properties,
)
from jobs.common.views_counting import check_views_count
from jobs.ingest.kafka_source import FetchSettings, OffsetRange, fetch_ranges
from jobs.ingest.products_dimension import read_products
from jobs.ingest.validation import rejected_records, to_click_events, to_rejects, valid_click_events
from jobs.verify.repair import OP, merge_statement

log = logging.getLogger("verify.clicks_repair")

Ranges = list[tuple[int, int, int]]  # (partition, first, last)
LINEAGE = ["kafka_partition", "kafka_offset"]
ISOLATION = "write.merge.isolation-level"
# More separate offset ranges than this: a rollback is the better repair (each range is a piece of
# the commit's summary and of the views job's reading of it).
MAX_REPAIR_RANGES = 10_000
_RANK = "_lakehouse_rank"


@dataclass(frozen=True)
class ClickTables:
    fact: str
    rejects: str
    views: str | None
    products: str
    topic: str


@dataclass(frozen=True)
class ClicksRepair:
    """What the check found that a repair can mend."""

    readable: Ranges  # missing offsets the topic still holds
    duplicates: Ranges  # offsets with more than one row (either table)


@dataclass(frozen=True)
class TableRepair:
    table: str
    added: int  # rows read again from the topic
    removed: int  # extra copies of duplicated offsets
    snapshot_id: int | None


@dataclass(frozen=True)
class ClicksRepairOutcome:
    tables: tuple[TableRepair, ...]

    @property
    def rows(self) -> int:
        return sum(t.added + t.removed for t in self.tables)

    def note(self) -> str:
        parts = [
            f"{t.table.split('.')[-1]}: {t.added} rows read again from the topic, {t.removed} duplicate "
            f"rows removed (snapshot {t.snapshot_id})"
            for t in self.tables
            if t.added or t.removed
        ]
        return "repaired " + ("; ".join(parts) if parts else "nothing (what remains is not repairable here)")


class TooScattered(ValueError):
    """More offset ranges than one repair takes."""


def as_ranges(offsets: dict[int, list[int]]) -> dict[str, list[list[int]]]:
    """{partition: offsets} -> {"<partition>": [[first, last], ...]}, consecutive offsets joined."""
    out: dict[str, list[list[int]]] = {}
    for partition, values in sorted(offsets.items()):
        pieces: list[list[int]] = []
        for offset in sorted(set(values)):
            if pieces and offset == pieces[-1][1] + 1:
                pieces[-1][1] = offset
            else:
                pieces.append([offset, offset])
        if pieces:
            out[str(partition)] = pieces
    return out


def read_again(spark: SparkSession, client_config_factory: Callable, topic: str, ranges: Ranges) -> DataFrame:
    """The records at `ranges`, read with the ingest's reader (exact ends: a short read fails) and
    classified by its validator, materialized once (both tables are written from the same read)."""
    plans = [
        OffsetRange(topic, p, first, last - first + 1, last + 1, end=last + 1) for p, first, last in ranges
    ]
    fetched = fetch_ranges(spark, client_config_factory, plans, FetchSettings()).localCheckpoint(eager=True)
    read, wanted = fetched.count(), sum(last - first + 1 for _, first, last in ranges)
    if read != wanted:
        raise RuntimeError(f"{topic}: read {read} of the {wanted} missing records again; nothing written")
    return fetched


def read_at(spark: SparkSession, table: str, snapshot: int | None) -> DataFrame | None:
    return spark.read.format("iceberg").option("snapshot-id", snapshot).load(table) if snapshot else None


def duplicates_of(rows: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(offsets stored more than once with their row counts, the row of each kept: the one ingested
    first)."""
    order = Window.partitionBy(*LINEAGE).orderBy("ingested_at")
    ranked = rows.withColumn(_RANK, F.row_number().over(order))
    repeated = rows.groupBy(*LINEAGE).count().where("count > 1")
    kept = ranked.where(F.col(_RANK) == 1).drop(_RANK).join(repeated.select(*LINEAGE), LINEAGE, "left_semi")
    return repeated, kept


def repair_table(
    spark: SparkSession, table: str, duplicates: Ranges, new_rows: DataFrame | None, others: list[DataFrame]
) -> TableRepair:
    """One MERGE commit: `table`'s duplicates in `duplicates` removed (the first ingested kept),
    `new_rows` inserted where neither table holds their offset now (`others`: the other table's
    rows). Retried whole when a concurrent delete wins."""
    repair_id = uuid.uuid4().hex
    view = "verify_repair_" + re.sub(r"\W", "_", table)
    outcome: TableRepair | None = None

    @retry_commit()
    def attempt() -> None:
        nonlocal outcome
        if outcome is not None and find_lineage(spark, table, REPAIR_KEY, repair_id) is not None:
            return  # an attempt whose outcome was unknown did land
        snapshot = main_snapshot(spark, table)
        current = read_at(spark, table, snapshot)
        columns = spark.table(table).columns
        parts, touched = [], {}
        removed = added = 0
        if current is not None and duplicates:
            repeated, kept = duplicates_of(in_offset_ranges(current, duplicates))
            kept = kept.localCheckpoint(eager=True)
            counted = repeated.collect()
            repeated_offsets = [(r[0], r[1]) for r in counted]
            if repeated_offsets:
                removed = sum(r["count"] - 1 for r in counted)
                deletes = kept.select(
                    *[
                        F.col(c) if c in LINEAGE else F.lit(None).cast(kept.schema[c].dataType).alias(c)
                        for c in columns
                    ]
                )
                parts += [
                    deletes.withColumn(OP, F.lit("delete")),
                    kept.select(*columns).withColumn(OP, F.lit("insert")),
                ]
                for p, o in repeated_offsets:
                    touched.setdefault(p, []).append(o)
        if new_rows is not None:
            fresh = new_rows
            for frame in (*others, current):
                if frame is not None:
                    fresh = fresh.join(frame.select(*LINEAGE), LINEAGE, "left_anti")
            fresh = fresh.select(*columns).localCheckpoint(eager=True)
            lineage = [(r[0], r[1]) for r in fresh.select(*LINEAGE).collect()]
            if lineage:
                added = len(lineage)
                parts.append(fresh.withColumn(OP, F.lit("insert")))
                for p, o in lineage:
                    touched.setdefault(p, []).append(o)
        outcome = TableRepair(table, added, removed, None)
        if not touched:
            return
        source = parts[0]
        for part in parts[1:]:
            source = source.unionByName(part)
        source.createOrReplaceTempView(view)
        summary = {
            "id": repair_id,
            "added": added,
            "removed": removed,
            "ranges": as_ranges(touched),
            # What an ingest checks before it validates past this commit (`replayed_below`).
            "below": {str(p): max(offsets) + 1 for p, offsets in sorted(touched.items())},
        }
        if sum(len(pieces) for pieces in summary["ranges"].values()) > MAX_REPAIR_RANGES:
            raise TooScattered(
                f"{table}: the rows to write fall in more than {MAX_REPAIR_RANGES:,} separate offset "
                "ranges: roll the tables back to a snapshot before the damage instead"
            )
        if dict(load_iceberg_table(spark, table).properties()).get(ISOLATION) != "snapshot":
            spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('{ISOLATION}' = 'snapshot')")
        try:
            statement = merge_statement(table, view, {c: c for c in columns}, tuple(LINEAGE))
            with_snapshot_properties(spark, {REPAIR_KEY: json.dumps(summary)}, lambda: spark.sql(statement))
        finally:
            spark.catalog.dropTempView(view)

    attempt()
    assert outcome is not None
    landed = find_lineage(spark, table, REPAIR_KEY, repair_id) if outcome.added + outcome.removed else None
    return TableRepair(table, outcome.added, outcome.removed, landed)


def repair_clicks(
    spark: SparkSession, plan: ClicksRepair, tables: ClickTables, client_config_factory: Callable
) -> ClicksRepairOutcome:
    """The fact table's commit, then the rejects'. Killed between them, the next run's check finds
    only what the rejects lack."""
    pieces = len(plan.readable) + len(plan.duplicates)
    if pieces > MAX_REPAIR_RANGES:
        raise TooScattered(
            f"{pieces:,} offset ranges to repair (more than {MAX_REPAIR_RANGES:,}): roll the tables back "
            "to a snapshot before the damage instead (the findings' hints)"
        )
    check_views_count(spark, tables.views, "repairs")
    fetched = read_again(spark, client_config_factory, tables.topic, plan.readable) if plan.readable else None
    has_rejects = spark.catalog.tableExists(tables.rejects)

    def current(table: str) -> DataFrame | None:
        if not spark.catalog.tableExists(table):
            return None
        return read_at(spark, table, main_snapshot(spark, table))

    facts = None
    if fetched is not None:
        products = read_products(spark, tables.products)
        facts = to_click_events(valid_click_events(fetched), products, F.current_timestamp())
    fact = repair_table(spark, tables.fact, plan.duplicates, facts, [current(tables.rejects)])
    crash_point("verify.clicks-repair.between-tables")
    done = [fact]
    # A reject's ingested_at is the record's time to `replay-rejects` (its "updateTime at most 24 h
    # later" bound): the record's Kafka time, not this late read's.
    record_time = F.coalesce(F.timestamp_millis(F.col("kafka_timestamp_ms")), F.current_timestamp())
    rejects = to_rejects(rejected_records(fetched), record_time) if fetched is not None else None
    if has_rejects or (rejects is not None and not rejects.isEmpty()):
        if not has_rejects:
            raise RuntimeError(f"{tables.rejects} does not exist: run the ingest once, then repair")
        done.append(repair_table(spark, tables.rejects, plan.duplicates, rejects, [current(tables.fact)]))
    outcome = ClicksRepairOutcome(tuple(done))
    log.info("%s", outcome.note())
    return outcome
