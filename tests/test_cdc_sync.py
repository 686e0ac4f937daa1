"""CDC against the real local MariaDB and Iceberg catalog (the session stack)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import queue
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pymysql
import pytest
from pyspark.sql import functions as F
from support import LAKEHOUSE_BIN

from jobs.cdc import source_db
from jobs.cdc.binlog_reader import BinlogPosition
from jobs.cdc.sync import CdcSync
from jobs.cdc.table_selection import TableSelection, TableSpec
from jobs.config import ConfigError
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


def mysql_rows(conn: pymysql.Connection, table: str, columns: list[str]) -> Counter:
    """The source rows as a multiset (the source's primary key makes every count 1)."""
    cols = ", ".join(f"CAST(`{c}` AS CHAR)" for c in columns)
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"SELECT {cols} FROM {table}")
        rows = Counter(tuple(r) for r in cur.fetchall())
    conn.commit()
    return rows


def iceberg_rows(spark, table: str, columns: list[str]) -> Counter:
    """The lake rows as a multiset, after asserting the key (first column) is unique."""
    cols = ", ".join(f"CAST(`{c}` AS STRING)" for c in columns)
    rows = Counter(tuple(r) for r in spark.sql(f"SELECT {cols} FROM {table}").collect())
    keys = Counter(row[0] for row in rows.elements())
    duplicated = [k for k, n in keys.items() if n > 1]
    assert not duplicated, f"{table}: {len(duplicated)} keys occur more than once, e.g. {duplicated[:3]}"
    return rows


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
_server_ids = itertools.count(5100)  # one per reader, never reused (the CDC fuzzer's start at 5600)


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

    def factory(
        *pairs: str,
        resync: tuple[str, ...] = (),
        progress_seconds: float | None = None,
        chunk_rows: int = 10_000,
        commit_rows: int = 200_000,
        include: tuple[str, ...] = (),
        exclude: tuple[str, ...] = (),
        reads_in_process: bool = False,
        metrics=None,
    ) -> CdcSync:
        """`reads_in_process`: the snapshot reads in the test's process, where a test can hook the
        reads (`source_db.read_chunk`); every other test reads in the reader process, as the job."""
        selection = TableSelection.from_args(lake_config, pairs, include, exclude)
        sync = CdcSync(
            spark, lake_config, selection, resync=resync, server_id=next(_server_ids),
            snapshot_chunk_rows=chunk_rows, snapshot_commit_rows=commit_rows,
            snapshot_reader_process=not reads_in_process,
            **({"metrics": metrics} if metrics is not None else {}),
        )  # fmt: skip
        if progress_seconds is not None:
            sync.progress_seconds = progress_seconds
        made.append(sync)
        return sync.start()

    yield factory
    for sync in made:
        sync.close()


def fresh_source_database(local_stack, name: str) -> None:
    """A source database of the test's own (empty), which the app user writes and CDC reads."""
    from lakehouse.local.mariadb import APP_USER, CDC_USER

    for sql in (
        f"DROP DATABASE IF EXISTS {name}",
        f"CREATE DATABASE {name}",
        f"GRANT ALL PRIVILEGES ON {name}.* TO '{APP_USER}'@'127.0.0.1'",
        f"GRANT SELECT ON {name}.* TO '{CDC_USER}'@'127.0.0.1'",
    ):
        local_stack.mariadb.admin_sql(sql)


def fresh_test_table(spark, conn, name: str) -> str:
    recreate_source(conn, name)
    spark.sql(f"DROP TABLE IF EXISTS lakehouse.dim_db.{name}")
    return f"user_db.{name}=dim_db.{name}"


def assert_converged(spark, conn, name: str, columns: list[str] = COLUMNS) -> int:
    expected = mysql_rows(conn, f"user_db.{name}", columns)
    actual = iceberg_rows(spark, f"lakehouse.dim_db.{name}", columns)
    missing, extra = expected - actual, actual - expected
    assert actual == expected, (
        f"{sum(missing.values()) + sum(extra.values())} rows differ; mysql-only sample "
        f"{sorted(missing)[:3]}, iceberg-only sample {sorted(extra)[:3]}"
    )
    return sum(expected.values())


# ---- the MERGE step ----------------------------------------------------------------------------


def test_apply_changes_updates_inserts_and_deletes(spark) -> None:
    from jobs.cdc.apply_changes import apply_changes
    from jobs.cdc.change_batch import DELETE, UPSERT, RowChange

    table = "lakehouse.dim_db.cdc_test_merge_step"
    spark.sql(f"DROP TABLE IF EXISTS {table}")
    spark.sql(f"CREATE TABLE {table} (id STRING NOT NULL, qty INT) USING iceberg")
    spark.sql(f"INSERT INTO {table} VALUES ('keep', 1), ('update', 2), ('delete', 3)")
    columns = [("id", "string"), ("qty", "int")]
    changes = [
        RowChange(UPSERT, ("update",), {"id": "update", "qty": 20}),
        RowChange(UPSERT, ("insert",), {"id": "insert", "qty": 40}),
        RowChange(DELETE, ("delete",), {"id": "delete", "qty": 3}),
        RowChange(DELETE, ("never-there",), {"id": "never-there", "qty": 5}),
    ]
    apply_changes(spark, table, columns, ("id",), changes, None, BinlogPosition("mysql-bin.000001", 4))
    rows = Counter(tuple(r) for r in spark.sql(f"SELECT id, qty FROM {table}").collect())
    assert rows == Counter([("keep", 1), ("update", 20), ("insert", 40)])


def test_a_crafted_source_name_is_recorded_as_it_is_and_adds_no_table_property(spark) -> None:
    """The source's `schema.table` becomes a table property value; a name with quotes must not
    close the literal and add properties of its own (security round 3, item 7)."""
    from jobs.cdc.target_table import SOURCE_PROPERTY, configure_table, create_iceberg_table

    table = "lakehouse.dim_db.cdc_test_crafted_source"
    spark.sql(f"DROP TABLE IF EXISTS {table}")
    create_iceberg_table(spark, table, [("id", "string"), ("we`ird", "int")], ("id",))
    crafted = "user_db.t', 'write.metadata.delete-after-commit.enabled'='false', 'x'='\\"
    configure_table(spark, table, ("id",), source=crafted)
    props = dict(spark.sql(f"SHOW TBLPROPERTIES {table}").collect())
    assert props[SOURCE_PROPERTY] == crafted
    assert "x" not in props and props.get("write.metadata.delete-after-commit.enabled") != "false"
    assert [f.name for f in spark.table(table).schema.fields] == ["id", "we`ird"]


@pytest.mark.parametrize("set_before", [None, "1000"])
def test_a_frame_read_in_tasks_is_a_partition_per_arrow_batch_and_leaves_the_session_as_it_was(
    spark, tmp_path, set_before
) -> None:
    """The snapshot's pieces: read by the tasks (one per Arrow batch), not planned as a local
    relation, whose rows Spark's optimizer walks in every rule. A MERGE's change batch keeps the
    local relation (its size known: a broadcast join)."""
    import pyarrow as pa
    from pyspark.sql import types as T

    from jobs.common.arrow_frames import LOCAL_RELATION_THRESHOLD, arrow_file_frame, write_arrow_file

    rows = [(i, f"v{i}" if i % 7 else None) for i in range(25)]
    table = pa.table({"id": [r[0] for r in rows], "v": [r[1] for r in rows]})
    path = tmp_path / "piece.arrow"
    write_arrow_file(table, path, batch_rows=10)
    schema = T.StructType([T.StructField("id", T.LongType(), False), T.StructField("v", T.StringType())])
    if set_before is not None:
        spark.conf.set(LOCAL_RELATION_THRESHOLD, set_before)
    try:
        in_tasks = arrow_file_frame(spark, path, schema, in_tasks=True)
        assert spark.conf.get(LOCAL_RELATION_THRESHOLD, None) == set_before
        planned = arrow_file_frame(spark, path, schema)
    finally:
        spark.conf.unset(LOCAL_RELATION_THRESHOLD)
    assert in_tasks.rdd.getNumPartitions() == 3  # 10 + 10 + 5 rows
    assert Counter(tuple(r) for r in in_tasks.collect()) == Counter(rows)
    assert "LocalTableScan" not in in_tasks._jdf.queryExecution().executedPlan().toString()
    if set_before is None:  # under the default threshold: a local relation, as before
        assert "LocalTableScan" in planned._jdf.queryExecution().executedPlan().toString()
    assert Counter(tuple(r) for r in planned.collect()) == Counter(rows)


def test_merge_warm_up_runs_the_merge_without_touching_the_lake(spark, caplog) -> None:
    from jobs.cdc.merge_warm_up import warm_up_merge

    table = "lakehouse.dim_db.cdc_test_warm_up"
    spark.sql(f"DROP TABLE IF EXISTS {table}")
    spark.sql(f"CREATE TABLE {table} (id STRING NOT NULL, qty INT) USING iceberg")
    spark.sql(f"INSERT INTO {table} VALUES ('a', 1)")

    def lake() -> tuple:
        namespaces = [r[0] for r in spark.sql("SHOW NAMESPACES IN lakehouse").collect()]
        tables = sorted(
            (ns, r["tableName"])
            for ns in namespaces
            for r in spark.sql(f"SHOW TABLES IN lakehouse.{ns}").collect()
        )
        snapshots = [r[0] for r in spark.sql(f"SELECT snapshot_id FROM {table}.snapshots").collect()]
        return tables, snapshots

    before = lake()
    # Every Iceberg type the CDC maps to, the key among them.
    columns = [
        ("id", "string"), ("qty", "int"), ("big", "bigint"), ("price", "decimal(10,4)"), ("f", "float"),
        ("d", "double"), ("ok", "boolean"), ("blob", "binary"), ("day", "date"), ("at", "timestamp"),
    ]  # fmt: skip
    with caplog.at_level("INFO", logger="jobs.cdc.merge_warm_up"):
        for _ in range(2):  # the scratch catalog is registered once and reused
            warm_up_merge(spark, columns, ("id",))
    assert "skipped" not in caplog.text  # the MERGE ran
    assert lake() == before
    assert not os.path.exists(os.path.join(spark.sparkContext._temp_dir, "lakehouse_cdc_warm_up"))


# ---- the seed tables ----------------------------------------------------------------------------

PRODUCT_COLUMNS = ["productId", "name", "description", "product_price", "update_time"]
MEMBER_COLUMNS = ["userid", "name", "show_params", "memberLevel", "update_time"]


def test_seed_tables_sync_inserts_updates_deletes(spark, app_conn, make_sync) -> None:
    sync = make_sync("user_db.products=dim_db.products", "user_db.user_member=dim_db.user_member")
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


def stored_position(spark, table: str) -> BinlogPosition:
    from jobs.cdc.target_table import POSITION_KEY
    from jobs.common.snapshot_progress import read_progress

    return BinlogPosition.from_json(read_progress(spark, table, POSITION_KEY))


def snapshot_count(spark, table: str) -> int:
    return spark.sql(f"SELECT count(*) FROM {table}.snapshots").collect()[0][0]


def test_quiet_table_position_advances_by_progress_commits(spark, app_conn, make_sync) -> None:
    quiet = fresh_test_table(spark, app_conn, "cdc_test_quiet")
    busy = fresh_test_table(spark, app_conn, "cdc_test_busy")
    sync = make_sync(quiet, busy, progress_seconds=0.0)  # a progress commit whenever the position moved
    with app_conn.cursor() as cur:
        cur.execute("INSERT INTO cdc_test_busy (id, name) VALUES ('a', 'b')")
    app_conn.commit()
    target = end_of_binlog(sync)
    assert catch_up(sync) == 1
    sync.run_batch()
    quiet_position = stored_position(spark, "lakehouse.dim_db.cdc_test_quiet")
    assert quiet_position.order >= target.order
    assert quiet_position == stored_position(spark, "lakehouse.dim_db.cdc_test_busy")
    assert assert_converged(spark, app_conn, "cdc_test_quiet") == 0
    # Nothing new in the binlog: no further commits.
    before = snapshot_count(spark, "lakehouse.dim_db.cdc_test_quiet")
    sync.run_batch()
    assert snapshot_count(spark, "lakehouse.dim_db.cdc_test_quiet") == before
    sync.close()
    # A restart reads the binlog from there, not from the quiet table's initial snapshot.
    restarted = make_sync(quiet, busy)
    assert restarted.reader.start_position.order >= target.order


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
    spark, app_conn, local_stack, secrets, make_sync, monkeypatch, tmp_path
) -> None:
    """The snapshot under concurrent writes, with the CDC user's RDS privileges (no lock possible):
    20 chunks, writes committed between them and a writer that never stops; the lake then equals
    the source as a multiset."""
    from jobs.cdc import snapshot
    from lakehouse.local.mariadb import APP_USER

    pair = fresh_test_table(spark, app_conn, "cdc_test_snapshot")
    with app_conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO cdc_test_snapshot (id, name, qty, price) VALUES (%s, 'seed', %s, 1)",
            [(f"k{i:05d}", i) for i in range(20_000)],
        )
    app_conn.commit()
    stop = threading.Event()
    inside: list[int] = []  # statements committed while the snapshot was half read

    def writes_between_chunks(pauses) -> None:
        # Before the 6th and the 11th chunk the snapshot's reader process waits while another
        # connection changes rows on both sides of the chunks read so far and commits: at known
        # points, because a writer thread's timing against the reads is luck.
        for nth in (6, 11):
            marker = pauses / f"cdc.snapshot-chunk.cdc_test_snapshot-{nth}"
            deadline = time.monotonic() + 120
            while not marker.exists() and not stop.is_set() and time.monotonic() < deadline:
                time.sleep(0.02)
            if not marker.exists():
                return
            writer = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
            try:
                inside.append(random_workload(writer, "cdc_test_snapshot", 40, seed=11, keys=20_000))
            finally:
                writer.close()
                marker.unlink()

    def churn() -> None:  # and a writer that keeps going before, during and after the snapshot
        conn = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
        try:
            while not stop.is_set():
                random_workload(conn, "cdc_test_snapshot", 50, seed=int(time.time() * 1000), keys=20_000)
        finally:
            conn.close()

    pauses = tmp_path / "pauses"
    pauses.mkdir()
    monkeypatch.setenv("LAKEHOUSE_PAUSE_AT", f"cdc.snapshot-chunk.cdc_test_snapshot:{pauses}:6,11")
    writers = [threading.Thread(target=churn), threading.Thread(target=writes_between_chunks, args=(pauses,))]
    for writer in writers:
        writer.start()
    try:
        # Read by the reader process, as in the job, while the writers write.
        sync = make_sync(pair, chunk_rows=1_000, commit_rows=5_000)
    finally:
        stop.set()
        for writer in writers:
            writer.join()
    assert len(inside) == 2 and min(inside) >= 40, "no write committed between the snapshot's chunks"
    assert snapshot.staging_tables(spark, "lakehouse.dim_db.cdc_test_snapshot") == []
    catch_up(sync)
    assert assert_converged(spark, app_conn, "cdc_test_snapshot") > 15_000


