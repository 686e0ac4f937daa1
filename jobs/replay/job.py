"""Replay of rejects: re-validate what the ingest rejected, land what passes now, exactly once.

A reject stays a reject unless something on our side was wrong: a validator bug fixed in a later
release. `lakehouse replay-rejects` reads the rejects not replayed yet (no fact row has their
lineage), validates each raw payload again with this release's validator (`classify_payload`,
the very function the ingest runs), enriches what passes with today's products, and appends those
rows to the fact table in one commit:

- **Marked in the same commit.** A replayed reject is one whose `(kafka_partition, kafka_offset)`
  the fact table holds: its fact row, with that lineage, is the mark, and it lands atomically with
  the data. The rejects table is left as it was (what the ingest rejected, and why, stays on record);
  the commit's summary says what was replayed (`lineage.replay`: id, records, reasons).
- **Exactly once under kill -9.** One commit: killed before it nothing landed, after it every
  record did; a run again finds them in the fact table and replays nothing twice. Two replays at once:
  the second one's append is validated against the first's and plans again.
- **Beside the running ingest.** Its rows are at offsets the ingest has passed; the ingest takes
  an append without its offsets for what it is (`appended_without`) and carries on.
- **The record's time.** The rejects keep no Kafka timestamp, so the "at most 24 h after the record's
  time" bound of `updateTime` is taken from the reject's `ingested_at` (the ingest reads within
  seconds of the produce; a reject ingested from a backlog is bounded more loosely).
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.common.fault_injection import crash_point
from jobs.common.lake_tables import REPLAY_KEY, load_iceberg_table
from jobs.common.snapshot_progress import (
    appended_without,
    exclusive_append_options,
    is_concurrent_append,
    main_snapshot,
    writer_options,
)
from jobs.ingest.kafka_source import FETCHED_RECORD
from jobs.ingest.products_dimension import read_products
from jobs.ingest.validation import (
    REQUIRED_FIELDS,
    ClickEvent,
    classify_payload,
    to_click_events,
    valid_click_events,
)

log = logging.getLogger("replay")

LINEAGE = ["kafka_partition", "kafka_offset"]
PLANS = 10  # replays that may win the race before this one gives up


@dataclass(frozen=True)
class ReplaySettings:
    fact_table: str
    rejects_table: str
    products_table: str
    reasons: tuple[str, ...] = ()  # reason kinds (`not_json`, `wrong_type: uid` ...); () = all
    since: datetime | None = None  # only rejects ingested at or after this (UTC)
    dry_run: bool = False


@dataclass(frozen=True)
class ReplayResult:
    considered: Counter  # rejects not replayed yet, by reason
    passing: Counter  # of those, the ones that pass today, by their old reason
    replayed: int  # landed in the fact table by this run
    snapshot_id: int | None


# ---- transforms -----------------------------------------------------------------------------------


def not_replayed(rejects: DataFrame, facts: DataFrame, reasons: Sequence[str], since) -> DataFrame:
    """Rejects no fact row has the lineage of, optionally of some reasons (a reason kind matches
    `kind` and `kind: detail`) and ingested since a time; one row per lineage."""
    selected = rejects
    if reasons:
        match = F.lit(False)
        for reason in reasons:
            match = match | (F.col("reason") == reason) | F.col("reason").startswith(f"{reason}: ")
        selected = selected.where(match)
    if since is not None:
        selected = selected.where(F.col("ingested_at") >= F.lit(since))
    return selected.join(facts.select(*LINEAGE), on=LINEAGE, how="left_anti").dropDuplicates(LINEAGE)


def _payload(raw: str | None, is_base64: bool | None) -> bytes:
    if raw is None:
        return b""
    return base64.b64decode(raw) if is_base64 else raw.encode("utf-8")


def revalidated(candidates: DataFrame) -> DataFrame:
    """Each candidate as the ingest's fetch would classify it now (FETCHED_RECORD, `reject_reason`
    NULL when it passes), plus its old reason in `old_reason`."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([*FETCHED_RECORD.fields, StructField("old_reason", StringType(), True)])
    arrow_schema = to_arrow_schema(schema)

    def classify(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = []
            for row in batch.to_pylist():
                ingested = row["ingested_at"]
                if ingested is not None and ingested.tzinfo is None:  # Arrow without a zone: UTC
                    ingested = ingested.replace(tzinfo=UTC)
                record_ms = int(ingested.timestamp() * 1000) if ingested is not None else None
                verdict = classify_payload(_payload(row["raw_payload"], row["payload_is_base64"]), record_ms)
                base = {
                    "kafka_partition": row["kafka_partition"],
                    "kafka_offset": row["kafka_offset"],
                    "kafka_timestamp_ms": None,
                    "raw_payload": row["raw_payload"],
                    "payload_is_base64": row["payload_is_base64"],
                    "old_reason": row["reason"],
                }
                if isinstance(verdict, ClickEvent):
                    rows.append(
                        {**base, "reject_reason": None, **{f: getattr(verdict, f) for f in REQUIRED_FIELDS}}
                    )
                else:
                    rows.append({**base, "reject_reason": verdict.reason})
            yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)

    columns = ["kafka_partition", "kafka_offset", "raw_payload", "payload_is_base64", "reason", "ingested_at"]
    return candidates.select(*columns).mapInArrow(classify, schema)


