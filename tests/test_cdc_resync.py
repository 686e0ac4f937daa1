"""Re-snapshot beside the stream (jobs/cdc/resync.py): the other tables' batches go on while one
table's copy is built, verified against the source and swapped in; compared with the source as
multisets, under writes, with a DDL in the middle, a copy that does not verify, and a kill -9."""

# ruff: noqa: F811 - the CDC fixtures (app_conn, make_sync, secrets) are imported from test_cdc_sync

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import threading
import time

from support import LAKEHOUSE_BIN
from test_cdc_sync import (  # noqa: F401 - fixtures among them
    COLUMNS,
    FK_LATE_CHILD,
    FK_TABLES,
    app_conn,
    assert_converged,
    catch_up,
    fk_columns,
    fk_schema,
    fresh_test_table,
    iceberg_rows,
    make_sync,
    mysql_rows,
    record_chunk_starts,
    recreate_source,
    secrets,
    seed_rows,
)

from jobs.cdc import snapshot
from jobs.cdc.position_commit import stored_position
from jobs.common.lake_tables import load_iceberg_table

ROWS = 20_000


def churning(local_stack, secrets, table: str, other: str):
    """A writer changing `table` (updates, inserts, deletes of the last 100 keys only: its row count
    stays at least ROWS - 100) and inserting into `other`, until the returned event is set."""
    from lakehouse.local.mariadb import APP_USER

    stop = threading.Event()

    def churn() -> None:
        conn = local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"])
        rng = random.Random(7)
        try:
            n = 0
            while not stop.is_set():
                with conn.cursor() as cur:
                    for _ in range(10):
                        cur.execute(f"UPDATE {table} SET qty = %s, note = %s WHERE id = %s",
                                    (n, f"u{n}", f"k{rng.randrange(ROWS):05d}"))  # fmt: skip
                    cur.execute(f"INSERT INTO {table} (id, name, qty, price) VALUES (%s, 'new', %s, 2)",
                                (f"n{n:06d}", n))  # fmt: skip
                    cur.execute(
                        f"DELETE FROM {table} WHERE id = %s", (f"k{ROWS - 1 - rng.randrange(100):05d}",)
                    )
                    cur.execute(f"INSERT INTO {other} (id, name, qty, price) VALUES (%s, 'w', %s, 1)",
                                (f"w{n:06d}", n))  # fmt: skip
                conn.commit()
                n += 1
                time.sleep(0.05)
        finally:
            conn.close()

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    return stop, thread


def run_until_swapped(sync, timeout: float = 240.0, each=lambda: None) -> None:
    deadline = time.monotonic() + timeout
    while sync.resyncing:
        sync.run_batch()
        each()
        assert time.monotonic() < deadline, "the resync did not finish"
        time.sleep(0.05)


def test_a_resync_runs_beside_the_stream_and_swaps_in_a_verified_copy(
    spark, app_conn, local_stack, secrets, make_sync, caplog
) -> None:
    """`--resync` of a damaged table: the other table's changes keep landing while the copy is built
    and verified; readers never see a half-built table; the table keeps its identity and history;
    it ends equal to the source, with every write made during the resync."""
    big, other = "cdc_test_resync_big", "cdc_test_resync_other"
    pairs = (fresh_test_table(spark, app_conn, big), fresh_test_table(spark, app_conn, other))
    seed_rows(app_conn, big, ROWS)
    seed_rows(app_conn, other, 5)
    first = make_sync(*pairs)
    catch_up(first)
    first.close()
    lake, lake_other = f"lakehouse.dim_db.{big}", f"lakehouse.dim_db.{other}"
    # Damage behind CDC's back, as a resync repairs: two rows gone, one row wrong.
    spark.sql(f"DELETE FROM {lake} WHERE id IN ('k00001', 'k00002')")
    spark.sql(f"UPDATE {lake} SET qty = -1 WHERE id = 'k00003'")
    identity = load_iceberg_table(spark, lake).uuid().toString()
    history = spark.sql(f"SELECT snapshot_id FROM {lake}.snapshots").count()

    caplog.set_level(logging.INFO, logger="cdc_sync")
    sync = make_sync(*pairs, resync=(f"user_db.{big}",), chunk_rows=1_000, commit_rows=2_000)
    commits: list[tuple[str, bool]] = []  # (table, whether a resync was under way)
    sync.on_commit = lambda target, latest, at: commits.append((target, sync.resyncing))
    counts: list[int] = []
    stop, writer = churning(local_stack, secrets, big, other)
    try:
        run_until_swapped(sync, each=lambda: counts.append(spark.table(lake).count()))
    finally:
        stop.set()
        writer.join()
    catch_up(sync)

    assert sync.errors == []
    assert_converged(spark, app_conn, big)
    assert_converged(spark, app_conn, other)
    # The other table went on: its inserts were committed while the copy was being built.
    during = [t for t, resyncing in commits if t == lake_other and resyncing]
    assert len(during) >= 2, commits
    # Readers saw the old rows (ROWS, less the 2 lost and at most 100 deleted) until the swap.
    assert counts and min(counts) >= ROWS - 102, counts[:20]
    assert load_iceberg_table(spark, lake).uuid().toString() == identity
    assert spark.sql(f"SELECT snapshot_id FROM {lake}.snapshots").count() > history
    assert snapshot.staging_tables(spark, lake) == []
    swapped = [r.getMessage() for r in caplog.records if "re-snapshotted beside the stream" in r.getMessage()]
    assert len(swapped) == 1 and "verified against the source" in swapped[0], swapped


