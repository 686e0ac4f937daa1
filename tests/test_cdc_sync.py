"""CDC against the real local MariaDB and Iceberg catalog (the session stack)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from decimal import Decimal

import pymysql
import pytest
from pyspark.sql import functions as F
from support import LAKEHOUSE_BIN

from jobs.cdc import source_db
from jobs.cdc.binlog_reader import BinlogPosition
from jobs.cdc_sync import DEFAULT_TABLES, CdcSync, TableSpec
from lakehouse.local.mariadb import SEED

pytestmark = pytest.mark.stack

TEST_TABLE_DDL = """
    CREATE TABLE {name} (
      id VARCHAR(16) PRIMARY KEY,
      name VARCHAR(64) NOT NULL,
      qty INT,
      price DECIMAL(10,4),
      note TEXT,
      updated TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP
    )"""


def recreate_source(conn: pymysql.Connection, name: str) -> None:
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {name}")
        cur.execute(TEST_TABLE_DDL.format(name=name))
    conn.commit()


def end_of_binlog(sync: CdcSync) -> BinlogPosition:
    conn = sync._connect()
    try:
        return BinlogPosition(*source_db.master_position(conn))
    finally:
        conn.close()


def catch_up(sync: CdcSync, timeout: float = 120.0) -> int:
    """Run batches until everything in the binlog right now is applied; returns changes applied."""
    target = end_of_binlog(sync)
    deadline = time.monotonic() + timeout
    total = 0
    while True:
        total += sync.run_batch()
        if sync.caught_up(target):
            return total
        if time.monotonic() > deadline:
            raise AssertionError(
                f"CDC did not reach {target} in {timeout}s (reader at {sync.reader.position})"
            )
        time.sleep(0.1)


def mysql_rows(conn: pymysql.Connection, table: str, columns: list[str]) -> set[tuple]:
    cols = ", ".join(f"CAST(`{c}` AS CHAR)" for c in columns)
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"SELECT {cols} FROM {table}")
        rows = {tuple(r) for r in cur.fetchall()}
    conn.commit()
    return rows


def iceberg_rows(spark, table: str, columns: list[str]) -> set[tuple]:
    cols = ", ".join(f"CAST(`{c}` AS STRING)" for c in columns)
    return {tuple(r) for r in spark.sql(f"SELECT {cols} FROM {table}").collect()}


def random_workload(conn: pymysql.Connection, table: str, statements: int, seed: int, keys: int = 400) -> int:
    """Inserts, updates, deletes, key changes, delete-then-reinsert and multi-row transactions."""
    rng = random.Random(seed)

    def key() -> str:
        return f"k{rng.randrange(keys):05d}"

    def values() -> tuple:
        return (key(), f"n{rng.randrange(10**6)}", rng.randrange(-5, 1000), round(rng.uniform(0, 9999), 4))

    done = 0
    with conn.cursor() as cur:
        while done < statements:
            r = rng.random()
            try:
                if r < 0.30:
                    cur.execute(
                        f"INSERT INTO {table} (id, name, qty, price) VALUES (%s,%s,%s,%s) "
                        "ON DUPLICATE KEY UPDATE name=VALUES(name), qty=VALUES(qty), price=VALUES(price)",
                        values(),
                    )
                    done += 1
                elif r < 0.55:
                    cur.execute(
                        f"UPDATE {table} SET qty = qty + 1, note = %s WHERE id = %s", (f"u{done}", key())
                    )
                    done += 1
                elif r < 0.70:
                    cur.execute(f"DELETE FROM {table} WHERE id = %s", (key(),))
                    done += 1
                elif r < 0.78:  # delete then re-insert the same key in one transaction
                    k = key()
                    cur.execute(f"DELETE FROM {table} WHERE id = %s", (k,))
                    cur.execute(
                        f"INSERT INTO {table} (id, name, qty, price) VALUES (%s, 'reborn', %s, 1.5)",
                        (k, done),
                    )
                    done += 2
                elif r < 0.83:  # primary key change
                    cur.execute(f"UPDATE IGNORE {table} SET id = %s WHERE id = %s", (key(), key()))
                    done += 1
                else:  # a transaction of multi-row statements
                    rows = [values() for _ in range(rng.randrange(2, 8))]
                    dedup = list({row[0]: row for row in rows}.values())
                    cur.executemany(
                        f"INSERT INTO {table} (id, name, qty, price) VALUES (%s,%s,%s,%s) "
                        "ON DUPLICATE KEY UPDATE qty = VALUES(qty)",
                        dedup,
                    )
                    lo = key()
                    cur.execute(
                        f"UPDATE {table} SET price = price + 1 WHERE id BETWEEN %s AND %s",
                        (lo, lo[:-1] + "9"),
                    )
                    cur.execute(f"DELETE FROM {table} WHERE id IN (%s, %s, %s)", (key(), key(), key()))
                    done += 3
                conn.commit()
            except pymysql.err.IntegrityError:
                conn.rollback()
    return done


# ---- fixtures -----------------------------------------------------------------------------------

COLUMNS = ["id", "name", "qty", "price", "note", "updated"]
_server_ids = iter(range(5100, 5200))


@pytest.fixture(scope="module")
def secrets(local_stack) -> dict:
    from lakehouse.local.settings import load_or_create_secrets

    return load_or_create_secrets(local_stack.settings)


@pytest.fixture
def app_conn(local_stack, secrets):
    from lakehouse.local.mariadb import APP_USER

    conn = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
    yield conn
    if conn.open:  # the MariaDB restart test closes it
        conn.close()


@pytest.fixture
def make_sync(spark, lake_config):
    """CdcSync factory; every reader gets its own replication server id and is closed after."""
    made: list[CdcSync] = []

    def factory(*pairs: str, resync: tuple[str, ...] = ()) -> CdcSync:
        specs = [TableSpec.parse(p, lake_config) for p in pairs]
        sync = CdcSync(spark, lake_config, specs, resync=resync, server_id=next(_server_ids))
        made.append(sync)
        return sync.start()

    yield factory
    for sync in made:
        sync.close()


def fresh_test_table(spark, conn, name: str) -> str:
    recreate_source(conn, name)
    spark.sql(f"DROP TABLE IF EXISTS lakehouse.dim_db.{name}")
    return f"user_db.{name}=dim_db.{name}"


def assert_converged(spark, conn, name: str, columns: list[str] = COLUMNS) -> int:
    expected = mysql_rows(conn, f"user_db.{name}", columns)
    actual = iceberg_rows(spark, f"lakehouse.dim_db.{name}", columns)
    assert actual == expected, (
        f"{len(expected ^ actual)} rows differ; mysql-only sample {sorted(expected - actual)[:3]}, "
        f"iceberg-only sample {sorted(actual - expected)[:3]}"
    )
    return len(expected)


# ---- the seed tables ----------------------------------------------------------------------------

PRODUCT_COLUMNS = ["productId", "name", "description", "product_price", "update_time"]
MEMBER_COLUMNS = ["userid", "name", "show_params", "memberLevel", "update_time"]


def test_seed_tables_sync_inserts_updates_deletes(spark, app_conn, make_sync) -> None:
    sync = make_sync(*DEFAULT_TABLES)
    schema = {f.name: f.dataType.simpleString() for f in spark.table("lakehouse.dim_db.products").schema}
    assert schema == {
        "productId": "string",
        "name": "string",
        "description": "string",
        "product_price": "decimal(10,4)",
        "update_time": "timestamp",
    }
    members = {f.name: f.dataType.simpleString() for f in spark.table("lakehouse.dim_db.user_member").schema}
    assert members["memberLevel"] == "int"
    props = dict(spark.sql("SHOW TBLPROPERTIES lakehouse.dim_db.products").collect())
    assert props["format-version"] == "2" and props["write.merge.mode"] == "copy-on-write"
    try:
        with app_conn.cursor() as cur:
            # The customer's two statements from the source article.
            cur.execute("UPDATE user_member SET memberLevel=2 WHERE userid='555655'")
            cur.execute("UPDATE products SET description='test666', product_price=8.1 WHERE productId='1'")
            cur.execute(
                "INSERT INTO products (productId, name, description, product_price) VALUES ('cdc1','n','d',1)"
            )
            cur.execute("DELETE FROM products WHERE productId='9'")
            cur.execute(
                "INSERT INTO user_member (userid, name, show_params, memberLevel) VALUES ('cdc1','n','p',9)"
            )
            cur.execute("DELETE FROM user_member WHERE userid='795098'")
        app_conn.commit()
        assert catch_up(sync) == 6

        one = spark.sql(
            "SELECT description, product_price FROM lakehouse.dim_db.products WHERE productId='1'"
        )
        assert [tuple(r) for r in one.collect()] == [("test666", Decimal("8.1000"))]
        level = spark.sql(
            "SELECT memberLevel FROM lakehouse.dim_db.user_member WHERE userid='555655'"
        ).collect()
        assert [r[0] for r in level] == [2]
        assert mysql_rows(app_conn, "user_db.products", PRODUCT_COLUMNS) == iceberg_rows(
            spark, "lakehouse.dim_db.products", PRODUCT_COLUMNS
        )
        assert mysql_rows(app_conn, "user_db.user_member", MEMBER_COLUMNS) == iceberg_rows(
            spark, "lakehouse.dim_db.user_member", MEMBER_COLUMNS
        )
        position = spark.sql(
            "SELECT summary['lakehouse.cdc.position'] FROM lakehouse.dim_db.products.snapshots "
            "ORDER BY committed_at DESC LIMIT 1"
        ).collect()[0][0]
        assert json.loads(position)["file"].startswith("mysql-bin.")
    finally:
        # Restore the seed for the other test modules (they join products).
        with app_conn.cursor() as cur:
            cur.execute("DELETE FROM products WHERE productId='cdc1'")
            cur.execute("DELETE FROM user_member WHERE userid='cdc1'")
            for _ddl, insert, rows in SEED.values():
                cur.executemany(insert.replace("INSERT IGNORE", "REPLACE"), rows)
        app_conn.commit()
        catch_up(sync)
    assert mysql_rows(app_conn, "user_db.products", PRODUCT_COLUMNS) == iceberg_rows(
        spark, "lakehouse.dim_db.products", PRODUCT_COLUMNS
    )


def test_no_empty_commits(spark, app_conn, make_sync) -> None:
    pair = fresh_test_table(spark, app_conn, "cdc_test_quiet")
    other = fresh_test_table(spark, app_conn, "cdc_test_busy")
    sync = make_sync(pair, other)
    before = spark.sql("SELECT count(*) FROM lakehouse.dim_db.cdc_test_quiet.snapshots").collect()[0][0]
    with app_conn.cursor() as cur:
        cur.execute("INSERT INTO cdc_test_busy (id, name) VALUES ('a', 'b')")
    app_conn.commit()
    assert catch_up(sync) == 1
    assert catch_up(sync) == 0
    after = spark.sql("SELECT count(*) FROM lakehouse.dim_db.cdc_test_quiet.snapshots").collect()[0][0]
    assert after == before


# ---- convergence --------------------------------------------------------------------------------


def test_randomized_workload_converges(spark, app_conn, make_sync) -> None:
    pair = fresh_test_table(spark, app_conn, "cdc_test_random")
    random_workload(app_conn, "cdc_test_random", 300, seed=1)  # rows before the initial snapshot
    sync = make_sync(pair)
    assert_converged(spark, app_conn, "cdc_test_random")

    done = threading.Event()
    writer = threading.Thread(
        target=lambda: (random_workload(app_conn, "cdc_test_random", 3000, seed=2), done.set())
    )
    writer.start()
    while not done.is_set():  # batches run while the workload is being written
        sync.run_batch()
        time.sleep(0.3)
    writer.join()
    catch_up(sync)
    assert assert_converged(spark, app_conn, "cdc_test_random") > 50


def test_rows_changed_during_initial_snapshot_converge(
    spark, app_conn, local_stack, secrets, make_sync
) -> None:
    from lakehouse.local.mariadb import APP_USER

    pair = fresh_test_table(spark, app_conn, "cdc_test_snapshot")
    with app_conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO cdc_test_snapshot (id, name, qty, price) VALUES (%s, 'seed', %s, 1)",
            [(f"k{i:05d}", i) for i in range(20_000)],
        )
    app_conn.commit()
    stop = threading.Event()

    def churn() -> None:
        conn = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
        try:
            while not stop.is_set():
                random_workload(conn, "cdc_test_snapshot", 50, seed=int(time.time() * 1000), keys=20_000)
        finally:
            conn.close()

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        sync = make_sync(pair)  # the snapshot is read while the writer keeps changing rows
    finally:
        stop.set()
        writer.join()
    catch_up(sync)
    assert assert_converged(spark, app_conn, "cdc_test_snapshot") > 15_000


def test_kill_9_mid_stream_then_restart_converges(spark, app_conn, local_stack, secrets, make_sync) -> None:
    from lakehouse.local.mariadb import APP_USER

    name = "cdc_test_kill"
    pair = fresh_test_table(spark, app_conn, name)
    random_workload(app_conn, name, 200, seed=3)
    job = subprocess.Popen(
        [LAKEHOUSE_BIN, "run", "cdc", "--table", pair, "--server-id", "5099", "--trigger-seconds", "0.5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    stop = threading.Event()

    def churn() -> None:
        conn = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
        seed = 100
        try:
            while not stop.is_set():
                seed += 1
                random_workload(conn, name, 40, seed=seed)
                time.sleep(0.05)
        finally:
            conn.close()

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        deadline = time.monotonic() + 120
        snapshots = f"SELECT count(*) FROM lakehouse.dim_db.{name}.snapshots"
        while time.monotonic() < deadline:  # wait for a few tailing commits, then kill mid-stream
            if job.poll() is not None:
                raise AssertionError(f"cdc job exited early: {job.stderr.read()[-3000:]}")
            if (
                spark.catalog.tableExists(f"lakehouse.dim_db.{name}")
                and spark.sql(snapshots).collect()[0][0] >= 4
            ):
                break
            time.sleep(0.5)
        else:
            raise AssertionError("cdc job made no commits in 120s")
        time.sleep(1.3)
        job.send_signal(signal.SIGKILL)
        job.wait(30)
        time.sleep(1)  # changes keep coming while the job is down
    finally:
        stop.set()
        writer.join()
        if job.poll() is None:
            job.kill()
    assert job.returncode == -signal.SIGKILL
    sync = make_sync(pair)  # restart resumes from the position stored in the table
    catch_up(sync)
    assert_converged(spark, app_conn, name)


# ---- schema evolution and DDL -------------------------------------------------------------------


def test_add_column_evolves_and_other_ddl_stops_with_the_fix(spark, app_conn, make_sync) -> None:
    name = "cdc_test_ddl"
    pair = fresh_test_table(spark, app_conn, name)
    sync = make_sync(pair)
    with app_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {name} (id, name, qty) VALUES ('a', 'before', 1)")
        cur.execute(f"ALTER TABLE {name} ADD COLUMN stock DECIMAL(12,3) NULL AFTER name")
        cur.execute(f"INSERT INTO {name} (id, name, qty, stock) VALUES ('b', 'after', 2, 7.125)")
        cur.execute(f"UPDATE {name} SET stock = 1.5 WHERE id = 'a'")
    app_conn.commit()
    catch_up(sync)
    schema = {f.name: f.dataType.simpleString() for f in spark.table(f"lakehouse.dim_db.{name}").schema}
    assert schema["stock"] == "decimal(12,3)"
    assert assert_converged(spark, app_conn, name, [*COLUMNS, "stock"]) == 2
    assert not sync.errors

    statement = f"ALTER TABLE {name} DROP COLUMN note"
    with app_conn.cursor() as cur:
        cur.execute(statement)
        cur.execute(f"INSERT INTO {name} (id, name, qty) VALUES ('c', 'lost', 3)")
    app_conn.commit()
    catch_up(sync)
    assert len(sync.errors) == 1
    error = sync.errors[0]
    assert statement in error and f"lakehouse run cdc --resync user_db.{name}" in error
    assert spark.sql(f"SELECT * FROM lakehouse.dim_db.{name} WHERE id = 'c'").count() == 0

    # A restart stops at the same statement; --resync re-snapshots the table with its new shape.
    again = make_sync(pair)
    catch_up(again)
    assert again.errors and statement in again.errors[0]
    again.close()
    resynced = make_sync(pair, resync=(f"user_db.{name}",))
    catch_up(resynced)
    assert not resynced.errors
    columns = ["id", "name", "stock", "qty", "price", "updated"]
    assert "note" not in spark.table(f"lakehouse.dim_db.{name}").columns
    assert assert_converged(spark, app_conn, name, columns) == 3


def test_purged_binlog_position_gives_the_fix(spark, app_conn, make_sync) -> None:
    from jobs.cdc.target_table import POSITION_KEY
    from jobs.common.snapshot_progress import writer_options

    name = "cdc_test_purged"
    pair = fresh_test_table(spark, app_conn, name)
    make_sync(pair).close()
    # Store a position in a binlog file the server no longer has (as after PURGE BINARY LOGS).
    gone = BinlogPosition("mysql-bin.000000", 4).to_json()
    table = f"lakehouse.dim_db.{name}"
    spark.table(table).writeTo(table).options(**writer_options({POSITION_KEY: gone})).overwrite(F.lit(True))
    sync = make_sync(pair)
    assert len(sync.errors) == 1
    assert (
        "binlog purged" in sync.errors[0] and f"lakehouse run cdc --resync user_db.{name}" in sync.errors[0]
    )


# ---- resilience ---------------------------------------------------------------------------------


def test_mariadb_restart_mid_run_is_survived(spark, app_conn, local_stack, secrets, make_sync) -> None:
    from lakehouse.local.mariadb import APP_USER

    name = "cdc_test_restart"
    pair = fresh_test_table(spark, app_conn, name)
    sync = make_sync(pair)
    random_workload(app_conn, name, 300, seed=7)
    sync.run_batch()
    app_conn.close()
    local_stack.mariadb.stop()
    sync.run_batch()  # the source is down: batches keep running, the reader retries
    time.sleep(1.0)
    local_stack.mariadb.start(secrets)
    conn = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
    try:
        random_workload(conn, name, 300, seed=8)
        catch_up(sync)
        assert sync.reader.reconnects >= 1
        assert not sync.errors
        assert_converged(spark, conn, name)
    finally:
        conn.close()
