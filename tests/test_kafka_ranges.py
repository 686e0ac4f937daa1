"""How a fetch task decides a range is done: the planned minimum end (the high watermark) holds
whatever single polls return; past it, an empty or short poll ends the range. No broker: the
reader's polls are scripted (the broker itself is exercised by the ingest tests); and when the ingest
takes an empty fetch for the end."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from jobs.config import LakehouseConfig
from jobs.ingest.job import (
    EMPTY_FETCHES_BEHIND_WATERMARK,
    ClickstreamIngest,
    IngestSettings,
    TableProgress,
)
from jobs.ingest.kafka_source import (
    FETCHED_RECORD,
    BrokerUnavailable,
    FetchSettings,
    OffsetRange,
    _arrow_stats,
    _fetched_arrow_schema,
    _read_range,
    materialize_with_stats,
    plan_frame,
    plan_ranges,
    planned_records,
    split_ranges,
)


class Message:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self):
        return None

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return b"{}"

    def timestamp(self):
        return (1, 0)


class ScriptedReader:
    """Polls return what `script` says per call (a count of records, 0 for an empty poll), as a
    fetcher that falls behind on a busy box does; then empty polls."""

    def __init__(self, start: int, script: list[int]) -> None:
        self.position, self.warm, self.assigned_at, self.errors = start, True, time.monotonic() - 10, []
        self._script = list(script)
        self.polls: list[tuple[int, float]] = []  # (count asked for, timeout) per poll

    def past(self, offset: int) -> bool:
        return self.position >= offset

    def consume(self, count: int, timeout: float) -> list[Message]:
        self.polls.append((count, timeout))
        n = min(count, self._script.pop(0) if self._script else 0)
        messages = [Message(self.position + i) for i in range(n)]
        self.position += n
        return messages


def offsets_read(reader: ScriptedReader, plan: OffsetRange) -> int:
    settings = FetchSettings(min_fetch_seconds=0.3, idle_poll_seconds=0.0, max_fetch_seconds=5)
    return sum(batch.num_rows for batch in _read_range(reader, plan, settings))


SHORT_AND_EMPTY_POLLS = [1, 5, 0, 3, 0, 0, 40, 0, 1] + [0] * 20


def test_a_range_reads_up_to_its_minimum_end_whatever_the_polls_return():
    plan = OffsetRange("t", 0, start=100, max_records=10_000, min_end=150)
    assert offsets_read(ScriptedReader(100, SHORT_AND_EMPTY_POLLS), plan) == 50


def test_without_a_minimum_end_the_first_empty_poll_ends_the_range():
    plan = OffsetRange("t", 0, start=100, max_records=10_000)
    assert offsets_read(ScriptedReader(100, SHORT_AND_EMPTY_POLLS), plan) == 6


def test_past_the_minimum_end_the_range_drains_what_keeps_arriving():
    plan = OffsetRange("t", 0, start=0, max_records=10_000, min_end=10)
    assert offsets_read(ScriptedReader(0, [10, 10_000, 10_000, 0]), plan) == 10_000


def test_the_minimum_end_is_the_high_watermark_capped_and_never_below_the_start():
    ranges = plan_ranges(
        "t", [0, 1, 2], {0: 5, 1: 500, 2: 0}, max_records=100, high_watermarks={0: 90, 1: 400}
    )
    assert [(r.partition, r.start, r.min_end) for r in ranges] == [(0, 5, 90), (1, 500, 500), (2, 0, 0)]
    (unknown,) = plan_ranges("t", [3], {3: 70}, max_records=100, high_watermarks={})
    assert unknown.min_end == 0  # no watermark: the range ends by what the polls say
    (capped,) = plan_ranges("t", [0], {0: 0}, max_records=100, high_watermarks={0: 1_000_000})
    assert capped.min_end == 100


@pytest.mark.stack
def test_the_executors_get_every_field_of_the_planned_ranges(spark):
    ranges = plan_ranges("clicks", [0, 1, 2], {0: 5, 1: 7}, max_records=100, high_watermarks={0: 50, 2: 9})
    rows = plan_frame(spark, ranges).collect()
    assert [OffsetRange(**row.asDict()) for row in rows] == ranges


def test_the_driver_counts_a_batchs_stats_as_the_tasks_observe_them(spark):
    """The end offsets, rejects and lag come from these stats: a batch read by the driver must give
    the same as one materialized by tasks (rejects, a record without a timestamp, an all-reject
    partition, an empty one)."""
    import pyarrow as pa

    from jobs.common.arrow_frames import arrow_frame

    schema = _fetched_arrow_schema()

    def batch(partition: int, offsets: list[int], times: list, reasons: list) -> pa.RecordBatch:
        n = len(offsets)
        columns = {
            "kafka_partition": [partition] * n, "kafka_offset": offsets, "kafka_timestamp_ms": times,
            "reject_reason": reasons, "raw_payload": [r and "x" for r in reasons],
            "payload_is_base64": [r and False for r in reasons],
        }  # fmt: skip
        arrays = [pa.array(columns.get(f.name, [None] * n), f.type) for f in schema]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    by_partition = {
        0: [batch(0, [7, 8], [1000, None], [None, "not_json"]), batch(0, [9], [900], [None])],
        1: [batch(1, [3, 4], [5, 6], ["not_json", "payload_too_large"])],
        2: [],
    }
    table = pa.Table.from_batches([b for bs in by_partition.values() for b in bs], schema=schema)
    _, observed = materialize_with_stats(arrow_frame(spark, table, FETCHED_RECORD), [0, 1, 2])
    counted = {p: _arrow_stats(batches) for p, batches in by_partition.items()}
    assert counted == observed
    assert (counted[0].records, counted[0].rejects, counted[0].last_offset, counted[0].newest_ms) == (
        3, 1, 9, 1000
    )  # fmt: skip


def test_past_the_minimum_end_a_short_poll_ends_the_range_at_once():
    plan = OffsetRange("t", 0, start=0, max_records=10_000, min_end=10)
    # Up to the end (1 + 9), then what the next poll finds buffered (5): short, so the range ends.
    assert offsets_read(ScriptedReader(0, [1, 9, 5, 5, 5]), plan) == 15


def test_reaching_the_minimum_end_costs_no_wait():
    """Below the end a poll asks for no more than are left (it returns once it has them); past it,
    polls take what is buffered without waiting."""
    plan = OffsetRange("t", 0, start=0, max_records=10_000, min_end=10)
    reader = ScriptedReader(0, [1, 4, 5, 3])
    assert offsets_read(reader, plan) == 13
    assert [count for count, _ in reader.polls] == [1, 9, 5, 9_990]
    assert reader.polls[-1][1] == 0.0


def test_when_nothing_was_new_at_planning_a_short_look_ends_the_range():
    plan = OffsetRange("t", 0, start=100, max_records=10_000, min_end=100)
    settings = FetchSettings(idle_poll_seconds=0.1)
    reader = ScriptedReader(100, [3, 2])
    assert sum(batch.num_rows for batch in _read_range(reader, plan, settings)) == 3
    assert reader.polls == [(1, 0.1), (9_999, 0.0)]  # what arrived since, taken without waiting


class ScriptedBroker:
    """What the broker answers about watermarks: whatever the script last said."""

    def __init__(self) -> None:
        self.watermarks: dict[int, int] = {}

    def high_watermarks(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return {p: hw for p, hw in self.watermarks.items() if p in partitions}

    def close(self) -> None:
        pass


class ScriptedIngest(ClickstreamIngest):
    """The ingest's batch loop with scripted fetches: each `_batch` returns the next count and
    leaves the broker's watermarks as the script says (no Spark, no broker). A third item is what
    the batch planned with, when it differs (the driver's readers' cached, older watermarks)."""

    def __init__(self, script: list[tuple[int, dict[int, int]]]) -> None:
        config = LakehouseConfig.aws(
            env="dev", region="us-east-1", kafka_bootstrap="b:9098",
            mysql_host="db", mysql_cdc_secret_id="s",
        )  # fmt: skip
        super().__init__(None, config, IngestSettings("t", "a.b", "a.c", "a.d"))
        self.fact = self.rejects = TableProgress({0: 100, 1: 100}, None)
        self._script = list(script)
        self._metadata = ScriptedBroker()
        self.calls = 0

    def _batch(self) -> int:
        self.calls += 1
        handled, self._metadata.watermarks, *planned_with = self._script.pop(0)
        self._watermarks = planned_with[0] if planned_with else dict(self._metadata.watermarks)
        if handled is None:  # the job was asked to stop during this fetch
            self.stop.set()
            return 0
        return handled

    def _fetch_with_retry(self):
        raise AssertionError("the loop must go through _batch")


def test_an_empty_fetch_below_the_watermark_is_fetched_again_not_taken_for_the_end():
    # The broker says partition 1 holds records past offset 100, the first two fetches read none.
    ingest = ScriptedIngest([(0, {0: 100, 1: 150}), (0, {0: 100, 1: 150}), (50, {0: 100, 1: 150})])
    assert ingest.run_batch() == 50
    assert ingest.calls == 3


def test_an_empty_batch_planned_with_stale_cached_watermarks_asks_the_broker_before_ending():
    # The driver's readers last heard watermarks {0: 100, 1: 100}; the broker holds 50 more in
    # partition 1 by now. Ending on the stale figures would stop `--until-idle` short.
    stale = {0: 100, 1: 100}
    ingest = ScriptedIngest([(0, {0: 100, 1: 150}, stale), (50, {0: 100, 1: 150}, stale)])
    assert ingest.run_batch() == 50
    assert ingest.calls == 2


def test_a_batch_is_small_only_when_every_partitions_watermark_is_known():
    ranges = plan_ranges("t", [0, 1, 2], {0: 10, 1: 0, 2: 5}, 1000, {0: 30, 1: 0, 2: 5})
    assert planned_records(ranges, {0: 30, 1: 0, 2: 5}) == 20  # an empty partition's 0 is known
    assert planned_records(ranges, {0: 30, 2: 5}) is None


def test_an_empty_fetch_at_the_watermark_is_the_end_at_once():
    ingest = ScriptedIngest([(0, {0: 100, 1: 100})])
    assert ingest.run_batch() == 0
    assert ingest.calls == 1


def test_a_fetch_that_stays_empty_below_the_watermark_gives_up_after_a_few_tries():
    ingest = ScriptedIngest([(0, {0: 100, 1: 150})] * 10)
    assert ingest.run_batch() == 0
    assert ingest.calls == EMPTY_FETCHES_BEHIND_WATERMARK
    # The same gap next time: not retried again (records the consumer never gets, say markers).
    assert ingest.run_batch() == 0
    assert ingest.calls == EMPTY_FETCHES_BEHIND_WATERMARK + 1


def test_a_stop_request_or_no_watermark_ends_the_batch_at_once():
    stopping = ScriptedIngest([(None, {0: 100, 1: 150})] * 3)
    assert stopping.run_batch() == 0
    assert stopping.calls == 1
    unknown = ScriptedIngest([(0, {})] * 3)
    assert unknown.run_batch() == 0
    assert unknown.calls == 1


# ---- a hot partition's backlog split over several tasks -------------------------------------------


def _covered(ranges: list[OffsetRange], partition: int) -> Counter:
    """Every offset the pieces of `partition` read up to their minimum ends, as a multiset."""
    return Counter(o for r in ranges if r.partition == partition for o in range(r.start, r.min_end))


def test_one_hot_partition_is_split_into_contiguous_exact_pieces_one_per_core():
    watermarks = {0: 181_000, 1: 50, 2: 0}
    ranges = plan_ranges("t", [0, 1, 2], {0: 1_000, 1: 50, 2: 0}, 200_000, watermarks)
    split = split_ranges(ranges, watermarks, tasks=4, min_piece=10_000)
    hot = [r for r in split if r.partition == 0]
    assert len(hot) == 4
    # Each offset of the backlog once, nothing past it, and every piece but the last has an exact end.
    assert _covered(split, 0) == Counter(range(1_000, 181_000))
    assert all(r.end == r.min_end == r.start + r.max_records for r in hot[:-1])
    assert hot[-1].end == 0 and hot[-1].min_end == 181_000
    assert hot[-1].start + hot[-1].max_records == 1_000 + 200_000  # the batch's cap is unchanged
    assert [r for r in split if r.partition != 0] == ranges[1:]  # idle partitions untouched


def test_backlogs_are_split_in_proportion_and_never_below_the_minimum_piece():
    watermarks = {0: 90_000, 1: 30_000}
    ranges = plan_ranges("t", [0, 1], {0: 0, 1: 0}, 200_000, watermarks)
    split = split_ranges(ranges, watermarks, tasks=8, min_piece=10_000)
    assert Counter(r.partition for r in split) == {0: 6, 1: 2}
    assert _covered(split, 0) == Counter(range(90_000)) and _covered(split, 1) == Counter(range(30_000))
    small = split_ranges(ranges, watermarks, tasks=8, min_piece=40_000)
    assert Counter(r.partition for r in small) == {0: 2, 1: 1}


@pytest.mark.parametrize(
    ("starts", "watermarks", "tasks"),
    [
        ({0: 0, 1: 0}, {0: 100_000, 1: 100_000}, 2),  # as many busy partitions as cores
        ({0: 0, 1: 0}, {0: 100_000}, 2),  # partition 1's size is unknown: it takes a core
        ({0: 0, 1: 0}, {0: 15_000, 1: 0}, 2),  # too small to be worth a second task
    ],
)
def test_ranges_stay_whole_when_splitting_gains_nothing(starts, watermarks, tasks):
    ranges = plan_ranges("t", [0, 1], starts, 200_000, watermarks)
    assert split_ranges(ranges, watermarks, tasks, min_piece=10_000) == ranges


class GreedyReader(ScriptedReader):
    """Returns what the script says whatever was asked for (as a consumer reading over offset gaps
    can return records past the offset count it was asked for)."""

    def consume(self, count: int, timeout: float) -> list[Message]:
        return super().consume(10**9, timeout)


def test_a_piece_reads_exactly_to_its_end_and_drops_what_was_prefetched_past_it():
    plan = OffsetRange("t", 0, start=100, max_records=50, min_end=150, end=150)
    reader = GreedyReader(100, [30, 40, 40])  # the second poll runs past the end
    settings = FetchSettings(idle_poll_seconds=0.0, max_fetch_seconds=5)
    batches = list(_read_range(reader, plan, settings))
    offsets = [o for b in batches for o in b.column("kafka_offset").to_pylist()]
    assert offsets == list(range(100, 150))


def test_a_piece_that_stops_short_fails_the_batch_instead_of_leaving_a_hole():
    plan = OffsetRange("t", 0, start=100, max_records=50, min_end=150, end=150)
    reader = ScriptedReader(100, [1, 29])  # then nothing more arrives
    settings = FetchSettings(idle_poll_seconds=0.0, max_fetch_seconds=0.3)
    with pytest.raises(BrokerUnavailable, match="stopped at 130"):
        list(_read_range(reader, plan, settings))


class FakeContext:
    def __init__(self, conf: dict[str, str], parallelism: int) -> None:
        self._conf, self.defaultParallelism = conf, parallelism

    def getConf(self):  # noqa: N802 - SparkContext's name
        return self

    def get(self, key: str, default: str | None = None) -> str | None:
        return self._conf.get(key, default)


@pytest.mark.parametrize(
    ("conf", "registered", "slots"),
    [
        ({}, 2, 2),  # local: the cores it has
        # EMR (prod's streaming resources): starts with no executors, may grow to 2 x 4 cores
        ({"spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.maxExecutors": "2",
          "spark.executor.cores": "4"}, 2, 8),
        ({"spark.dynamicAllocation.enabled": "true", "spark.executor.cores": "4"}, 2, 2),  # no cap set
    ],
)  # fmt: skip
def test_a_batch_plans_tasks_for_the_cores_the_application_may_grow_to(conf, registered, slots):
    from jobs.ingest.kafka_source import task_slots

    spark = type("Spark", (), {"sparkContext": FakeContext(conf, registered)})()
    assert task_slots(spark) == slots
