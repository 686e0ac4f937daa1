"""`lakehouse demo` (what `make demo` runs): a short run of the whole scenario on a fresh stack of
its own (as after a fresh clone) exits 0 and leaves a consistent lake behind."""

from __future__ import annotations

import pytest
from support import private_stack_env, run_cli

from lakehouse.local.catalog import pyiceberg_catalog

pytestmark = pytest.mark.stack


@pytest.fixture
def demo_env(tmp_path):
    env = private_stack_env(tmp_path / "demo-home")
    yield env
    run_cli("local", "down", "--purge", env=env, check=False)


def test_short_demo_runs_the_scenario_end_to_end(demo_env, tmp_path):
    result = run_cli("demo", "--seconds", "30", "--rate", "200", timeout=900, check=False, env=demo_env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for stage in ("1/6", "2/6", "3/6", "4/6", "5/6", "6/6", "demo summary", "demo done"):
        assert stage in out
    assert "memberLevel=2" in out  # the source system's UPDATE reached dim_db.user_member

    home = tmp_path / "demo-home"
    catalog = pyiceberg_catalog(home / "catalog.db", home / "warehouse")
    views = catalog.load_table("ads_behavior.product_views").scan().to_arrow().to_pylist()
    clicks = catalog.load_table("ods_behavior.clickevent").scan().to_arrow()
    assert sum(r["views"] for r in views) == clicks.num_rows > 0
    # New clicks of product 1 carry the new price, in the aggregate; the dimension has it once.
    assert any(r["productId"] == "1" and float(r["product_price"]) == 8.1 for r in views)
    products = catalog.load_table("dim_db.products").scan().to_arrow().to_pylist()
    assert [float(p["product_price"]) for p in products if p["productId"] == "1"] == [8.1]
    report = catalog.load_table("ads_behavior.member_daily_report").scan().to_arrow()
    assert report.num_rows > 0
