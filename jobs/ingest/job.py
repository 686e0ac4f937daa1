"""Job `ingest`: Kafka `clicktopic` -> `ods_behavior.clickevent` (+ rejects), exactly once.

Each micro-batch:
1. plans one offset range per partition, starting where the tables' snapshots say (the offsets are
   committed in the snapshot summary together with the rows, key `lakehouse.kafka.offsets`);
2. fetches and validates the records (`ingest.kafka_source`): a small batch in the driver, a
   backlog in executor tasks, materialized once; either way both writes see the same records and
   the per-partition end offsets are taken from what was read;
3. enriches valid events with `dim_db.products` re-read this batch, appends them to the fact table
   and the invalid ones to the rejects table, each commit carrying the batch's end offsets. Rejects
   are held and committed every `rejects_commit_seconds` (or on a clean stop), so they do not add a
   commit to every batch.

A table only receives records at or after its own stored offset, so a crash between the two
commits, a kill -9 or a replay never duplicates anything. Run as `lakehouse run ingest` locally;
the same module is the EMR step.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.common.fault_injection import crash_point, rendezvous
from jobs.common.kafka_client import kafka_client_config
from jobs.common.lake_tables import (
    FACT_TABLE,
    OFFSETS_KEY,
    PRODUCTS_TABLE,
    REJECTS_TABLE,
    fact_table_ddl,
    offsets_at_or_after,
    offsets_from_summary,
    offsets_summary,
    rejects_table_ddl,
    replayed_below,
)
from jobs.common.metrics import NO_METRICS, BatchMetrics, MetricsSink, guarded
from jobs.common.run_modes import StopRequest
from jobs.common.snapshot_progress import (
    COMMIT_ID_KEY,
    ConcurrentWriterError,
    adds_no_data,
    exclusive_append_options,
    exclusive_append_past,
    find_commit,
    read_stored_progress,
    retry_commit,
    writer_options,
)
from jobs.common.streaming_job import StreamingJob
from jobs.config import KafkaConfig, LakehouseConfig
from jobs.ingest.kafka_source import (
    BrokerUnavailable,
    FetchSettings,
    PartitionStats,
    TopicMetadata,
    cached_high_watermarks,
    close_readers,
    fetch_ranges,
    materialize_with_stats,
    plan_ranges,
    planned_records,
    read_here,
    split_ranges,
    task_slots,
)
from jobs.ingest.offsets import Offsets, advance, check_read_start, passes
from jobs.ingest.products_dimension import ensure_products_dimension, read_products
from jobs.ingest.validation import (
    rejected_records,
    to_click_events,
    to_rejects,
    valid_click_events,
)

log = logging.getLogger("clickstream_ingest")

# Held rejects keep their batches materialized: commit them once this many records are held.
MAX_HELD_RECORDS = 1_000_000


@dataclass(frozen=True)
class IngestSettings:
    topic: str
    fact_table: str
    rejects_table: str
    products_table: str
    fetch: FetchSettings = field(default_factory=FetchSettings)
    max_backoff_seconds: float = 30.0
    # Held rejects are committed once this long passed since the last rejects commit (checked after
    # every batch), sooner when many records are held, and on a clean stop.
    rejects_commit_seconds: float = 10.0

    @classmethod
    def default(cls, config: LakehouseConfig) -> IngestSettings:
        return cls(
            topic=config.kafka.topic,
            fact_table=config.table(*FACT_TABLE),
            rejects_table=config.table(*REJECTS_TABLE),
            products_table=config.table(*PRODUCTS_TABLE),
        )


# ---- offsets in snapshot summaries -----------------------------------------------------------------


@dataclass(frozen=True)
class TableProgress:
    """A table's stored offsets and the snapshot that stored them (its next commit validates from
    there: any data another writer added since makes that commit fail)."""

    offsets: Offsets
    snapshot_id: int | None


def stored_progress(spark: SparkSession, table: str, topic: str) -> TableProgress:
    stored = read_stored_progress(spark, table, OFFSETS_KEY)
    return TableProgress(offsets_from_summary(stored.value, topic), stored.snapshot_id)


# ---- the job -----------------------------------------------------------------------------------------


@dataclass
class BatchResult:
    records: int = 0
    valid: int = 0
    rejects: int = 0
    end_offsets: Offsets = field(default_factory=dict)
    commit_ms: float = 0.0
    fetch_ms: float = 0.0
    fact_commit_ms: float = 0.0
    committed: list[str] = field(default_factory=list)  # the tables this batch committed to
    lag_seconds: float | None = None
    # "driver" (a small batch), "tasks" (a backlog) or "tasks(N ranges)" (split): see kafka_source
    read_by: str = ""


# Empty fetches in a row, below the broker's watermark, before a batch reports "nothing new" (a topic
# ending in control records, e.g. from transactional producers, never reaches its watermark).
EMPTY_FETCHES_BEHIND_WATERMARK = 5


class ClickstreamIngest(StreamingJob):
    """Holds the per-table offsets between batches; `run_batch` is one micro-batch."""

    def __init__(
        self,
        spark: SparkSession,
        config: LakehouseConfig,
        settings: IngestSettings,
        stop: StopRequest | None = None,
        metrics: MetricsSink = NO_METRICS,
    ) -> None:
        self.spark = spark
        self.config = config
        self.settings = settings
        self.stop = stop or StopRequest()
        self.metrics = guarded(metrics)
        self._watermarks: dict[int, int] = {}  # each partition's high watermark at the last planning
        self._given_up_gap: dict[int, tuple[int, int]] | None = None  # re-fetched in vain before
        self.batches = 0
        self.last_lag_seconds: float | None = None  # now - the newest Kafka timestamp, after commit
        kafka: KafkaConfig = config.kafka
        self._client_config_factory = lambda: kafka_client_config(kafka)
        self.fact = TableProgress({}, None)
        self.rejects = TableProgress({}, None)  # in memory: may be ahead of what the table stores
        self._committed_rejects = self.rejects
        self._held_rejects: list[DataFrame] = []  # rejects read but not committed yet
        self._held_records = 0  # records of the batches those come from (kept materialized)
        self._metadata = TopicMetadata(self._client_config_factory)
        self._rejects_committed_at = time.monotonic()

    def prepare(self) -> None:
        ddl = fact_table_ddl(self.settings.fact_table) + rejects_table_ddl(self.settings.rejects_table)
        for statement in ddl:
            self.spark.sql(statement)
        ensure_products_dimension(self.spark, self.config, self.settings.products_table)
        self.fact = stored_progress(self.spark, self.settings.fact_table, self.settings.topic)
        self.rejects = self._committed_rejects = stored_progress(
            self.spark, self.settings.rejects_table, self.settings.topic
        )
        log.info(
            "resuming %s from fact offsets %s, rejects offsets %s",
            self.settings.topic,
            self.fact.offsets,
            self.rejects.offsets,
        )

    # -- one micro-batch --

    def run_batch(self) -> int:
        """One micro-batch. An empty fetch while the broker reports records past the stored offsets
        (its watermark is a lower bound of the end) is most likely a slow fetch, not the end: fetch
        again, a few times, so `--until-idle` does not stop short. A gap that stays the same after
        that (records the consumer never gets, e.g. transaction markers) is not retried again."""
        for _ in range(EMPTY_FETCHES_BEHIND_WATERMARK):
            handled = self._batch()
            if handled:
                return handled
            gap = self._gap_to_watermark()
            if not gap or gap == self._given_up_gap:
                return handled
            log.info("fetched nothing though the broker reports records past offsets %s; fetching again", gap)
        log.warning(
            "fetched nothing %d times though the broker reports records past offsets %s; going on",
            EMPTY_FETCHES_BEHIND_WATERMARK,
            gap,
        )
        self._given_up_gap = gap
        return 0

    def _gap_to_watermark(self) -> dict[int, tuple[int, int]]:
        """{partition: (fetch start, watermark)} for each partition whose start is below its watermark,
        asked of the broker: after an empty batch the watermarks the driver's readers cached may be
        as old as their last fetch response (a slow one is what an empty batch may mean)."""
        if self.stop.requested or not self._watermarks:
            return {}
        try:
            self._watermarks = self._metadata.high_watermarks(self.settings.topic, sorted(self._watermarks))
        except BrokerUnavailable:
            return {}  # the next batch backs off and retries
        _, _, starts = self._starts(sorted(self._watermarks))
        return {p: (starts[p], hw) for p, hw in self._watermarks.items() if starts[p] < hw}

    def _batch(self) -> int:
        began = time.monotonic()
        fetched = self._fetch_with_retry()
        if fetched is None:
            return 0
        batch, partitions, stats, read_by = fetched
        result = BatchResult(
            records=sum(s.records for s in stats.values()),
            rejects=sum(s.rejects for s in stats.values()),
            read_by=read_by,
        )
        if not result.records:
            self._commit_rejects_when_due()  # a quiet topic must not keep rejects uncommitted
            return 0
        result.valid = result.records - result.rejects
        # The batch's end is defined by what was read, never by the broker's watermark.
        result.end_offsets = {p: s.last_offset + 1 for p, s in stats.items() if s.records}
        newest_ms = max((s.newest_ms or 0) for s in stats.values())
        result.fetch_ms = (time.monotonic() - began) * 1000
        self._commit(batch, partitions, result)
        result.lag_seconds = max(0.0, time.time() - newest_ms / 1000) if newest_ms else None
        self.last_lag_seconds = result.lag_seconds
        self.batches += 1
        self._log_batch(result)
        self.metrics.record(
            BatchMetrics(
                job="ingest",
                table=self.settings.fact_table.split(".", 1)[-1],
                records_in=result.records,
                rejects=result.rejects,
                batch_seconds=time.monotonic() - began,
                commit_seconds=result.commit_ms / 1000,
                lag_seconds=result.lag_seconds,
                offset_lag={
                    p: max(0, hw - self.fact.offsets.get(p, hw)) for p, hw in self._watermarks.items()
                },
            )
        )
        return result.records

    def finish(self) -> None:
        """On a clean stop: commit the held rejects and the rejects offsets batches moved on."""
        self._commit_rejects()
        self.close()

    def close(self) -> None:
        """Release the broker clients (also after a failure; idempotent)."""
        self._metadata.close()
        close_readers(self._client_config_factory(), self.settings.topic)

    def lag_seconds(self) -> float | None:
        return self.last_lag_seconds

    def _starts(self, partitions: list[int]) -> tuple[Offsets, Offsets, Offsets]:
        fact = {p: self.fact.offsets.get(p, 0) for p in partitions}
        rejects = {p: self.rejects.offsets.get(p, 0) for p in partitions}
        fetch = {p: min(fact[p], rejects[p]) for p in partitions}
        return fact, rejects, fetch

    def _check_read_starts(self, partitions: list[int], stats: dict[int, PartitionStats]) -> None:
        """Before anything is written: records below the range's start mean the topic was recreated
        (stop); a gap after it may be records that expired unread (say so, loudly: they are lost)."""
        topic = self.settings.topic
        _, _, starts = self._starts(partitions)
        for p in partitions:
            lost = check_read_start(
                topic,
                p,
                starts[p],
                stats[p].first_offset,
                lambda p=p: self._metadata.earliest_offset(topic, p),
            )
            if lost:
                log.error(
                    "DATA LOST: %d records of %s[%d] (offsets %d..%d) expired from the broker before the "
                    "ingest read them; the ingest lagged more than the topic's retention",
                    lost,
                    topic,
                    p,
                    starts[p],
                    starts[p] + lost - 1,
                )

    def _fetch_with_retry(self) -> tuple[DataFrame, list[int], dict[int, PartitionStats], str] | None:
        """Plan and fetch one batch, and say who read it ("driver" or "tasks"); while the broker is
        down, back off and retry (never crash)."""
        delay = 1.0
        while not self.stop.requested:
            try:
                topic, fetch = self.settings.topic, self.settings.fetch
                partitions = self._metadata.partitions(topic)
                _, _, starts = self._starts(partitions)
                self._watermarks = self._high_watermarks(partitions)
                # Each range reads at least up to its watermark whatever single polls return.
                cap = fetch.max_records_per_partition
                ranges = plan_ranges(topic, partitions, starts, cap, self._watermarks)
                planned = planned_records(ranges, self._watermarks)
                read_by = "driver" if planned is not None and planned <= fetch.driver_max_records else "tasks"
                if read_by == "driver":
                    batch, stats = read_here(self.spark, self._client_config_factory(), ranges, fetch)
                else:
                    tasks = task_slots(self.spark)
                    busy = [r for r in ranges if r.partition not in self._watermarks or r.min_end > r.start]
                    if len(busy) < tasks:
                        # Fewer busy partitions than cores, as far as the cached watermarks tell: a
                        # hot partition's backlog is split. Pieces need true ends, and cached
                        # watermarks are only lower bounds (a backlog's batch is large: asking the
                        # broker costs little here).
                        self._watermarks = self._metadata.high_watermarks(topic, partitions)
                        ranges = plan_ranges(topic, partitions, starts, cap, self._watermarks)
                        ranges = split_ranges(ranges, self._watermarks, tasks, fetch.min_split_records)
                    if len(ranges) > len(partitions):
                        read_by = f"tasks({len(ranges)} ranges)"
                    close_readers(self._client_config_factory(), topic)
                    fetched = fetch_ranges(self.spark, self._client_config_factory, ranges, fetch)
                    # Materialized once: both tables and the end offsets come from the same
                    # records. The per-partition stats are observed while materializing.
                    batch, stats = materialize_with_stats(fetched, partitions)
                # Before anything is written; inside the retry, since it may ask the broker.
                self._check_read_starts(partitions, stats)
                return batch, partitions, stats, read_by
            except Exception as exc:  # noqa: BLE001 - Py4J wraps executor errors; classify by text
                if not isinstance(exc, BrokerUnavailable) and "BrokerUnavailable" not in str(exc):
                    raise
                reason = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
                log.warning(
                    "Kafka broker %s unavailable (%s); retrying in %.0fs, nothing committed",
                    self.config.kafka.bootstrap,
                    reason,
                    delay,
                )
                self._commit_rejects_when_due()  # the catalog may be up while the broker is not
                self.stop.wait(delay)
                delay = min(delay * 2, self.settings.max_backoff_seconds)
        return None

    def _high_watermarks(self, partitions: list[int]) -> dict[int, int]:
        """The driver's own readers know the watermarks from their last fetch response; only a
        partition they do not know is asked of the broker (a request per partition, 50-400 ms of a
        batch on a busy box)."""
        topic = self.settings.topic
        known = cached_high_watermarks(self._client_config_factory(), topic, partitions)
        unknown = [p for p in partitions if p not in known]
        return {**known, **(self._metadata.high_watermarks(topic, unknown) if unknown else {})}

    def _commit(self, fetched: DataFrame, partitions: list[int], result: BatchResult) -> None:
        """Append the batch to each table it reads past the start of; a table's offsets never go back
        (a restart reads from the lower of the two tables' offsets, so a batch may end below one)."""
        rendezvous("ingest.before-commit")
        fact_starts, reject_starts, _ = self._starts(partitions)
        ingested_at = F.current_timestamp()
        began = time.monotonic()
        if passes(fact_starts, result.end_offsets):
            products = read_products(self.spark, self.settings.products_table)
            fact_rows = to_click_events(
                valid_click_events(fetched).where(offsets_at_or_after(fact_starts)), products, ingested_at
            )
            self.fact = self._append(
                self.settings.fact_table, fact_rows, self.fact, advance(self.fact.offsets, result.end_offsets)
            )
            result.committed.append("fact")
        result.fact_commit_ms = (time.monotonic() - began) * 1000
        crash_point("ingest.between-commits")
        # Rejects are few and nobody waits for them: a batch's rejects are held (the batch is
        # materialized, so holding its rows costs no re-read) and committed with later ones once
        # `rejects_commit_seconds` passed (checked after every batch, empty ones too), when many
        # are held, or on a clean stop. The fact commit alone then sets the pace of batches. A
        # restart re-reads from the rejects' stored offsets, so what was held is derived again:
        # nothing is lost, and the fact table takes nothing twice. (A batch the driver read holds
        # its rows in its plan; one read by tasks lives in the executors' block stores: losing an
        # executor fails the next rejects commit, and the job restarts from the stored offsets.)
        if result.rejects and passes(reject_starts, result.end_offsets):
            self._held_rejects.append(rejected_records(fetched).where(offsets_at_or_after(reject_starts)))
            self._held_records += result.records
        self.rejects = TableProgress(
            advance(self.rejects.offsets, result.end_offsets), self._committed_rejects.snapshot_id
        )
        if self._commit_rejects_when_due():
            result.committed.append("rejects")
        result.commit_ms = (time.monotonic() - began) * 1000

    def _commit_rejects_when_due(self) -> bool:
        """Commit the held rejects once `rejects_commit_seconds` passed since the last rejects
        commit (checked after every batch, empty ones too) or many records are held."""
        if self._held_records >= MAX_HELD_RECORDS or (
            time.monotonic() - self._rejects_committed_at >= self.settings.rejects_commit_seconds
        ):
            return self._commit_rejects()
        return False

    def _commit_rejects(self) -> bool:
        """Commit the held rejects and the rejects' in-memory offsets; False if nothing moved."""
        self._rejects_committed_at = time.monotonic()
        if self.rejects.offsets == self._committed_rejects.offsets:
            return False
        if self._held_rejects:
            rows = to_rejects(
                functools.reduce(DataFrame.unionByName, self._held_rejects), F.current_timestamp()
            )
        else:
            rows = self.spark.table(self.settings.rejects_table).where(F.lit(False))
        self.rejects = self._committed_rejects = self._append(
            self.settings.rejects_table, rows, self._committed_rejects, self.rejects.offsets
        )
        self._held_rejects, self._held_records = [], 0
        return True

    def _append(self, table: str, rows: DataFrame, base: TableProgress, offsets: Offsets) -> TableProgress:
        """Append `rows` with `offsets` in the same commit, exactly once. Fails with
        ConcurrentWriterError if another writer added data since `base` (this job's last commit)."""
        commit_id = uuid.uuid4().hex
        summary = {OFFSETS_KEY: offsets_summary(self.settings.topic, offsets), COMMIT_ID_KEY: commit_id}

        # No shuffle before the write: each fetch task writes its rows itself (still sorted within
        # files by the table's order). A micro-batch's rows are few and mostly of one day, so
        # clustering them by partition first cost a whole extra stage per batch; compaction
        # merges the small files later.
        options = {
            **writer_options(summary),
            "distribution-mode": "none",
            **exclusive_append_options(base.snapshot_id),
        }

        attempts = 0

        @retry_commit()
        def append() -> int:
            nonlocal attempts
            attempts += 1
            # An earlier attempt whose outcome was unknown may have landed: never append twice.
            # (The first attempt has nothing to look for: one metadata load less per commit.)
            landed = find_commit(self.spark, table, commit_id) if attempts > 1 else None
            if landed is not None:
                log.warning("%s: the commit of the previous attempt had landed; not appending again", table)
                return landed

            # Rows a replay of rejects (`jobs/replay`) appended, or a repair (`verify --repair`)
            # changed, below this job's offsets are not another ingest's: validate past them. Any
            # other append stops this job.
            def passable(summary: dict) -> bool:
                if OFFSETS_KEY in summary:  # an ingest's, even one that only moved its offsets
                    return False
                return adds_no_data(summary) or replayed_below(summary, base.offsets)

            written = exclusive_append_past(
                self.spark,
                table,
                lambda opts: rows.writeTo(table).options(**opts).overwrite(F.lit(False)),
                options,
                passable,
            )
            if not written:
                landed = find_commit(self.spark, table, commit_id)
                if landed is not None:
                    return landed
                raise ConcurrentWriterError(
                    f"another ingest committed to {table} since this one's last commit (offsets "
                    f"{offsets_summary(self.settings.topic, base.offsets)}): only one ingest may "
                    "write a table; stopping without committing this batch"
                )
            landed = find_commit(self.spark, table, commit_id)
            if landed is None:
                raise RuntimeError(f"{table}: commit {commit_id} succeeded but is not in the table's history")
            return landed

        return TableProgress(offsets, append())

    def _log_batch(self, r: BatchResult) -> None:
        lag = "n/a" if r.lag_seconds is None else f"{r.lag_seconds:.1f}"
        log.info(
            "batch %d: records=%d valid=%d rejects=%d offsets=%s commit_ms=%.0f lag_s=%s fetch_ms=%.0f"
            " fact_commit_ms=%.0f committed=%s read_by=%s",
            self.batches,
            r.records,
            r.valid,
            r.rejects,
            json.dumps({str(p): o for p, o in sorted(r.end_offsets.items())}),
            r.commit_ms,
            lag,
            r.fetch_ms,
            r.fact_commit_ms,
            # "none" after a restart: records below both tables' stored offsets, re-read and skipped
            "+".join(r.committed) or "none",
            r.read_by,
        )


def job_spark_conf() -> dict[str, str]:
    # Materialized batches are released by the context cleaner; run it often in a long job.
    return {"spark.cleaner.periodicGC.interval": "2min", "spark.ui.showConsoleProgress": "false"}
