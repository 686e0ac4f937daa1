"""Which tables CDC syncs (patterns, explicit tables) and how a table created later is noticed.

Without a database: the selection rule, the DDL classification of CREATE/RENAME, and the binlog
reader's queueing of a created table, fed with the library's own event classes. The end-to-end
behaviour on MariaDB is in test_cdc_sync.py (test_whole_database_*)."""

from __future__ import annotations

import pytest
from pymysqlreplication.event import MariadbGtidEvent, QueryEvent, XidEvent
from pymysqlreplication.row_event import TableMapEvent, WriteRowsEvent

from jobs.cdc.binlog_reader import BinlogPosition, BinlogReader, DdlEvent, Transaction
from jobs.cdc.ddl import classify
from jobs.cdc.table_selection import TableSelection, UnusableName
from jobs.config import ConfigError, LakehouseConfig


@pytest.fixture
def config() -> LakehouseConfig:
    return LakehouseConfig.aws(
        env="dev", region="eu-west-1", kafka_bootstrap="b:9098", mysql_host="db", mysql_cdc_secret_id="s"
    )


def test_default_selection_is_every_table_of_the_source_database(config) -> None:
    selection = TableSelection.from_args(config)
    assert selection.dynamic and selection.schemas == ("user_db",)
    assert selection.spec_for("user_db", "products").target == config.table("dim_db", "products")
    assert selection.spec_for("user_db", "orders_2026").target == config.table("dim_db", "orders_2026")
    assert selection.spec_for("other_db", "products") is None
    assert selection.spec_for("lakehouse_meta", "cdc_snapshot_barrier") is None


@pytest.mark.parametrize(
    ("schema", "table"),
    [("mysql", "user"), ("sys", "sys_config"), ("performance_schema", "threads"),
     ("information_schema", "tables"), ("lakehouse_meta", "cdc_snapshot_barrier")],
)  # fmt: skip
def test_every_pattern_leaves_the_server_s_own_schemas_and_cdc_s_barrier_out(config, schema, table) -> None:
    """`--include '*.*'` takes every schema the CDC user can see, except these: never the server's
    own tables or the snapshot's barrier row (the default `user_db.*` could not show it)."""
    for pattern in ("*.*", f"{schema}.*", f"{schema}.{table}"):
        selection = TableSelection.from_args(config, includes=(pattern,))
        assert selection.spec_for(schema, table) is None, pattern
    assert TableSelection.from_args(config, includes=("*.*",)).spec_for("shop", "orders") is not None


def test_patterns_exclusions_and_explicit_tables(config) -> None:
    selection = TableSelection.from_args(
        config,
        tables=("user_db.audit_log=ods_behavior.audit",),
        includes=("user_db.order*", "shop_*.customers"),
        excludes=("user_db.*_tmp", "user_db.audit*"),
        namespace="sales",
    )
    assert selection.spec_for("user_db", "orders").target == config.table("sales", "orders")
    assert selection.spec_for("user_db", "orders_tmp") is None  # excluded
    assert selection.spec_for("shop_eu", "customers").target == config.table("sales", "customers")
    assert selection.spec_for("user_db", "products") is None  # no pattern takes it
    # An explicit table is taken whatever --exclude says, to the target it names.
    assert selection.spec_for("user_db", "audit_log").target == config.table("ods_behavior", "audit")
    assert selection.schemas is None  # `shop_*`: the schemas are listed, not known up front
    assert selection.covers("user_db.orders") and selection.covers("sales.orders")
    assert not selection.covers("user_db.products")


def test_only_explicit_tables_without_a_pattern(config) -> None:
    selection = TableSelection.from_args(config, tables=("user_db.products=dim_db.products",))
    assert not selection.dynamic and selection.schemas == ("user_db",)
    assert selection.spec_for("user_db", "products") is not None
    assert selection.spec_for("user_db", "user_member") is None


def test_targets_are_lower_case_and_unusable_names_are_named(config) -> None:
    selection = TableSelection.from_args(config)
    assert selection.spec_for("user_db", "UserOrders").target == config.table("dim_db", "userorders")
    with pytest.raises(UnusableName, match=r"user_db\.order-items.*--table user_db\.order-items=dim_db"):
        selection.spec_for("user_db", "order-items")
    assert selection.selects("user_db", "order-items")  # selected: the sync reports it, never skips it