def test_a_resync_requested_of_the_running_job_is_copied_beside_the_stream_and_answered(
    spark, app_conn, make_sync, lake_config
) -> None:
    """`lakehouse run cdc --request-resync` while CDC runs: no restart; the damaged table is copied
    beside the stream and swapped in, with the writes made meanwhile; the swap answers the request
    (a job that exits right after it, as `--until-idle` does, must not copy it again at its next
    start). One made while the job is stopped is taken at its start. A table that is not in the
    lake, or not synced by CDC, is refused."""
    from jobs.cdc.__main__ import request_resync
    from jobs.cdc.target_table import RESYNC_DONE_PROPERTY, pending_resync_request

    name = "cdc_test_requested"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 2_000)
    lake = f"lakehouse.dim_db.{name}"
    sync = make_sync(pair)
    sync.request_poll_seconds = 0
    catch_up(sync)

    def damage_then_request() -> None:
        spark.sql(f"DELETE FROM {lake} WHERE id IN ('k00001', 'k00002')")  # behind CDC's back
        assert request_resync(spark, lake_config, [f"dim_db.{name}"]) == 0
        with app_conn.cursor() as cur:
            cur.execute(f"INSERT INTO {name} (id, name, qty, price) VALUES ('n1', 'during', 1, 1)")
            cur.execute(f"UPDATE {name} SET qty = -5 WHERE id = 'k00010'")
        app_conn.commit()

    catch_up(sync)
    assert not sync.resyncing and spark.table(lake).count() == 2_000  # nothing asked: nothing copied
    damage_then_request()
    sync.run_batch()  # it looks
    assert sync.resyncing
    copy = sync.tables[("user_db", name)].resync
    assert request_resync(spark, lake_config, [f"dim_db.{name}"]) == 0  # a newer request, mid-copy
    newer = pending_resync_request(spark, lake)
    sync.run_batch()  # it looks: the copy under way answers the newer request too, not started again
    assert sync.tables[("user_db", name)].resync is copy
    sync.request_poll_seconds = 3_600  # it looks no more: the swap itself answers the request
    assert pending_resync_request(spark, lake) == newer  # until the copy is in
    run_until_swapped(sync)
    assert pending_resync_request(spark, lake) is None
    assert load_iceberg_table(spark, lake).properties()[RESYNC_DONE_PROPERTY] == newer
    catch_up(sync)
    assert sync.errors == []
    assert_converged(spark, app_conn, name)
    sync.close()
    again = make_sync(pair)
    again.run_batch()  # its first batch looks: nothing pending
    assert not again.resyncing
    again.close()

    spark.sql(f"DELETE FROM {lake} WHERE id = 'k00003'")  # while the job is stopped
    assert request_resync(spark, lake_config, [f"dim_db.{name}"]) == 0
    restarted = make_sync(pair)
    restarted.run_batch()  # its first batch looks
    assert restarted.resyncing
    run_until_swapped(restarted)
    catch_up(restarted)
    assert restarted.errors == []
    assert_converged(spark, app_conn, name)
    assert pending_resync_request(spark, lake) is None

    spark.sql("CREATE TABLE IF NOT EXISTS lakehouse.dim_db.cdc_test_not_cdc (id INT) USING iceberg")
    try:
        assert request_resync(spark, lake_config, ["dim_db.cdc_test_not_cdc"]) == 2
        assert request_resync(spark, lake_config, ["dim_db.cdc_test_no_such_table"]) == 2
        assert pending_resync_request(spark, "lakehouse.dim_db.cdc_test_not_cdc") is None
    finally:
        spark.sql("DROP TABLE IF EXISTS lakehouse.dim_db.cdc_test_not_cdc")