class RecordingMetrics:
    """A metrics sink that keeps what it is given."""

    def __init__(self) -> None:
        self.batches: list = []

    def record(self, batch) -> None:
        self.batches.append(batch)

    def close(self) -> None:
        pass


def test_snapshot_reads_after_its_barrier_and_takes_no_lock(spark, app_conn, make_sync, monkeypatch) -> None:
    """The order the proof rests on: the position, then the barrier's commit, then the reads; and
    nothing on the source that RDS would refuse the CDC user (a lock, FLUSH, a long transaction)."""
    from jobs.cdc import snapshot

    name = "cdc_test_barrier"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 2_500)
    from pymysql.constants import SERVER_STATUS

    calls: list[str] = []
    open_transactions: list[str] = []  # a read view held past a chunk (conn.begin, autocommit off)
    for function in ("master_position", "write_barrier", "read_chunk"):
        real = getattr(snapshot.source_db, function)

        def spy(*args, _real=real, _name=function, **kwargs):
            calls.append(_name)
            result = _real(*args, **kwargs)
            conn = args[0]
            if not conn.get_autocommit() or conn.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
                open_transactions.append(_name)
            return result

        monkeypatch.setattr(snapshot.source_db, function, spy)
    statements: list[str] = []
    real_cursor = pymysql.cursors.Cursor.execute

    def recording_execute(self, query, args=None):
        statements.append(" ".join(str(query).split()).upper())
        return real_cursor(self, query, args)

    monkeypatch.setattr(pymysql.cursors.Cursor, "execute", recording_execute)
    metrics = RecordingMetrics()
    make_sync(pair, chunk_rows=1_000, reads_in_process=True, metrics=metrics)
    monkeypatch.undo()
    assert calls[:2] == ["master_position", "write_barrier"], calls
    assert calls[2:] == ["read_chunk"] * 3, calls  # 1000 + 1000 + 500 rows
    # Each commit's rows reach the metrics (job cdc-snapshot): a first piece of one chunk, then the rest.
    snapshot_batches = [(b.job, b.table, b.records_in) for b in metrics.batches if b.job == "cdc-snapshot"]
    assert snapshot_batches == [
        ("cdc-snapshot", f"dim_db.{name}", 1_000),
        ("cdc-snapshot", f"dim_db.{name}", 1_500),
    ]
    forbidden = ("LOCK", "FLUSH", "START TRANSACTION", "BEGIN", "SET SESSION TRANSACTION")
    assert not [s for s in statements if s.startswith(forbidden)], statements
    assert open_transactions == []  # each read is a statement on its own: no read view outlives it
    assert assert_converged(spark, app_conn, name) == 2_500


def test_snapshot_without_its_barrier_row_says_what_to_grant(spark, app_conn, make_sync, monkeypatch) -> None:
    from jobs.cdc import snapshot

    name = "cdc_test_no_barrier"
    pair = fresh_test_table(spark, app_conn, name)
    monkeypatch.setattr(snapshot.source_db, "SNAPSHOT_BARRIER", "lakehouse_meta.no_such_barrier")
    with pytest.raises(ConfigError, match=r"GRANT SELECT, INSERT, UPDATE ON lakehouse_meta.no_such_barrier"):
        make_sync(pair)
    assert not spark.catalog.tableExists(f"lakehouse.dim_db.{name}")


def reader_processes() -> list[str]:
    """Command lines of the snapshot reader processes of this session's stack (its LAKEHOUSE_HOME in
    their environment, inherited from the jobs that started them, killed ones too): `make test`'s
    other group runs readers of its own stacks at the same time (the rehearsal's, the demo's)."""
    home = f"LAKEHOUSE_HOME={os.environ.get('LAKEHOUSE_HOME', '')}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
            if b"jobs.cdc.chunk_reader" not in cmdline:
                continue
            if home not in (entry / "environ").read_bytes().split(b"\0"):
                continue  # another stack's reader
        except OSError:
            continue
        found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def record_chunk_starts(monkeypatch) -> list[tuple]:
    """(after, upto) of every chunk a snapshot in this process reads from now on."""
    from jobs.cdc import snapshot

    starts: list[tuple] = []
    real_read_chunk = snapshot.source_db.read_chunk

    def recording(conn, table, after, rows, upto=None):
        starts.append((after, upto))
        return real_read_chunk(conn, table, after, rows, upto)

    monkeypatch.setattr(snapshot.source_db, "read_chunk", recording)
    return starts


# The CLI of the code on PYTHONPATH (a release's tree), as its `lakehouse` entry point runs it.
RUN_CLI = "from lakehouse.cli import main; main()"


@pytest.mark.parametrize("killed", ["this version", "the last release"])
def test_kill_9_mid_snapshot_resumes_after_the_last_chunk_committed(
    spark, app_conn, local_stack, secrets, make_sync, monkeypatch, request, killed
) -> None:
    """Killed -9 at its third snapshot commit, the job left a staging table with its progress; the
    next start resumes after the last committed chunk. Killed as the last release's code, it is an
    upgrade in place (the cluster replaced mid-snapshot): this version reads that release's staging
    table and progress (issue 47)."""
    from jobs.cdc import snapshot
    from lakehouse.local.mariadb import APP_USER

    name = "cdc_test_snapshot_kill"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 12_000)
    stop = threading.Event()

    def churn() -> None:  # changes on every side of the chunks, before, during and after the kill
        conn = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
        try:
            while not stop.is_set():
                random_workload(conn, name, 30, seed=int(time.time() * 1000), keys=12_000)
                time.sleep(0.02)
        finally:
            conn.close()

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        arguments = ["run", "cdc", "--until-idle", "--table", pair, "--server-id", "5098",
                     "--snapshot-chunk-rows", "1000", "--snapshot-commit-rows", "2000"]  # fmt: skip
        env = {**os.environ, "LAKEHOUSE_CRASH_AT": "cdc.snapshot-commit:3"}
        if killed == "this version":
            command, cwd = [LAKEHOUSE_BIN, *arguments], None
        else:
            code = request.getfixturevalue("last_release")
            command, cwd = [sys.executable, "-c", RUN_CLI, *arguments], code
            env["PYTHONPATH"] = str(code)
        job = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert job.returncode == -signal.SIGKILL, job.stderr[-3000:]
        # The job's reader process goes with it (it was reading ahead when the job died).
        deadline = time.monotonic() + 15
        while reader_processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not reader_processes(), "the killed job's snapshot reader is still running"
        [staging] = snapshot.staging_tables(spark, f"lakehouse.dim_db.{name}")
        stored = snapshot.SnapshotProgress.from_json(
            snapshot.read_progress(spark, staging, snapshot.PROGRESS_KEY)
        )
        assert (stored.rows, stored.chunks) == (5_000, 5)  # a first piece of one chunk, then 2 of 2
        assert not spark.catalog.tableExists(f"lakehouse.dim_db.{name}")  # nothing published yet
        starts = record_chunk_starts(monkeypatch)
        sync = make_sync(pair, chunk_rows=1_000, commit_rows=2_000, reads_in_process=True)
    finally:
        stop.set()
        writer.join()
    # Resumed after the last committed key, with the position stored before the kill.
    assert starts[0] == (stored.ranges[0].after, None)
    assert len(starts) <= 8  # about 6,000 rows left (plus what the writer inserted), not 12,000
    assert stored_position(spark, f"lakehouse.dim_db.{name}") == stored.position
    assert snapshot.staging_tables(spark, f"lakehouse.dim_db.{name}") == []  # it became the table
    catch_up(sync)
    assert_converged(spark, app_conn, name)


@pytest.mark.parametrize("resume", ["in_process", "reader_processes"])
def test_two_readers_killed_mid_snapshot_resume_each_range_under_writes(
    spark, app_conn, local_stack, secrets, make_sync, monkeypatch, resume
) -> None:
    """`--snapshot-readers 2`: two ranges of an integer key read side by side, every commit storing
    both ranges' last keys; after a kill -9 each range resumes after its own (read in this process,
    where the reads can be watched, or by reader processes side by side, as the job does), and the
    lake ends equal to the source (as multisets) though writes went on all along."""
    from jobs.cdc import snapshot
    from lakehouse.local.mariadb import APP_USER

    name = f"cdc_test_two_readers_{resume}"
    with app_conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {name}")
        cur.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, v INT NOT NULL, note VARCHAR(16))")
        rows = [(i, i, f"n{i}") for i in range(1, 16_001)]
        cur.executemany(f"INSERT INTO {name} VALUES (%s, %s, %s)", rows)
        cur.execute(f"ANALYZE TABLE {name}")  # the row estimate that lets the snapshot split the keys
        cur.fetchall()
    app_conn.commit()
    spark.sql(f"DROP TABLE IF EXISTS lakehouse.dim_db.{name}")
    pair = f"user_db.{name}=dim_db.{name}"
    stop = threading.Event()

    def churn() -> None:  # in both ranges, before, during and after the kill
        conn = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
        rng = random.Random(11)
        upsert = f"INSERT INTO {name} VALUES (%s, 0, 'new') ON DUPLICATE KEY UPDATE note = 'x'"
        try:
            while not stop.is_set():
                with conn.cursor() as cur:
                    for _ in range(20):
                        key = rng.randint(-10, 16_200)
                        kind = rng.random()
                        if kind < 0.5:
                            cur.execute(f"UPDATE {name} SET v = v + 1 WHERE id = %s", (key,))
                        elif kind < 0.75:
                            cur.execute(f"DELETE FROM {name} WHERE id = %s", (key,))
                        else:
                            cur.execute(upsert, (key,))
                conn.commit()
                time.sleep(0.02)
        finally:
            conn.close()

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        job = subprocess.run(
            [LAKEHOUSE_BIN, "run", "cdc", "--until-idle", "--table", pair, "--server-id", "5097",
             "--snapshot-readers", "2", "--snapshot-chunk-rows", "500", "--snapshot-commit-rows", "1000"],
            env={**os.environ, "LAKEHOUSE_CRASH_AT": "cdc.snapshot-commit:8"},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert job.returncode == -signal.SIGKILL, job.stderr[-3000:]
        deadline = time.monotonic() + 15  # both readers go with the job
        while reader_processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not reader_processes(), "the killed job's snapshot readers are still running"
        [staging] = snapshot.staging_tables(spark, f"lakehouse.dim_db.{name}")
        stored_json = snapshot.read_progress(spark, staging, snapshot.PROGRESS_KEY)
        stored = snapshot.SnapshotProgress.from_json(stored_json)
        # Each range has 8,000 rows or so: 8 commits of at most 1,000 rows cannot finish both, even
        # when a busy driver commits only full ones (a shared box: with 8,000 rows in all it did).
        [first, second] = stored.ranges
        assert first.after is not None and second.after > first.upto, stored
        assert stored.rows == spark.table(staging).count()
        starts = record_chunk_starts(monkeypatch)
        in_process = resume == "in_process"
        sync = make_sync(pair, chunk_rows=500, commit_rows=1_000, reads_in_process=in_process)
    finally:
        stop.set()
        writer.join()
    resumed = [(r.after, r.upto) for r in stored.ranges if not r.done]
    assert resumed, stored  # the kill came before the end
    if in_process:
        # Each range not done went on after its own last committed key (here the ranges in turn);
        # a range done was not read again.
        assert starts[0] == resumed[0] and all(r in starts for r in resumed)
        assert not any(upto == r.upto for _, upto in starts for r in stored.ranges if r.done)
    # Resumed, not restarted: the commit holding the stored progress is in the published table's
    # history, with the position stored before the kill.
    target = f"lakehouse.dim_db.{name}"
    history = spark.sql(f"SELECT summary['{snapshot.PROGRESS_KEY}'] AS p FROM {target}.snapshots").collect()
    assert [r["p"] for r in history].count(stored_json) == 1
    assert stored_position(spark, target) == stored.position
    catch_up(sync)
    assert_converged(spark, app_conn, name, ["id", "v", "note"])


def test_a_snapshot_failing_before_its_first_piece_leaves_no_reader_running(
    spark, app_conn, lake_config, monkeypatch
) -> None:
    from jobs.cdc import snapshot, target_table

    name = "cdc_test_readers_closed"
    with app_conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {name}")
        cur.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, v INT)")
        cur.executemany(f"INSERT INTO {name} VALUES (%s, %s)", [(i, i) for i in range(2_000)])
        cur.execute(f"ANALYZE TABLE {name}")
        cur.fetchall()
    app_conn.commit()
    settings = source_db.connection_settings(lake_config, source_db.cdc_credentials(lake_config))
    cdc = source_db.connect_with(settings)
    started: list[int] = []
    real_reader = snapshot.ChunkReader

    def counted(*args, **kwargs):
        started.append(1)
        return real_reader(*args, **kwargs)

    def no_table(*_args, **_kwargs):
        assert len(reader_processes()) == 2  # both readers run while the staging table is made
        raise RuntimeError("the catalog refused the staging table")

    monkeypatch.setattr(snapshot, "ChunkReader", counted)
    monkeypatch.setattr(target_table, "create_iceberg_table", no_table)
    try:
        with pytest.raises(RuntimeError, match="refused the staging table"):
            snapshot.snapshot_table(
                spark, cdc, "user_db", name, f"lakehouse.dim_db.{name}", chunk_rows=100, commit_rows=500,
                reader_connection=settings, readers=2,
            )  # fmt: skip
    finally:
        cdc.close()
    assert len(started) == 2
    assert reader_processes() == []  # closed before the error left snapshot_table


