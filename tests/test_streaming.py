"""`lakehouse run streaming`: CDC, ingest and views in one Spark application, on a stack of its own;
and `lakehouse verify` on the same stack.

Every test compares the lake with what went in, read back by independent readers: the topic by a
plain Kafka consumer, the source tables by SQL, the lake by pyiceberg. The tests share the stack and
check the same invariants over everything produced so far, so each also re-checks the ones before
it. `lakehouse verify` must agree: clean while the application runs under load and after every
fault, and - last, as it damages the lake - it finds and names each kind of damage made behind the
jobs' back (with pyiceberg).
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support import run_cli
from test_demo import read_topic

from lakehouse.local.catalog import pyiceberg_catalog
from lakehouse.local.mariadb import APP_USER
from lakehouse.local.settings import StackSettings
from lakehouse.local.stack import LocalStack

pytestmark = pytest.mark.stack

REPO = Path(__file__).resolve().parents[1]
DIMS = {
    "products": ("dim_db.products", ["productId", "name", "description", "product_price", "update_time"]),
    "user_member": ("dim_db.user_member", ["userid", "name", "show_params", "memberLevel", "update_time"]),
}


class Stack:
    def __init__(self, home: Path) -> None:
        self.settings = StackSettings.on_free_ports(home)
        self.stack = LocalStack(self.settings)
        self.env = {**os.environ, **self.settings.environment()}

    def up(self) -> None:
        self.secrets = self.stack.up()["mysql"]

    def connect(self):
        return self.stack.mariadb.connect(APP_USER, self.secrets["password"])

    @property
    def status_file(self) -> Path:
        return self.settings.home / "streaming-status.json"

    def start_streaming(
        self, *args: str, code: Path = REPO, status_file: Path | None = None
    ) -> subprocess.Popen:
        """The streaming application of the code in `code` (this checkout, or a release's tree)."""
        log = (self.settings.home / "streaming.log").open("a")
        status = status_file or self.status_file
        command = [sys.executable, "-m", "jobs.streaming", "--status-file", str(status), *args]
        env = {**self.env, "PYTHONPATH": str(code)}  # before the editable install's path to this checkout
        return subprocess.Popen(
            command, cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def run_until_idle(self) -> subprocess.CompletedProcess:
        return run_cli(
            "run", "streaming", "--until-idle", "--idle-seconds", "2", "--status-file", str(self.status_file),
            env=self.env, timeout=600,
        )  # fmt: skip

    def produce(self, count: int, *args: str) -> subprocess.CompletedProcess:
        return run_cli("gendata", "--count", str(count), "--no-progress", *args, env=self.env, timeout=600)

    def job_status(self, status_file: Path | None = None) -> dict[str, dict]:
        return {job["name"]: job for job in self.app_status(status_file).get("jobs", [])}

    def app_status(self, status_file: Path | None = None) -> dict:
        try:
            return json.loads((status_file or self.status_file).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("streaming-home"))
    try:  # a part that failed to start must not leave the others running after the module
        stack.up()
        yield stack
    finally:
        stack.stack.down()


# ---- independent readers -------------------------------------------------------------------------------


def lake(stack: Stack, table: str) -> list[dict]:
    catalog = pyiceberg_catalog(stack.settings.catalog_path, stack.settings.warehouse)
    return catalog.load_table(table).scan().to_arrow().to_pylist()


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, Decimal):
        return f"{value:.4f}"
    if hasattr(value, "strftime"):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def assert_lake_equals_sources(stack: Stack) -> None:
    # Every record in the topic is in exactly one of the two click tables, exactly once.
    clicks = lake(stack, "ods_behavior.clickevent")
    rejects = lake(stack, "ods_behavior.clickevent_rejects")
    sent = read_topic(f"127.0.0.1:{stack.settings.kafka_port}", "clicktopic")
    landed = collections.Counter((r["kafka_partition"], r["kafka_offset"]) for r in clicks + rejects)
    assert landed == collections.Counter(sent.keys()), (len(sent), sum(landed.values()))
    # The views count every click once, per product and price.
    lake_views = lake(stack, "ads_behavior.product_views")
    counted = collections.Counter()
    for row in lake_views:
        counted[(row["productId"], row["product_price"])] += row["views"]
    assert +counted == collections.Counter((r["productId"], r["product_price"]) for r in clicks)
    # ... and per product, the clicks the topic holds (read back by the plain consumer).
    per_product = collections.Counter()
    for r in lake_views:
        per_product[r["productId"]] += r["views"]
    fact_keys = [(r["kafka_partition"], r["kafka_offset"]) for r in clicks]
    assert +per_product == collections.Counter(json.loads(sent[k])["productId"] for k in fact_keys)
    # The dimensions equal the source tables, row for row.
    assert dims_differences(stack) == {}


def dims_differences(stack: Stack) -> dict[str, tuple]:
    """Per dimension table that differs from its source: (rows only in the source, only in the lake)."""
    differences = {}
    conn = stack.connect()
    try:
        for source, (target, columns) in DIMS.items():
            with conn.cursor() as cur:
                cur.execute("SET time_zone = '+00:00'")
                cur.execute(f"SELECT {', '.join(columns)} FROM {source}")
                expected = collections.Counter(tuple(map(_text, row)) for row in cur.fetchall())
            conn.commit()
            actual = collections.Counter(tuple(_text(row[c]) for c in columns) for row in lake(stack, target))
            if actual != expected:
                differences[target] = (expected - actual, actual - expected)
    finally:
        conn.close()
    return differences


def change_sources(stack: Stack, statements: int, seed: int) -> None:
    """Updates, inserts and deletes on both source tables."""
    rng = random.Random(seed)
    conn = stack.connect()
    try:
        with conn.cursor() as cur:
            for i in range(statements):
                pick = rng.random()
                if pick < 0.5:
                    cur.execute(
                        "UPDATE products SET product_price=%s WHERE productId=%s",
                        (round(rng.uniform(1, 99), 2), str(rng.randint(1, 20))),
                    )
                elif pick < 0.7:
                    cur.execute(
                        "UPDATE user_member SET memberLevel=%s WHERE userid=%s",
                        (rng.randint(1, 5), str(rng.choice([555655, 555656, 555657]))),
                    )
                elif pick < 0.85:
                    cur.execute(
                        "INSERT INTO user_member (userid, name, memberLevel) VALUES (%s, %s, %s)",
                        (f"s{seed}-{i}", f"member {i}", rng.randint(1, 5)),
                    )
                else:
                    cur.execute("DELETE FROM user_member WHERE userid LIKE %s LIMIT 1", (f"s{seed}-%",))
                conn.commit()
    finally:
        conn.close()


def verify(stack: Stack, *args: str) -> tuple[int, dict]:
    """`lakehouse verify --json`: exit code and the checks by (check, table)."""
    result = run_cli("verify", "--json", *args, env=stack.env, timeout=600, check=False)
    assert result.returncode in (0, 1, 2), result.stderr[-3000:]
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}") from None
    assert report["exit_code"] == result.returncode
    # every run's findings are also kept beside the tables (locally as printed, keys included)
    stored = json.loads(Path(report.pop("findings_stored_at")).read_text())
    assert stored == report, "the stored findings are not what verify printed"
    return result.returncode, {(c["check"], c["table"]): c for c in report["checks"]}