def corrupting_builds(monkeypatch, bad_builds: int) -> list[str]:
    """The first `bad_builds` copies lose a row after they are built: what verification must catch."""
    real = snapshot.build_staging
    built: list[str] = []

    def build(*args, **kwargs):
        result = real(*args, **kwargs)
        built.append(result.staging)
        if len(built) <= bad_builds:
            (kwargs.get("spark") or args[0]).sql(f"DELETE FROM {result.staging} WHERE id = 'k00007'")
        return result

    monkeypatch.setattr(snapshot, "build_staging", build)
    return built


def test_a_copy_that_does_not_verify_is_built_again_and_never_swapped_in(
    spark, app_conn, make_sync, monkeypatch, caplog, lake_config
) -> None:
    from jobs.cdc.__main__ import request_resync
    from jobs.cdc.target_table import pending_resync_request

    name = "cdc_test_resync_verify"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 2_000)
    catch_up(make_sync(pair))
    lake = f"lakehouse.dim_db.{name}"
    caplog.set_level(logging.INFO, logger="cdc_sync")

    # The first copy is wrong: found, built again, the second one swapped in.
    built = corrupting_builds(monkeypatch, bad_builds=1)
    sync = make_sync(pair, resync=(f"user_db.{name}",))
    run_until_swapped(sync)
    assert len(built) == 2 and sync.errors == []
    retried = [r.getMessage() for r in caplog.records if "attempt 1 of 3" in r.getMessage()]
    assert retried and "rows the lake lacks" in retried[0] and "key k00007" in retried[0], retried
    assert_converged(spark, app_conn, name)
    # Swapped in without a copy: the table's files are the copy's, in its folder; its metadata gone.
    files = [r.file_path for r in spark.sql(f"SELECT file_path FROM {lake}.files").collect()]
    (folder,) = {path.split("/data/")[0].removeprefix("file:") for path in files}
    assert built[1].split(".")[-1] in folder, (folder, built)
    assert os.path.isdir(f"{folder}/data") and not os.path.exists(f"{folder}/metadata")
    sync.close()

    # Every copy wrong (this time a request of the running job): the table stays as it was, synced,
    # and the job says so (exit 2 at its end); the failed copy answers the request (not asked again).
    monkeypatch.setattr("jobs.cdc.sync.ATTEMPTS", 2)
    monkeypatch.setattr("jobs.cdc.resync.ATTEMPTS", 2)
    built = corrupting_builds(monkeypatch, bad_builds=99)
    sync = make_sync(pair)
    sync.request_poll_seconds = 0
    assert request_resync(spark, lake_config, [f"dim_db.{name}"]) == 0
    sync.run_batch()  # it looks
    assert sync.resyncing
    run_until_swapped(sync)
    with app_conn.cursor() as cur:
        cur.execute(f"UPDATE {name} SET qty = 4242 WHERE id = 'k00009'")
    app_conn.commit()
    catch_up(sync)
    (error,) = sync.errors
    assert "failed 2 times" in error and "k00007" in error and "syncs as before" in error, error
    assert_converged(spark, app_conn, name)  # the live table kept receiving changes
    assert snapshot.staging_tables(spark, lake) == []
    assert pending_resync_request(spark, lake) is None  # answered by the failed copy, at the next look
    sync.close()
    again = make_sync(pair)
    again.run_batch()  # its first batch looks: nothing pending, nothing copied
    assert not again.resyncing and len(built) == 2
    again.close()


def run_in_source(connect, statements) -> None:
    conn = connect()
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
        conn.commit()
    finally:
        conn.close()


def once_the_copy_has_its_position(monkeypatch, connect, *statements: str) -> list:
    """Run `statements` in the source once, as soon as a copy beside the stream has read its
    position (B); returns the positions it ran at (one, once it did)."""
    real, ran = snapshot.build_staging, []

    def build(*args, on_position, **kwargs):
        def learned(position) -> None:
            on_position(position)
            if not ran:
                run_in_source(connect, statements)
                ran.append(position)

        return real(*args, on_position=learned, **kwargs)

    monkeypatch.setattr(snapshot, "build_staging", build)
    return ran