def test_a_snapshot_an_earlier_version_interrupted_starts_over(
    spark, app_conn, lake_config, make_sync, caplog
) -> None:
    """An earlier version stored one last key, maybe as MySQL compares it out of the key's order
    (an ENUM as text, a FLOAT rounded): its staging table is dropped and the snapshot starts over,
    so the rows it held (stale here) are not kept."""
    from jobs.cdc import snapshot, target_table
    from jobs.common.snapshot_progress import writer_options

    name = "cdc_test_earlier_snapshot"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 40)
    target = f"lakehouse.dim_db.{name}"
    cdc = source_db.connect(lake_config, source_db.cdc_credentials(lake_config))
    try:  # a position the source still has: only the form of the progress is against a resume
        position = BinlogPosition(*source_db.master_position(cdc))
    finally:
        cdc.close()
    stale = spark.createDataFrame(
        [(f"k{i:05d}", "stale", -1, Decimal("9.0000"), None, None) for i in range(20)],
        "id string, name string, qty int, price decimal(10,4), note string, updated timestamp",
    )
    staging = snapshot.new_staging_table(target)
    target_table.create_iceberg_table(
        spark, staging, [(f.name, f.dataType.simpleString()) for f in stale.schema.fields], ("id",)
    )
    earlier = {"position": json.loads(position.to_json()), "after": ["k00019"], "rows": 20, "chunks": 1}
    stale.writeTo(staging).options(**writer_options({snapshot.PROGRESS_KEY: json.dumps(earlier)})).append()
    caplog.set_level("WARNING", logger="cdc_snapshot")
    make_sync(pair)
    assert assert_converged(spark, app_conn, name) == 40
    assert snapshot.staging_tables(spark, target) == []
    assert any("an earlier version" in r.getMessage() for r in caplog.records)


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


# ---- whole-database sync: a selection by pattern, tables created while the job runs --------------


def _drop_tables(conn: pymysql.Connection, spark, names: list[str]) -> None:
    with conn.cursor() as cur:
        for name in names:
            cur.execute(f"DROP TABLE IF EXISTS {name}")
    conn.commit()
    for name in names:
        spark.sql(f"DROP TABLE IF EXISTS lakehouse.dim_db.{name}")


def test_whole_database_sync_follows_new_tables_and_stops_only_a_table_without_a_key(
    spark, app_conn, make_sync, local_stack, secrets, monkeypatch, tmp_path
) -> None:
    """`--include user_db.<prefix>_*`: the tables there at start are snapshotted; one created while
    the job runs (plain, CREATE ... SELECT, renamed into the pattern) is snapshotted - with writes
    committed between its chunks - and followed, without a restart; one without a primary key gets
    one clear error and the others go on; an excluded one is never synced. Each synced table then
    equals its source as a multiset."""
    from jobs.cdc import snapshot
    from lakehouse.local.mariadb import APP_USER

    p = "cdc_wds"
    tables = [f"{p}_{t}" for t in ("a", "b", "c", "d", "nokey", "nokey2", "skip", "skip2")] + [f"tmp_{p}_d"]
    _drop_tables(app_conn, spark, tables)
    recreate_source(app_conn, f"{p}_a")
    seed_rows(app_conn, f"{p}_a", 300)
    with app_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {p}_nokey (id INT, v INT)")
        cur.execute(f"CREATE TABLE {p}_skip (id INT PRIMARY KEY)")
    app_conn.commit()

    between_chunks: list[int] = []
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    # While the new table's snapshot is half read (its reader process waits before its 2nd chunk),
    # another connection changes it and commits.
    monkeypatch.setenv("LAKEHOUSE_PAUSE_AT", f"cdc.snapshot-chunk.{p}_b:{pauses}:2")

    def write_between_chunks() -> None:
        marker = pauses / f"cdc.snapshot-chunk.{p}_b-2"
        deadline = time.monotonic() + 300
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not marker.exists():
            return
        writer = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
        try:
            between_chunks.append(random_workload(writer, f"{p}_b", 60, seed=5, keys=2_000))
        finally:
            writer.close()
            marker.unlink()

    pauser = threading.Thread(target=write_between_chunks, daemon=True)
    pauser.start()
    sync = make_sync(include=(f"user_db.{p}_*",), exclude=(f"user_db.{p}_skip*",), chunk_rows=100)
    assert sorted(t.spec.source for t in sync.tables.values()) == [f"user_db.{p}_a", f"user_db.{p}_nokey"]
    (error,) = sync.errors
    assert f"user_db.{p}_nokey has no primary key" in error and "--exclude" in error and "\n" not in error
    random_workload(app_conn, f"{p}_a", 80, seed=1, keys=300)
    catch_up(sync)
    assert_converged(spark, app_conn, f"{p}_a")

    # Created while the job runs, each its own way.
    recreate_source(app_conn, f"{p}_b")
    seed_rows(app_conn, f"{p}_b", 1_500)
    with app_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {p}_c (PRIMARY KEY (id)) SELECT * FROM {p}_a")
        cur.execute(TEST_TABLE_DDL.format(name=f"tmp_{p}_d"))
        cur.execute(f"INSERT INTO tmp_{p}_d (id, name, qty) VALUES ('r1', 'moved', 1), ('r2', 'moved', 2)")
        cur.execute(f"RENAME TABLE tmp_{p}_d TO {p}_d")
        cur.execute(f"CREATE TABLE {p}_skip2 (id INT PRIMARY KEY)")
        cur.execute(f"CREATE TABLE {p}_nokey2 (id INT)")
    app_conn.commit()
    random_workload(app_conn, f"{p}_a", 40, seed=2, keys=300)
    catch_up(sync)
    pauser.join(timeout=5)
    assert between_chunks and between_chunks[0] >= 60, "no write landed between the new table's chunks"
    # Changes after the new tables' snapshots are followed too.
    for name, seed in ((f"{p}_b", 3), (f"{p}_c", 4), (f"{p}_d", 6)):
        random_workload(app_conn, name, 50, seed=seed, keys=2_000)
    catch_up(sync)

    for name in (f"{p}_a", f"{p}_b", f"{p}_c", f"{p}_d"):
        assert_converged(spark, app_conn, name)
    assert assert_converged(spark, app_conn, f"{p}_b") > 1_000
    for name in (f"{p}_skip", f"{p}_skip2", f"tmp_{p}_d"):
        assert not spark.catalog.tableExists(f"lakehouse.dim_db.{name}"), f"{name} must not be synced"
    assert sorted(e.split(":")[0] for e in sync.errors) == [
        f"lakehouse.dim_db.{p}_nokey",
        f"lakehouse.dim_db.{p}_nokey2",
    ]
    assert not sync.all_stopped

    # A primary key added to a table that waits for one: snapshotted and followed, no restart.
    with app_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {p}_nokey VALUES (1, 10), (2, 20)")
        cur.execute(f"ALTER TABLE {p}_nokey ADD PRIMARY KEY (id)")
        cur.execute(f"INSERT INTO {p}_nokey VALUES (3, 30)")
        cur.execute(f"UPDATE {p}_nokey SET v = 11 WHERE id = 1")
    app_conn.commit()
    catch_up(sync)
    assert [e.split(":")[0] for e in sync.errors] == [f"lakehouse.dim_db.{p}_nokey2"]
    assert assert_converged(spark, app_conn, f"{p}_nokey", columns=["id", "v"]) == 3

    # A restart finds every table where it left it: no snapshot again, the changes since applied.
    sync.close()
    random_workload(app_conn, f"{p}_c", 30, seed=7, keys=2_000)
    chunks_of: list[str] = []
    real_read_chunk = snapshot.source_db.read_chunk

    def recording(conn, table, after, rows, upto=None):
        chunks_of.append(table.name)
        return real_read_chunk(conn, table, after, rows, upto)

    monkeypatch.setattr(snapshot.source_db, "read_chunk", recording)
    again = make_sync(include=(f"user_db.{p}_*",), exclude=(f"user_db.{p}_skip*",), reads_in_process=True)
    catch_up(again)
    assert chunks_of == [], "a table the lake already had was snapshotted again"
    for name in (f"{p}_a", f"{p}_b", f"{p}_c", f"{p}_d"):
        assert_converged(spark, app_conn, name)
    again.close()
    _drop_tables(app_conn, spark, tables)


def test_create_or_replace_re_snapshots_the_table(spark, app_conn, make_sync) -> None:
    """CREATE OR REPLACE gives the source table other rows without a row event for the old ones: the
    lake table is snapshotted again instead of keeping rows the source no longer has (both ways:
    LIKE then INSERT, and ... SELECT, whose rows come inside the CREATE's own transaction)."""
    name = "cdc_test_replaced"
    pair = fresh_test_table(spark, app_conn, name)
    recreate_source(app_conn, f"{name}_next")
    seed_rows(app_conn, name, 50)
    seed_rows(app_conn, f"{name}_next", 7, prefix="n")
    sync = make_sync(pair)
    with app_conn.cursor() as cur:
        cur.execute(f"CREATE OR REPLACE TABLE {name} LIKE {name}_next")
        cur.execute(f"INSERT INTO {name} SELECT * FROM {name}_next")
    app_conn.commit()
    catch_up(sync)
    assert assert_converged(spark, app_conn, name) == 7
    random_workload(app_conn, name, 20, seed=9, keys=50)
    with app_conn.cursor() as cur:
        cur.execute(
            f"CREATE OR REPLACE TABLE {name} (PRIMARY KEY (id)) SELECT * FROM {name}_next WHERE qty < 3"
        )
    app_conn.commit()
    catch_up(sync)
    assert assert_converged(spark, app_conn, name) == 3
    assert sync.errors == []
    with app_conn.cursor() as cur:
        cur.execute(f"DROP TABLE {name}_next")
    app_conn.commit()


def test_a_renamed_or_swapped_table_stops_alone_and_the_others_go_on(spark, app_conn, make_sync) -> None:
    """RENAME of a synced table marks it dropped (its lake table stays); an online-schema-change swap
    (`RENAME t TO t_old, t_new TO t`, the new t keyed otherwise) stops it as created again, and does
    not trip the binlog reader: a bystander table keeps syncing and converges."""
    name, bystander = "cdc_test_renamed", "cdc_test_bystander"
    pair, other = fresh_test_table(spark, app_conn, name), fresh_test_table(spark, app_conn, bystander)
    seed_rows(app_conn, name, 30)
    seed_rows(app_conn, bystander, 30)
    with app_conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {name}_old")
        cur.execute(f"DROP TABLE IF EXISTS {name}_new")
    app_conn.commit()
    sync = make_sync(pair, other)
    with app_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {name}_new (code INT PRIMARY KEY, label VARCHAR(16))")
        cur.execute(f"RENAME TABLE {name} TO {name}_old, {name}_new TO {name}")
        cur.execute(f"INSERT INTO {name} (code, label) VALUES (1, 'x'), (2, 'y')")  # no `id`, the old key
    app_conn.commit()
    random_workload(app_conn, bystander, 40, seed=12, keys=30)
    catch_up(sync)
    (error,) = sync.errors
    assert error.startswith(f"lakehouse.dim_db.{name}:") and "was created again" in error
    assert "(renamed away)" in error and f"--resync user_db.{name}`" in error
    assert sync.reader.fatal is None
    assert_converged(spark, app_conn, bystander)
    with app_conn.cursor() as cur:
        cur.execute(f"DROP TABLE {name}_old")
    app_conn.commit()


def test_create_or_replace_with_another_key_or_none(spark, app_conn, make_sync) -> None:
    """CREATE OR REPLACE with another primary key: the lake table is snapshotted again and its changes
    merge by the new key; without a primary key the table stops alone, with the reason."""
    name, keyless = "cdc_test_rekeyed", "cdc_test_keyless"
    pairs = [fresh_test_table(spark, app_conn, n) for n in (name, keyless)]
    seed_rows(app_conn, name, 20)
    seed_rows(app_conn, keyless, 20)
    sync = make_sync(*pairs)
    columns = ["code", "tag", "name"]
    with app_conn.cursor() as cur:
        cur.execute(
            f"CREATE OR REPLACE TABLE {name} (code INT PRIMARY KEY, tag VARCHAR(16), name VARCHAR(64))"
        )
        cur.executemany(
            f"INSERT INTO {name} (code, tag, name) VALUES (%s, %s, 'new')",
            [(i, f"k{i % 3}") for i in range(12)],
        )
        cur.execute(f"UPDATE {name} SET name = 'changed' WHERE code IN (3, 4)")
        cur.execute(f"DELETE FROM {name} WHERE code = 5")
        cur.execute(f"CREATE OR REPLACE TABLE {keyless} (id VARCHAR(16), note TEXT)")
    app_conn.commit()
    catch_up(sync)
    with app_conn.cursor() as cur:
        cur.execute(f"UPDATE {name} SET name = 'after' WHERE code = 6")
    app_conn.commit()
    catch_up(sync)
    assert assert_converged(spark, app_conn, name, columns) == 11
    (error,) = sync.errors
    assert error.startswith(f"lakehouse.dim_db.{keyless}:") and "no primary key" in error
    assert sync.reader.fatal is None


def test_verify_explains_changes_in_flight_and_finds_what_they_do_not(
    spark, lake_config, app_conn, make_sync, monkeypatch
) -> None:
    """`lakehouse verify`'s dimension check on a live source: changes CDC has not applied yet are
    explained by the binlog after the lake's position (no false alarm); a lake row changed behind
    CDC's back, on a key no change touched, is found and named - also once CDC has caught up. The
    source is read in pieces of 100 rows, each summed as it comes, in buckets of about 20 keys: once
    caught up, only the tampered row's bucket is compared value by value."""
    from jobs.cdc import reconcile, source_db
    from jobs.verify.dimensions import check_dimension

    monkeypatch.setattr(reconcile, "CHUNK_ROWS", 50)
    monkeypatch.setattr(reconcile, "FRAME_ROWS", 100)
    monkeypatch.setattr(reconcile, "BUCKET_ROWS", 20)
    compared: list[int] = []  # rows (both sides) compared value by value, per check
    row_differences = reconcile._row_differences

    def counted(left, right, *args):
        compared.append(left.count() + right.count())
        return row_differences(left, right, *args)

    monkeypatch.setattr(reconcile, "_row_differences", counted)

    name = "cdc_test_verify"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 600)
    sync = make_sync(pair)
    catch_up(sync)
    random_workload(app_conn, name, 60, seed=3, keys=500)  # k00000-k00499; not applied yet
    credentials = source_db.cdc_credentials(lake_config)
    conn = source_db.connect(lake_config, credentials)
    settings = source_db.connection_settings(lake_config, credentials)

    def verify():
        target = f"lakehouse.dim_db.{name}"
        return check_dimension(
            spark, conn, target, ("user_db", name), settings, 4291, source_db.is_mariadb(conn)
        )

    try:
        clean = verify()
        assert clean.status == "ok" and clean.compared >= 500
        assert any("in flight" in note for note in clean.notes), clean.notes
        spark.sql(f"UPDATE lakehouse.dim_db.{name} SET name = 'tampered' WHERE id = 'k00550'")
        damaged = verify()
        assert damaged.error is None, damaged.error  # a second run in the same process reads too
        assert [(f.kind, f.examples) for f in damaged.findings] == [("rows that differ", ("key k00550",))]
        catch_up(sync)
        compared.clear()
        settled = verify()
        assert [(f.kind, f.examples) for f in settled.findings] == [("rows that differ", ("key k00550",))]
        assert not any("in flight" in note for note in settled.notes)
        # ~30 buckets of ~20 rows a side: the one that differs, not the ~1,200 rows (4x margin)
        assert len(compared) == 1 and 0 < compared[0] <= 4 * 2 * 20, compared
    finally:
        conn.close()