def assert_verifies_clean(stack: Stack, *, whole_topic: bool) -> None:
    code, checks = verify(stack)
    assert code == 0, json.dumps(checks, indent=1)[:4000]
    assert set(checks) == {
        ("kafka -> clicks", "ods_behavior.clickevent"),
        ("mysql -> dimension", "dim_db.products"),
        ("mysql -> dimension", "dim_db.user_member"),
        ("clicks -> views", "ads_behavior.product_views"),
    }
    assert all(c["compared"] > 0 for c in checks.values())
    if whole_topic:  # every offset the topic holds was compared (the plain consumer counts them)
        sent = read_topic(f"127.0.0.1:{stack.settings.kafka_port}", "clicktopic")
        assert checks[("kafka -> clicks", "ods_behavior.clickevent")]["compared"] == len(sent)


def wait_for(condition, timeout: float, what: str, detail=lambda: "") -> None:
    """`detail`: what to print besides `what` when the wait times out (read then)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}. {detail()}")
        time.sleep(0.5)


# ---- tests ------------------------------------------------------------------------------------------


def test_until_idle_over_a_backlog_equals_the_sources(stack):
    stack.produce(20_000, "--bad-ratio", "0.05")
    change_sources(stack, 60, seed=1)
    result = stack.run_until_idle()
    assert "streaming stopped: cdc" in result.stderr, result.stderr[-2000:]
    assert_lake_equals_sources(stack)
    status = stack.job_status()
    assert {name: job["state"] for name, job in status.items()} == dict.fromkeys(
        ("cdc", "ingest", "views"), "finished"
    )
    assert status["ingest"]["records"] == 20_000
    assert status["views"]["records"] == len(lake(stack, "ods_behavior.clickevent"))


def compacted_clicks(stack: Stack) -> bool:
    """A table maintenance run of the application left the click table with fewer data files."""
    try:
        maintenance = json.loads(stack.status_file.read_text()).get("maintenance") or {}
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return maintenance.get("data_files_removed", {}).get("ods_behavior.clickevent", 0) > 0


def test_mariadb_down_leaves_ingest_and_views_committing_and_cdc_catches_up(stack):
    """... with table maintenance running beside the jobs (as locally every 5 min): it compacts the
    click table while they commit, and nothing is lost or doubled."""
    stack.status_file.unlink(missing_ok=True)  # an earlier run's "running" must not count
    app = stack.start_streaming("--maintain-every-minutes", "0.2")
    try:
        wait_for(lambda: stack.job_status().get("cdc", {}).get("state") == "running", 180, "CDC running")
        assert stack.stack.mariadb.stop()
        before = stack.job_status()
        # Small commits for maintenance to compact: Iceberg's bin-pack rewrites a partition's small
        # files once there are 5 (min-input-files). One burst at a time, each committed before the
        # next, so there are 10 new files however the ingest batches (on a loaded box one 10 s
        # burst went in 2 commits: nothing to compact, and the wait below timed out in CI).
        for burst in range(1, 11):
            stack.produce(300)
            committed = before["ingest"]["records"] + 300 * burst
            wait_for(
                lambda committed=committed: stack.job_status()["ingest"]["records"] >= committed,
                120,
                f"the ingest to commit burst {burst} of the clicks produced while MariaDB is down",
            )
        wait_for(
            lambda: stack.job_status()["views"]["records"] > before["views"]["records"],
            120,
            "views to count them",
        )
        assert app.poll() is None
        assert "binlog connection lost" in (stack.job_status()["cdc"]["error"] or "")
        stack.up()  # MariaDB back
        change_sources(stack, 20, seed=2)
        wait_for(
            lambda: not dims_differences(stack), 180, "CDC to apply the changes made after MariaDB returned"
        )
        # A liveness wait: on a loaded box (the other test group beside it) a maintenance pass over
        # every table takes minutes; 120 s timed out once there (passed alone in 90 s, whole test).
        wait_for(
            lambda: compacted_clicks(stack),
            300,
            "table maintenance to compact the click table",
            lambda: f"maintenance: {stack.app_status().get('maintenance')}",
        )
        assert json.loads(stack.status_file.read_text())["maintenance"]["errors"] == []
        # Clicks and source changes flow while verify runs: no false alarm.
        load = threading.Thread(target=stack.produce, args=(3_000, "--rate", "300"))
        changes = threading.Thread(target=change_sources, args=(stack, 40, 4))
        load.start()
        changes.start()
        try:
            assert_verifies_clean(stack, whole_topic=False)
        finally:
            load.join()
            changes.join()
    finally:
        app.send_signal(signal.SIGTERM)
        code = app.wait(120)
    assert code == 0
    assert_lake_equals_sources(stack)


def replace_the_cluster(stack: Stack, last_release: Path) -> tuple[subprocess.Popen, dict]:
    """A cluster replacement whose old cluster outlives the new one's start: the last release's
    application runs and commits; this version's starts beside it and must start no job while the
    old one's binlog reader is connected; the old one is killed -9 (its cluster terminated), then
    this version's jobs start, resuming from what the old code stored."""
    old_status = stack.settings.home / "old-release-status.json"
    old_status.unlink(missing_ok=True)
    old = stack.start_streaming(code=last_release, status_file=old_status)
    try:
        wait_for(
            lambda: (
                stack.job_status(old_status).get("ingest", {}).get("records", 0) > 0
                and stack.job_status(old_status).get("cdc", {}).get("state") == "running"
            ),
            180,
            "the last release's application to run and commit",
        )
        new = stack.start_streaming()
        wait_for(
            lambda: stack.app_status().get("waiting_for"), 120, "this version to see the old binlog reader"
        )
        began, old_records = time.monotonic(), stack.job_status(old_status)["ingest"]["records"]
        stack.produce(3_000, "--rate", "1000")
        wait_for(
            lambda: stack.job_status(old_status)["ingest"]["records"] >= old_records + 3_000,
            120,
            "the old application to go on committing while this one waits",
        )
        assert {j["state"] for j in stack.job_status().values()} == {"waiting"}, stack.app_status()
        assert old.poll() is None and new.poll() is None
        together = {
            "seconds": round(time.monotonic() - began, 1),
            "old_records": stack.job_status(old_status)["ingest"]["records"] - old_records,
            "waiting_for": stack.app_status()["waiting_for"],
        }
    finally:
        os.killpg(old.pid, signal.SIGKILL)
    assert old.wait(30) == -signal.SIGKILL
    stack.produce(500)  # the old one may have committed every click: this one must have some to commit
    wait_for(
        lambda: stack.job_status().get("ingest", {}).get("records", 0) > 0, 180, "this version's first commit"
    )
    assert stack.app_status()["waiting_for"] is None
    return new, together