def test_a_ddl_during_the_copy_starts_it_again_with_the_new_column(
    spark, app_conn, local_stack, secrets, make_sync, monkeypatch, caplog
) -> None:
    from lakehouse.local.mariadb import APP_USER

    name = "cdc_test_resync_ddl"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 6_000)
    catch_up(make_sync(pair))
    caplog.set_level(logging.INFO, logger="cdc_sync")
    altered = once_the_copy_has_its_position(  # a migration lands mid-copy
        monkeypatch, lambda: local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"]),
        f"ALTER TABLE {name} ADD COLUMN extra INT NOT NULL DEFAULT 7",
        f"UPDATE {name} SET extra = 8 WHERE id = 'k00011'",
    )  # fmt: skip
    sync = make_sync(pair, resync=(f"user_db.{name}",), chunk_rows=500, commit_rows=1_000)
    run_until_swapped(sync)
    catch_up(sync)
    assert sync.errors == [] and altered
    assert_converged(spark, app_conn, name, [*COLUMNS, "extra"])
    again = [r.getMessage() for r in caplog.records if "again after `ALTER TABLE" in r.getMessage()]
    assert again, [r.getMessage() for r in caplog.records][-10:]


def test_a_table_made_again_and_dropped_while_its_copy_is_built_keeps_its_first_drop(
    spark, app_conn, local_stack, secrets, make_sync, monkeypatch
) -> None:
    """Dropped, made again (stopped until --resync), then dropped again while its copy is built: the
    lake table, which received nothing meanwhile, holds the first table's rows. It was marked as of
    the second DROP (found by review of the CDC fuzzer's model), claiming rows it does not hold."""
    from jobs.cdc.target_table import source_dropped
    from lakehouse.local.mariadb import APP_USER

    name = "cdc_test_resync_dropped"
    pair, lake = fresh_test_table(spark, app_conn, name), f"lakehouse.dim_db.{name}"
    seed_rows(app_conn, name, 300)
    sync = make_sync(pair)
    catch_up(sync)
    first = iceberg_rows(spark, lake, COLUMNS)
    with app_conn.cursor() as cur:
        cur.execute(f"DROP TABLE {name}")
    app_conn.commit()
    catch_up(sync)
    mark = source_dropped(spark, lake)
    assert mark.startswith("at ")
    recreate_source(app_conn, name)
    seed_rows(app_conn, name, 3_000, prefix="again")
    sync.close()
    dropped = once_the_copy_has_its_position(
        monkeypatch, lambda: local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"]),
        f"DROP TABLE {name}",
    )  # fmt: skip
    sync = make_sync(pair, resync=(f"user_db.{name}",), chunk_rows=500, commit_rows=1_000)
    catch_up(sync)
    assert dropped and sync.errors == []
    assert sync.tables[("user_db", name)].dropped == mark == source_dropped(spark, lake)
    assert iceberg_rows(spark, lake, COLUMNS) == first


def once_the_copy_read_its_rows(monkeypatch, connect, *statements: str):
    """Run `statements` in the source once, when a copy beside the stream has read its last chunk,
    and hold the copy back (not yet built) until the returned function, called between the test's
    batches, finds them applied (`applied()`); it returns whether that happened."""
    real, release, ran = snapshot.build_staging, threading.Event(), []

    def build(*args, **kwargs):
        built = real(*args, **kwargs)
        if not ran:
            run_in_source(connect, statements)
            ran.append(True)
            assert release.wait(120), "no batch applied the statements"
        return built

    monkeypatch.setattr(snapshot, "build_staging", build)

    def run_until_applied(sync, applied) -> None:
        deadline = time.monotonic() + 120
        while not release.is_set():
            sync.run_batch()
            if ran and applied():
                release.set()
            assert time.monotonic() < deadline, "the copy never read its rows"
            time.sleep(0.05)

    return run_until_applied