def test_verify_repair_mends_the_differing_keys_beside_a_running_cdc(
    spark, lake_config, local_stack, secrets, app_conn, make_sync
) -> None:
    """Issue 51, item 2: `verify --repair` on a dimension while CDC applies a workload in another
    thread. Damage behind CDC's back, on keys the workload never touches: a row changed, a row
    deleted, a row stored twice, a row the source never had. The repair writes exactly those keys in
    one commit (lineage in its summary) and the check after it is clean; once CDC has caught up, the
    lake equals the source as a multiset (keys unique), so nothing CDC applied meanwhile was lost."""
    from jobs.common.lake_tables import load_iceberg_table
    from jobs.verify.__main__ import repaired_dimension
    from jobs.verify.repair import REPAIR_KEY
    from lakehouse.local.mariadb import APP_USER

    name = "cdc_test_repair"
    target = f"lakehouse.dim_db.{name}"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 600)
    sync = make_sync(pair)
    catch_up(sync)
    spark.sql(f"UPDATE {target} SET name = 'tampered' WHERE id = 'k00550'")
    spark.sql(f"DELETE FROM {target} WHERE id = 'k00551'")
    spark.sql(f"INSERT INTO {target} SELECT * FROM {target} WHERE id = 'k00552'")
    ghost = f"SELECT 'ghost', name, qty, price, note, updated FROM {target} WHERE id = 'k00553'"
    spark.sql(f"INSERT INTO {target} {ghost}")

    credentials = source_db.cdc_credentials(lake_config)
    conn = source_db.connect(lake_config, credentials)
    settings = source_db.connection_settings(lake_config, credentials)
    is_mariadb = source_db.is_mariadb(conn)
    writer = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
    writer.select_db("user_db")
    stop, failures = threading.Event(), []

    def cdc_and_workload() -> None:
        try:
            rounds = 0
            while not stop.is_set():
                if rounds < 20:
                    random_workload(writer, name, 10, seed=100 + rounds, keys=400)  # k00000-k00399
                rounds += 1
                sync.run_batch()
                time.sleep(0.05)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    running = threading.Thread(target=cdc_and_workload, daemon=True)
    running.start()
    try:
        arguments = (spark, conn, target, ("user_db", name), settings, 4293, is_mariadb)
        result = repaired_dimension(arguments, settings, 4293, is_mariadb)
    finally:
        stop.set()
        running.join(timeout=120)
        conn.close()
        writer.close()
    assert not failures, failures
    assert result.status == "ok" and result.repaired == 4, result
    assert result.notes[0].startswith("repaired 4 keys: 3 rows written from the source, 1 deleted"), (
        result.notes
    )
    catch_up(sync)
    assert_converged(spark, app_conn, name)
    repairs = [
        json.loads(s.summary()[REPAIR_KEY])
        for s in load_iceberg_table(spark, target).snapshots()
        if s.summary().get(REPAIR_KEY) is not None
    ]
    assert [(r["keys"], r["written"], r["source"]) for r in repairs] == [(4, 3, f"user_db.{name}")]


# ---- schema evolution and DDL -------------------------------------------------------------------


def lake_schema(spark, name: str) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in spark.table(f"lakehouse.dim_db.{name}").schema}


def test_column_changes_are_followed_under_evolve(spark, app_conn, make_sync) -> None:
    """ADD (any position), DROP (the lake keeps the column and its values), RENAME (history kept),
    and widening type changes Iceberg promotes, each between row changes; the lake then equals the
    source on the source's columns, and the dropped column still holds what it held."""
    name = "cdc_test_ddl"
    pair = fresh_test_table(spark, app_conn, name)
    sync = make_sync(pair)
    with app_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {name} (id, name, qty, note) VALUES ('a', 'before', 1, 'kept a')")
        cur.execute(f"INSERT INTO {name} (id, name, qty, note) VALUES ('z', 'untouched', 9, 'kept z')")
        cur.execute(f"ALTER TABLE {name} ADD COLUMN stock DECIMAL(12,3) NULL AFTER name")
        cur.execute(f"INSERT INTO {name} (id, name, qty, stock) VALUES ('b', 'after', 2, 7.125)")
        cur.execute(f"UPDATE {name} SET stock = 1.5 WHERE id = 'a'")
        cur.execute(f"ALTER TABLE {name} DROP COLUMN note")
        cur.execute(f"INSERT INTO {name} (id, name, qty) VALUES ('c', 'after drop', 3)")
        cur.execute(f"ALTER TABLE {name} RENAME COLUMN name TO title")
        cur.execute(f"UPDATE {name} SET title = 'renamed' WHERE id = 'b'")
        cur.execute(f"ALTER TABLE {name} MODIFY qty BIGINT, CHANGE price price DECIMAL(14,4)")
        cur.execute(
            f"INSERT INTO {name} (id, title, qty, price) VALUES ('d', 'wide', 9000000000, 1234567890.5)"
        )
    app_conn.commit()
    catch_up(sync)
    assert not sync.errors
    schema = lake_schema(spark, name)
    assert (schema["stock"], schema["qty"], schema["price"]) == ("decimal(12,3)", "bigint", "decimal(14,4)")
    assert "title" in schema and "name" not in schema and "note" in schema
    source_columns = ["id", "title", "stock", "qty", "price", "updated"]
    assert assert_converged(spark, app_conn, name, source_columns) == 5
    notes = {r.id: r.note for r in spark.table(f"lakehouse.dim_db.{name}").collect()}
    # Never changed since the drop: its value stays; written after it: NULL.
    assert notes["z"] == "kept z" and notes["c"] is None and notes["d"] is None
    titles = {r.id: r.title for r in spark.table(f"lakehouse.dim_db.{name}").collect()}
    assert titles["z"] == "untouched"  # written under the old name, read under the new one


def test_a_type_change_iceberg_cannot_follow_stops_that_table_with_the_fix(
    spark, app_conn, make_sync
) -> None:
    name = "cdc_test_ddl_narrow"
    pair = fresh_test_table(spark, app_conn, name)
    sync = make_sync(pair)
    statement = f"ALTER TABLE {name} MODIFY price DECIMAL(10,2)"  # the scale changes: values rounded
    with app_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {name} (id, name, price) VALUES ('a', 'x', 1.2345)")
        cur.execute(statement)
        cur.execute(f"INSERT INTO {name} (id, name, price) VALUES ('c', 'not applied', 3)")
    app_conn.commit()
    catch_up(sync)
    assert len(sync.errors) == 1
    error = sync.errors[0]
    assert statement in error and "cannot promote" in error and f"--resync user_db.{name}" in error
    assert spark.sql(f"SELECT * FROM lakehouse.dim_db.{name} WHERE id = 'c'").count() == 0

    # A restart stops at the same statement; --resync re-snapshots the table with its new shape.
    again = make_sync(pair)
    catch_up(again)
    assert again.errors and statement in again.errors[0]
    again.close()
    resynced = make_sync(pair, resync=(f"user_db.{name}",))
    catch_up(resynced)
    assert not resynced.errors
    assert lake_schema(spark, name)["price"] == "decimal(10,2)"
    assert assert_converged(spark, app_conn, name) == 2


def test_a_type_change_that_rewrites_values_resnapshots(spark, app_conn, make_sync) -> None:
    """VARCHAR(64) -> VARCHAR(3) keeps the Iceberg type (string) but MySQL cut the values without a
    row event: the table is read again."""
    name = "cdc_test_ddl_rewrite"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 20)
    sync = make_sync(pair)
    with app_conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # MySQL truncates instead of refusing
        cur.execute(f"ALTER TABLE {name} MODIFY name VARCHAR(3) NOT NULL")
    app_conn.commit()
    catch_up(sync)
    assert not sync.errors
    assert {r.name for r in spark.table(f"lakehouse.dim_db.{name}").collect()} == {
        r[0] for r in mysql_rows(app_conn, f"user_db.{name}", ["name"])
    }
    assert assert_converged(spark, app_conn, name) == 20


@pytest.mark.parametrize("policy", ["strict", "ignore"])
def test_schema_change_policies_strict_and_ignore(spark, app_conn, lake_config, policy) -> None:
    name = f"cdc_test_ddl_{policy}"
    pair = fresh_test_table(spark, app_conn, name)
    sync = CdcSync(
        spark,
        lake_config,
        [TableSpec.parse(pair, lake_config)],
        server_id=next(_server_ids),
        schema_changes=policy,
    ).start()
    try:
        statement = f"ALTER TABLE {name} ADD COLUMN stock INT, RENAME COLUMN note TO remark"
        with app_conn.cursor() as cur:
            cur.execute(f"INSERT INTO {name} (id, name, note) VALUES ('a', 'x', 'n')")
            cur.execute(statement)
            cur.execute(f"INSERT INTO {name} (id, name, stock, remark) VALUES ('b', 'y', 5, 'r')")
        app_conn.commit()
        catch_up(sync)
        schema = lake_schema(spark, name)
        assert "stock" not in schema and "remark" not in schema and "note" in schema
        if policy == "strict":
            assert len(sync.errors) == 1 and statement in sync.errors[0] and "strict" in sync.errors[0]
            assert spark.sql(f"SELECT * FROM lakehouse.dim_db.{name} WHERE id = 'b'").count() == 0
        else:
            assert not sync.errors
            rows = {r.id: r.note for r in spark.table(f"lakehouse.dim_db.{name}").collect()}
            assert rows == {"a": "n", "b": None}  # the renamed column is not synced
    finally:
        sync.close()


def test_ignore_never_writes_a_new_column_into_the_lake_column_of_its_name(
    spark, app_conn, lake_config
) -> None:
    """Under `ignore` a dropped column added back under its name (here with another type) wrote the
    new column's values into the old lake column, or failed the whole job converting them."""
    name = "cdc_test_ignore_readded"
    pair = fresh_test_table(spark, app_conn, name)

    def ignoring() -> CdcSync:
        return CdcSync(spark, lake_config, [TableSpec.parse(pair, lake_config)], server_id=next(_server_ids),
                       schema_changes="ignore").start()  # fmt: skip

    sync = ignoring()
    try:
        with app_conn.cursor() as cur:
            cur.execute(f"INSERT INTO {name} (id, name, note) VALUES ('a', 'x', 'old note')")
            cur.execute(f"ALTER TABLE {name} DROP COLUMN note")
            cur.execute(f"ALTER TABLE {name} ADD COLUMN note DATETIME")  # another type, same name
            cur.execute(f"INSERT INTO {name} (id, name, note) VALUES ('b', 'y', '2026-01-02 03:04:05')")
        app_conn.commit()
        catch_up(sync)
        assert sync.errors == []
        rows = {r.id: r.note for r in spark.table(f"lakehouse.dim_db.{name}").collect()}
        assert rows == {"a": "old note", "b": None}
    finally:
        sync.close()
    sync = ignoring()  # after a restart too
    try:
        with app_conn.cursor() as cur:
            cur.execute(f"INSERT INTO {name} (id, name, note) VALUES ('c', 'z', '2026-01-03 00:00:00')")
        app_conn.commit()
        catch_up(sync)
        assert sync.errors == []
        rows = {r.id: r.note for r in spark.table(f"lakehouse.dim_db.{name}").collect()}
        assert rows == {"a": "old note", "b": None, "c": None}
    finally:
        sync.close()


def test_truncate_empties_and_a_dropped_table_is_kept_marked_and_the_job_goes_on(
    spark, app_conn, make_sync, lake_config
) -> None:
    """A dropped source table used to stop with an error at every start (exit 2), and verify could
    not run: now its lake table keeps exactly the rows it had, marked with where the DROP was, the
    job goes on without an error, and a table created again under the name waits for --resync."""
    from jobs.cdc.__main__ import drop_orphaned
    from jobs.cdc.target_table import DROPPED_PROPERTY, source_dropped

    truncated, dropped = "cdc_test_truncate", "cdc_test_drop"
    pairs = [fresh_test_table(spark, app_conn, n) for n in (truncated, dropped)]
    seed_rows(app_conn, truncated, 10)
    seed_rows(app_conn, dropped, 10)
    sync = make_sync(*pairs)
    with app_conn.cursor() as cur:
        cur.execute(f"UPDATE {dropped} SET qty = qty + 100 WHERE id < 'k00003'")
    app_conn.commit()
    before_drop = mysql_rows(app_conn, f"user_db.{dropped}", COLUMNS)
    with app_conn.cursor() as cur:
        cur.execute(f"UPDATE {truncated} SET qty = 1")
        cur.execute(f"TRUNCATE TABLE {truncated}")
        cur.execute(f"INSERT INTO {truncated} (id, name) VALUES ('after', 'truncate')")
        cur.execute(f"DROP TABLE {dropped}")
    app_conn.commit()
    catch_up(sync)
    assert assert_converged(spark, app_conn, truncated) == 1
    assert sync.errors == []
    state = sync.tables[("user_db", dropped)]
    assert state.dropped.startswith("at ") and not state.live
    lake = f"lakehouse.dim_db.{dropped}"
    assert iceberg_rows(spark, lake, COLUMNS) == before_drop  # the rows as of the DROP, each once
    assert source_dropped(spark, lake) == state.dropped
    sync.close()

    # The next start finds the mark: no error, the other table goes on.
    sync = make_sync(*pairs)
    assert sync.errors == [] and sync.tables[("user_db", dropped)].dropped == state.dropped
    with app_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {truncated} (id, name) VALUES ('restarted', 'restart')")
    app_conn.commit()
    catch_up(sync)
    assert assert_converged(spark, app_conn, truncated) == 2

    # Created again under its name while the job runs: another table's rows; it waits for --resync.
    recreate_source(app_conn, dropped)
    seed_rows(app_conn, dropped, 3, prefix="new")
    catch_up(sync)
    (error,) = sync.errors
    assert f"user_db.{dropped} was created again" in error and f"--resync user_db.{dropped}" in error
    assert iceberg_rows(spark, lake, COLUMNS) == before_drop
    sync.close()
    resynced = make_sync(*pairs, resync=(f"user_db.{dropped}",))
    catch_up(resynced)  # re-snapshotted beside the stream
    assert resynced.errors == []
    assert assert_converged(spark, app_conn, dropped) == 3 and source_dropped(spark, lake) is None
    resynced.close()

    # Gone for good: one command removes a marked lake table, and refuses one that is not marked.
    with app_conn.cursor() as cur:
        cur.execute(f"DROP TABLE {dropped}")
    app_conn.commit()
    catch_up(make_sync(*pairs))
    assert drop_orphaned(spark, lake_config, [f"dim_db.{truncated}"]) == 2
    assert drop_orphaned(spark, lake_config, [f"dim_db.{dropped}"]) == 0
    assert not spark.catalog.tableExists(lake) and spark.catalog.tableExists(f"lakehouse.dim_db.{truncated}")
    assert DROPPED_PROPERTY == "lakehouse.cdc.source-dropped"
    # A misspelt source onto a lake table synced from another one is an error at start.
    with pytest.raises(source_db.MissingTable, match=f"user_db.{truncated}_typo does not exist"):
        make_sync(f"user_db.{truncated}_typo=dim_db.{truncated}")