def test_a_pattern_without_a_schema_is_refused(config) -> None:
    with pytest.raises(ConfigError, match="SCHEMA.TABLE"):
        TableSelection.from_args(config, includes=("products",))


@pytest.mark.parametrize(
    ("statement", "tables", "created", "replaces"),
    [
        ("CREATE TABLE t (id INT PRIMARY KEY)", ((None, "t"),), ((None, "t"),), False),
        ("CREATE TABLE IF NOT EXISTS `s`.`t` LIKE u", (("s", "t"),), (("s", "t"),), False),
        ("create or replace table t as select * from u", ((None, "t"),), ((None, "t"),), True),
        ("RENAME TABLE a TO b, s.c TO s.d", ((None, "a"), ("s", "c")), ((None, "b"), ("s", "d")), False),
        ("ALTER TABLE a RENAME TO s.b", ((None, "a"),), (("s", "b"),), False),
    ],
)
def test_statements_that_make_a_table_exist(statement, tables, created, replaces) -> None:
    change = classify(statement)
    assert change.tables == tables and change.created == created and change.replaces == replaces


def test_renames_stop_the_old_table_and_temporary_tables_are_no_tables() -> None:
    assert classify("RENAME TABLE a TO b").unsupported
    assert classify("ALTER TABLE a RENAME AS b").reason == "RENAME"
    assert classify("CREATE TEMPORARY TABLE t (a INT)") is None
    assert classify("ALTER TABLE a RENAME INDEX i TO j") is None  # an index: rows unchanged
    assert not classify("ALTER TABLE a RENAME COLUMN x TO y").created


# ---- the reader --------------------------------------------------------------------------------


class _Events:
    def __init__(self, log_file: str, events: list) -> None:
        self.log_file, self.log_pos, self._events = log_file, 4, events

    def __iter__(self):
        for pos, event in self._events:
            self.log_pos = pos
            yield event


def _query(text: str, schema: str = "user_db") -> QueryEvent:
    event = QueryEvent.__new__(QueryEvent)
    event.query, event.schema, event.timestamp = text, schema.encode(), 1_700_000_000
    return event


def _gtid(seq: int, standalone: bool) -> MariadbGtidEvent:
    event = MariadbGtidEvent.__new__(MariadbGtidEvent)
    event.gtid, event.flags = f"0-1-{seq}", 1 if standalone else 0
    return event


def _rows(table: str, row: dict) -> WriteRowsEvent:
    event = WriteRowsEvent.__new__(WriteRowsEvent)
    event.schema, event.table, event.columns = "user_db", table, []
    event._RowsEvent__rows = [{"values": row, "none_sources": {}}]
    return event


def _xid() -> XidEvent:
    event = XidEvent.__new__(XidEvent)
    event.timestamp = 1_700_000_000
    return event


def _reader(selects) -> BinlogReader:
    start = BinlogPosition("mysql-bin.000001", 4)
    return BinlogReader({}, 1, start, {("user_db", "products"): ("id",)}, selects=selects)


def _queued(reader: BinlogReader) -> list:
    items = []
    while not reader.items.empty():
        items.append(reader.items.get_nowait())
    return items


def test_a_created_table_the_selection_takes_is_queued_and_followed_once_asked() -> None:
    reader = _reader(lambda schema, name: name.startswith("orders"))
    table_map = TableMapEvent.__new__(TableMapEvent)
    reader._read(
        _Events(
            "mysql-bin.000001",
            [
                (100, _gtid(1, standalone=True)),
                (200, _query("CREATE TABLE orders (id INT PRIMARY KEY)")),
                (300, _gtid(2, standalone=True)),
                (400, _query("CREATE TABLE scratch (id INT PRIMARY KEY)")),  # not selected
                (500, _gtid(3, standalone=False)),
                (550, _query("BEGIN")),
                (560, table_map),
                (600, _rows("orders", {"id": 1})),  # before `follow`: the snapshot will read it
                (700, _xid()),
            ],
        )
    )
    (created,) = _queued(reader)
    assert isinstance(created, DdlEvent) and created.created == (("user_db", "orders"),)
    assert created.tables == () and created.end == BinlogPosition("mysql-bin.000001", 200)

    reader.follow(("user_db", "orders"), ("id",))
    reader._read(
        _Events(
            "mysql-bin.000001",
            [
                (800, _gtid(4, standalone=False)),
                (810, _query("BEGIN")),
                (900, _rows("orders", {"id": 2})),
                (950, _xid()),
                (960, _gtid(5, standalone=True)),
                (970, _query("CREATE TABLE IF NOT EXISTS orders (id INT PRIMARY KEY)")),
            ],
        )
    )
    queued = _queued(reader)
    assert [type(item) for item in queued] == [Transaction, DdlEvent]
    assert [c.key for c in queued[0].changes[("user_db", "orders")]] == [(2,)]
    # Once followed, a CREATE on the name touches the table; it creates nothing new.
    assert queued[1].tables == (("user_db", "orders"),) and queued[1].created == ()


