"""`lakehouse verify` on a stack of its own: clean while the pipeline runs under load, and each kind of
damage made behind the jobs' back (with pyiceberg, not through the jobs) found, named and exit 1.

The damage is checked against what went in: the offsets deleted or copied, the key changed, the
group miscounted are exactly the ones the findings name.
"""

from __future__ import annotations

import json
import signal
import threading

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support import run_cli
from test_demo import read_topic
from test_streaming import Stack, change_sources, wait_for

from lakehouse.local.catalog import pyiceberg_catalog

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("verify-home"))
    stack.up()
    yield stack
    stack.stack.down()


def verify(stack: Stack, *args: str) -> tuple[int, dict]:
    result = run_cli("verify", "--json", *args, env=stack.env, timeout=600, check=False)
    assert result.returncode in (0, 1, 2), result.stderr[-3000:]
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}") from None
    assert report["exit_code"] == result.returncode
    return result.returncode, {(c["check"], c["table"]): c for c in report["checks"]}


def table(stack: Stack, name: str):
    return pyiceberg_catalog(stack.settings.catalog_path, stack.settings.warehouse).load_table(name)


def test_a_running_pipeline_under_load_verifies_clean(stack) -> None:
    """Clicks and source changes keep flowing while verify runs: no false alarm; then, with the
    pipeline stopped and caught up, every offset and row is compared and matches."""
    stack.produce(3_000, "--rate", "0")
    app = stack.start_streaming()
    try:
        wait_for(lambda: stack.job_status().get("views", {}).get("records", 0) > 0, 240, "views to count")
        load = threading.Thread(target=lambda: (stack.produce(4_000, "--rate", "400"), None))
        changes = threading.Thread(target=change_sources, args=(stack, 60, 7))
        load.start()
        changes.start()
        code, checks = verify(stack)
        load.join()
        changes.join()
        assert code == 0, json.dumps(checks, indent=1)[:4000]
        assert {k[1] for k in checks} >= {
            "ods_behavior.clickevent",
            "ads_behavior.product_views",
            "dim_db.products",
            "dim_db.user_member",
        }
        assert all(c["compared"] > 0 for c in checks.values())
    finally:
        app.send_signal(signal.SIGTERM)
        app.wait(timeout=180)
    stack.run_until_idle()
    code, checks = verify(stack)
    assert code == 0, json.dumps(checks, indent=1)[:4000]
    # Every offset the topic holds was compared (an independent consumer counts them).
    sent = read_topic(f"127.0.0.1:{stack.settings.kafka_port}", "clicktopic")
    assert checks[("kafka -> clicks", "ods_behavior.clickevent")]["compared"] == len(sent) >= 7_000


def _findings(check: dict) -> dict[str, dict]:
    return {f["kind"]: f for f in check["findings"]}


def test_each_kind_of_damage_is_found_and_named(stack) -> None:
    """Made behind the jobs' back, one kind at a time: a views count off by one, a dimension row
    changed, a fact row deleted and another appended twice. Each is found, named (the group, the
    key, the offsets), comes with a repair hint, and verify exits 1."""
    # A views count off by one.
    views = table(stack, "ads_behavior.product_views")
    rows = views.scan().to_arrow().sort_by("productId")
    victim = rows.slice(0, 1).to_pylist()[0]
    bumped = pc.add(rows["views"], pa.array([1] + [0] * (rows.num_rows - 1), pa.int64()))
    views.overwrite(rows.set_column(rows.schema.get_field_index("views"), "views", bumped))
    code, checks = verify(stack, "--tables", "ads_behavior.product_views")
    assert code == 1
    (finding,) = checks[("clicks -> views", "ads_behavior.product_views")]["findings"]
    assert finding["count"] == 1 and finding["kind"] == "groups with a wrong count"
    assert finding["examples"][0].startswith(f"{victim['productId']}/{victim['name']}/")
    assert f"{victim['views'] + 1} counted of {victim['views']}" in finding["examples"][0]
    assert "lakehouse run views" in finding["hint"]
    views.overwrite(rows)  # put it back

    # A dimension row changed.
    products = table(stack, "dim_db.products")
    rows = products.scan().to_arrow().sort_by("productId")
    key = rows["productId"][0].as_py()
    names = pc.if_else(pc.equal(rows["productId"], key), pa.scalar("tampered"), rows["name"])
    products.overwrite(rows.set_column(rows.schema.get_field_index("name"), "name", names))
    code, checks = verify(stack, "--tables", "dim_db.products")
    assert code == 1
    (finding,) = checks[("mysql -> dimension", "dim_db.products")]["findings"]
    assert finding["kind"] == "rows that differ" and finding["examples"] == [f"key {key}"]
    assert "--resync user_db.products" in finding["hint"]
    products.overwrite(rows)

    # A fact row deleted and another appended twice.
    clicks = table(stack, "ods_behavior.clickevent")
    all_clicks = clicks.scan(selected_fields=("kafka_partition", "kafka_offset")).to_arrow()
    lost = all_clicks.slice(10, 1).to_pylist()[0]
    copied = all_clicks.slice(20, 1).to_pylist()[0]
    where = "kafka_partition = {kafka_partition} AND kafka_offset = {kafka_offset}"
    clicks.delete(where.format(**lost))
    clicks.append(clicks.scan(row_filter=where.format(**copied)).to_arrow())  # now there twice
    code, checks = verify(stack, "--tables", "ods_behavior.clickevent")
    assert code == 1
    found = _findings(checks[("kafka -> clicks", "ods_behavior.clickevent")])
    assert set(found) == {"missing offsets", "duplicate offsets"}
    assert found["missing offsets"]["count"] == 1
    assert found["missing offsets"]["examples"] == [
        f"partition {lost['kafka_partition']}: {lost['kafka_offset']}"
    ]
    assert found["duplicate offsets"]["examples"] == [
        f"partition {copied['kafka_partition']}: {copied['kafka_offset']}"
    ]
    assert "rollback_to_snapshot" in found["missing offsets"]["hint"]