def test_a_table_dropped_while_cdc_was_stopped_is_kept_marked_and_the_others_go_on(
    spark, app_conn, make_sync
) -> None:
    """Whole-database sync: the source lists only the tables there now, so a table dropped while the
    job was down used to vanish from the sync without a word, then stop every start with an error;
    then it was marked dropped as of its stored position, without the changes the source made to it
    after that and before the DROP (found by the CDC fuzzer): they are applied up to the DROP."""
    from jobs.cdc.target_table import source_dropped

    p = "cdc_gone"
    names = [f"{p}_kept", f"{p}_dropped", f"{p}_stops", f"{p}_other"]
    _drop_tables(app_conn, spark, names)
    for name in names[:3]:
        recreate_source(app_conn, name)
        seed_rows(app_conn, name, 20)
    make_sync(include=(f"user_db.{p}_*",)).close()
    # A lake table of the same namespace that this selection never synced stays out of it.
    spark.sql(f"CREATE TABLE lakehouse.dim_db.{p}_other (id STRING) USING iceberg")
    with app_conn.cursor() as cur:  # while the job is down, before the DROP
        cur.execute(f"UPDATE {p}_dropped SET qty = qty + 100 WHERE qty < 5")
        cur.execute(f"DELETE FROM {p}_dropped WHERE qty > 15")
        cur.execute(f"INSERT INTO {p}_dropped (id, name, qty, price) VALUES ('late', 'late', 1, 1)")
        # a statement that stops a table's sync, then its DROP: no source to --resync from
        cur.execute(f"ALTER IGNORE TABLE {p}_stops ADD UNIQUE (name)")
        cur.execute(f"DROP TABLE {p}_stops")
    app_conn.commit()
    before_drop = mysql_rows(app_conn, f"user_db.{p}_dropped", COLUMNS)
    with app_conn.cursor() as cur:
        cur.execute(f"DROP TABLE {p}_dropped")
        cur.execute(f"UPDATE {p}_kept SET qty = qty + 1")
    app_conn.commit()

    sync = make_sync(include=(f"user_db.{p}_*",))
    assert sync.errors == []
    lake = f"lakehouse.dim_db.{p}_dropped"
    catch_up(sync)
    assert sync.errors == []
    assert source_dropped(spark, lake).startswith("at ")  # where the binlog's DROP is
    stopped = source_dropped(spark, f"lakehouse.dim_db.{p}_stops")
    assert "while the job was stopped; then sync stopped" in stopped and "ALTER IGNORE" in stopped
    assert assert_converged(spark, app_conn, f"{p}_kept") == 20
    assert iceberg_rows(spark, lake, COLUMNS) == before_drop
    assert source_dropped(spark, f"lakehouse.dim_db.{p}_other") is None


def test_drop_database_marks_every_table_of_it_and_a_reload_waits_for_resync(
    spark, local_stack, secrets, lake_config, make_sync
) -> None:
    """A reset script (DROP DATABASE, CREATE DATABASE, the tables again, new rows): the deleted rows
    used to stay in the lake for good with the new ones merged on top."""
    from lakehouse.local.mariadb import APP_USER

    db = "cdc_reload"
    fresh_source_database(local_stack, db)
    conn = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"], database=db)
    names = ["reload_a", "reload_b"]
    for name in names:
        spark.sql(f"DROP TABLE IF EXISTS lakehouse.dim_db.{name}")
        recreate_source(conn, name)
        seed_rows(conn, name, 5)
    try:
        sync = make_sync(include=(f"{db}.reload_*",))
        before = {n: mysql_rows(conn, f"{db}.{n}", COLUMNS) for n in names}
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE {db}")
            cur.execute(f"CREATE DATABASE {db}")
            cur.execute(f"USE {db}")
        conn.commit()
        for name in names:
            recreate_source(conn, name)
            seed_rows(conn, name, 2, prefix="reloaded")
        catch_up(sync)
        assert len(sync.errors) == 2
        for name in names:
            state = sync.tables[(db, name)]
            assert state.dropped.startswith("at ") and "was created again" in state.error
            assert f"--resync {db}.{name}" in state.error
            assert iceberg_rows(spark, f"lakehouse.dim_db.{name}", COLUMNS) == before[name]
    finally:
        conn.close()
        local_stack.mariadb.admin_sql(f"DROP DATABASE IF EXISTS {db}")


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


def test_mariadb_kill_9_mid_run_is_survived(spark, app_conn, local_stack, secrets, make_sync) -> None:
    from lakehouse.local.mariadb import APP_USER

    name = "cdc_test_kill_db"
    pair = fresh_test_table(spark, app_conn, name)
    sync = make_sync(pair)
    random_workload(app_conn, name, 300, seed=17)
    sync.run_batch()
    app_conn.close()
    pid = local_stack.mariadb.process.pid()
    os.kill(pid, signal.SIGKILL)  # no shutdown: only what reached the disk survives
    while local_stack.mariadb.process.is_running():
        time.sleep(0.1)
    sync.run_batch()  # the source is down: batches keep running, the reader retries
    local_stack.mariadb.start(secrets)
    conn = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
    try:
        random_workload(conn, name, 300, seed=18)
        catch_up(sync)
        assert sync.reader.reconnects >= 1
        assert not sync.errors
        assert assert_converged(spark, conn, name) > 20
        sync.close()
        restarted = make_sync(pair)  # and a job restart after the crash resumes where it was
        random_workload(conn, name, 100, seed=19)
        catch_up(restarted)
        assert not restarted.errors
        assert_converged(spark, conn, name)
    finally:
        conn.close()


# ---- exactly-once holes (issue 14) ---------------------------------------------------------------


def seed_rows(conn: pymysql.Connection, table: str, count: int, prefix: str = "k") -> None:
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {table} (id, name, qty, price) VALUES (%s, 'seed', %s, 1)",
            [(f"{prefix}{i:05d}", i) for i in range(count)],
        )
    conn.commit()


def test_second_writer_aborts_with_a_one_line_error(spark, lake_config, app_conn, make_sync, capsys) -> None:
    from jobs.common.snapshot_progress import ConcurrentWriterError

    name = "cdc_test_two_writers"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 10)
    first = make_sync(pair)
    second = make_sync(pair)  # a re-submitted step beside a live one: same stored position
    random_workload(app_conn, name, 100, seed=31, keys=20)
    catch_up(first)
    committed = stored_position(spark, f"lakehouse.dim_db.{name}")
    with pytest.raises(ConcurrentWriterError) as raised:
        catch_up(second)
    message = str(raised.value)
    assert "\n" not in message and "another CDC job" in message and name in message
    assert stored_position(spark, f"lakehouse.dim_db.{name}") == committed
    assert_converged(spark, app_conn, name)
    # The job's run loop turns it into a non-zero exit with that one line on stderr.
    from jobs.cdc.sync import run_sync
    from jobs.common.run_modes import RunMode, StopRequest

    third = CdcSync(spark, lake_config, [TableSpec.parse(pair, lake_config)], server_id=next(_server_ids))
    third.start()  # reads the stored position, then another job commits before it does
    random_workload(app_conn, name, 30, seed=32, keys=20)
    catch_up(first)
    third.start = lambda: third  # run_sync starts the job; this one is already started
    capsys.readouterr()
    mode = RunMode(until_idle=True, idle_seconds=0.5, trigger_seconds=0.2)
    assert run_sync(third, mode, StopRequest()) == 3
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "another CDC job" in lines[0]
    assert_converged(spark, app_conn, name)


def test_commit_with_unknown_outcome_that_landed_is_not_applied_again(
    spark, app_conn, make_sync, monkeypatch
) -> None:
    from jobs.cdc import apply_changes
    from jobs.cdc.target_table import POSITION_KEY

    name = "cdc_test_unknown_commit"
    pair = fresh_test_table(spark, app_conn, name)
    sync = make_sync(pair)
    real = apply_changes.with_snapshot_properties
    failures = []

    def lands_then_reports_unknown(spark_, properties, action):
        real(spark_, properties, action)
        if not failures:
            failures.append(properties)
            raise RuntimeError("org.apache.iceberg.exceptions.CommitStateUnknownException: injected timeout")

    monkeypatch.setattr(apply_changes, "with_snapshot_properties", lands_then_reports_unknown)
    seed_rows(app_conn, name, 50)
    catch_up(sync)
    assert failures, "the injected unknown outcome never happened"
    end = failures[0][POSITION_KEY]
    commits = spark.sql(
        f"SELECT count(*) FROM lakehouse.dim_db.{name}.snapshots WHERE summary['{POSITION_KEY}'] = '{end}'"
    ).collect()[0][0]
    assert commits == 1, f"the batch ending at {end} was committed {commits} times"
    assert assert_converged(spark, app_conn, name) == 50


def test_a_snapshot_commit_with_unknown_outcome_that_landed_is_not_appended_again(
    spark, app_conn, make_sync, monkeypatch
) -> None:
    """A staging commit is recognised by the progress it stored; the first attempt does not look
    (no earlier commit can hold it), a retry must, or its rows are in the lake twice."""
    from pyspark.sql import DataFrame

    from jobs.cdc import snapshot

    name = "cdc_test_unknown_snapshot_commit"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 50)
    real_write_to = DataFrame.writeTo
    failures: list[str] = []

    def write_to(frame, table):
        writer = real_write_to(frame, table)
        if snapshot.STAGING_SUFFIX in table and not failures:
            real_append = writer.append

            def lands_then_reports_unknown() -> None:
                real_append()
                failures.append(table)
                raise RuntimeError("org.apache.iceberg.exceptions.CommitStateUnknownException: injected")

            writer.append = lands_then_reports_unknown
        return writer

    monkeypatch.setattr(DataFrame, "writeTo", write_to)
    make_sync(pair, chunk_rows=10, commit_rows=20)
    assert failures, "the injected unknown outcome never happened"
    assert assert_converged(spark, app_conn, name) == 50  # as multisets: a row twice is a difference
    stored = spark.sql(
        f"SELECT summary['{snapshot.PROGRESS_KEY}'] AS p FROM lakehouse.dim_db.{name}.snapshots "
        f"WHERE summary['{snapshot.PROGRESS_KEY}'] IS NOT NULL"
    ).collect()
    assert len(stored) == len({r["p"] for r in stored}) == 3  # 10 rows, then 20 and 20: each once


def test_add_column_with_default_or_not_null_backfills_existing_rows(spark, app_conn, make_sync) -> None:
    name = "cdc_test_add_default"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 30)
    sync = make_sync(pair)
    with app_conn.cursor() as cur:
        cur.execute(f"ALTER TABLE {name} ADD COLUMN flag INT NOT NULL DEFAULT 7")
        cur.execute(
            f"ALTER TABLE {name} ADD COLUMN label VARCHAR(8) DEFAULT 'x', ADD COLUMN code INT NOT NULL"
        )
        cur.execute(f"INSERT INTO {name} (id, name, flag, label, code) VALUES ('new', 'n', 1, 'y', 2)")
        cur.execute(f"UPDATE {name} SET flag = 8 WHERE id = 'k00001'")
    app_conn.commit()
    catch_up(sync)
    assert not sync.errors
    assert assert_converged(spark, app_conn, name, [*COLUMNS, "flag", "label", "code"]) == 31


def test_unmapped_column_type_stops_only_that_table(spark, app_conn, make_sync) -> None:
    odd, fine = "cdc_test_odd_type", "cdc_test_fine"
    sync = make_sync(fresh_test_table(spark, app_conn, odd), fresh_test_table(spark, app_conn, fine))
    statement = f"ALTER TABLE {odd} ADD COLUMN shape POINT NULL"
    with app_conn.cursor() as cur:
        cur.execute(statement)
    app_conn.commit()
    seed_rows(app_conn, fine, 20)
    catch_up(sync)
    assert len(sync.errors) == 1
    error = sync.errors[0]
    assert odd in error and "point" in error.lower() and "\n" not in error
    assert assert_converged(spark, app_conn, fine) == 20