def test_kill_9_three_times_then_a_clean_run_loses_and_doubles_nothing(stack, last_release):
    """The first run is a cluster replacement (replace_the_cluster): the last release's code runs
    beside this version's, which waits, then is killed at a commit; this version resumes from the
    progress that code stored (offsets, binlog positions, the views' watermark) and is killed at a
    commit, mid-run and during startup."""
    producer = subprocess.Popen(
        [sys.executable, "-m", "jobs.gendata", "--count", "24000", "--rate", "2000", "--no-progress",
         "--bad-ratio", "0.02"],
        cwd=REPO, env=stack.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    changes = threading.Thread(target=change_sources, args=(stack, 100, 3))
    changes.start()
    app = None
    try:
        for kill_after in (None, 3.0, 0.5):  # at a commit, mid-run after one, and during startup
            stack.status_file.unlink(missing_ok=True)  # what this run commits, only
            if kill_after is None:
                app, together = replace_the_cluster(stack, last_release)
                print(f"the two versions ran together: {together}")
            else:
                app = stack.start_streaming()
            if kill_after != 0.5:
                if producer.poll() is not None:  # the load ended: give this run clicks to commit
                    stack.produce(500)
                wait_for(lambda: stack.job_status().get("ingest", {}).get("records", 0) > 0, 180, "a commit")
            time.sleep(kill_after or 0.0)
            assert app.poll() is None, f"the application ended by itself before the kill ({kill_after})"
            os.killpg(app.pid, signal.SIGKILL)
            assert app.wait(30) == -signal.SIGKILL  # it died of the kill, not of something else
    finally:
        if app is not None and app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)
        _, errors = producer.communicate(timeout=120)
        changes.join(120)
    assert producer.returncode == 0, errors
    stack.run_until_idle()
    assert_lake_equals_sources(stack)
    assert_verifies_clean(stack, whole_topic=True)