def test_a_cascade_into_a_table_whose_first_copy_is_being_built_reaches_the_copy(
    spark, app_conn, local_stack, secrets, make_sync, monkeypatch, caplog
) -> None:
    """A cascading child created while the job runs is copied beside the stream. A parent's DELETE
    and key UPDATE after the copy read its rows (and after its position B) cascade to it in the
    source without row events: the copy kept the old child rows, failed its verification and was
    built again, each time (a busy parent made it stop after three). The cascade must reach the copy
    itself, verified the first time, the lake equal to the source as multisets."""
    from lakehouse.local.mariadb import APP_USER

    fk_schema(app_conn, spark)
    sync = make_sync(include=("user_db.fk_*",))
    catch_up(sync)
    run_until_applied = once_the_copy_read_its_rows(  # the parent's changes cascade to rows it read
        monkeypatch, lambda: local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"]),
        "DELETE FROM fk_parent WHERE id = 2", "UPDATE fk_parent SET id = 60 WHERE id = 3",
    )  # fmt: skip
    with app_conn.cursor() as cur:
        cur.execute(
            f"CREATE TABLE {FK_LATE_CHILD} (id INT PRIMARY KEY, parent_id INT, boss_id INT, "
            "FOREIGN KEY (parent_id) REFERENCES fk_parent(id) ON DELETE CASCADE ON UPDATE CASCADE, "
            f"FOREIGN KEY (boss_id) REFERENCES {FK_LATE_CHILD}(id) ON DELETE CASCADE)"
        )  # it references itself too: a deleted boss's staff go, and theirs
        rows = [(i, i % 6 + 1, i - 33 if i >= 33 else None) for i in range(60)]
        cur.executemany(f"INSERT INTO {FK_LATE_CHILD} VALUES (%s, %s, %s)", rows)
    app_conn.commit()
    caplog.set_level(logging.INFO, logger="cdc_sync")
    run_until_applied(sync, lambda: spark.table("lakehouse.dim_db.fk_parent").where("id = 60").count() == 1)
    run_until_swapped(sync)
    catch_up(sync)

    assert sync.errors == []
    for name in [*FK_TABLES, FK_LATE_CHILD]:
        columns = fk_columns(app_conn, name)
        expected = mysql_rows(app_conn, name, columns)
        assert iceberg_rows(spark, f"lakehouse.dim_db.{name}", columns) == expected, name
    # the parent's 10 went, and the 5 under them (under another parent): rows the copy had read
    assert sum(mysql_rows(app_conn, FK_LATE_CHILD, ["id"]).values()) == 45
    again = [r.getMessage() for r in caplog.records if "building it again" in r.getMessage()]
    assert again == []  # verified the first time


def test_a_child_waiting_for_its_copy_passes_the_cascades_on_to_its_own_children(
    spark, app_conn, local_stack, secrets, make_sync, monkeypatch
) -> None:
    """fk_child's values are rewritten by a column change (no row events): its lake table waits for
    a copy. A parent's DELETE while the copy is built cascades to fk_child and on to fk_grandchild,
    which is synced live: the rows it lost could only be found through fk_child's rows, which no
    table held. Its copy is taken after fk_child's, and every table equals its source."""
    from lakehouse.local.mariadb import APP_USER

    fk_schema(app_conn, spark)
    sync = make_sync(include=("user_db.fk_*",))
    catch_up(sync)
    run_until_applied = once_the_copy_read_its_rows(
        monkeypatch, lambda: local_stack.mariadb.connect(APP_USER, secrets["mysql_app_password"]),
        "DELETE FROM fk_parent WHERE id = 2",
    )  # fmt: skip
    with app_conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute("UPDATE fk_child SET note = 'a-long-note' WHERE id % 2 = 0")
        cur.execute("ALTER TABLE fk_child MODIFY note VARCHAR(4)")  # 'a-long-note' -> 'a-lo', no row events
        cur.execute("SET SESSION sql_mode = DEFAULT")
    app_conn.commit()
    run_until_applied(sync, lambda: spark.table("lakehouse.dim_db.fk_parent").where("id = 2").count() == 0)
    run_until_swapped(sync)
    catch_up(sync)

    assert sync.errors == []
    for name in FK_TABLES:
        columns = fk_columns(app_conn, name)
        expected = mysql_rows(app_conn, name, columns)
        assert iceberg_rows(spark, f"lakehouse.dim_db.{name}", columns) == expected, name
    assert sum(mysql_rows(app_conn, "fk_grandchild", ["id"]).values()) == 40  # 8 went with 4 children


def seeded_and_synced(spark, app_conn, make_sync, name: str, rows: int = 200):
    """A fresh source table of `rows` rows, synced: (its pair, the job caught up on it)."""
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, rows)
    sync = make_sync(pair)
    catch_up(sync)
    return pair, sync