def test_kill_9_between_publishing_and_storing_the_position_snapshots_again(
    spark, app_conn, make_sync
) -> None:
    """The staging table became the target but its position was never stored: the next start
    cannot trust the table, so it snapshots again, into it."""
    from jobs.cdc import snapshot

    name = "cdc_test_snapshot_renamed"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 300)
    job = subprocess.run(
        [LAKEHOUSE_BIN, "run", "cdc", "--until-idle", "--table", pair, "--server-id", "5097"],
        env={**os.environ, "LAKEHOUSE_CRASH_AT": "cdc.snapshot-renamed:1"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert job.returncode == -signal.SIGKILL, job.stderr[-3000:]
    target = f"lakehouse.dim_db.{name}"
    assert spark.table(target).count() == 300 and stored_position_or_none(spark, target) is None
    with app_conn.cursor() as cur:
        cur.execute(f"DELETE FROM {name} WHERE id < 'k00100'")
    app_conn.commit()
    sync = make_sync(pair)
    assert stored_position_or_none(spark, target) is not None
    assert snapshot.staging_tables(spark, target) == []
    catch_up(sync)
    assert assert_converged(spark, app_conn, name) == 200


def stored_position_or_none(spark, target: str):
    from jobs.cdc.position_commit import stored_position as stored

    return stored(spark, target)


def test_a_write_to_rows_already_read_is_not_lost(
    spark, app_conn, local_stack, secrets, make_sync, monkeypatch
) -> None:
    """After the first chunk is read, its rows are changed, one deleted and keys inserted into its
    range: no later read sees them, only the tail replaying from the snapshot's position can."""
    from jobs.cdc import snapshot
    from lakehouse.local.mariadb import APP_USER

    name = "cdc_test_snapshot_gap"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 100)
    real_read_chunk = snapshot.source_db.read_chunk
    writes: list[tuple] = []

    def write_behind_the_reads(conn, table, after, rows, upto=None):
        if after is not None and not writes:  # the second read: the first chunk is read
            writes.append(after)
            writer = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
            try:
                with writer.cursor() as cur:
                    cur.execute(f"UPDATE {name} SET qty = -1, note = 'behind' WHERE id < 'k00010'")
                    cur.execute(f"DELETE FROM {name} WHERE id = 'k00005'")
                    cur.execute(f"INSERT INTO {name} (id, name) VALUES ('k00000a', 'x'), ('k00001a', 'y')")
                writer.commit()
            finally:
                writer.close()
        return real_read_chunk(conn, table, after, rows, upto)

    monkeypatch.setattr(snapshot.source_db, "read_chunk", write_behind_the_reads)
    sync = make_sync(pair, chunk_rows=20, reads_in_process=True)
    monkeypatch.setattr(snapshot.source_db, "read_chunk", real_read_chunk)
    assert writes == [("k00019",)], "the writes behind the reads never ran"
    catch_up(sync)
    # 100 seeded - 1 deleted + 2 inserted: the count and the rows differ if the writes were lost.
    assert assert_converged(spark, app_conn, name) == 101
    lake = {r.id: r.qty for r in spark.table(f"lakehouse.dim_db.{name}").collect()}
    assert "k00005" not in lake and {"k00000a", "k00001a"} <= lake.keys()
    assert [lake[f"k{i:05d}"] for i in range(10) if i != 5] == [-1] * 9


def test_a_type_change_made_while_cdc_was_away_re_snapshots(spark, app_conn, make_sync) -> None:
    """MySQL cut the values (VARCHAR(64) -> VARCHAR(3), non-strict mode) while no CDC job ran; on
    restart the source's columns are read after the statement, so its replay cannot trust them."""
    name = "cdc_test_ddl_away"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 20)
    make_sync(pair).close()
    with app_conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute(f"ALTER TABLE {name} MODIFY name VARCHAR(3) NOT NULL")
    app_conn.commit()
    sync = make_sync(pair)
    catch_up(sync)
    assert not sync.errors
    assert assert_converged(spark, app_conn, name) == 20


def test_a_dropped_column_added_again_re_snapshots(spark, app_conn, make_sync) -> None:
    name = "cdc_test_ddl_readd"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 10)
    sync = make_sync(pair)
    with app_conn.cursor() as cur:
        cur.execute(f"UPDATE {name} SET note = 'old note'")
        cur.execute(f"ALTER TABLE {name} DROP COLUMN note")
        cur.execute(f"ALTER TABLE {name} ADD COLUMN note VARCHAR(20) DEFAULT NULL")
        cur.execute(f"UPDATE {name} SET note = 'new' WHERE id = 'k00001'")
    app_conn.commit()
    catch_up(sync)
    assert not sync.errors
    # Without the re-snapshot the nine rows not changed since would still read 'old note'.
    assert assert_converged(spark, app_conn, name) == 10


class _DropAfterSavepoint:
    """A binlog stream that loses its connection right after a SAVEPOINT inside a transaction."""

    dropped = 0

    def __init__(self, stream) -> None:
        self._stream = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def __iter__(self):
        from pymysqlreplication.event import QueryEvent

        for event in self._stream:
            yield event
            if (
                isinstance(event, QueryEvent)
                and event.query.strip().upper().startswith("SAVEPOINT")
                and not _DropAfterSavepoint.dropped
            ):
                _DropAfterSavepoint.dropped += 1
                raise pymysql.err.OperationalError(2013, "injected: lost connection mid-transaction")


def test_reconnect_inside_a_transaction_loses_nothing(spark, app_conn, make_sync, monkeypatch) -> None:
    from jobs.cdc.binlog_reader import BinlogReader

    name = "cdc_test_savepoint"
    pair = fresh_test_table(spark, app_conn, name)
    real_open = BinlogReader._open
    monkeypatch.setattr(BinlogReader, "_open", lambda self: _DropAfterSavepoint(real_open(self)))
    _DropAfterSavepoint.dropped = 0
    sync = make_sync(pair)
    with app_conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {name} (id, name) VALUES ('before-savepoint', 'a')")
        cur.execute("SAVEPOINT sp1")
        cur.execute(f"INSERT INTO {name} (id, name) VALUES ('after-savepoint', 'b')")
        cur.execute("ROLLBACK TO SAVEPOINT sp1")
        cur.execute(f"INSERT INTO {name} (id, name) VALUES ('after-rollback', 'c')")
        cur.execute("COMMIT")
    catch_up(sync)
    assert _DropAfterSavepoint.dropped == 1 and sync.reader.reconnects >= 1
    assert assert_converged(spark, app_conn, name) == 2


def test_restart_resumes_after_the_stored_position(spark, app_conn, make_sync) -> None:
    name = "cdc_test_resume"
    pair = fresh_test_table(spark, app_conn, name)
    sync = make_sync(pair)
    seed_rows(app_conn, name, 40)
    catch_up(sync)
    sync.close()
    stored = stored_position(spark, f"lakehouse.dim_db.{name}")
    assert stored.gtid, "the stored position carries the GTID of the last applied transaction"
    restarted = make_sync(pair)
    with app_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {name} (id, name) VALUES ('marker', 'm')")
    app_conn.commit()
    seen = []
    deadline = time.monotonic() + 60
    while not any(_has_key(tx, name, "marker") for tx in seen):
        assert time.monotonic() < deadline, "the restarted reader never queued the marker"
        try:
            seen.append(restarted.reader.items.get(timeout=0.5))
        except queue.Empty:
            pass
    # Nothing at or before the stored position was read again.
    assert [tx.end for tx in seen if tx.end.order <= stored.order] == []
    for tx in seen:
        restarted.reader.items.put(tx)
    catch_up(restarted)
    assert assert_converged(spark, app_conn, name) == 41


def _has_key(tx, name: str, key: str) -> bool:
    return any(change.key == (key,) for change in getattr(tx, "changes", {}).get(("user_db", name), []))


def test_stored_position_past_the_source_end_asks_for_resync(spark, app_conn, make_sync) -> None:
    from jobs.cdc.target_table import POSITION_KEY
    from jobs.common.snapshot_progress import writer_options

    name = "cdc_test_past_end"
    pair = fresh_test_table(spark, app_conn, name)
    first = make_sync(pair)
    end = end_of_binlog(first)
    first.close()
    table = f"lakehouse.dim_db.{name}"
    # As after a source crash that lost the binlog tail the lake had already applied.
    for ahead in (
        BinlogPosition(end.file, end.pos + 100_000, end.gtid),
        BinlogPosition(end.file[:-6] + "999999", 4, end.gtid),
    ):
        spark.table(table).writeTo(table).options(
            **writer_options({POSITION_KEY: ahead.to_json()})
        ).overwrite(F.lit(True))
        sync = make_sync(pair)
        assert len(sync.errors) == 1, ahead
        assert "past the end" in sync.errors[0] and f"--resync user_db.{name}" in sync.errors[0]
        sync.close()


# ---- binlog settings the reader cannot follow -------------------------------------------------------


@pytest.fixture
def admin_sql(local_stack):
    """SQL as MariaDB's superuser; every global it sets is put back afterwards."""
    restore: list[str] = []

    def run(statement: str, undo: str | None = None) -> str:
        if undo:
            restore.append(undo)
        return local_stack.mariadb.admin_sql(statement)

    yield run
    for statement in reversed(restore):
        local_stack.mariadb.admin_sql(statement)


def test_a_compressed_transaction_stops_the_sync_instead_of_vanishing(spark, app_conn, make_sync, admin_sql):
    """MariaDB's log_bin_compress (MySQL's binlog_transaction_compression) writes events the binlog
    reader cannot decode; skipping them would move the stored position past lost rows."""
    name = "cdc_test_compressed"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 3)
    sync = make_sync(pair)
    catch_up(sync)
    admin_sql("SET GLOBAL log_bin_compress=ON", undo="SET GLOBAL log_bin_compress=OFF")
    with app_conn.cursor() as cur:  # above log_bin_compress_min_len (256 bytes): compressed
        cur.execute(f"INSERT INTO {name} (id, name, note) VALUES ('big', 'b', %s)", ("x" * 2000,))
    app_conn.commit()
    admin_sql("SET GLOBAL log_bin_compress=OFF")
    seed_rows(app_conn, name, 1, prefix="after")
    deadline = time.monotonic() + 60
    while not sync.errors and time.monotonic() < deadline:
        sync.run_batch()
        time.sleep(0.2)
    assert len(sync.errors) == 1, "the compressed transaction was skipped without an error"
    error = sync.errors[0]
    assert "compress" in error and f"--resync user_db.{name}" in error and "\n" not in error
    # Nothing after the unreadable transaction was applied, and the stored position did not pass
    # it: a restarted sync (compression off by now) meets the same transaction and stops again.
    lake_ids = {r["id"] for r in spark.table(f"lakehouse.dim_db.{name}").collect()}
    assert lake_ids == {"k00000", "k00001", "k00002"}
    sync.close()
    again = make_sync(pair)
    deadline = time.monotonic() + 60
    while not again.errors and time.monotonic() < deadline:
        again.run_batch()
        time.sleep(0.2)
    assert again.errors and "compress" in again.errors[0]


