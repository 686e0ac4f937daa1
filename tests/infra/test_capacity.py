"""The capacity model (infra/capacity.py), the config built from it, and the docs that print it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infra.capacity import MIN_PARTITIONS, CapacityTarget, capacity_table, plan_capacity
from infra.config import DEV_PLAN, PROD_PLAN, DeploymentConfig

REPO = Path(__file__).resolve().parents[2]


def target(sustained: int, outage: int = 60, catch_up: int = 20, headroom: float = 2.0) -> CapacityTarget:
    return CapacityTarget(sustained, outage, catch_up, headroom, why="test")


def test_the_catch_up_rate_drains_the_backlog_in_the_window_while_clicks_keep_coming():
    t = target(1_000, outage=60, catch_up=20)
    backlog = 1_000 * 3600
    # After 20 minutes at this rate, the backlog and the 20 minutes that came meanwhile are read.
    assert t.catch_up_clicks_per_second * 20 * 60 == pytest.approx(backlog + 1_000 * 20 * 60)


@pytest.mark.parametrize(
    ("sustained", "brokers", "partitions"),
    [
        (100, 2, MIN_PARTITIONS),  # one vCPU is plenty: never below the topics' first 3
        (20_000, 3, 9),  # 160,000/s with headroom over 23,750 per vCPU: 7 vCPUs, rounded up to 3 x 3
        (20_000, 2, 8),
        (200_000, 3, 69),  # ten times prod: 68 vCPUs
    ],
)
def test_partitions_cover_the_vcpus_as_a_multiple_of_the_brokers(sustained, brokers, partitions):
    plan = plan_capacity(target(sustained), brokers, executor_cores=4)
    assert plan.partitions == partitions
    assert plan.partitions >= plan.ingest_vcpus
    assert plan.partitions == MIN_PARTITIONS or plan.partitions % brokers == 0
    assert plan.ingest_executors * 4 >= plan.ingest_vcpus > (plan.ingest_executors - 1) * 4


def test_docs_capacity_prints_the_model_the_config_is_built_from():
    text = (REPO / "docs" / "capacity.md").read_text()
    (printed,) = re.findall(r"<!-- capacity-table:[^>]*-->\n(.*?)\n<!-- /capacity-table -->", text, re.S)
    assert printed == capacity_table({"dev": DEV_PLAN, "prod": PROD_PLAN})


def _cost_rows(path: Path) -> dict[str, str]:
    rows = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] and not cells[0].startswith("-"):
            rows[cells[0]] = cells[1]
    return rows


@pytest.mark.parametrize(("env", "doc"), [("dev", "infra/README.md"), ("prod", "docs/capacity.md")])
def test_the_cost_tables_price_the_sizes_the_config_deploys(env, doc):
    config = DeploymentConfig.for_env(env)
    rows = _cost_rows(REPO / doc)
    times = r"\s*[x×]\s*"
    assert re.match(
        rf"{config.kafka.broker_count}{times}{config.kafka.broker_instance_type}\b", rows["MSK brokers"]
    )
    worker = config.compute.worker_instance_types[0]
    assert re.match(rf"{config.compute.core_units}{times}{worker}\b", rows["EMR core"])
    assert re.match(rf"1{times}{config.compute.primary_instance_types[0]}\b", rows["EMR primary"])
    assert f"db.{config.source_database.instance_class}" in rows["RDS"]
    assert ("Multi-AZ" in rows["RDS"]) == config.source_database.multi_az
