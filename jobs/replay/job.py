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
- **Beside the running ingest.** Its rows are below the fact table's stored offsets, and the commit
  says so (`below`); the ingest validates past such a commit when those bounds are below its own
  offsets (`replayed_below`) and carries on.
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
from jobs.common.lake_tables import OFFSETS_KEY, REPLAY_KEY, offsets_from_summary
from jobs.common.snapshot_progress import (
    exclusive_append_options,
    exclusive_append_past,
    find_lineage,
    main_snapshot,
    progress_as_of,
    writer_options,
)
from jobs.common.views_counting import check_views_count
from jobs.config import ConfigError
from jobs.ingest.kafka_source import FETCHED_RECORD
from jobs.ingest.products_dimension import read_products
from jobs.ingest.validation import (
    REQUIRED_FIELDS,
    ClickEvent,
    RejectReason,
    classify_payload,
    to_click_events,
    valid_click_events,
)

log = logging.getLogger("replay")

LINEAGE = ["kafka_partition", "kafka_offset"]
# Its verdict depends on the record's Kafka timestamp, which the rejects do not keep: replayed only
# when asked for by name (`--reason update_time_out_of_range`), bounded by `ingested_at` instead.
TIME_BOUND = RejectReason.UPDATE_TIME_OUT_OF_RANGE
PLANS = 10  # replays that may win the race before this one gives up
REPLAY_REBASES = 200  # ingest commits one replay commit may validate past


@dataclass(frozen=True)
class ReplaySettings:
    fact_table: str
    rejects_table: str
    products_table: str
    topic: str  # the ingest's topic: its stored offsets bound what may be replayed
    views_table: str | None = None  # must be counted by a views job that counts replays
    reasons: tuple[str, ...] = ()  # reason kinds (`not_json`, `wrong_type: uid` ...); () = all but TIME_BOUND
    since: datetime | None = None  # only rejects ingested at or after this (UTC)
    dry_run: bool = False


@dataclass(frozen=True)
class ReplayResult:
    considered: Counter  # rejects not replayed yet, by reason
    passing: Counter  # of those, the ones that pass today, by their old reason
    replayed: int  # landed in the fact table by this run
    snapshot_id: int | None


# ---- transforms -----------------------------------------------------------------------------------


def _of_reasons(reasons: Sequence[str]):
    match = F.lit(False)
    for reason in reasons:  # a reason kind matches `kind` and `kind: detail`
        match = match | (F.col("reason") == reason) | F.col("reason").startswith(f"{reason}: ")
    return match


def not_replayed(
    rejects: DataFrame, facts: DataFrame, reasons: Sequence[str], since, stored: dict[int, int]
) -> DataFrame:
    """Rejects no fact row has the lineage of, below the fact table's stored offsets `stored` (an
    offset at or past them the ingest will read again: after a rollback of the fact table, say), of
    the given reasons (none given: all but TIME_BOUND) and ingested since a time; one per lineage."""
    selected = rejects.where(_of_reasons(reasons) if reasons else ~_of_reasons([TIME_BOUND]))
    if since is not None:
        selected = selected.where(F.col("ingested_at") >= F.lit(since))
    below = F.lit(False)
    for partition, end in stored.items():
        below = below | ((F.col("kafka_partition") == partition) & (F.col("kafka_offset") < end))
    selected = selected.where(below)
    return selected.join(facts.select(*LINEAGE), on=LINEAGE, how="left_anti").dropDuplicates(LINEAGE)


def reason_kind(reason: str) -> str:
    """A reject reason's kind and field (`wrong_type: uid`), without a detail that may quote a value."""
    return ": ".join(reason.split(": ")[:2])