@pytest.mark.parametrize(
    ("setting", "undo", "named"),
    [
        ("SET GLOBAL log_bin_compress=ON", "SET GLOBAL log_bin_compress=OFF", "log_bin_compress=ON"),
        (
            "SET GLOBAL binlog_row_image='MINIMAL'",
            "SET GLOBAL binlog_row_image='FULL'",
            "binlog_row_image=MINIMAL",
        ),
    ],
)
def test_cdc_refuses_to_start_on_binlog_settings_it_cannot_follow(
    local_stack, admin_sql, setting, undo, named
):
    admin_sql(setting, undo=undo)
    result = subprocess.run(
        [LAKEHOUSE_BIN, "run", "cdc", "--until-idle", "--server-id", "5299"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0] and "parameter group" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


# ---- type parity: a row loaded by snapshot equals the same row arriving through the binlog -------

# (column, MySQL type, two SQL literals, the two values the lake must hold for them). The expected
# values are written out by hand from MySQL's documented semantics, not computed by the mapping.
_F32 = struct.Struct("<f")


def _float32(x: float) -> float:
    return _F32.unpack(_F32.pack(x))[0]


TYPE_CASES = [
    ("c_tinyint", "TINYINT", "127", "-128", 127, -128),
    ("c_utinyint", "TINYINT UNSIGNED", "255", "0", 255, 0),
    ("c_smallint", "SMALLINT", "-32768", "32767", -32768, 32767),
    ("c_usmallint", "SMALLINT UNSIGNED", "65535", "0", 65535, 0),
    ("c_mediumint", "MEDIUMINT", "-8388608", "8388607", -8388608, 8388607),
    ("c_umediumint", "MEDIUMINT UNSIGNED", "16777215", "0", 16777215, 0),
    ("c_int", "INT", "-2147483648", "2147483647", -2147483648, 2147483647),
    ("c_uint", "INT UNSIGNED", "4294967295", "0", 4294967295, 0),
    ("c_bigint", "BIGINT", "-9223372036854775808", "9223372036854775807", -(2**63), 2**63 - 1),
    ("c_ubigint", "BIGINT UNSIGNED", "18446744073709551615", "0", Decimal(2**64 - 1), Decimal(0)),
    ("c_bool", "BOOL", "TRUE", "FALSE", 1, 0),
    ("c_decimal", "DECIMAL(10,4)", "-999999.9999", "0.0001", Decimal("-999999.9999"), Decimal("0.0001")),
    (
        "c_decimal38",
        "DECIMAL(38,10)",
        "9999999999999999999999999999.9999999999",
        "-0.0000000001",
        Decimal("9999999999999999999999999999.9999999999"),
        Decimal("-0.0000000001"),
    ),
    (  # wider than Iceberg's decimal(38): kept exactly as MySQL's own text
        "c_decimal65",
        "DECIMAL(65,30)",
        "99999999999999999999999999999999999.999999999999999999999999999999",
        "-0.000000000000000000000000000001",
        "99999999999999999999999999999999999.999999999999999999999999999999",
        "-0.000000000000000000000000000001",
    ),
    ("c_float", "FLOAT", "123456.789", "-0.1", _float32(123456.789), _float32(-0.1)),
    (
        "c_double",
        "DOUBLE",
        "1.7976931348623157E308",
        "0.30000000000000004E0",
        1.7976931348623157e308,
        0.30000000000000004,
    ),
    ("c_bit1", "BIT(1)", "b'1'", "b'0'", b"\x01", b"\x00"),
    ("c_bit10", "BIT(10)", "b'1000000001'", "b'0'", b"\x02\x01", b"\x00\x00"),
    ("c_bit64", "BIT(64)", "b'" + "1" * 64 + "'", "b'1'", b"\xff" * 8, b"\x00" * 7 + b"\x01"),
    ("c_char", "CHAR(4)", "'ab  '", "''", "ab", ""),  # CHAR drops trailing spaces on read
    (
        "c_varchar",
        "VARCHAR(32)",
        "'tail  '",
        "'\U0001f600 \u00fc\u4e2d'",
        "tail  ",
        "\U0001f600 \u00fc\u4e2d",
    ),
    ("c_text", "TEXT", "'line\\nbreak \"q\" \u2603'", "''", 'line\nbreak "q" \u2603', ""),
    ("c_longtext", "LONGTEXT", "REPEAT('\u00e9', 70000)", "'x'", "\u00e9" * 70000, "x"),
    ("c_enum", "ENUM('b','a','c')", "'c'", "'b'", "c", "b"),
    ("c_set", "SET('b','a','c')", "'a,c,b'", "''", "b,a,c", ""),  # definition order; empty is not NULL
    (
        "c_json",
        "JSON",
        """'{"k": "\u00fc\U0001f600", "n": [1, 2.5, null, true]}'""",
        "'[]'",
        '{"k": "\u00fc\U0001f600", "n": [1, 2.5, null, true]}',
        "[]",
    ),
    ("c_date", "DATE", "'9999-12-31'", "'0000-00-00'", dt.date(9999, 12, 31), None),
    ("c_date_old", "DATE", "'1000-01-01'", "'1582-10-04'", dt.date(1000, 1, 1), dt.date(1582, 10, 4)),
    ("c_date_year0", "DATE", "'0000-01-01'", "'0999-12-31'", None, dt.date(999, 12, 31)),  # year 0: no day
    (
        "c_datetime",
        "DATETIME(6)",
        "'9999-12-31 23:59:59.999999'",
        "'0000-00-00 00:00:00'",
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        None,
    ),
    (
        "c_datetime0",
        "DATETIME",
        "'1000-01-01 00:00:00'",
        "'2024-02-29 12:00:01'",
        dt.datetime(1000, 1, 1),
        dt.datetime(2024, 2, 29, 12, 0, 1),
    ),
    (  # the zero TIMESTAMP is no instant: NULL, not 1970-01-01
        "c_ts",
        "TIMESTAMP(3) NULL DEFAULT NULL",
        "'2038-01-19 03:14:07.999'",
        "'0000-00-00 00:00:00'",
        dt.datetime(2038, 1, 19, 3, 14, 7, 999000),
        None,
    ),
    (
        "c_ts_min",
        "TIMESTAMP(6) NULL DEFAULT NULL",
        "'1970-01-01 00:00:01.000001'",
        "'2000-01-01 00:00:00'",
        dt.datetime(1970, 1, 1, 0, 0, 1, 1),
        dt.datetime(2000, 1, 1),
    ),
    ("c_time", "TIME(3)", "'838:59:59.000'", "'-00:00:01.250'", "838:59:59.000", "-00:00:01.250"),
    ("c_time6", "TIME(6)", "'-00:00:01.123456'", "'-00:00:00.25'", "-00:00:01.123456", "-00:00:00.250000"),
    ("c_time0", "TIME", "'-838:59:59'", "'00:00:00'", "-838:59:59", "00:00:00"),
    ("c_year", "YEAR", "2155", "0", 2155, 0),
    ("c_year_min", "YEAR", "1901", "2000", 1901, 2000),
    ("c_binary", "BINARY(4)", "x'0100'", "x''", b"\x01\x00\x00\x00", b"\x00" * 4),  # padded, as stored
    ("c_varbinary", "VARBINARY(8)", "x'00ff00'", "x''", b"\x00\xff\x00", b""),
    ("c_tinyblob", "TINYBLOB", "x'ff'", "x''", b"\xff", b""),
    ("c_blob", "BLOB", "x'deadbeef00'", "x'00'", b"\xde\xad\xbe\xef\x00", b"\x00"),
    ("c_mediumblob", "MEDIUMBLOB", "REPEAT(x'fe', 70000)", "x''", b"\xfe" * 70000, b""),
    ("c_longblob", "LONGBLOB", "x'80'", "x''", b"\x80", b""),
]


def test_snapshot_and_binlog_store_every_type_alike_and_as_the_source_holds_it(
    spark, app_conn, make_sync
) -> None:
    name = "cdc_test_types"
    columns = ", ".join(f"`{c}` {kind}" for c, kind, *_ in TYPE_CASES)
    with app_conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {name}")
        cur.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, {columns}) DEFAULT CHARSET=utf8mb4")
    spark.sql(f"DROP TABLE IF EXISTS lakehouse.dim_db.{name}")
    names = ", ".join(f"`{c}`" for c, *_ in TYPE_CASES)

    def insert(first_id: int) -> None:
        """Three rows: the first literals, the second literals, and all NULL."""
        with app_conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")  # zero dates are what some sources hold
            for offset, pick in ((0, 2), (1, 3)):
                values = ", ".join(case[pick] for case in TYPE_CASES)
                cur.execute(f"INSERT INTO {name} (id, {names}) VALUES ({first_id + offset}, {values})")
                cur.execute("SHOW WARNINGS")
                assert not cur.fetchall(), f"row {first_id + offset} did not go in as written"
            cur.execute(f"INSERT INTO {name} (id) VALUES ({first_id + 2})")
        app_conn.commit()

    insert(1)  # loaded by the snapshot
    sync = make_sync(f"user_db.{name}=dim_db.{name}")
    insert(101)  # arrives through the binlog
    assert catch_up(sync) == 3
    assert not sync.errors

    rows = spark.table(f"lakehouse.dim_db.{name}").collect()
    # each row once (a dict by id below would hide a duplicate)
    assert Counter(row["id"] for row in rows) == Counter([1, 2, 3, 101, 102, 103])
    lake = {
        row["id"]: {k: bytes(v) if isinstance(v, bytearray) else v for k, v in row.asDict().items()}
        for row in rows
    }
    differences = []
    for column, kind, _, _, first, second in TYPE_CASES:
        for row_id, expected in ((1, first), (2, second), (3, None)):
            snapshot_value, binlog_value = lake[row_id][column], lake[row_id + 100][column]
            if not (snapshot_value == binlog_value == expected and type(snapshot_value) is type(expected)):
                shown = [repr(v)[:60] for v in (expected, snapshot_value, binlog_value)]
                differences.append(
                    f"{column} {kind} row {row_id}: source {shown[0]}, snapshot {shown[1]}, binlog {shown[2]}"
                )
    assert not differences, "\n".join(differences)


def test_an_event_the_reader_cannot_decode_stops_the_sync_instead_of_retrying_forever(
    spark, app_conn, make_sync, monkeypatch
) -> None:
    from jobs.cdc import binlog_reader

    name = "cdc_test_undecodable"
    pair = fresh_test_table(spark, app_conn, name)
    decode = binlog_reader.selected_row

    def failing_decode(row: dict, columns: list) -> dict:
        if row.get("values", {}).get("note") == "poison":
            raise ValueError("injected: cannot decode this row")
        return decode(row, columns)

    monkeypatch.setattr(binlog_reader, "selected_row", failing_decode)
    sync = make_sync(pair)
    with app_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {name} (id, name) VALUES ('fine', 'a')")
    app_conn.commit()
    catch_up(sync)
    with app_conn.cursor() as cur:
        cur.execute(f"INSERT INTO {name} (id, name, note) VALUES ('bad', 'b', 'poison')")
    app_conn.commit()
    deadline = time.monotonic() + 60
    while not sync.errors and time.monotonic() < deadline:
        sync.run_batch()
        time.sleep(0.1)
    assert len(sync.errors) == 1, "an undecodable event must stop the sync, not be retried forever"
    assert "failed 3 times in a row" in sync.errors[0] and "injected" in sync.errors[0]
    assert sync.reader.reconnects == 2
    # Nothing skipped: the stored position is before the event, the earlier row is in the lake.
    lake = [r.id for r in spark.table(f"lakehouse.dim_db.{name}").collect()]
    assert lake == ["fine"]


def test_mariadb_s_position_and_gtid_set_are_one_point_of_the_binlog(app_conn, local_stack, secrets) -> None:
    """The file position and the GTID set were read in two statements: a transaction committed
    between them was inside the GTID set and after the position, and a restart resuming by GTID
    skipped it. The race is made to happen: the write commits right after SHOW MASTER STATUS."""
    from lakehouse.local.mariadb import CDC_USER

    name = "cdc_test_position_race"
    recreate_source(app_conn, name)
    cdc = local_stack.mariadb.connect(CDC_USER, secrets["mysql_cdc_password"])
    original = cdc.cursor

    class RacingCursor(pymysql.cursors.Cursor):
        def execute(self, query, args=None):
            result = super().execute(query, args)
            if "MASTER STATUS" in query.upper() or "BINARY LOG STATUS" in query.upper():
                with app_conn.cursor() as cur:  # another client commits in between
                    cur.execute(f"INSERT INTO {name} (id, name) VALUES ('raced', 'in between')")
                app_conn.commit()
            return result

    try:
        cdc.cursor = lambda *a: original(RacingCursor)
        file, position, gtid = source_db.master_position(cdc)
        cdc.cursor = original
        with cdc.cursor() as cur:
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s), @@gtid_binlog_pos", (file, position))
            at_position, now = cur.fetchone()
        assert now != at_position  # the racing transaction committed after the position was read
        assert gtid == at_position  # and the GTID set returned is the position's own
    finally:
        cdc.close()


FK_TABLES = {  # parent first; every referential action InnoDB applies without row events
    "fk_parent": "id INT PRIMARY KEY, name VARCHAR(20)",
    "fk_child": "id INT PRIMARY KEY, parent_id INT, note VARCHAR(20), "
    "FOREIGN KEY (parent_id) REFERENCES fk_parent(id) ON DELETE CASCADE ON UPDATE CASCADE",
    "fk_orphan": "id INT PRIMARY KEY, parent_id INT, "
    "FOREIGN KEY (parent_id) REFERENCES fk_parent(id) ON DELETE SET NULL ON UPDATE SET NULL",
    "fk_grandchild": "id INT PRIMARY KEY, child_id INT, "
    "FOREIGN KEY (child_id) REFERENCES fk_child(id) ON DELETE CASCADE",
    "fk_staff": "id INT PRIMARY KEY, manager_id INT, "
    "FOREIGN KEY (manager_id) REFERENCES fk_staff(id) ON DELETE CASCADE",
}


FK_LATE_CHILD = "fk_late"  # a cascading child some tests create while the job runs