def test_values_the_source_rewrote_are_re_snapshotted_even_when_the_job_stops_mid_copy(
    spark, app_conn, make_sync, monkeypatch
) -> None:
    """A column change that rewrote existing values without row events (a VARCHAR shortened in
    non-strict mode) re-snapshots the table. Its live table went on receiving changes and storing
    positions past that statement, so a job stopped before the copy's swap never saw the statement
    again: the lake kept the old values for good (found by the CDC fuzzer, with a crash)."""
    from jobs.cdc.sync import CdcSync

    name = "cdc_test_resync_rewritten"
    pair, sync = seeded_and_synced(spark, app_conn, make_sync, name)
    with app_conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute(f"UPDATE {name} SET name = CONCAT(name, '-long') WHERE qty % 2 = 0")
        cur.execute(f"ALTER TABLE {name} MODIFY name VARCHAR(6) NOT NULL")  # 'seed-long' -> 'seed-l'
        cur.execute("SET SESSION sql_mode = DEFAULT")
        cur.execute(f"INSERT INTO {name} (id, name, qty, price) VALUES ('after', 'after', 1, 1)")
    app_conn.commit()
    monkeypatch.setattr(CdcSync, "_step_resync", lambda self, state: None)  # never swapped in
    state = sync.tables[("user_db", name)]
    for _ in range(40):  # the ALTER's re-snapshot is requested; the INSERT after it read
        sync.run_batch()
        if state.resync is not None and sync.reader.items.empty():
            break
        time.sleep(0.25)
    sync.run_batch()
    assert state.resync is not None
    sync.close()  # stopped before the swap
    monkeypatch.undo()

    restarted = make_sync(pair)
    catch_up(restarted)
    assert restarted.errors == []
    assert_converged(spark, app_conn, name)


def test_a_re_snapshot_whose_source_is_gone_keeps_the_table_as_of_its_position(
    spark, app_conn, make_sync
) -> None:
    """A column change that rewrote values without row events asks for a re-snapshot; when the
    job reads it, the source table is already gone (its DROP ahead in the binlog). There is nothing
    to copy: the lake table is kept with the rows it had before the change, marked, and not stopped
    (it was stopped with "cannot start: source table missing; --resync", for a table --resync
    cannot copy; the CDC fuzzer met it twice)."""
    name = "cdc_test_resync_gone"
    pair, sync = seeded_and_synced(spark, app_conn, make_sync, name)
    with app_conn.cursor() as cur:
        cur.execute(f"UPDATE {name} SET name = CONCAT(name, '-long'), qty = qty + 1 WHERE qty % 3 = 0")
    app_conn.commit()
    before = mysql_rows(app_conn, f"user_db.{name}", COLUMNS)  # what the lake must keep
    with app_conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute(f"ALTER TABLE {name} MODIFY name VARCHAR(6) NOT NULL")  # no row events
        cur.execute("SET SESSION sql_mode = DEFAULT")
        cur.execute(f"INSERT INTO {name} (id, name, qty, price) VALUES ('after', 'after', 1, 1)")
        cur.execute(f"DROP TABLE {name}")
    app_conn.commit()

    catch_up(sync)

    state = sync.tables[("user_db", name)]
    assert sync.errors == [] and state.error is None
    assert state.dropped is not None and state.dropped.startswith("after "), state.dropped
    assert "a re-snapshot could not start" in state.dropped
    assert iceberg_rows(spark, f"lakehouse.dim_db.{name}", COLUMNS) == before
    sync.close()
    restarted = make_sync(pair)  # the mark holds: kept, not synced, not an error
    catch_up(restarted)
    assert restarted.errors == []
    assert restarted.tables[("user_db", name)].dropped == state.dropped
    assert iceberg_rows(spark, f"lakehouse.dim_db.{name}", COLUMNS) == before