def by_kind(reasons: Counter) -> Counter:
    kinds: Counter = Counter()
    for reason, count in reasons.items():
        kinds[reason_kind(reason)] += count
    return kinds


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
            try:
                yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                yield pa.RecordBatch.from_pylist(
                    [_convertible(r, arrow_schema) for r in rows], schema=arrow_schema
                )

    columns = ["kafka_partition", "kafka_offset", "raw_payload", "payload_is_base64", "reason", "ingested_at"]
    return candidates.select(*columns).mapInArrow(classify, schema)


def _convertible(row: dict, schema) -> dict:
    """`row`, or the reject it stays when Arrow refuses one of its values (as the ingest does)."""
    import pyarrow as pa

    try:
        pa.RecordBatch.from_pylist([row], schema=schema)
        return row
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        kept = {k: row[k] for k in ("kafka_partition", "kafka_offset", "kafka_timestamp_ms", "raw_payload",
                                   "payload_is_base64", "old_reason")}  # fmt: skip
        return {**kept, "reject_reason": f"{RejectReason.UNCONVERTIBLE}: {type(exc).__name__}"}


# ---- the job --------------------------------------------------------------------------------------


def replay_rejects(spark: SparkSession, settings: ReplaySettings) -> ReplayResult:
    """Plan, then append in one exclusive commit; another replay's commit in between plans again."""
    if not settings.dry_run:
        check_views_count(spark, settings.views_table, "replays")
    for _ in range(PLANS):
        base = main_snapshot(spark, settings.fact_table)
        facts = spark.table(settings.fact_table)
        if base is not None:
            facts = spark.read.format("iceberg").option("snapshot-id", base).load(settings.fact_table)
        stored_value = progress_as_of(spark, settings.fact_table, base, OFFSETS_KEY) if base else None
        stored = offsets_from_summary(stored_value, settings.topic)
        if not stored:
            topics = sorted(json.loads(stored_value)) if stored_value else []
            raise ConfigError(
                f"{settings.fact_table} stores no offsets of topic {settings.topic!r} (it holds "
                f"{', '.join(topics) or 'none: the ingest never committed'}): pass the ingest's --topic"
            )
        candidates = not_replayed(
            spark.table(settings.rejects_table), facts, settings.reasons, settings.since, stored
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
            passed = valid_click_events(checked)
            rows = to_click_events(passed, products, F.current_timestamp())
            ends = passed.groupBy("kafka_partition").agg(F.max("kafka_offset").alias("last")).collect()
            summary = {
                "id": uuid.uuid4().hex,
                "records": total,
                # Kind and field only: an `unconvertible` reason's detail can quote the value.
                "reasons": dict(sorted(by_kind(passing).items())),
                # What an ingest checks before it validates past this commit (`replayed_below`).
                "below": {str(r["kafka_partition"]): r["last"] + 1 for r in ends},
            }
            landed = _append(spark, settings.fact_table, rows, base, summary)
            if landed is not None:
                return ReplayResult(considered, passing, total, landed)
        finally:
            checked.unpersist()
        log.info("another replay committed meanwhile; planning again")
    raise RuntimeError(f"{settings.fact_table}: {PLANS} other replays committed while this one planned")


def _append(spark, table: str, rows: DataFrame, base: int | None, summary: dict) -> int | None:
    """Append `rows` validated from `base`, past the ingest's appends (their offsets are past the
    replayed ones), not past another replay's (None: plan again). Returns the new snapshot's id."""
    options = {
        **writer_options({REPLAY_KEY: json.dumps(summary, sort_keys=True)}),
        **exclusive_append_options(base),
    }
    crash_point("replay.before-commit")

    def write(opts: dict[str, str]) -> None:
        rows.writeTo(table).options(**opts).overwrite(F.lit(False))

    # Every ingest commit landing while the files are written costs one attempt: allow many.
    if not exclusive_append_past(
        spark, table, write, options, lambda summary: REPLAY_KEY not in summary, rebases=REPLAY_REBASES
    ):
        return None
    crash_point("replay.after-commit")
    return find_lineage(spark, table, REPLAY_KEY, summary["id"], max_depth=1000)
