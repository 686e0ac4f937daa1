"""A CDC fuzzer: random statement sequences against MariaDB with CDC following, checked against the
source at quiet points (Hypothesis stateful testing, as SQLancer and Jepsen do for databases).

Four tables: a parent, a child (ON DELETE/UPDATE CASCADE), a child (ON DELETE/UPDATE SET NULL) and a
plain one, all synced by one whole-database selection. The rules draw row changes in multi-row
transactions, cascading parent deletes and key updates, column add/drop/rename/widen, TRUNCATE,
primary-key changes, ALTER IGNORE … ADD UNIQUE, a restart of the job, and a restart with `--resync`
of one table (its copy built beside the stream while the next rules write). At each quiet point every
table is either equal to its source as a multiset (over the source's columns), or stopped with one
line that names `--resync`. A silent difference fails, and Hypothesis shrinks the sequence to the
shortest that still fails and prints it. `make fuzz` runs many sequences; `make test` a bounded,
derandomized few (tests/test_cdc_fuzz.py).
"""

from __future__ import annotations

import itertools
from collections import Counter

import pymysql
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule
from test_cdc_sync import iceberg_rows, mysql_rows

TABLES = ("fz_parent", "fz_child", "fz_orphan", "fz_plain")
DDL = {
    "fz_parent": "id INT PRIMARY KEY, v INT, s VARCHAR(20)",
    "fz_child": "id INT PRIMARY KEY, parent_id INT, v INT, "
    "FOREIGN KEY (parent_id) REFERENCES fz_parent(id) ON DELETE CASCADE ON UPDATE CASCADE",
    "fz_orphan": "id INT PRIMARY KEY, parent_id INT, v INT, "
    "FOREIGN KEY (parent_id) REFERENCES fz_parent(id) ON DELETE SET NULL ON UPDATE SET NULL",
    "fz_plain": "id INT PRIMARY KEY, v INT, s VARCHAR(20)",
}
KEYS = 40  # a small key space: updates and deletes find rows, inserts collide
# What ran, over every sequence of a session (printed by the tests).
STATEMENTS: Counter = Counter()
STOPPED: Counter = Counter()
_server_ids = itertools.count(5600)


