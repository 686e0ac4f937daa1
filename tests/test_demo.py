"""`lakehouse demo` (what `make demo` runs): a short run of the whole scenario exits 0 and leaves a
consistent lake behind."""

from __future__ import annotations

import pytest
from support import run_cli

pytestmark = pytest.mark.stack


def test_short_demo_runs_the_scenario_end_to_end(local_stack, pyiceberg_catalog):
    result = run_cli("demo", "--seconds", "30", "--rate", "200", timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for stage in ("1/6", "2/6", "3/6", "4/6", "5/6", "6/6", "demo summary", "demo done"):
        assert stage in out
    assert "memberLevel=2" in out  # the source system's UPDATE reached dim_db.user_member

    views = pyiceberg_catalog.load_table("ads_behavior.product_views").scan().to_arrow().to_pylist()
    clicks = pyiceberg_catalog.load_table("ods_behavior.clickevent").scan().to_arrow()
    assert sum(r["views"] for r in views) == clicks.num_rows > 0
    # New clicks of product 1 carry the new price, in the fact table and in the aggregate.
    assert any(r["productId"] == "1" and float(r["product_price"]) == 8.1 for r in views)
    products = pyiceberg_catalog.load_table("dim_db.products").scan().to_arrow().to_pylist()
    assert [float(p["product_price"]) for p in products if p["productId"] == "1"] == [8.1]
    report = pyiceberg_catalog.load_table("ads_behavior.member_daily_report").scan().to_arrow()
    assert report.num_rows > 0
    assert local_stack.status()["healthy"] is True