def table(stack: Stack, name: str):
    return pyiceberg_catalog(stack.settings.catalog_path, stack.settings.warehouse).load_table(name)


def test_verify_finds_and_names_damage_made_behind_the_jobs_back(stack):
    """Last (it damages the lake): a views count off by one, a dimension row changed, a fact row
    deleted and another of the same group stored twice. One verify run names each: the group, the
    key, the two offsets (whose effects on the view cancel out: a count would not see them), each
    with a repair hint, and exits 1."""
    views = table(stack, "ads_behavior.product_views")
    counts = views.scan().to_arrow().sort_by([("views", "descending")])
    victim = counts.slice(0, 1).to_pylist()[0]
    bumped = pc.add(counts["views"], pa.array([1] + [0] * (counts.num_rows - 1), pa.int64()))
    views.overwrite(counts.set_column(counts.schema.get_field_index("views"), "views", bumped))

    products = table(stack, "dim_db.products")
    rows = products.scan().to_arrow().sort_by("productId")
    key = rows["productId"][0].as_py()
    names = pc.if_else(pc.equal(rows["productId"], key), pa.scalar("tampered"), rows["name"])
    products.overwrite(rows.set_column(rows.schema.get_field_index("name"), "name", names))

    clicks = table(stack, "ods_behavior.clickevent")
    # the biggest group other than the victim's, of a known product (no NULL key)
    other = next(
        r for r in counts.to_pylist()[1:] if None not in (r["productId"], r["name"], r["product_price"])
    )
    fields = ("productId", "name", "product_price", "kafka_partition", "kafka_offset")
    everything = clicks.scan(selected_fields=fields).to_arrow()
    in_group = pc.and_(
        pc.and_(
            pc.equal(everything["productId"], other["productId"]), pc.equal(everything["name"], other["name"])
        ),
        pc.equal(
            everything["product_price"], pa.scalar(other["product_price"], everything["product_price"].type)
        ),
    )
    lineage = everything.filter(in_group).select(["kafka_partition", "kafka_offset"])
    lost, copied = lineage.slice(0, 1).to_pylist()[0], lineage.slice(1, 1).to_pylist()[0]
    where = "kafka_partition = {kafka_partition} AND kafka_offset = {kafka_offset}"
    clicks.delete(where.format(**lost))
    clicks.append(clicks.scan(row_filter=where.format(**copied)).to_arrow())  # now there twice

    code, checks = verify(stack)
    assert code == 1
    (miscounted,) = checks[("clicks -> views", "ads_behavior.product_views")]["findings"]
    assert miscounted["kind"] == "groups with a wrong count" and miscounted["count"] == 1
    assert miscounted["examples"] == [
        f"{victim['productId']}/{victim['name']}/{victim['product_price']}: "
        f"{victim['views'] + 1} counted of {victim['views']}"
    ]
    assert "lakehouse run views" in miscounted["hint"]
    (changed,) = checks[("mysql -> dimension", "dim_db.products")]["findings"]
    assert changed["kind"] == "rows that differ" and changed["examples"] == [f"key {key}"]
    assert "--resync user_db.products" in changed["hint"]
    assert checks[("mysql -> dimension", "dim_db.user_member")]["findings"] == []
    found = {f["kind"]: f for f in checks[("kafka -> clicks", "ods_behavior.clickevent")]["findings"]}
    assert set(found) == {"missing offsets", "duplicate offsets"}
    named = "partition {kafka_partition}: {kafka_offset}"
    assert found["missing offsets"]["examples"] == [named.format(**lost)]
    assert found["duplicate offsets"]["examples"] == [named.format(**copied)]
    assert found["missing offsets"]["count"] == found["duplicate offsets"]["count"] == 1
    assert "rollback_to_snapshot" in found["missing offsets"]["hint"]
    assert "lakehouse verify --repair" in found["missing offsets"]["hint"]