# ---- the job --------------------------------------------------------------------------------------


def replay_rejects(spark: SparkSession, settings: ReplaySettings) -> ReplayResult:
    """Plan, then append in one exclusive commit; another replay's commit in between plans again."""
    for _ in range(PLANS):
        base = main_snapshot(spark, settings.fact_table)
        facts = spark.table(settings.fact_table)
        if base is not None:
            facts = spark.read.format("iceberg").option("snapshot-id", base).load(settings.fact_table)
        candidates = not_replayed(
            spark.table(settings.rejects_table), facts, settings.reasons, settings.since
        )
        checked = revalidated(candidates).cache()
        try:
            counts = checked.groupBy("old_reason", F.col("reject_reason").isNull().alias("passes")).count()
            considered, passing = Counter(), Counter()
            for row in counts.collect():
                considered[row["old_reason"]] += row["count"]
                if row["passes"]:
                    passing[row["old_reason"]] += row["count"]
            total = sum(passing.values())
            if settings.dry_run or not total:
                return ReplayResult(considered, passing, 0, None)
            products = read_products(spark, settings.products_table)
            rows = to_click_events(valid_click_events(checked), products, F.current_timestamp())
            replay_id = uuid.uuid4().hex
            summary = {"id": replay_id, "records": total, "reasons": dict(sorted(passing.items()))}
            landed = _append(spark, settings.fact_table, rows, base, summary)
            if landed is not None:
                return ReplayResult(considered, passing, total, landed)
        finally:
            checked.unpersist()
        log.info("another replay committed meanwhile; planning again")
    raise RuntimeError(f"{settings.fact_table}: {PLANS} other replays committed while this one planned")


def _append(spark, table: str, rows: DataFrame, base: int | None, summary: dict) -> int | None:
    """Append `rows` validated from `base`: past the ingest's appends (they carry no replay), not
    past another replay's (None: plan again). Returns the new snapshot's id."""
    options = {
        **writer_options({REPLAY_KEY: json.dumps(summary, sort_keys=True)}),
        **exclusive_append_options(base),
    }
    crash_point("replay.before-commit")
    for _ in range(100):
        try:
            rows.writeTo(table).options(**options).overwrite(F.lit(False))
            break
        except Exception as exc:
            if not is_concurrent_append(exc):
                raise
            since = options.get("validate-from-snapshot-id")
            rebased = appended_without(spark, table, REPLAY_KEY, int(since) if since else None)
            if rebased is None:
                return None
            options.update(exclusive_append_options(rebased))
    else:
        raise RuntimeError(f"{table}: the ingest kept committing; 100 attempts lost the race")
    crash_point("replay.after-commit")
    return replay_snapshot(spark, table, summary["id"])


def replay_snapshot(spark, table: str, replay_id: str) -> int | None:
    """The snapshot of the current ancestry that the replay `replay_id` committed."""
    snapshot = load_iceberg_table(spark, table).currentSnapshot()
    while snapshot is not None:
        if json.loads(snapshot.summary().get(REPLAY_KEY) or "{}").get("id") == replay_id:
            return snapshot.snapshotId()
        parent = snapshot.parentId()
        snapshot = load_iceberg_table(spark, table).snapshot(parent) if parent is not None else None
    return None