def fk_schema(conn, spark) -> None:
    with conn.cursor() as cur:
        for name in [FK_LATE_CHILD, *reversed(FK_TABLES)]:
            cur.execute(f"DROP TABLE IF EXISTS {name}")
        for name, columns in FK_TABLES.items():
            cur.execute(f"CREATE TABLE {name} ({columns}) ENGINE=InnoDB")
        cur.executemany("INSERT INTO fk_parent VALUES (%s, %s)", [(p, f"p{p}") for p in range(1, 7)])
        cur.executemany("INSERT INTO fk_child VALUES (%s, %s, 'c')", [(c, c % 6 + 1) for c in range(1, 25)])
        cur.executemany("INSERT INTO fk_orphan VALUES (%s, %s)", [(o, o % 6 + 1) for o in range(1, 13)])
        cur.executemany("INSERT INTO fk_grandchild VALUES (%s, %s)", [(g, g % 24 + 1) for g in range(1, 49)])
        cur.execute("INSERT INTO fk_staff VALUES (1, NULL)")
        cur.executemany("INSERT INTO fk_staff VALUES (%s, %s)", [(s, s // 2) for s in range(2, 32)])
    conn.commit()
    for name in [*FK_TABLES, FK_LATE_CHILD]:
        spark.sql(f"DROP TABLE IF EXISTS lakehouse.dim_db.{name}")


def fk_columns(conn, name: str) -> list[str]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {name} LIMIT 0")
        return [d[0] for d in cur.description]


def test_foreign_key_cascades_reach_the_lake(spark, app_conn, make_sync) -> None:
    """InnoDB writes no row events for what ON DELETE/UPDATE CASCADE and SET NULL do to child rows
    (MySQL bug #32506): the lake kept every cascaded child row. Each table must equal its source as a
    multiset after deletes, key updates, a chain of cascades and a table referencing itself."""
    fk_schema(app_conn, spark)
    sync = make_sync(include=("user_db.fk_*",))
    # the schema's other tables (the fuzzer's) have keys too: only these four are this test's
    assert sync.errors == [] and len([k for k in sync.foreign_keys if k.child[1].startswith("fk_")]) == 4
    with app_conn.cursor() as cur:
        cur.execute("DELETE FROM fk_parent WHERE id = 2")  # cascades to children and grandchildren
        cur.execute("UPDATE fk_parent SET id = 60 WHERE id = 3")  # ON UPDATE CASCADE / SET NULL
        cur.execute("DELETE FROM fk_staff WHERE id = 2")  # a subtree of a self-referencing table
        cur.execute("INSERT INTO fk_parent VALUES (2, 'back')")  # the key comes back: no old children
        cur.execute("INSERT INTO fk_child VALUES (100, 2, 'new')")
    app_conn.commit()
    catch_up(sync)
    with app_conn.cursor() as cur:
        cur.execute("DELETE FROM fk_parent WHERE id IN (1, 60)")  # a second batch, on the moved key
    app_conn.commit()
    catch_up(sync)
    assert sync.errors == []
    for name in FK_TABLES:
        columns = fk_columns(app_conn, name)
        expected = mysql_rows(app_conn, f"user_db.{name}", columns)
        assert iceberg_rows(spark, f"lakehouse.dim_db.{name}", columns) == expected, name
    with app_conn.cursor() as cur:  # the workload did cascade: the sources lost child rows
        cur.execute("SELECT (SELECT count(*) FROM fk_child), (SELECT count(*) FROM fk_staff)")
        assert cur.fetchone() < (24, 30)


def test_a_cascading_child_dropped_before_its_cascade_was_read_is_kept_as_of_its_position(
    spark, app_conn, make_sync
) -> None:
    """A parent's delete, then DROP TABLE of its cascading child, both not applied yet: reading the
    child's rows the delete cascaded to failed on the missing table and the whole job with it (found
    by review of the CDC fuzzer's new rules). Dropped while the job was stopped, the child's keys are
    gone from the source too: it is kept as of its position, never claimed to be as of its DROP."""
    from jobs.cdc.target_table import CASCADED_FROM_PROPERTY, source_dropped

    tables = {"fkd_parent": "id INT PRIMARY KEY, name VARCHAR(20)"} | {
        child: "id INT PRIMARY KEY, parent_id INT, FOREIGN KEY (parent_id) REFERENCES fkd_parent(id) "
        "ON DELETE CASCADE"
        for child in ("fkd_running", "fkd_stopped", "fkd_later", "fkd_last")
    }
    with app_conn.cursor() as cur:
        for name in [*reversed(tables), "fkd_parent2"]:
            cur.execute(f"DROP TABLE IF EXISTS {name}")
            spark.sql(f"DROP TABLE IF EXISTS lakehouse.dim_db.{name}")
        for name, columns in tables.items():
            cur.execute(f"CREATE TABLE {name} ({columns}) ENGINE=InnoDB")
        cur.executemany("INSERT INTO fkd_parent VALUES (%s, 'p')", [(p,) for p in range(1, 5)])
        for child in ("fkd_running", "fkd_stopped", "fkd_later", "fkd_last"):
            cur.executemany(f"INSERT INTO {child} VALUES (%s, %s)", [(c, c % 4 + 1) for c in range(1, 13)])
    app_conn.commit()
    sync = make_sync(include=("user_db.fkd_*",))
    catch_up(sync)
    lake = {name: f"lakehouse.dim_db.{name}" for name in tables}
    properties = dict(spark.sql(f"SHOW TBLPROPERTIES {lake['fkd_stopped']}").collect())
    assert properties[CASCADED_FROM_PROPERTY] == "user_db.fkd_parent"

    def kept_as_of_its_position(child: str, *statements: str) -> None:
        """`statements` run while the job runs, none applied yet: `child` keeps its rows, marked."""
        kept = iceberg_rows(spark, lake[child], ["id", "parent_id"])
        with app_conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
        app_conn.commit()
        catch_up(sync)
        assert sync.errors == []
        assert "cascaded to could be read" in source_dropped(spark, lake[child])
        assert iceberg_rows(spark, lake[child], ["id", "parent_id"]) == kept  # as of its position

    kept_as_of_its_position("fkd_running", "DELETE FROM fkd_parent WHERE id = 1", "DROP TABLE fkd_running")
    # Any DDL read before the parent's change makes the job read the foreign keys again, from a
    # source the child is gone from: its key left the list, the delete did not cascade to it, and
    # its DROP marked it as of the DROP, claiming rows it does not hold (found by the CDC fuzzer).
    kept_as_of_its_position(
        "fkd_later",
        "ALTER TABLE fkd_parent ADD COLUMN note INT",
        "DELETE FROM fkd_parent WHERE id = 3",
        "DROP TABLE fkd_later",
    )
    sync.close()

    stopped = iceberg_rows(spark, lake["fkd_stopped"], ["id", "parent_id"])
    with app_conn.cursor() as cur:  # while the job is stopped
        cur.execute("DELETE FROM fkd_parent WHERE id = 2")
        cur.execute("DROP TABLE fkd_stopped")
    app_conn.commit()
    sync = make_sync(include=("user_db.fkd_*",))
    catch_up(sync)
    assert sync.errors == []
    assert source_dropped(spark, lake["fkd_stopped"]).endswith("(while the job was stopped)")
    assert iceberg_rows(spark, lake["fkd_stopped"], ["id", "parent_id"]) == stopped
    assert_converged(spark, app_conn, "fkd_parent", ["id", "name"])
    # The parent renamed away, then the child dropped: the kept key points at a parent no longer
    # followed (the child was stopped with a resync it cannot take).
    kept_as_of_its_position("fkd_last", "RENAME TABLE fkd_parent TO fkd_parent2", "DROP TABLE fkd_last")


def test_a_child_whose_cascading_parent_is_not_synced_stops_with_the_reason(
    spark, app_conn, make_sync
) -> None:
    fk_schema(app_conn, spark)
    sync = make_sync(include=("user_db.fk_*",), exclude=("user_db.fk_parent",))
    errors = {e.split(":", 1)[0] for e in sync.errors}
    assert errors == {
        "lakehouse.dim_db.fk_child",
        "lakehouse.dim_db.fk_orphan",
        "lakehouse.dim_db.fk_grandchild",
    }
    assert sum("user_db.fk_parent too, or --exclude" in e for e in sync.errors) == 2
    assert any("user_db.fk_child too, or --exclude user_db.fk_grandchild" in e for e in sync.errors)
    assert not sync.tables[("user_db", "fk_staff")].error  # its cascade is its own: followed
    # A parent the selection takes but cannot sync (here its target is another table's): a resync of
    # both cannot work, and the children's line must not send the user there (found by review).
    clash = make_sync("user_db.fk_staff=dim_db.fk_parent", include=("user_db.fk_*",))
    assert "already syncs to lakehouse.dim_db.fk_parent" in clash.tables[("user_db", "fk_parent")].error
    children = [
        e for e in clash.errors if e.startswith(("lakehouse.dim_db.fk_child", "lakehouse.dim_db.fk_orphan"))
    ]
    assert len(children) == 2 and all("the parent cannot be synced" in e for e in children), children
    assert not any("--resync" in e for e in children), children


def test_a_child_whose_parent_is_made_again_names_the_resync_of_both(spark, app_conn, make_sync) -> None:
    """The parent dropped and made again stops until --resync; its cascading child then stopped with
    "sync the parent too, or --exclude" (found by the CDC fuzzer: the parent is synced, and a resync
    of the child alone stops again): the line names the resync of both."""
    fk_schema(app_conn, spark)
    sync = make_sync(include=("user_db.fk_*",))
    with app_conn.cursor() as cur:
        cur.execute("SET FOREIGN_KEY_CHECKS = 0")
        cur.execute("DROP TABLE fk_parent")
        cur.execute(f"CREATE TABLE fk_parent ({FK_TABLES['fk_parent']}) ENGINE=InnoDB")
        cur.execute("SET FOREIGN_KEY_CHECKS = 1")
    app_conn.commit()
    catch_up(sync)
    child = sync.tables[("user_db", "fk_child")].error
    assert "was created again" in sync.tables[("user_db", "fk_parent")].error
    assert "`lakehouse run cdc --resync user_db.fk_parent --resync user_db.fk_child`" in child, child
    grandchild = sync.tables[("user_db", "fk_grandchild")].error  # its parent's stop is the key's
    assert "sync user_db.fk_child too, or --exclude user_db.fk_grandchild" in grandchild, grandchild


def test_a_column_added_as_the_snapshot_starts_is_in_the_lake(
    spark, app_conn, make_sync, monkeypatch
) -> None:
    """An ADD COLUMN committed between the snapshot's description and its position B was before B
    (never replayed) and not described (never read): the lake never got the column."""
    name = "cdc_test_describe_race"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 30)
    real = source_db.estimated_rows
    altered = []

    def migration_lands_now(conn, table):  # called between the description and position B
        if not altered:
            with app_conn.cursor() as cur:
                cur.execute(f"ALTER TABLE {name} ADD COLUMN stock INT")
                cur.execute(f"UPDATE {name} SET stock = qty * 2")
            app_conn.commit()
            altered.append(True)
        return real(conn, table)

    monkeypatch.setattr(source_db, "estimated_rows", migration_lands_now)
    sync = make_sync(pair, reads_in_process=True)
    assert altered and sync.errors == []
    with app_conn.cursor() as cur:
        cur.execute(f"UPDATE {name} SET stock = stock + 1 WHERE id < 'k00005'")
    app_conn.commit()
    catch_up(sync)
    assert assert_converged(spark, app_conn, name, [*COLUMNS, "stock"]) == 30


def test_maintenance_expires_a_cdc_table_s_merge_snapshots(spark, app_conn, make_sync, lake_config) -> None:
    """A CDC table made from its snapshot's staging table kept the staging commits' progress key in
    its history; expiry protected the newest of them and so kept every later MERGE snapshot for good
    (the history of a busy dimension grew without bound)."""
    from jobs.maintain.job import MaintainSettings, maintain_table

    name = "cdc_test_expiry"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 20)
    sync = make_sync(pair)
    merges = 12
    for round_ in range(merges):
        with app_conn.cursor() as cur:
            cur.execute(f"UPDATE {name} SET qty = qty + 1 WHERE id = 'k{round_ % 20:05d}'")
        app_conn.commit()
        catch_up(sync)
    table = f"lakehouse.dim_db.{name}"
    position = stored_position(spark, table)
    before = snapshot_count(spark, table)
    assert before >= merges + 1  # the staging commits, then a MERGE each
    report = maintain_table(
        spark,
        lake_config,
        f"dim_db.{name}",
        MaintainSettings(retain_hours=0, retain_last=1, expire_in_driver=True),
    )
    assert report.error is None, report.error
    after = snapshot_count(spark, table)
    assert after <= 2, (before, after)  # the current one (and a compaction's), not every MERGE
    assert stored_position(spark, table) == position  # resume is unchanged
    assert assert_converged(spark, app_conn, name) == 20


def test_two_sources_onto_one_target_stop_the_second_and_views_are_never_synced(
    spark, local_stack, secrets, make_sync
) -> None:
    """Two schemas' tables of one name land on one target under a pattern: the second gets an error of
    its own (the first goes on), at start and when created while the job runs. A view, even one the
    pattern matches, is not a table to sync."""
    from lakehouse.local.mariadb import APP_USER

    schemas = ("cdc_twin_a", "cdc_twin_b", "cdc_twin_c")
    for schema in schemas:
        fresh_source_database(local_stack, schema)
    spark.sql("DROP TABLE IF EXISTS lakehouse.dim_db.twin")
    conns = {
        s: local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"], database=s) for s in schemas
    }
    try:
        for schema in schemas[:2]:
            recreate_source(conns[schema], "twin")
            seed_rows(conns[schema], "twin", 3, prefix=schema[-1])
        with conns["cdc_twin_a"].cursor() as cur:
            cur.execute("CREATE VIEW twin_view AS SELECT id, qty FROM twin")
        sync = make_sync(include=("cdc_twin_*.twin*",))
        assert set(sync.tables) == {("cdc_twin_a", "twin"), ("cdc_twin_b", "twin")}  # not the view
        (error,) = sync.errors
        assert (
            "cdc_twin_a.twin already syncs to lakehouse.dim_db.twin" in error and "cdc_twin_b.twin" in error
        )
        recreate_source(conns["cdc_twin_c"], "twin")  # a third, while the job runs
        with conns["cdc_twin_c"].cursor() as cur:
            cur.execute("CREATE VIEW twin_view2 AS SELECT id FROM twin")
        conns["cdc_twin_c"].commit()
        catch_up(sync)
        assert len(sync.errors) == 2 and any(
            "cdc_twin_c.twin" in e and "already syncs" in e for e in sync.errors
        )
        assert ("cdc_twin_c", "twin_view2") not in sync.tables
        assert iceberg_rows(spark, "lakehouse.dim_db.twin", COLUMNS) == mysql_rows(
            conns["cdc_twin_a"], "cdc_twin_a.twin", COLUMNS
        )
    finally:
        for schema, conn in conns.items():
            conn.close()
            local_stack.mariadb.admin_sql(f"DROP DATABASE IF EXISTS {schema}")


def test_cascades_into_keys_that_hold_the_foreign_key_binary_keys_and_after_a_crash(
    spark, app_conn, make_sync, monkeypatch
) -> None:
    """Three ways the first cascade emulation lost rows: a child whose primary key holds the foreign
    key (ON UPDATE CASCADE re-keys it: read by the old key, it was deleted and never re-inserted); a
    binary key (the lake's bytearray and the source's bytes never matched: every child was deleted);
    and a crash after the parent's commit (the cascade ran after it and was never found again)."""
    from jobs.cdc import apply_changes as apply_module

    tables = {
        "fkc_order": "id INT PRIMARY KEY, note VARCHAR(10)",
        "fkc_line": "order_id INT, line INT, qty INT, PRIMARY KEY (order_id, line), "
        "FOREIGN KEY (order_id) REFERENCES fkc_order(id) ON DELETE CASCADE ON UPDATE CASCADE",
        "fkc_tag": "tag VARBINARY(8) PRIMARY KEY, order_id INT, "
        "FOREIGN KEY (order_id) REFERENCES fkc_order(id) ON DELETE CASCADE ON UPDATE CASCADE",
    }
    with app_conn.cursor() as cur:
        for name in reversed(tables):
            cur.execute(f"DROP TABLE IF EXISTS {name}")
        for name, columns in tables.items():
            cur.execute(f"CREATE TABLE {name} ({columns}) ENGINE=InnoDB")
        cur.executemany("INSERT INTO fkc_order VALUES (%s, 'o')", [(i,) for i in range(1, 6)])
        cur.executemany(
            "INSERT INTO fkc_line VALUES (%s, %s, 1)", [(o, n) for o in range(1, 6) for n in (1, 2)]
        )
        cur.executemany("INSERT INTO fkc_tag VALUES (%s, %s)", [(bytes([i, 255]), i) for i in range(1, 6)])
    app_conn.commit()
    for name in tables:
        spark.sql(f"DROP TABLE IF EXISTS lakehouse.dim_db.{name}")

    def assert_all_equal() -> None:
        queries = {  # the same text from both sides (binary as hex)
            "fkc_order": ("CAST(id AS CHAR), note", "CAST(id AS STRING), note"),
            "fkc_line": ("CAST(order_id AS CHAR), CAST(line AS CHAR), CAST(qty AS CHAR)",
                         "CAST(order_id AS STRING), CAST(line AS STRING), CAST(qty AS STRING)"),
            "fkc_tag": ("LOWER(HEX(tag)), CAST(order_id AS CHAR)", "hex(tag), CAST(order_id AS STRING)"),
        }  # fmt: skip
        for name, (source_sql, lake_sql) in queries.items():
            with app_conn.cursor() as cur:
                cur.execute(f"SELECT {source_sql} FROM {name}")
                expected = Counter(tuple(r) for r in cur.fetchall())
            app_conn.commit()
            lake = spark.sql(f"SELECT {lake_sql} FROM lakehouse.dim_db.{name}").collect()
            actual = Counter(tuple(v.lower() if isinstance(v, str) and name == "fkc_tag" else v for v in r)
                             for r in lake)  # fmt: skip
            assert actual == expected, name

    sync = make_sync(include=("user_db.fkc_*",))
    assert sync.errors == []
    with app_conn.cursor() as cur:
        cur.execute("UPDATE fkc_order SET id = 50 WHERE id = 1")  # re-keys fkc_line (1, n) -> (50, n)
        cur.execute("DELETE FROM fkc_order WHERE id = 2")  # cascades to lines and a binary-keyed tag
    app_conn.commit()
    catch_up(sync)
    assert_all_equal()

    # The job dies after the parent's commit, before the child's: the restart must still cascade.
    real = apply_module.apply_changes
    committed: list[str] = []

    def dies_before_the_children(spark_, target, *args, **kwargs):
        if "lakehouse.dim_db.fkc_order" in committed and "fkc_order" not in target:
            raise RuntimeError("killed between two tables' commits")
        result = real(spark_, target, *args, **kwargs)
        committed.append(target)
        return result

    monkeypatch.setattr(apply_module, "apply_changes", dies_before_the_children)
    with app_conn.cursor() as cur:
        cur.execute("DELETE FROM fkc_order WHERE id = 3")
    app_conn.commit()
    with pytest.raises(RuntimeError, match="killed between"):
        catch_up(sync)
    assert "lakehouse.dim_db.fkc_order" in committed and "lakehouse.dim_db.fkc_tag" not in committed
    sync.close()
    monkeypatch.setattr(apply_module, "apply_changes", real)
    catch_up(make_sync(include=("user_db.fkc_*",)))
    assert_all_equal()
