"""The capacity model: a stated target per environment -> the click topic's partitions and how many
executors the ingest may take. infra/config.py builds both environments' values with `plan_capacity`,
so the config cannot drift from the target; docs/capacity.md prints the model (`capacity_table`).

Measured, on the 2-vCPU development box (bench/results/RESULTS.md and the issue-49 figures):
* the ingest reading a backlog with tasks: 95,000-111,000 events/s on 2 cores;
* CDC applying changes: 12,000-20,000 changes/s (12,243, 12,905 and 13,079 in three runs on
  2026-11-29); the snapshot: 117,000-184,000 rows/s.

Extrapolated, not measured here: an EMR vCPU is a hyperthread, so it is counted as half of one of
these cores (`EMR_VCPU_SHARE`); and throughput is taken to add up across executors: the scale-out
bench (`bench/scaleout_bench.py`) shows a batch's tasks on both executors, but on this 2-core box
not the throughput gain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Events/s one core of the development box ingests from a backlog (the lower measured figure / 2).
INGEST_EVENTS_PER_CORE_SECOND = 47_500
# An EMR vCPU (one hyperthread of a core) counted as this share of such a core: an assumption.
EMR_VCPU_SHARE = 0.5
# The click topic never has fewer: Kafka cannot remove partitions, and topics were created with 3.
MIN_PARTITIONS = 3


@dataclass(frozen=True)
class CapacityTarget:
    """What an environment must carry: `sustained` clicks/s, and a backlog of `outage_minutes`
    (ingest down, a cluster replaced) read back within `catch_up_minutes` while clicks keep coming,
    with `headroom` on top of both."""

    sustained_clicks_per_second: int
    outage_minutes: int
    catch_up_minutes: int
    headroom: float
    why: str

    @property
    def catch_up_clicks_per_second(self) -> float:
        """The rate that drains the backlog in time: the backlog over the window, plus the stream."""
        backlog = self.sustained_clicks_per_second * self.outage_minutes * 60
        return self.sustained_clicks_per_second + backlog / (self.catch_up_minutes * 60)


@dataclass(frozen=True)
class CapacityPlan:
    target: CapacityTarget
    ingest_vcpus: int  # EMR vCPUs the ingest needs to catch up in time, with headroom
    partitions: int  # the click topic's
    ingest_executors: int  # of `executor_cores` vCPUs each

    @property
    def catch_up_rate_with_headroom(self) -> float:
        return self.target.catch_up_clicks_per_second * self.target.headroom


def plan_capacity(target: CapacityTarget, broker_count: int, executor_cores: int) -> CapacityPlan:
    """Partitions: at least one per vCPU the catch-up needs (a steady stream's batches are read
    partition by partition; a backlog on fewer busy partitions is split, jobs/ingest/kafka_source.py),
    a multiple of the brokers so leaders spread evenly, never below MIN_PARTITIONS."""
    per_vcpu = INGEST_EVENTS_PER_CORE_SECOND * EMR_VCPU_SHARE
    vcpus = math.ceil(target.catch_up_clicks_per_second * target.headroom / per_vcpu)
    partitions = max(MIN_PARTITIONS, math.ceil(vcpus / broker_count) * broker_count)
    return CapacityPlan(target, vcpus, partitions, math.ceil(vcpus / executor_cores))


def capacity_table(plans: dict[str, CapacityPlan]) -> str:
    """The model per environment as a Markdown table (docs/capacity.md embeds it; a test compares)."""
    rows = [
        "| | " + " | ".join(plans) + " |",
        "|---|" + "---|" * len(plans),
    ]

    def row(label: str, value) -> str:
        return f"| {label} | " + " | ".join(value(p) for p in plans.values()) + " |"

    rows += [
        row("sustained clicks/s (target)", lambda p: f"{p.target.sustained_clicks_per_second:,}"),
        row(
            "backlog read back (target)",
            lambda p: f"{p.target.outage_minutes} min within {p.target.catch_up_minutes} min",
        ),
        row("catch-up rate", lambda p: f"{p.target.catch_up_clicks_per_second:,.0f}/s"),
        row("with headroom", lambda p: f"x{p.target.headroom:g} = {p.catch_up_rate_with_headroom:,.0f}/s"),
        row("ingest vCPUs", lambda p: str(p.ingest_vcpus)),
        row("click topic partitions", lambda p: str(p.partitions)),
        row("ingest executors", lambda p: str(p.ingest_executors)),
    ]
    return "\n".join(rows)