def source_rows(conn: pymysql.Connection, table: str) -> tuple[list[str], Counter]:
    """The source table's columns now, and its rows as a multiset (test_cdc_sync.mysql_rows)."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table} LIMIT 0")
        columns = [d[0] for d in cur.description]
    return columns, mysql_rows(conn, f"user_db.{table}", columns)


def cdc_machine(spark, lake_config, connect_app, catch_up, make_sync):
    """The state machine class, bound to the test session's Spark, stack and helpers."""

    class CdcFuzz(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.conn = connect_app()
            self.sync = None
            self.log: list[str] = []
            self.added: list[str] = []  # columns added to fz_plain that may be dropped/renamed
            self.names = itertools.count()

        def run(self, *statements: str, kind: str) -> None:
            STATEMENTS[kind] += 1
            with self.conn.cursor() as cur:
                for statement in statements:
                    self.log.append(statement)
                    try:
                        cur.execute(statement)
                    except pymysql.err.IntegrityError:
                        self.log.append("-- (refused by the source)")
            self.conn.commit()

        @initialize()
        def tables(self) -> None:
            with self.conn.cursor() as cur:
                for name in reversed(TABLES):
                    cur.execute(f"DROP TABLE IF EXISTS {name}")
                for name in TABLES:
                    cur.execute(f"CREATE TABLE {name} ({DDL[name]}) ENGINE=InnoDB")
                cur.executemany("INSERT INTO fz_parent VALUES (%s, %s, 's')", [(i, i) for i in range(10)])
                cur.executemany("INSERT INTO fz_child VALUES (%s, %s, 0)", [(i, i % 10) for i in range(20)])
                cur.executemany("INSERT INTO fz_orphan VALUES (%s, %s, 0)", [(i, i % 10) for i in range(15)])
                cur.executemany("INSERT INTO fz_plain VALUES (%s, %s, 's')", [(i, i) for i in range(20)])
            self.conn.commit()
            for name in TABLES:
                spark.sql(f"DROP TABLE IF EXISTS lakehouse.dim_db.{name}")
            self.sync = make_sync(next(_server_ids))

        # ---- row changes ---------------------------------------------------------------------

        @rule(table=st.sampled_from(TABLES), ids=st.lists(st.integers(0, KEYS), min_size=1, max_size=6))
        def upsert_rows(self, table: str, ids: list[int]) -> None:
            child = table in ("fz_child", "fz_orphan")
            columns = "(id, parent_id, v)" if child else "(id, v, s)"

            def values(i: int) -> str:
                return f"({i}, {i % 10}, {i})" if child else f"({i}, {i}, 'u')"

            upserts = [f"INSERT INTO {table} {columns} VALUES {values(i)} ON DUPLICATE KEY UPDATE v = v + 1"
                       for i in ids]  # fmt: skip
            self.run("BEGIN", *upserts, "COMMIT", kind="insert/update (transaction)")

        @rule(table=st.sampled_from(TABLES), modulus=st.integers(2, 7), remainder=st.integers(0, 6))
        def update_rows(self, table: str, modulus: int, remainder: int) -> None:
            self.run(
                f"UPDATE {table} SET v = v + 1 WHERE id % {modulus} = {remainder % modulus}", kind="update"
            )

        @rule(table=st.sampled_from(TABLES), modulus=st.integers(3, 9), remainder=st.integers(0, 8))
        def delete_rows(self, table: str, modulus: int, remainder: int) -> None:
            kind = "delete (cascades)" if table == "fz_parent" else "delete"
            self.run(f"DELETE FROM {table} WHERE id % {modulus} = {remainder % modulus}", kind=kind)

        @rule(old=st.integers(0, KEYS), shift=st.integers(1, 3))
        def move_parent_key(self, old: int, shift: int) -> None:
            self.run(
                f"UPDATE IGNORE fz_parent SET id = id + {KEYS * shift} WHERE id = {old}",
                kind="parent key update (cascades)",
            )

        # ---- schema changes (fz_plain) ----------------------------------------------------------

        @rule()
        def add_column(self) -> None:
            name = f"c{next(self.names)}"
            self.added.append(name)
            self.run(f"ALTER TABLE fz_plain ADD COLUMN {name} INT", f"UPDATE fz_plain SET {name} = id",
                     kind="add column")  # fmt: skip

        @precondition(lambda self: self.added)
        @rule(data=st.data())
        def drop_column(self, data) -> None:
            name = data.draw(st.sampled_from(self.added))
            self.added.remove(name)
            self.run(f"ALTER TABLE fz_plain DROP COLUMN {name}", kind="drop column")

        @precondition(lambda self: self.added)
        @rule(data=st.data())
        def rename_column(self, data) -> None:
            name = data.draw(st.sampled_from(self.added))
            new = f"c{next(self.names)}"
            self.added[self.added.index(name)] = new
            self.run(f"ALTER TABLE fz_plain RENAME COLUMN {name} TO {new}", kind="rename column")

        @rule()
        def widen_column(self) -> None:
            self.run("ALTER TABLE fz_plain MODIFY v BIGINT", kind="retype column (widening)")

        @rule()
        def truncate(self) -> None:
            self.run("TRUNCATE TABLE fz_plain", kind="truncate")

        @rule(spelling=st.sampled_from(["DROP PRIMARY KEY", "DROP INDEX `PRIMARY`"]))
        def change_primary_key(self, spelling: str) -> None:
            self.run(f"ALTER TABLE fz_plain {spelling}, ADD PRIMARY KEY (id, v)", kind="primary key change")

        @rule()
        def alter_ignore_unique(self) -> None:
            self.run("ALTER IGNORE TABLE fz_plain ADD UNIQUE (s)", kind="ALTER IGNORE ADD UNIQUE")

        @rule()
        def restart(self) -> None:
            STATEMENTS["restart of the job"] += 1
            self.log.append("-- restart of the job")
            self.sync.close()
            self.sync = make_sync(next(_server_ids))

        @rule(table=st.sampled_from(TABLES))
        def resync(self, table: str) -> None:
            """A restart with `--resync`: the copy is built beside the stream while the next rules
            write (and alter) on; the next quiet point waits for it to be swapped in."""
            STATEMENTS["--resync (a restart, the copy beside the stream)"] += 1
            self.log.append(f"-- restart with --resync user_db.{table}")
            self.sync.close()
            self.sync = make_sync(next(_server_ids), resync=(f"user_db.{table}",))

        # ---- the check ------------------------------------------------------------------------

        @rule()
        def quiet_point(self) -> None:
            STATEMENTS["quiet point (checked)"] += 1
            self.lake_equals_source_or_says_why()

        def lake_equals_source_or_says_why(self) -> None:
            catch_up(self.sync)
            for name in TABLES:
                state = self.sync.tables.get(("user_db", name))
                assert state is not None, f"{name} is not synced"
                if state.error is not None:
                    assert "--resync" in state.error and "\n" not in state.error, state.error
                    continue
                columns, expected = source_rows(self.conn, name)
                actual = iceberg_rows(spark, f"lakehouse.dim_db.{name}", columns)
                assert actual == expected, (
                    f"{name} differs from its source silently: only in the source "
                    f"{sorted(expected - actual)[:3]}, only in the lake {sorted(actual - expected)[:3]}; "
                    "statements:\n" + "\n".join(self.log)
                )

        def teardown(self) -> None:
            if self.sync is not None:
                try:
                    self.lake_equals_source_or_says_why()  # every sequence ends at a quiet point
                finally:
                    self._close()
            else:
                self.conn.close()

        def _close(self) -> None:
            if self.sync is not None:
                for state in self.sync.tables.values():
                    if state.error is not None:
                        STOPPED[_reason(state.error)] += 1
                self.sync.close()
            self.conn.close()

    return CdcFuzz


def _reason(error: str) -> str:
    for reason in ("primary key", "ALTER IGNORE", "strict", "was created again", "foreign key"):
        if reason.lower() in error.lower():
            return reason
    return error.split(":", 2)[-1][:60]
