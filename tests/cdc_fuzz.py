"""A CDC fuzzer: random statement sequences against MariaDB with CDC following, checked against the
source at quiet points (Hypothesis stateful testing, as SQLancer and Jepsen do for databases).

A database of its own (`fz_db`), synced whole by one pattern: a parent, a child (ON DELETE/UPDATE
CASCADE), a child (ON DELETE/UPDATE SET NULL), a plain table, and the tables the rules create. The
rules draw row changes in multi-row transactions, cascading parent deletes and key updates, column
add/drop/rename, widening, narrowing and lossy (non-strict) retypes, TRUNCATE, primary-key changes in
both spellings, ALTER IGNORE … ADD UNIQUE, CREATE TABLE (with a DDL as its first snapshot starts),
RENAME TABLE, DROP TABLE and its re-creation, DROP DATABASE with a reload, a restart of the job, a
restart with `--resync` of one table (its copy built beside the stream while the next rules write),
a crash of the job after a random number of its writes (`crash_after`), and (`make fuzz`) a kill -9
of the job run as a process of its own. At each quiet point
every source table's lake table is either equal to it as a multiset (over the source's columns) or
stopped with one line that names `--resync`, and a dropped table's lake table still holds the rows
the source had when it was dropped, or, kept as of a stored position ("after <position> (…)"), the
rows the source had at that position (a second session records the source's committed tables after
every statement, with the binlog's end). A silent difference fails, and Hypothesis shrinks the sequence
to the shortest that still fails and prints it. `make fuzz` runs many sequences; `make test` a
bounded, derandomized few (tests/test_cdc_fuzz.py).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
from collections import Counter

import pymysql
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule
from test_cdc_sync import iceberg_rows, mysql_rows

from jobs.cdc import source_db, target_table
from jobs.config import ConfigError

DATABASE = "fz_db"
BASE = ("fz_parent", "fz_child", "fz_orphan", "fz_plain")
PLAIN = "id INT PRIMARY KEY, v INT, s VARCHAR(20)"
DDL = {
    "fz_parent": PLAIN,
    "fz_child": "id INT PRIMARY KEY, parent_id INT, v INT, "
    "FOREIGN KEY (parent_id) REFERENCES fz_parent(id) ON DELETE CASCADE ON UPDATE CASCADE",
    "fz_orphan": "id INT PRIMARY KEY, parent_id INT, v INT, "
    "FOREIGN KEY (parent_id) REFERENCES fz_parent(id) ON DELETE SET NULL ON UPDATE SET NULL",
    "fz_plain": PLAIN,
}
CHILDREN = ("fz_child", "fz_orphan")
KEYS = 40  # a small key space: updates and deletes find rows, inserts collide
# What ran, over every sequence of a session (printed by the tests).
STATEMENTS: Counter = Counter()
STOPPED: Counter = Counter()
KEPT_COMPARED: Counter = Counter()  # dropped tables compared with the source, by what they are kept as of
_server_ids = itertools.count(5600)
# Why a dropped table's lake table may be kept as of its stored position rather than of the DROP
# (else a cascading child: `lakehouse.cdc.cascaded-from`): the fuzzer's source never purges binlogs.
KEPT_AS_OF_POSITION = (
    "; then ",
    "cascaded to could be read",
    "a re-snapshot was under way",
    "a re-snapshot could not start",
)
_WRITE = re.compile(r"^\s*(MERGE|INSERT|ALTER|CREATE|DROP|DELETE|UPDATE|CALL|REPLACE)\b", re.I)


class Crash(BaseException):
    """The job dies here, as under a kill -9 between two of its writes (a BaseException: the job's
    own `except Exception` handlers must not survive it)."""


@contextlib.contextmanager
def crash_after(writes: int):
    """Every Spark write of the job (a writing SQL statement or a DataFrameWriterV2 commit), in any
    of its threads, is counted; the `writes`-th raises `Crash` once it is done, and from then on every
    write and batch raises it too, as if the process were gone. Writes through Iceberg's Java API
    (the resync's file swap) are not counted: the crash lands between Python-level writes."""
    from pyspark.sql import DataFrameWriterV2, SparkSession

    from jobs.cdc.sync import CdcSync

    lock, state = threading.Lock(), {"left": writes, "crashed": False}

    def counting(original, is_write):
        def call(*args, **kwargs):
            if state["crashed"]:
                raise Crash("the job is gone")
            result = original(*args, **kwargs)
            if is_write(args):
                with lock:
                    state["left"] -= 1
                    state["crashed"] = state["left"] <= 0
                if state["crashed"]:
                    raise Crash(f"the job died after its write no. {writes}")
            return result

        return call

    patches = [
        (SparkSession, "sql", lambda args: bool(_WRITE.match(str(args[1])))),
        *((DataFrameWriterV2, name, lambda args: True)
          for name in ("append", "overwrite", "overwritePartitions", "create", "replace", "createOrReplace")),
        (CdcSync, "run_batch", lambda args: False),
    ]  # fmt: skip
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for (owner, name, is_write), (_, _, original) in zip(patches, originals, strict=True):
        setattr(owner, name, counting(original, is_write))
    try:
        yield state
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def source_rows(conn: pymysql.Connection, table: str) -> tuple[list[str], Counter]:
    """The source table's columns now, and its rows as a multiset (test_cdc_sync.mysql_rows)."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {DATABASE}.{table} LIMIT 0")
        columns = [d[0] for d in cur.description]
    return columns, mysql_rows(conn, f"{DATABASE}.{table}", columns)


def binlog_end(conn: pymysql.Connection) -> tuple[str, int]:
    return source_db.master_position(conn)[:2]


_AFTER = re.compile(r"^after (\S+):(\d+)\b")


def lake_tables(spark) -> list[str]:
    """The fuzzer's lake tables (and staging tables) in dim_db."""
    return [r.tableName for r in spark.sql("SHOW TABLES IN lakehouse.dim_db LIKE 'fz_*'").collect()]


def cdc_machine(
    spark, lake_config, connect_app, connect_observer, catch_up, make_sync, run_killed=None, kills: int = 0
):
    """The state machine class, bound to the test session's Spark, stack and helpers (the observer's
    connection may read the binlog's end: CDC's user). `run_killed`
    (server id, when, seconds): the job as a process of its own, killed -9; `kills` per sequence."""

    class CdcFuzz(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.conn = connect_app()
            # Another session, each statement its own transaction: what the source has committed
            # after every statement (the writing session's open transaction unseen, as in the binlog).
            self.observer = connect_observer()
            self.observer.autocommit(True)
            # (binlog end before a statement, after its commit, {table: (columns, rows)} then): a
            # table kept as of a stored position must hold the source's rows at that position.
            self.history: list[tuple[tuple[str, int], tuple[str, int], dict]] = []
            self.sync = None
            self.log: list[str] = []
            self.live: dict[str, str] = {}  # source tables now: name -> its DDL
            self.added: dict[str, list[str]] = {}  # columns added to a plain table, to drop/rename
            # What the lake may keep of a dropped name: the source's rows at one of its DROPs (at
            # the first that the job had synced; None: unknown, a copy was under way); `resyncing`:
            # copies requested since the last check.
            self.dropped: dict[str, list[tuple[list[str], Counter] | None]] = {}
            self.resyncing: set[str] = set()
            self.reloads = 0
            self.kills = 0
            self.names = itertools.count()

        def run(self, *statements: str, kind: str) -> None:
            STATEMENTS[kind] += 1
            explicit = False  # inside BEGIN … COMMIT
            with self.conn.cursor() as cur:
                for statement in statements:
                    self.log.append(statement)
                    if not explicit:
                        before = binlog_end(self.observer)
                    try:
                        cur.execute(statement)
                    except (pymysql.err.IntegrityError, pymysql.err.DataError) as exc:
                        self.log.append(f"-- (refused by the source: {exc.args[0]})")
                    explicit = statement == "BEGIN" or (explicit and statement != "COMMIT")
                    if not explicit:  # each statement its own transaction, as a DDL would make it
                        self.conn.commit()
                        self.observe(before)
            self.conn.commit()

        def observe(self, before: tuple[str, int]) -> None:
            """The source's committed tables after a statement whose commit came after `before` (a
            copy's barrier may add to the binlog between the commit and this look)."""
            after = binlog_end(self.observer)
            if self.history and self.history[-1][1] == after:
                return  # nothing committed
            with self.observer.cursor() as cur:  # (none between a DROP DATABASE and the reload)
                cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                            (DATABASE,))  # fmt: skip
                names = [row[0] for row in cur.fetchall()]
            self.history.append((before, after, {name: source_rows(self.observer, name) for name in names}))

        def rows_at(self, name: str, mark: str) -> list[tuple[list[str], Counter]]:
            """What the source's table `name` may have held at the position a mark "after <position>
            (...)" names: each state whose commit may be at or before it (its statement began before
            it) while the next one's is not surely so (ended by then)."""
            at = _AFTER.match(mark)
            assert at, f"{name}: kept as of a position the mark does not name: {mark}"
            position = (at.group(1), int(at.group(2)))
            states = [
                tables[name]
                for k, (before, _, tables) in enumerate(self.history)
                if before < position and (k + 1 == len(self.history) or self.history[k + 1][1] > position)
                and name in tables
            ]  # fmt: skip
            assert states, f"{name}: no such table in the source at {mark}"
            return states

        def note_dropped(self, table: str) -> None:
            """The lake keeps the rows of the first DROP of the name (a table made again is stopped
            until a `--resync`), or of a later one (the earlier table went before its first copy
            landed); unknown if a copy was under way."""
            rows = None if table in self.resyncing else source_rows(self.conn, table)
            self.dropped.setdefault(table, []).append(rows)

        def plain_tables(self) -> list[str]:
            return sorted(n for n, ddl in self.live.items() if ddl == PLAIN and n != "fz_parent")

        def create_base_tables(self) -> None:
            with self.conn.cursor() as cur:
                for name in BASE:
                    before = binlog_end(self.observer)
                    cur.execute(f"CREATE TABLE {name} ({DDL[name]}) ENGINE=InnoDB")
                    self.observe(before)
                before = binlog_end(self.observer)
                cur.executemany("INSERT INTO fz_parent VALUES (%s, %s, 's')", [(i, i) for i in range(10)])
                cur.executemany("INSERT INTO fz_child VALUES (%s, %s, 0)", [(i, i % 10) for i in range(20)])
                cur.executemany("INSERT INTO fz_orphan VALUES (%s, %s, 0)", [(i, i % 10) for i in range(15)])
                cur.executemany("INSERT INTO fz_plain VALUES (%s, %s, 's')", [(i, i) for i in range(20)])
            self.conn.commit()
            self.observe(before)
            for name in BASE:
                self.live[name] = DDL[name]
                self.added[name] = []

        @initialize()
        def tables(self) -> None:
            with self.conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
                cur.execute(f"CREATE DATABASE {DATABASE}")
                cur.execute(f"USE {DATABASE}")
            self.create_base_tables()
            for name in lake_tables(spark):
                spark.sql(f"DROP TABLE IF EXISTS lakehouse.dim_db.{name}")
            self.sync = make_sync(next(_server_ids))

        # ---- row changes ---------------------------------------------------------------------

        @rule(data=st.data(), ids=st.lists(st.integers(0, KEYS), min_size=1, max_size=6))
        def upsert_rows(self, data, ids: list[int]) -> None:
            table = data.draw(st.sampled_from(sorted(self.live)), label="table")
            child = self.live[table] != PLAIN
            columns = "(id, parent_id, v)" if child else "(id, v, s)"

            def values(i: int) -> str:
                return f"({i}, {i % 10}, {i})" if child else f"({i}, {i}, 'u')"

            upserts = [f"INSERT INTO {table} {columns} VALUES {values(i)} ON DUPLICATE KEY UPDATE v = v + 1"
                       for i in ids]  # fmt: skip
            self.run("BEGIN", *upserts, "COMMIT", kind="insert/update (transaction)")

        @rule(data=st.data(), modulus=st.integers(2, 7), remainder=st.integers(0, 6))
        def update_rows(self, data, modulus: int, remainder: int) -> None:
            table = data.draw(st.sampled_from(sorted(self.live)), label="table")
            self.run(
                f"UPDATE {table} SET v = v + 1 WHERE id % {modulus} = {remainder % modulus}", kind="update"
            )

        @rule(data=st.data(), modulus=st.integers(3, 9), remainder=st.integers(0, 8))
        def delete_rows(self, data, modulus: int, remainder: int) -> None:
            table = data.draw(st.sampled_from(sorted(self.live)), label="table")
            kind = "delete (cascades)" if table == "fz_parent" else "delete"
            self.run(f"DELETE FROM {table} WHERE id % {modulus} = {remainder % modulus}", kind=kind)

        @precondition(lambda self: "fz_parent" in self.live)
        @rule(old=st.integers(0, KEYS), shift=st.integers(1, 3))
        def move_parent_key(self, old: int, shift: int) -> None:
            self.run(
                f"UPDATE IGNORE fz_parent SET id = id + {KEYS * shift} WHERE id = {old}",
                kind="parent key update (cascades)",
            )

        # ---- schema changes (plain tables) -------------------------------------------------------

        @precondition(lambda self: self.plain_tables())
        @rule(data=st.data())
        def add_column(self, data) -> None:
            table = data.draw(st.sampled_from(self.plain_tables()), label="table")
            name = f"c{next(self.names)}"
            self.added[table].append(name)
            self.run(f"ALTER TABLE {table} ADD COLUMN {name} INT", f"UPDATE {table} SET {name} = id",
                     kind="add column")  # fmt: skip

        @precondition(lambda self: any(self.added.get(t) for t in self.plain_tables()))
        @rule(data=st.data())
        def drop_column(self, data) -> None:
            table = data.draw(st.sampled_from([t for t in self.plain_tables() if self.added[t]]))
            name = data.draw(st.sampled_from(self.added[table]), label="column")
            self.added[table].remove(name)
            self.run(f"ALTER TABLE {table} DROP COLUMN {name}", kind="drop column")

        @precondition(lambda self: any(self.added.get(t) for t in self.plain_tables()))
        @rule(data=st.data())
        def rename_column(self, data) -> None:
            table = data.draw(st.sampled_from([t for t in self.plain_tables() if self.added[t]]))
            name = data.draw(st.sampled_from(self.added[table]), label="column")
            new = f"c{next(self.names)}"
            self.added[table][self.added[table].index(name)] = new
            self.run(f"ALTER TABLE {table} RENAME COLUMN {name} TO {new}", kind="rename column")

        @precondition(lambda self: self.plain_tables())
        @rule(data=st.data(), type_=st.sampled_from(["BIGINT", "SMALLINT", "INT UNSIGNED"]))
        def retype_column(self, data, type_: str) -> None:
            """Widening (followed), narrowing (re-snapshotted or stopped) or signed to unsigned."""
            table = data.draw(st.sampled_from(self.plain_tables()), label="table")
            self.run(f"ALTER TABLE {table} MODIFY v {type_}", kind=f"retype column (to {type_})")

        @precondition(lambda self: self.plain_tables())
        @rule(data=st.data())
        def lossy_retype(self, data) -> None:
            """Non-strict mode: MySQL truncates the existing values in the ALTER, with no row events."""
            table = data.draw(st.sampled_from(self.plain_tables()), label="table")
            self.run(
                "SET SESSION sql_mode = ''",
                f"UPDATE {table} SET s = CONCAT(s, 'xyz') WHERE id % 2 = 0",
                f"ALTER TABLE {table} MODIFY s VARCHAR(2)",
                "SET SESSION sql_mode = DEFAULT",
                kind="retype column (lossy, non-strict)",
            )

        @precondition(lambda self: self.plain_tables())
        @rule(data=st.data())
        def truncate(self, data) -> None:
            table = data.draw(st.sampled_from(self.plain_tables()), label="table")
            self.run(f"TRUNCATE TABLE {table}", kind="truncate")

        @precondition(lambda self: self.plain_tables())
        @rule(data=st.data(), spelling=st.sampled_from(["DROP PRIMARY KEY", "DROP INDEX `PRIMARY`"]))
        def change_primary_key(self, data, spelling: str) -> None:
            table = data.draw(st.sampled_from(self.plain_tables()), label="table")
            self.run(f"ALTER TABLE {table} {spelling}, ADD PRIMARY KEY (id, v)", kind="primary key change")

        @precondition(lambda self: self.plain_tables())
        @rule(data=st.data())
        def alter_ignore_unique(self, data) -> None:
            table = data.draw(st.sampled_from(self.plain_tables()), label="table")
            self.run(f"ALTER IGNORE TABLE {table} ADD UNIQUE (s)", kind="ALTER IGNORE ADD UNIQUE")

        # ---- tables and the database -------------------------------------------------------------

        @rule(alter=st.booleans())
        def create_table(self, alter: bool) -> None:
            """A new table (its first snapshot beside the stream), with an ADD COLUMN as it starts."""
            name = f"fz_new{next(self.names)}"
            self.live[name], self.added[name] = PLAIN, []
            rows = ", ".join(f"({i}, {i}, 's')" for i in range(12))
            statements = [f"CREATE TABLE {name} ({PLAIN}) ENGINE=InnoDB", f"INSERT INTO {name} VALUES {rows}"]
            kind = "create table"
            if alter:
                column = f"c{next(self.names)}"
                self.added[name].append(column)
                statements += [
                    f"ALTER TABLE {name} ADD COLUMN {column} INT",
                    f"UPDATE {name} SET {column} = v",
                ]
                kind += " (and a DDL as its snapshot starts)"
            self.run(*statements, kind=kind)

        @precondition(lambda self: set(self.live) - {"fz_parent"})
        @rule(data=st.data())
        def drop_table(self, data) -> None:
            table = data.draw(st.sampled_from(sorted(set(self.live) - {"fz_parent"})), label="table")
            self.note_dropped(table)
            del self.live[table]
            self.run(f"DROP TABLE {table}", kind="drop table")

        @precondition(lambda self: set(self.dropped) - set(self.live))
        @rule(data=st.data())
        def create_again(self, data) -> None:
            """A dropped table's name, created again (stopped until a `--resync`)."""
            table = data.draw(st.sampled_from(sorted(set(self.dropped) - set(self.live))), label="table")
            ddl = DDL.get(table, PLAIN) if table not in CHILDREN or "fz_parent" in self.live else PLAIN
            self.live[table], self.added[table] = ddl, []
            created = f"CREATE TABLE {table} ({ddl}) ENGINE=InnoDB"
            self.run(
                created, f"INSERT INTO {table} (id, v) VALUES (1, 1)", kind="create a dropped table again"
            )

        @precondition(lambda self: self.plain_tables())
        @rule(data=st.data())
        def rename_table(self, data) -> None:
            table = data.draw(st.sampled_from(self.plain_tables()), label="table")
            new = f"fz_new{next(self.names)}"
            self.note_dropped(table)
            self.live[new], self.added[new] = self.live.pop(table), self.added.pop(table)
            self.run(f"RENAME TABLE {table} TO {new}", kind="rename table")

        @precondition(lambda self: self.reloads < 2)  # at most twice a sequence: it resets everything
        @rule()
        def drop_database_and_reload(self) -> None:
            """A reset script: DROP DATABASE, CREATE DATABASE, the tables again with their rows."""
            for table in list(self.live):
                self.note_dropped(table)
            self.live.clear()
            self.reloads += 1
            self.run(f"DROP DATABASE {DATABASE}", f"CREATE DATABASE {DATABASE}", f"USE {DATABASE}",
                     kind="DROP DATABASE and a reload")  # fmt: skip
            self.log.append("-- the four tables again, with their first rows")
            self.create_base_tables()

        # ---- the job ---------------------------------------------------------------------------

        @rule()
        def restart(self) -> None:
            STATEMENTS["restart of the job"] += 1
            self.log.append("-- restart of the job")
            self.sync.close()
            self.sync = make_sync(next(_server_ids))

        @rule(data=st.data())
        def resync(self, data) -> None:
            """A restart with `--resync`: the copy is built beside the stream while the next rules
            write (and alter) on; the next quiet point waits for it to be swapped in."""
            table = data.draw(st.sampled_from(sorted(set(self.live) | set(self.dropped))), label="table")
            self.resyncing.add(table)
            STATEMENTS["--resync (a restart, the copy beside the stream)"] += 1
            self.log.append(f"-- restart with --resync {DATABASE}.{table}")
            self.sync.close()
            try:
                self.sync = make_sync(next(_server_ids), resync=(f"{DATABASE}.{table}",))
            except ConfigError as exc:  # a gone table the lake never had: the job says so, exit 2
                assert table not in self.live and "no such table" in str(exc), exc
                self.log.append(f"-- (refused: {exc})")
                self.sync = make_sync(next(_server_ids))

        @rule(writes=st.integers(1, 8))
        def crash(self, writes: int) -> None:
            """The job dies after its `writes`-th write from here (while it catches up), then starts
            again: whatever it was doing (a batch, a copy, a swap, a schema change) is cut there."""
            STATEMENTS["crash of the job (after a random write)"] += 1
            self.log.append(f"-- the job dies after its write no. {writes} from here, then starts again")
            with crash_after(writes), contextlib.suppress(Crash):
                try:
                    catch_up(self.sync)
                finally:
                    self.sync.close()  # inside: a copy's thread dies at its next write too
            self.sync = make_sync(next(_server_ids))

        @precondition(lambda self: self.kills < kills)
        @rule(when=st.sampled_from(("starting", "applying")), seconds=st.floats(0.0, 3.0))
        def kill_9(self, when: str, seconds: float) -> None:
            """The job as a process of its own (`lakehouse run cdc`), catching up on what the rules
            wrote since the last check, killed -9 in its start (its JVM, the snapshots of new tables)
            or after its first batch (its batches, a copy, a swap): nothing is cut at a place of the
            fuzzer's choosing. Then the job starts again in the test's process."""
            self.kills += 1
            STATEMENTS["kill -9 of the job's process"] += 1
            self.sync.close()
            self.log.append(f"-- the job runs as a process, killed -9 while {when} ({seconds:.1f})")
            self.log.append(f"-- ({run_killed(next(_server_ids), when, seconds)})")
            self.sync = make_sync(next(_server_ids))

        # ---- the check ------------------------------------------------------------------------

        @rule()
        def quiet_point(self) -> None:
            STATEMENTS["quiet point (checked)"] += 1
            self.lake_equals_source_or_says_why()

        def lake_equals_source_or_says_why(self) -> None:
            catch_up(self.sync)
            for name in sorted(self.live):
                state = self.sync.tables.get((DATABASE, name))
                assert state is not None, f"{name} is not synced"
                if state.error is not None:
                    assert "--resync" in state.error and "\n" not in state.error, state.error
                    continue
                columns, expected = source_rows(self.conn, name)
                self.assert_lake(name, columns, expected, "differs from its source silently")
            for name in sorted(self.resyncing):  # each copy has been swapped in, or called off
                state = self.sync.tables.get((DATABASE, name))
                if name in self.live and state is not None and state.live:
                    self.dropped.pop(name, None)  # the copy replaced what the lake kept of an older table
            self.resyncing.clear()
            for name, kept in sorted(self.dropped.items()):
                state = self.sync.tables.get((DATABASE, name))
                if name in self.live or state is None or state.error is not None:
                    continue  # created again; never seen by the job; or stopped, saying why
                assert state.dropped, f"{name} was dropped in the source, the job does not say so"
                if not state.dropped.startswith("at "):  # kept as of its stored position, saying why
                    lake = f"lakehouse.dim_db.{name}"
                    cascaded = name in lake_tables(spark) and target_table.cascaded_from(spark, lake)
                    assert cascaded or any(why in state.dropped for why in KEPT_AS_OF_POSITION), state.dropped
                    # A cascading child's rows were read as the source had them when a cascade was
                    # applied (maybe later than its position): not compared, as documented.
                    if name in lake_tables(spark) and not cascaded and "cascaded to" not in state.dropped:
                        self.assert_kept_as_of(name, state.dropped)
                    continue
                if None not in kept and name in lake_tables(spark):
                    KEPT_COMPARED["its DROP"] += 1
                    assert any(self.lake_holds(name, *rows) for rows in kept), (
                        f"{name} lost rows it had when its source was dropped: the source had "
                        f"{[sorted(rows)[:3] for _, rows in kept]} at its DROPs, the lake has "
                        f"{sorted(iceberg_rows(spark, f'lakehouse.dim_db.{name}', kept[0][0]))[:3]}; "
                        "statements:\n" + "\n".join(self.log)
                    )

        def assert_kept_as_of(self, name: str, mark: str) -> None:
            """The lake table holds the source's rows at the position the mark names, over the
            columns both have (a column renamed in the lake after it, by the job, keeps its values)."""
            lake_columns = {c.lower() for c in spark.table(f"lakehouse.dim_db.{name}").columns}
            compared = []
            for columns, rows in self.rows_at(name, mark):
                kept = [i for i, c in enumerate(columns) if c.lower() in lake_columns]
                projected = Counter()
                for row, count in rows.items():
                    projected[tuple(row[i] for i in kept)] += count
                lake = iceberg_rows(spark, f"lakehouse.dim_db.{name}", [columns[i] for i in kept])
                if lake == projected:
                    KEPT_COMPARED["its stored position"] += 1
                    return
                compared.append(f"only in the source {sorted(projected - lake)[:3]}, only in the lake "
                                f"{sorted(lake - projected)[:3]}")  # fmt: skip
            raise AssertionError(
                f"{name} is kept {mark}, without the source's rows there: " + "; or ".join(compared)
                + "; statements:\n" + "\n".join(self.log)
            )  # fmt: skip

        def lake_holds(self, name: str, columns: list[str], rows: Counter) -> bool:
            from pyspark.errors import AnalysisException

            try:
                return iceberg_rows(spark, f"lakehouse.dim_db.{name}", columns) == rows
            except AnalysisException:  # a column that table had and the lake does not: not it
                return False

        def assert_lake(self, name: str, columns: list[str], expected: Counter, what: str) -> None:
            actual = iceberg_rows(spark, f"lakehouse.dim_db.{name}", columns)
            assert actual == expected, (
                f"{name} {what}: only in the source {sorted(expected - actual)[:3]}, "
                f"only in the lake {sorted(actual - expected)[:3]}; statements:\n" + "\n".join(self.log)
            )

        def teardown(self) -> None:
            if self.sync is not None:
                try:
                    self.lake_equals_source_or_says_why()  # every sequence ends at a quiet point
                finally:
                    self._close()
            else:
                self.conn.close()
                self.observer.close()

        def _close(self) -> None:
            if self.sync is not None:
                for state in self.sync.tables.values():
                    if state.error is not None:
                        STOPPED[_reason(state.error)] += 1
                self.sync.close()
            self.conn.close()
            self.observer.close()

    return CdcFuzz


def _reason(error: str) -> str:
    for reason in ("primary key", "ALTER IGNORE", "strict", "was created again", "foreign key",
                   "cannot promote", "RENAME"):  # fmt: skip
        if reason.lower() in error.lower():
            return reason
    return error.split(":", 2)[-1][:60]
