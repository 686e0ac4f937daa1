"""Scale-out of the ingest over executors (issue 49) on a private local stack: a Spark cluster of
separate executor processes (`local-cluster[N,1,MB]`, Spark's own multi-process mode: a master,
workers and executor JVMs on this box, as on YARN) ingests a backlog spread over
BENCH_SCALEOUT_PARTITIONS (6) partitions, once with one executor of one core and once with two.

Evidence is Spark's own event log: for the batches of the two-executor run, which executors ran the
read tasks (the Kafka fetch, materialized by `localCheckpoint`) and the write tasks (the Iceberg
writes). Throughput is records per second of wall time over BENCH_SCALEOUT_BACKLOG (600,000)
records after a warm-up ingest on each cluster; the ratio of the two runs is the figure that
carries over, not the absolute rates: this box has 2 cores, so two executors share them with the
driver and the broker, and the ratio is a lower bound of what separate nodes give.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.clickstream_bench import create_topic, new_ingest
from bench.private_stack import private_stack, row

EXECUTOR_MEMORY_MB = 1536
MEASURED = "scaleout-measured"  # the job group of the measured ingest (the event log keeps it)


def _cluster_config(config, executors: int):
    from jobs.common.spark_session import local_spark_jars

    master = f"local-cluster[{executors},1,{EXECUTOR_MEMORY_MB}]"
    spark = dataclasses.replace(config.spark, master=master, jars=local_spark_jars())
    return dataclasses.replace(config, spark=spark)


def _spark(config, executors: int, event_dir: Path):
    from jobs.common.spark_session import build_spark
    from jobs.ingest.job import job_spark_conf

    extra = {
        **job_spark_conf(),
        # The executors are JVMs of their own: they need the Iceberg classes too.
        "spark.executor.extraClassPath": ":".join(config.spark.jars),
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": str(event_dir),
        "spark.sql.shuffle.partitions": str(executors * 2),
    }
    return build_spark(config, f"scaleout-{executors}", extra)


def _drain(spark, config, topic: str, expected: int) -> tuple[float, int]:
    ingest, _ = new_ingest(spark, config, topic, config.table("ods_behavior", f"{topic}_fact"), 200_000)
    handled, began = 0, time.monotonic()
    while handled < expected:
        records = ingest.run_batch()
        if not records:
            break
        handled += records
    ingest.finish()
    return handled / (time.monotonic() - began), handled


def _tasks_per_executor(event_dir: Path) -> dict[str, dict[str, int]]:
    """{"read"|"write"|"other": {executor id: tasks}} of the measured jobs' stages, from the event
    log of the run in `event_dir`."""
    names: dict[int, str] = {}
    measured: set[int] = set()
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for log in event_dir.iterdir():
        for line in log.read_text().splitlines():
            event = json.loads(line)
            kind = event.get("Event")
            if kind == "SparkListenerJobStart":
                if (event.get("Properties") or {}).get("spark.jobGroup.id") == MEASURED:
                    measured.update(event["Stage IDs"])
            elif kind == "SparkListenerStageSubmitted":
                info = event["Stage Info"]
                names[info["Stage ID"]] = info["Stage Name"]
            elif kind == "SparkListenerTaskEnd" and event["Stage ID"] in measured:
                name = names.get(event["Stage ID"], "")
                # The ingest appends with `.overwrite(lit(False))`: an append validated against
                # other commits since its start (jobs/common/snapshot_progress.py).
                write = any(verb in name for verb in ("append at", "overwrite at"))
                stage = "read" if "localCheckpoint" in name else "write" if write else "other"
                counts[stage][event["Task Info"]["Executor ID"]] += 1
    return {stage: dict(by_executor) for stage, by_executor in counts.items()}


def run() -> list[dict]:
    from jobs.gendata.generator import generate_records, produce, producer_config

    backlog = int(os.environ.get("BENCH_SCALEOUT_BACKLOG", "600000"))
    partitions = int(os.environ.get("BENCH_SCALEOUT_PARTITIONS", "6"))
    results = {}
    with private_stack("scaleout") as stack:
        from jobs.config import LakehouseConfig

        base = LakehouseConfig.local(stack.settings.home)
        for executors in (1, 2):
            config = _cluster_config(base, executors)
            warm, topic = f"scaleout_warm_{executors}", f"scaleout_backlog_{executors}"
            for name, count, seed in ((warm, 30_000, 7), (topic, backlog, 8 + executors)):
                create_topic(config.kafka.bootstrap, name, partitions)
                produce(producer_config(config), name, generate_records(count, seed=seed), count)
            events = Path(tempfile.mkdtemp(prefix=f"scaleout-{executors}-"))
            spark = _spark(config, executors, events)
            _drain(spark, config, warm, 30_000)  # JIT, class loading, Python workers on every executor
            spark.sparkContext.setJobGroup(MEASURED, "the measured backlog")
            rate, handled = _drain(spark, config, topic, backlog)
            spark.stop()
            results[executors] = (rate, handled, _tasks_per_executor(events))
            print(f"{executors} executor(s): {rate:,.0f} ev/s, {handled:,} records", flush=True)
    (one, _, _), (two, handled_two, tasks) = results[1], results[2]
    spread = {stage: tasks.get(stage, {}) for stage in ("read", "write")}
    both = all(len(spread[stage]) >= 2 for stage in spread)
    return [
        row(
            f"ingest of {backlog:,} over {partitions} partitions, 1 executor x 1 core",
            f"{one:,.0f} ev/s",
        ),
        row(f"the same, 2 executors x 1 core ({handled_two:,} records)", f"{two:,.0f} ev/s"),
        row("2 executors / 1 executor, same run", f"{two / one:.2f}x", "> 1.0x", two / one > 1.0),
        row(
            "read tasks (Kafka fetch) per executor, 2-executor run (event log)",
            json.dumps(spread["read"], sort_keys=True),
            "both executors",
            len(spread["read"]) >= 2,
        ),
        row(
            "write tasks (Iceberg commit's data files) per executor, 2-executor run (event log)",
            json.dumps(spread["write"], sort_keys=True),
            "both executors",
            len(spread["write"]) >= 2,
        ),
        row("scale-out shown", str(both), "True", both),
    ]
