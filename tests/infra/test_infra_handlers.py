"""The custom-resource Lambda handlers' logic, without AWS or a database."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from infra import seed_data

LAMBDAS = Path(__file__).resolve().parents[2] / "infra" / "lambdas"


def _load(handler_dir: str):
    """Import a handler the way Lambda does: its directory, and the shared modules the bundle
    copies next to it (infra/seed_data.py), on sys.path."""
    directory = str(LAMBDAS / handler_dir)
    shared = str(Path(seed_data.__file__).parent)
    sys.path[:0] = [directory, shared]
    try:
        spec = importlib.util.spec_from_file_location(
            f"{handler_dir}_handler", LAMBDAS / handler_dir / "handler.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(directory)
        sys.path.remove(shared)


@pytest.fixture(scope="module")
def seed():
    return _load("seed_source_db")


def _statements(seed):
    return list(seed.seed_statements("user_db", "cdc_user", "generated-in-test", 24))


def test_seed_keeps_the_source_column_names(seed):
    sql = " ".join(s for s, _ in _statements(seed))
    for column in ("productId", "name", "description", "product_price", "update_time"):
        assert re.search(rf"\b{column}\b", sql), column
    for column in ("userid", "show_params", "memberLevel"):
        assert re.search(rf"\b{column}\b", sql), column
    inserts = [args for s, args in _statements(seed) if s.startswith("INSERT IGNORE")]
    assert len(inserts) == 9 + 5
    assert ("513248", "test01", "label01", 1) in inserts


def test_cdc_user_gets_only_replication_select_and_the_barrier(seed):
    grants = [s for s, _ in _statements(seed) if s.startswith("GRANT")]
    privileges = set()
    for grant in grants:
        granted, on = grant[len("GRANT ") :].split(" TO ", 1)[0].split(" ON ", 1)
        privileges |= {(p.strip(), on) for p in granted.split(",")}
    barrier = "`lakehouse_meta`.`cdc_snapshot_barrier`"
    assert privileges == {
        ("REPLICATION SLAVE", "*.*"),
        ("REPLICATION CLIENT", "*.*"),
        ("SELECT", "`user_db`.*"),
        ("SELECT", barrier),
        ("INSERT", barrier),
        ("UPDATE", barrier),
    }
    # The barrier table exists before the grant on it, and is the one the CDC job writes.
    sql = [s for s, _ in _statements(seed)]
    grant_on_barrier = min(i for i, s in enumerate(sql) if s.startswith("GRANT") and barrier in s)
    assert sql.index(seed_data.CDC_BARRIER_DDL) < grant_on_barrier


def test_the_cdc_job_writes_the_barrier_the_seeding_creates():
    from jobs.cdc.source_db import SNAPSHOT_BARRIER

    assert SNAPSHOT_BARRIER == f"{seed_data.CDC_BARRIER_DATABASE}.{seed_data.CDC_BARRIER_TABLE}"


def test_binlog_retention_is_set_and_passwords_are_parameters(seed):
    statements = _statements(seed)
    assert (
        "CALL mysql.rds_set_configuration('binlog retention hours', %s)",
        (24,),
    ) in statements
    # The password only ever travels as a bound parameter, never inside the SQL text.
    assert all("generated-in-test" not in sql for sql, _ in statements)


def test_seed_delete_is_a_no_op(seed):
    event = {
        "RequestType": "Delete",
        "PhysicalResourceId": "seed-user_db",
        "ResourceProperties": {"DatabaseName": "user_db"},
    }
    assert seed.on_event(event, None) == {"PhysicalResourceId": "seed-user_db"}


def test_cleanup_revokes_only_group_references():
    cleanup = _load("emr_sg_cleanup")
    permissions = [
        {
            "IpProtocol": "tcp",
            "FromPort": 443,
            "ToPort": 443,
            "IpRanges": [{"CidrIp": "10.0.0.0/16"}],
            "UserIdGroupPairs": [],
        },
        {
            "IpProtocol": "-1",
            "IpRanges": [],
            "UserIdGroupPairs": [{"GroupId": "sg-1", "UserId": "111122223333", "Description": "EMR"}],
        },
    ]
    assert cleanup.group_references(permissions) == [
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-1", "UserId": "111122223333"}]}
    ]
    assert cleanup.on_event({"RequestType": "Create", "ResourceProperties": {}}, None) == {
        "PhysicalResourceId": cleanup.PHYSICAL_ID
    }