def test_kill_9_mid_resync_leaves_the_table_as_it_was_and_the_next_resync_resumes(
    spark, app_conn, make_sync, monkeypatch
) -> None:
    name = "cdc_test_resync_kill"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 12_000)
    catch_up(make_sync(pair))
    lake = f"lakehouse.dim_db.{name}"
    with app_conn.cursor() as cur:  # a change the killed job's copy holds, not yet the live table
        cur.execute(f"UPDATE {name} SET qty = 4242 WHERE id = 'k00005'")
    app_conn.commit()
    position = stored_position(spark, lake)

    job = subprocess.run(
        [LAKEHOUSE_BIN, "run", "cdc", "--until-idle", "--table", pair, "--server-id", "5096",
         "--resync", f"user_db.{name}", "--snapshot-chunk-rows", "1000", "--snapshot-commit-rows", "2000"],
        env={**os.environ, "LAKEHOUSE_CRASH_AT": "cdc.snapshot-commit:3"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert job.returncode == -signal.SIGKILL, job.stderr[-3000:]
    [staging] = snapshot.staging_tables(spark, lake)
    progress = snapshot.SnapshotProgress.from_json(
        snapshot.read_progress(spark, staging, snapshot.PROGRESS_KEY)
    )
    assert (progress.rows, progress.chunks) == (5_000, 5)
    # The live table is as the killed job left it: whole, every row (the copy was never swapped in).
    live = iceberg_rows(spark, lake, COLUMNS)
    assert sum(live.values()) == 12_000 and stored_position(spark, lake).order >= position.order

    starts = record_chunk_starts(monkeypatch)
    sync = make_sync(
        pair, resync=(f"user_db.{name}",), chunk_rows=1_000, commit_rows=2_000, reads_in_process=True
    )
    run_until_swapped(sync)
    catch_up(sync)
    assert starts[0] == (progress.ranges[0].after, None)  # resumed after the last committed key
    assert sync.errors == [] and snapshot.staging_tables(spark, lake) == []
    assert_converged(spark, app_conn, name)


def test_the_binlog_read_of_a_comparison_ends_on_a_source_that_never_pauses(
    spark, app_conn, local_stack, secrets, make_sync
) -> None:
    """`reconcile.changed_keys` (verify's and the resync's in-flight keys) reads the binlog up to
    the end of its source read. On a source written more often than its 0.2 s idle wait it used to
    read on forever (the resync's copy never verified; `lakehouse verify` hung on a busy source)."""
    from jobs.cdc import source_db
    from jobs.cdc.binlog_reader import BinlogPosition
    from jobs.cdc.reconcile import changed_keys

    name = "cdc_test_reconcile_busy"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 10)
    sync = make_sync(pair)
    start = sync.tables[("user_db", name)].position
    with app_conn.cursor() as cur:
        cur.execute(f"UPDATE {name} SET qty = 99 WHERE id IN ('k00003', 'k00004')")
    app_conn.commit()
    end = BinlogPosition(*source_db.master_position(sync._connect()))
    sink = "cdc_test_reconcile_sink"
    recreate_source(app_conn, sink)
    stop, writer = churning(local_stack, secrets, name, sink)
    found: list[set] = []
    try:
        settings = source_db.connection_settings(sync.config, sync.credentials)
        reading = threading.Thread(
            target=lambda: found.append(
                changed_keys(settings, 5095, ("user_db", name), ("id",), start, end, True, timeout=60)
            ),
            daemon=True,
        )
        reading.start()
        reading.join(45)
        assert not reading.is_alive(), "the binlog read did not end while the source kept writing"
    finally:
        stop.set()
        writer.join()
    assert {("k00003",), ("k00004",)} <= found[0]


def test_kill_9_after_the_swap_keeps_the_files_the_table_took_from_the_copy(
    spark, app_conn, make_sync
) -> None:
    """Killed after the swap, before its staging table was dropped: the next start drops the staging
    table, but not the data files the table took from it (a PURGE would delete the table's rows);
    with `--resync` again, the caught-up staging table is not resumed (it stores a position)."""
    name = "cdc_test_resync_swap_kill"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 3_000)
    catch_up(make_sync(pair))
    lake = f"lakehouse.dim_db.{name}"
    job = subprocess.run(
        [LAKEHOUSE_BIN, "run", "cdc", "--until-idle", "--table", pair, "--server-id", "5094",
         "--resync", f"user_db.{name}"],
        env={**os.environ, "LAKEHOUSE_CRASH_AT": "cdc.snapshot-published"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert job.returncode == -signal.SIGKILL, job.stderr[-3000:]
    assert len(snapshot.staging_tables(spark, lake)) == 1  # left behind by the kill
    with app_conn.cursor() as cur:
        cur.execute(f"UPDATE {name} SET qty = 7 WHERE id = 'k00002'")
    app_conn.commit()
    sync = make_sync(pair, resync=(f"user_db.{name}",))  # drops it: caught up, not resumable
    catch_up(sync)
    assert snapshot.staging_tables(spark, lake) == [] and sync.errors == []
    assert assert_converged(spark, app_conn, name) == 3_000


def test_the_staging_table_dropped_after_a_swap_keeps_its_files_whatever_its_uri_spelling(
    spark, tmp_path
) -> None:
    """Whether the target took a staging table's files is decided by the files themselves, not by
    the staging table's location as a text prefix: a location written `file:///…` (as the rehearsal's
    warehouse is) has data files `file:/…`, so the prefix never matched, the drop PURGEd the files
    the swap had just given the target, and the next reader failed (`make rehearse`, a requested
    resync of dim_db.products: the report step's FileNotFoundException). A staging table left
    behind by a crash after its swap is dropped the same way; one never swapped in goes with its
    files."""
    target = "lakehouse.dim_db.cdc_test_swap_uri"
    swapped, unswapped = f"{target}__cdc_snapshot_0", f"{target}__cdc_snapshot_1"
    tables = (target, swapped, unswapped)
    for table in tables:
        spark.sql(f"DROP TABLE IF EXISTS {table}")
    spark.sql(f"CREATE TABLE {target} (id INT, v STRING) USING iceberg")
    spark.sql(f"INSERT INTO {target} VALUES (1, 'old')")
    jvm = spark.sparkContext._jvm  # (Spark's LOCATION clause would write it `file:/…`)
    catalog = spark._jsparkSession.sessionState().catalogManager().catalog("lakehouse").icebergCatalog()
    for staging in (swapped, unswapped):
        catalog.createTable(
            jvm.org.apache.iceberg.catalog.TableIdentifier.parse(staging.split(".", 1)[1]),
            load_iceberg_table(spark, target).schema(),
            jvm.org.apache.iceberg.PartitionSpec.unpartitioned(),
            f"file://{tmp_path}/{staging.rsplit('_', 1)[1]}",
            jvm.java.util.HashMap(),
        )
        spark.sql(f"INSERT INTO {staging} VALUES (1, 'new'), (2, 'new')")
    try:
        assert load_iceberg_table(spark, swapped).location().startswith("file:///")
        assert snapshot._swap_files(spark, swapped, target, {})
        for staging in (swapped, unswapped):  # as the next start drops what a crash left behind
            snapshot.drop_staging(spark, staging, target)
            assert not spark.catalog.tableExists(staging)
        assert sorted(tuple(r) for r in spark.table(target).collect()) == [(1, "new"), (2, "new")]
        assert list((tmp_path / "0" / "data").iterdir())  # the target's files now
        assert not (tmp_path / "1" / "data").exists() or not list((tmp_path / "1" / "data").iterdir())
    finally:
        for table in tables:
            spark.sql(f"DROP TABLE IF EXISTS {table}")


def test_a_clean_up_failing_after_the_swap_keeps_the_swap_and_the_stream(
    spark, app_conn, make_sync, monkeypatch
) -> None:
    """The swap landed, then dropping the staging table failed: the table is synced from the
    swapped position on (not a false 'another CDC job committed', exit 3); the next start drops it."""
    name = "cdc_test_resync_cleanup"
    pair = fresh_test_table(spark, app_conn, name)
    seed_rows(app_conn, name, 2_000)
    catch_up(make_sync(pair))
    lake = f"lakehouse.dim_db.{name}"
    real, failed = snapshot.drop_staging, []

    def failing_once(spark_, staging, target, **kwargs):
        if not failed:
            failed.append(staging)
            raise OSError("injected: the object store refused the delete")
        return real(spark_, staging, target, **kwargs)

    monkeypatch.setattr(snapshot, "drop_staging", failing_once)
    sync = make_sync(pair, resync=(f"user_db.{name}",))
    run_until_swapped(sync)
    with app_conn.cursor() as cur:
        cur.execute(f"UPDATE {name} SET qty = 31 WHERE id = 'k00031'")
    app_conn.commit()
    catch_up(sync)
    assert failed and sync.errors == []
    assert_converged(spark, app_conn, name)
    assert snapshot.staging_tables(spark, lake) == failed
    sync.close()
    catch_up(make_sync(pair))  # the next start drops it, keeping the files the table took
    assert snapshot.staging_tables(spark, lake) == []
    assert_converged(spark, app_conn, name)