def test_create_select_inside_its_transaction_is_queued_before_the_rows() -> None:
    reader = _reader(lambda schema, name: True)
    reader._read(
        _Events(
            "mysql-bin.000001",
            [
                (100, _gtid(1, standalone=False)),
                (150, _query("CREATE TABLE orders_copy SELECT * FROM products")),
                (200, _rows("orders_copy", {"id": 1})),
                (300, _query("COMMIT")),
            ],
        )
    )
    (created,) = _queued(reader)  # the rows: not followed yet, the snapshot reads them
    assert created.created == (("user_db", "orders_copy"),)
    # Inside the transaction: after any position stored before it, before its end.
    assert BinlogPosition("mysql-bin.000001", 4).order < created.end.order < reader.position.order


@pytest.mark.parametrize("name_case", [1, 2])
def test_under_lower_case_table_names_a_ddl_names_the_table_in_any_letter_case(name_case: int) -> None:
    """lower_case_table_names=1 (a common RDS parameter) or 2: `ALTER TABLE Products …` is the synced
    `products` (MySQL reference manual, "Identifier Case Sensitivity": with 1, names are stored in
    lowercase on disk and comparisons are not case-sensitive; with 2, stored as given and compared in
    lowercase). Read as another table, the column change was missed silently."""
    start = BinlogPosition("mysql-bin.000001", 4)
    reader = BinlogReader(
        {}, 1, start, {("user_db", "products"): ("id",)}, lower_case_table_names=name_case,
        selects=lambda schema, name: name.lower().startswith("orders"),
    )  # fmt: skip
    reader._read(
        _Events(
            "mysql-bin.000001",
            [
                (100, _gtid(1, standalone=True)),
                (200, _query("ALTER TABLE Products ADD COLUMN x INT", schema="USER_DB")),
                (300, _gtid(2, standalone=True)),
                (400, _query("CREATE TABLE ORDERS (id INT PRIMARY KEY)")),
                (500, _gtid(3, standalone=True)),
                (600, _query("DROP DATABASE User_Db")),
            ],
        )
    )
    altered, created, dropped = _queued(reader)
    assert altered.tables == (("user_db", "products"),) and altered.change.column_changes
    assert created.created == (("user_db", "orders" if name_case == 1 else "ORDERS"),)
    assert dropped.tables == (("user_db", "products"),)


def test_with_case_sensitive_names_another_letter_case_is_another_table() -> None:
    reader = _reader(lambda schema, name: False)
    reader._read(
        _Events(
            "mysql-bin.000001",
            [(100, _gtid(1, standalone=True)), (200, _query("ALTER TABLE Products ADD COLUMN x INT"))],
        )
    )
    assert _queued(reader) == []


def test_an_idle_reader_reaches_the_end_of_a_new_mysql_binlog_file() -> None:
    """MySQL begins every binlog file with Format_description then Previous_gtids (MySQL source
    documentation, "Binary Log Events" / binlog file layout); SHOW MASTER STATUS on an idle server
    points past the latter. Not asked for, an idle reader stayed short of it after a rotate, and
    "caught up" (--until-idle, a table gone at start) waited for the next write."""
    from pymysqlreplication.event import PreviousGtidsEvent

    from jobs.cdc.binlog_reader import READ_EVENTS

    assert PreviousGtidsEvent in READ_EVENTS
    reader = _reader(lambda schema, name: False)
    reader._read(_Events("mysql-bin.000002", [(157, PreviousGtidsEvent.__new__(PreviousGtidsEvent))]))
    assert reader.position == BinlogPosition("mysql-bin.000002", 157)
