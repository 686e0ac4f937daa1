"""Every job, once: its name, its package and how it runs.

The CLI (`lakehouse run <job>`), the streaming application, the EMR steps (`infra/emr_steps.py`)
and the demo all read this table, so a job is added or renamed here and nowhere else. A job is a
package `jobs/<name>/` whose `__main__.py` has `main(argv) -> int`: `python -m jobs.<name>` locally,
`emr_step.py <name>` on EMR.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    STREAMING = "streaming"  # runs until stopped; on EMR a step kept alive by the step supervisor
    APPLICATION = "application"  # the streaming jobs together in one Spark application
    BATCH = "batch"  # runs to completion; on EMR a step started by a state machine


@dataclass(frozen=True)
class Job:
    name: str
    kind: Kind
    summary: str
    upstream: str | None = None  # the streaming job whose output it consumes

    @property
    def package(self) -> str:
        return f"jobs.{self.name}"

    def main(self) -> Callable[[Sequence[str]], int]:
        return importlib.import_module(f"{self.package}.__main__").main


JOBS: Mapping[str, Job] = {
    job.name: job
    for job in (
        Job("cdc", Kind.STREAMING, "MySQL binlog -> Iceberg dimension tables (dim_db), exactly once"),
        Job("ingest", Kind.STREAMING, "Kafka clicks -> ods_behavior.clickevent + rejects", upstream="cdc"),
        Job("views", Kind.STREAMING, "clicks -> ads_behavior.product_views", upstream="ingest"),
        Job("streaming", Kind.APPLICATION, "cdc, ingest and views in one Spark application"),
        Job("report", Kind.BATCH, "the daily member report -> ads_behavior.member_daily_report"),
        Job("maintain", Kind.BATCH, "compaction, snapshot expiry, orphan cleanup"),
        Job("verify", Kind.BATCH, "reconcile the lake with Kafka and MySQL; exit 1 on a mismatch"),
        Job("replay", Kind.BATCH, "rejects that pass today's validation -> the fact table, each once"),
        Job("gendata", Kind.BATCH, "ClickEvents (and malformed records on request) -> Kafka"),
    )
}


def names(kind: Kind) -> tuple[str, ...]:
    """The jobs of one kind, in table order (for streaming jobs: upstream first)."""
    return tuple(name for name, job in JOBS.items() if job.kind is kind)


def job(name: str) -> Job:
    if name not in JOBS:
        raise KeyError(f"no job {name!r}: one of {', '.join(JOBS)}")
    return JOBS[name]
