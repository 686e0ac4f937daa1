"""Pure parts of the CDC job: type mapping, DDL classification, per-key reduction, MERGE text.

What the MERGE does to a real table is tested in test_cdc_sync.py
(`test_apply_changes_updates_inserts_and_deletes`)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from jobs.cdc.apply_changes import merge_statement
from jobs.cdc.binlog_reader import BinlogPosition
from jobs.cdc.change_batch import DELETE, UPSERT, last_change_per_key, row_changes
from jobs.cdc.chunk_reader import StoredAsText, keys_from_json, keys_to_json
from jobs.cdc.ddl import classify
from jobs.cdc.schema_mapping import UnsupportedType, iceberg_type, to_spark_value


@pytest.mark.parametrize(
    ("mysql", "iceberg"),
    [
        ("decimal(10,4)", "decimal(10,4)"),
        ("timestamp", "timestamp"),
        ("datetime(3)", "timestamp"),
        ("int(11)", "int"),
        ("int(10) unsigned", "bigint"),
        ("bigint(20)", "bigint"),
        ("bigint(20) unsigned", "decimal(20,0)"),
        ("varchar(10)", "string"),
        ("text", "string"),
        ("tinyint(1)", "int"),
        ("double", "double"),
        ("date", "date"),
        ("blob", "binary"),
    ],
)
def test_type_mapping_is_faithful(mysql: str, iceberg: str) -> None:
    assert iceberg_type(mysql) == iceberg


def test_unmappable_type_is_an_error() -> None:
    with pytest.raises(UnsupportedType):
        iceberg_type("geometry")


def test_values_convert_for_spark() -> None:
    naive = dt.datetime(2024, 1, 2, 3, 4, 5)
    assert to_spark_value(naive, "timestamp") == naive.replace(tzinfo=dt.UTC)
    assert to_spark_value(8.1, "decimal(10,4)") == Decimal("8.1")
    assert (
        to_spark_value(Decimal("-1E-30"), "string") == "-0.000000000000000000000000000001"
    )  # DECIMAL(65,30)
    assert to_spark_value("0000-00-00", "date") is None  # the zero date, as PyMySQL hands it over
    assert to_spark_value(None, "int") is None


def test_add_column_is_classified_as_followed() -> None:
    ddl = classify(
        "ALTER TABLE `user_db`.`products` ADD COLUMN stock INT NOT NULL DEFAULT 0, ADD note varchar(20)"
    )
    assert ddl is not None and not ddl.unsupported
    assert ddl.tables == (("user_db", "products"),)
    assert [(c.name, c.spark_type) for c in ddl.added_columns] == [("stock", "int"), ("note", "string")]


def test_column_changes_are_classified() -> None:
    ddl = classify(
        "ALTER TABLE products DROP COLUMN description, RENAME COLUMN name TO title, "
        "CHANGE product_price price DECIMAL(12,4) NOT NULL, MODIFY COLUMN stock BIGINT UNSIGNED, "
        "ADD COLUMN x INT FIRST"
    )
    assert ddl is not None and not ddl.unsupported
    assert [(c.kind, c.name, c.new_name) for c in ddl.column_changes] == [
        ("drop", "description", None),
        ("rename", "name", "title"),
        ("rename", "product_price", "price"),
        ("retype", "price", None),
        ("retype", "stock", None),
        ("add", "x", None),
    ]
    retyped = [c.column for c in ddl.column_changes if c.kind == "retype"]
    assert [(c.column_type, c.nullable) for c in retyped] == [
        ("DECIMAL(12,4)", False),
        ("BIGINT UNSIGNED", True),
    ]
    assert classify("TRUNCATE TABLE products").truncate


@pytest.mark.parametrize(
    "statement",
    [
        "ALTER TABLE products RENAME TO products_old",
        "ALTER TABLE products DROP PRIMARY KEY",
        "ALTER TABLE products ADD COLUMN (a INT, b INT)",
        "RENAME TABLE products TO p2",
        "DROP TABLE IF EXISTS products",
        # the primary key changed in its other spellings (were taken as harmless or ignored)
        "ALTER TABLE products DROP INDEX `PRIMARY`, ADD PRIMARY KEY (id, region)",
        "ALTER TABLE products DROP KEY PRIMARY, ADD PRIMARY KEY (id, region)",
        "DROP INDEX `PRIMARY` ON products",
        # MariaDB deletes the rows that duplicate the new key inside the DDL, with no row events
        "ALTER IGNORE TABLE products ADD UNIQUE (name)",
        "ALTER IGNORE TABLE products ADD CONSTRAINT u UNIQUE KEY (name)",
        "ALTER IGNORE TABLE products ADD CONSTRAINT UNIQUE (name)",
        "ALTER IGNORE TABLE products ADD CONSTRAINT `a name` UNIQUE (name)",
        "ALTER IGNORE TABLE products MODIFY name VARCHAR(20) UNIQUE",
        "ALTER IGNORE TABLE products ADD COLUMN code INT UNIQUE",
    ],
)
def test_other_ddl_is_unsupported(statement: str) -> None:
    ddl = classify(statement)
    assert ddl is not None and ddl.unsupported
    assert (None, "products") in ddl.tables
    # a table renamed away is gone under its name, as a dropped one (its lake table is kept, marked)
    assert ddl.drops == ("RENAME" in statement or statement.startswith("DROP TABLE"))


def test_a_swap_by_rename_takes_the_name_away_and_makes_it_again() -> None:
    swap = classify("RENAME TABLE t TO t_old, t_new TO t")
    assert swap.drops and swap.renamed
    assert swap.tables == ((None, "t"), (None, "t_new")) and (None, "t") in swap.created
    renamed_and_altered = classify("ALTER TABLE t RENAME TO u, DROP PRIMARY KEY")
    assert renamed_and_altered.renamed and renamed_and_altered.created == ((None, "u"),)
    # a RENAME COLUMN clause not understood stops the table; it does not take the table away
    for clause in ("RENAME COLUMN IF EXISTS a TO b", "RENAME COLUMN naïve TO b"):
        assert not classify(f"ALTER TABLE t {clause}").drops


@pytest.mark.parametrize(
    "statement",
    [
        "BEGIN",
        "CREATE TEMPORARY TABLE t (a int)",
        "ALTER TABLE products ADD INDEX idx_name (name)",
        "GRANT SELECT ON *.* TO x",
        # a session's temporary table, even under a synced table's name, is not that table
        "DROP TEMPORARY TABLE IF EXISTS products",
        "DROP INDEX idx_name ON products",
        "ALTER TABLE products ADD UNIQUE (name)",  # without IGNORE a duplicate fails the ALTER
    ],
)
def test_harmless_statements_are_ignored(statement: str) -> None:
    assert classify(statement) is None


@pytest.mark.parametrize("statement", ["DROP DATABASE user_db", "DROP SCHEMA IF EXISTS `user_db`"])
def test_drop_database_drops_every_table_of_that_schema(statement: str) -> None:
    ddl = classify(statement)
    assert ddl.dropped_schema == "user_db" and ddl.reason == "DROP" and ddl.tables == ()


def test_a_signed_integer_made_unsigned_is_not_value_preserving() -> None:
    """Non-strict mode clamps the negatives to 0 inside the ALTER, with no row events."""
    from jobs.cdc.schema_mapping import SourceColumn
    from jobs.cdc.schema_policy import preserves_values

    (change,) = classify("ALTER TABLE t MODIFY v SMALLINT UNSIGNED").column_changes
    assert not preserves_values(SourceColumn("v", "tinyint(4)", True), change.column)
    assert preserves_values(SourceColumn("v", "tinyint(4)", True), SourceColumn("v", "smallint(6)", True))


@pytest.mark.parametrize(
    ("statement", "adds_key"),
    [
        ("ALTER TABLE t ADD PRIMARY KEY (id)", True),
        ("ALTER TABLE t ADD CONSTRAINT pk PRIMARY KEY (a, b)", True),
        ("ALTER TABLE t MODIFY id INT NOT NULL PRIMARY KEY", True),
        ("ALTER TABLE t ADD COLUMN id2 INT AUTO_INCREMENT PRIMARY KEY", True),
        ("ALTER TABLE t ADD COLUMN c INT", False),
        ("ALTER TABLE t ADD UNIQUE KEY u (c)", None),  # harmless: nothing to report
    ],
)
def test_a_primary_key_added_is_reported(statement: str, adds_key: bool | None) -> None:
    """A table that waits for a key (it had none) is synced once one is added (sync.py)."""
    ddl = classify(statement)
    if adds_key is None:
        assert ddl is None
        return
    assert ddl.adds_key is adds_key and not ddl.unsupported and ddl.tables == ((None, "t"),)


def test_update_changing_the_key_deletes_the_old_key() -> None:
    rows = [{"before_values": {"id": "1", "v": 1}, "after_values": {"id": "2", "v": 1}}]
    changes = row_changes("update", rows, ("id",))
    assert [(c.op, c.key) for c in changes] == [(DELETE, ("1",)), (UPSERT, ("2",))]


def test_last_change_per_key_keeps_binlog_order() -> None:
    changes = [
        *row_changes("insert", [{"values": {"id": "a", "v": 1}}], ("id",)),
        *row_changes("insert", [{"values": {"id": "b", "v": 1}}], ("id",)),
        *row_changes("delete", [{"values": {"id": "a", "v": 1}}], ("id",)),
        *row_changes(
            "update", [{"before_values": {"id": "b", "v": 1}, "after_values": {"id": "b", "v": 2}}], ("id",)
        ),
        *row_changes("insert", [{"values": {"id": "a", "v": 3}}], ("id",)),
    ]
    latest = last_change_per_key(changes)
    assert [(c.op, c.key, c.row["v"]) for c in latest] == [(UPSERT, ("b",), 2), (UPSERT, ("a",), 3)]


def test_merge_statement_has_delete_update_and_insert_clauses() -> None:
    sql = merge_statement(
        "lakehouse.dim_db.p", "v", [("productId", "string"), ("name", "string")], ("productId",)
    )
    assert "ON t.`productId` = s.`productId`" in sql
    assert "THEN DELETE" in sql and "UPDATE SET t.`name` = s.`name`" in sql
    assert "INSERT (`productId`, `name`)" in sql


def test_positions_order_across_files() -> None:
    a = BinlogPosition("mysql-bin.000001", 9000)
    b = BinlogPosition("mysql-bin.000002", 4)
    assert a.order < b.order
    assert BinlogPosition.from_json(a.to_json()) == a


ARROW_CASES = [
    # (Iceberg type, values as a SELECT gives them, what Spark must be given): what Arrow converts as
    # is, and what goes value by value. The expected values are written out, not computed.
    ("int", [1, None, -7], [1, None, -7]),
    ("bigint", [2**40, None], [2**40, None]),
    ("decimal(10,4)", [Decimal("8.1000"), None, 8.1], [Decimal("8.1000"), None, Decimal("8.1000")]),
    ("decimal(20,0)", [Decimal(2**64 - 1), None], [Decimal(2**64 - 1), None]),
    ("string", ["a", None, "\u00fc\U0001f600"], ["a", None, "\u00fc\U0001f600"]),
    ("string", [Decimal("1E-30"), Decimal("12.50")], ["0.000000000000000000000000000001", "12.50"]),
    ("string", [b"bytes as text", None], ["bytes as text", None]),
    (
        "timestamp",
        [dt.datetime(2026, 11, 23, 12, 0, 1), None, "0000-00-00 00:00:00"],
        [dt.datetime(2026, 11, 23, 12, 0, 1, tzinfo=dt.UTC), None, None],
    ),
    ("date", [dt.date(2026, 11, 23), None, "0000-00-00"], [dt.date(2026, 11, 23), None, None]),
    # As the snapshot's reader gets them: MySQL's text, parsed by Arrow (a zero date among them: no
    # day, and the column's other values still parsed).
    (
        "timestamp",
        ["2026-11-23 12:00:01", None, "1000-01-01 00:00:00.000001", "9999-12-31 23:59:59.5"],
        [
            dt.datetime(2026, 11, 23, 12, 0, 1, tzinfo=dt.UTC),
            None,
            dt.datetime(1000, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC),
            dt.datetime(9999, 12, 31, 23, 59, 59, 500000, tzinfo=dt.UTC),
        ],
    ),
    (
        "timestamp",
        ["2038-01-19 03:14:07.999", "0000-00-00 00:00:00", "2026-00-00 00:00:00"],
        [dt.datetime(2038, 1, 19, 3, 14, 7, 999000, tzinfo=dt.UTC), None, None],
    ),
    ("date", ["9999-12-31", None, "1582-10-04"], [dt.date(9999, 12, 31), None, dt.date(1582, 10, 4)]),
    ("date", ["2026-11-23", "0000-00-00", "2026-02-00"], [dt.date(2026, 11, 23), None, None]),
    # Year 0 with a month and a day: no day in Python, NULL from the binlog too (Arrow would take it).
    ("date", ["0000-01-01", "2026-11-23"], [None, dt.date(2026, 11, 23)]),
    ("timestamp", ["0000-01-01 00:00:00", None], [None, None]),
    ("double", [1.5, None, 2], [1.5, None, 2.0]),
    ("boolean", [True, False, None], [True, False, None]),
    ("binary", [b"\x00\x01", None, bytearray(b"\xff")], [b"\x00\x01", None, b"\xff"]),
]


@pytest.mark.parametrize(("kind", "values", "expected"), ARROW_CASES)
def test_arrow_change_columns_hold_what_spark_would_be_given(kind: str, values: list, expected: list) -> None:
    from jobs.cdc.apply_changes import OP_COLUMN, change_table
    from jobs.cdc.change_batch import UPSERT, RowChange

    changes = [RowChange(UPSERT, (i,), {"c": value}) for i, value in enumerate(values)]
    table = change_table([("c", kind)], changes)
    assert table.column_names == ["c", OP_COLUMN]
    got = table.column("c").to_pylist()
    assert got == expected
    assert [type(v) for v in got] == [type(v) for v in expected]
    assert table.column(OP_COLUMN).to_pylist() == [UPSERT] * len(values)


# ---- batching: how a batch waits for and drains the reader's queue ------------------------------


def _drainer(change_wait_seconds: float):
    """A CdcSync with only what `_drain` uses: the reader's queue and the two limits."""
    import queue
    from types import SimpleNamespace

    from jobs.cdc.sync import CdcSync

    sync = CdcSync.__new__(CdcSync)
    sync.reader = SimpleNamespace(items=queue.Queue())
    sync.max_batch_changes = 1_000_000
    sync.change_wait_seconds = change_wait_seconds
    return sync


def _transaction(n: int, committed: float):
    from jobs.cdc.binlog_reader import Transaction
    from jobs.cdc.change_batch import RowChange

    change = RowChange(UPSERT, (n,), {"id": n})
    end = BinlogPosition("mysql-bin.000001", 100 + n)
    return Transaction({("user_db", "t"): [change]}, end, int(committed))


def _put_later(items, transactions, gap: float) -> None:
    import threading
    import time

    def feed() -> None:
        for transaction in transactions:
            time.sleep(gap)
            items.put(transaction)

    threading.Thread(target=feed, daemon=True).start()


def test_an_idle_batch_starts_when_the_first_change_arrives() -> None:
    import time

    sync = _drainer(change_wait_seconds=30.0)
    _put_later(sync.reader.items, [_transaction(1, time.time())], gap=0.3)
    began = time.monotonic()
    transactions, ddl, drained_all = sync._drain()
    assert [t.end.pos for t in transactions] == [101]
    assert ddl is None and drained_all
    assert time.monotonic() - began < 30.0  # returned on arrival, not at the end of the wait


def test_an_idle_batch_with_nothing_to_do_returns_empty() -> None:
    sync = _drainer(change_wait_seconds=0.2)
    assert sync._drain() == ([], None, True)


def test_catching_up_a_batch_waits_out_the_readers_pauses(monkeypatch) -> None:
    import time

    import jobs.cdc.sync as cdc_sync

    monkeypatch.setattr(cdc_sync, "CATCH_UP_GAP_SECONDS", 3.0)
    sync = _drainer(change_wait_seconds=5.0)
    old = time.time() - 3600  # the backlog's transactions committed an hour ago
    _put_later(sync.reader.items, [_transaction(n, old) for n in range(4)], gap=0.3)
    transactions, _, _ = sync._drain()
    assert [t.end.pos for t in transactions] == [100, 101, 102, 103]  # one batch, one MERGE


def test_close_to_the_source_a_pause_ends_the_batch() -> None:
    import time

    sync = _drainer(change_wait_seconds=5.0)
    _put_later(sync.reader.items, [_transaction(n, time.time()) for n in range(2)], gap=0.5)
    transactions, _, drained_all = sync._drain()
    assert [t.end.pos for t in transactions] == [100] and drained_all  # the next one goes in the next batch


def test_catching_up_a_batch_stops_at_its_size_cap_or_at_a_ddl() -> None:
    import time

    from jobs.cdc.binlog_reader import DdlEvent

    old = time.time() - 3600
    sync = _drainer(change_wait_seconds=1.0)
    sync.max_batch_changes = 2
    for n in range(5):
        sync.reader.items.put(_transaction(n, old))
    transactions, ddl, drained_all = sync._drain()
    assert [t.end.pos for t in transactions] == [100, 101] and ddl is None and not drained_all

    sync = _drainer(change_wait_seconds=1.0)
    alter = DdlEvent(
        classify("ALTER TABLE t ADD COLUMN x INT"), (("user_db", "t"),), BinlogPosition("f", 9), int(old)
    )
    for item in (_transaction(1, old), alter, _transaction(2, old)):
        sync.reader.items.put(item)
    transactions, ddl, drained_all = sync._drain()
    assert [t.end.pos for t in transactions] == [101] and ddl is alter and not drained_all


@pytest.mark.parametrize(
    ("column", "fills"),
    [
        ("stock INT DEFAULT(7)", True),  # no space after DEFAULT: the form MySQL's docs show for expressions
        ("stock INT DEFAULT (7)", True),
        ("stock INT DEFAULT 0", True),
        ("stock INT NOT NULL", True),  # existing rows get the type's implicit default
        ("ts TIMESTAMP DEFAULT CURRENT_TIMESTAMP", True),
        ("ts DATETIME(6) DEFAULT now(6)", True),
        ("j JSON DEFAULT (JSON_ARRAY())", True),
        ("g INT GENERATED ALWAYS AS (qty + 1) VIRTUAL", True),
        ("g INT AS (qty+1) STORED", True),
        ("n INT AUTO_INCREMENT UNIQUE", True),
        ("s SET('a','b') DEFAULT 'a,b'", True),
        ("id SERIAL", True),
        ("n INT NULL DEFAULT NULL", False),
        ("n INT DEFAULT(NULL)", False),
        ("n INT", False),
        ("n VARCHAR(10) COMMENT 'DEFAULT 5 AS (x)'", False),  # only looks like a default
        ("n INT UNSIGNED AFTER qty", False),
    ],
)
def test_an_added_column_that_fills_existing_rows_is_recognised(column: str, fills: bool) -> None:
    for statement in (f"ALTER TABLE t ADD COLUMN {column}", f"ALTER ONLINE TABLE t ADD {column}"):
        ddl = classify(statement)
        assert ddl is not None and not ddl.unsupported, statement
        assert ddl.fills_existing_rows is fills, statement


# ---- binlog values as a SELECT gives them (the MySQL-only paths the local MariaDB cannot write) ---


def _column(name: str, kind: int, **extra):
    from pymysqlreplication.column import Column

    return Column(name=name, type=kind, character_set_name=extra.pop("charset", None), **extra)


def test_binlog_values_take_the_form_a_select_gives() -> None:
    from pymysqlreplication.constants import FIELD_TYPE, NONE_SOURCE

    from jobs.cdc.binlog_values import selected_row

    columns = [
        _column("bits", FIELD_TYPE.BIT, bits=10),
        _column("tags", FIELD_TYPE.SET, set_values=["b", "a", "c"]),
        _column("none", FIELD_TYPE.SET, set_values=["x"]),
        _column("null_set", FIELD_TYPE.SET, set_values=["x"]),
        _column("ts", FIELD_TYPE.TIMESTAMP2, fsp=0),
        _column("year", FIELD_TYPE.YEAR),
        _column("fixed", FIELD_TYPE.STRING, max_length=4, charset="binary"),
        _column("empty", FIELD_TYPE.VARCHAR, max_length=4, charset="binary"),
        _column("span", FIELD_TYPE.TIME2, fsp=2),
        _column("doc", FIELD_TYPE.JSON),
    ]
    row = {
        "values": {
            "bits": "1000000001",
            "tags": {"c", "a"},
            "none": None,
            "null_set": None,
            "ts": dt.datetime(1970, 1, 1),
            "year": 1900,
            "fixed": b"\x01",
            "empty": "",
            "span": -dt.timedelta(hours=100, seconds=1, microseconds=500_000),
            "doc": {b"k": "\u00fc", b"n": [1, 2.5, None, True, 1e300, 3.0, 'a"b\n']},
        },
        "none_sources": {"none": NONE_SOURCE.EMPTY_SET, "null_set": NONE_SOURCE.NULL},
    }
    assert selected_row(row, columns)["values"] == {
        "bits": b"\x02\x01",
        "tags": "a,c",  # definition order would be b,a,c: a before c
        "none": "",
        "null_set": None,
        "ts": None,
        "year": 0,
        "fixed": b"\x01\x00\x00\x00",
        "empty": b"",
        "span": "-100:00:01.50",
        "doc": '{"k": "\u00fc", "n": [1, 2.5, null, true, 1e300, 3.0, "a\\"b\\n"]}',
    }
    # An update's two images are both converted; a real 1970 TIMESTAMP second is kept.
    update = {
        "before_values": {"ts": dt.datetime(1970, 1, 1, 0, 0, 1)},
        "after_values": {"ts": dt.datetime(1970, 1, 1)},
        "before_none_sources": {},
        "after_none_sources": {},
    }
    converted = selected_row(update, columns)
    assert converted["before_values"] == {"ts": dt.datetime(1970, 1, 1, 0, 0, 1)}
    assert converted["after_values"] == {"ts": None}


def test_set_members_follow_the_definition_order() -> None:
    from pymysqlreplication.constants import FIELD_TYPE

    from jobs.cdc.binlog_values import selected_row

    column = _column("tags", FIELD_TYPE.SET, set_values=["z", "a", "m"])
    row = {"values": {"tags": {"a", "m", "z"}}, "none_sources": {}}
    assert selected_row(row, [column])["values"]["tags"] == "z,a,m"


@pytest.mark.parametrize(
    ("event_type", "says"),
    [(26, "incident"), (40, "Transaction_payload_event"), (166, "log_bin_compress=OFF")],
)
def test_events_that_may_hide_changes_stop_the_reader_before_them(event_type: int, says: str) -> None:
    from pymysqlreplication.event import NotImplementedEvent

    from jobs.cdc.binlog_reader import BinlogReader, UnreadableBinlog

    event = NotImplementedEvent.__new__(NotImplementedEvent)
    event.event_type = event_type
    start = BinlogPosition("mysql-bin.000003", 900)
    reader = BinlogReader({}, 1, start, {("user_db", "products"): ("id",)})
    with pytest.raises(UnreadableBinlog, match=says) as raised:
        reader._read(_Events("mysql-bin.000003", 1200, [event]))
    assert "mysql-bin.000003:1200" in str(raised.value)
    assert reader.position == start and reader.items.empty()


class _Events:
    """A stream stand-in: the events, and the position the library reports."""

    def __init__(self, log_file: str, log_pos: int, events: list) -> None:
        self.log_file, self.log_pos, self._events = log_file, log_pos, events

    def __iter__(self):
        return iter(self._events)


@pytest.mark.parametrize(
    ("decoded", "fsp", "text"),
    [
        # mysql-replication decodes a negative TIME2 fraction as its complement (-1.250 -> -1.75 s)
        (-dt.timedelta(seconds=1, microseconds=750_000), 3, "-00:00:01.250"),
        (-dt.timedelta(seconds=1, microseconds=876_544), 6, "-00:00:01.123456"),
        (-dt.timedelta(microseconds=750_000), 3, "-00:00:00.250"),
        (-dt.timedelta(seconds=1, microseconds=500_000), 1, "-00:00:01.5"),
        (-dt.timedelta(hours=838, minutes=59, seconds=59), 0, "-838:59:59"),
        (dt.timedelta(hours=1, minutes=2, seconds=3, microseconds=4000), 3, "01:02:03.004"),
    ],
)
def test_time2_values_take_mysqls_text(decoded: dt.timedelta, fsp: int, text: str) -> None:
    from pymysqlreplication.constants import FIELD_TYPE

    from jobs.cdc.binlog_values import selected_row

    column = _column("t", FIELD_TYPE.TIME2, fsp=fsp)
    assert selected_row({"values": {"t": decoded}, "none_sources": {}}, [column])["values"]["t"] == text


@pytest.mark.parametrize(
    ("value", "text"),
    [  # MySQL's own output for a JSON double (SELECT CAST('[x]' AS JSON))
        (2.5, "2.5"),
        (3.0, "3.0"),
        (-0.0, "-0.0"),
        (0.00005, "0.00005"),
        (2.5e-7, "0.00000025"),
        (1e-16, "1e-16"),
        (1e15, "1e15"),
        (123456789012345.6, "123456789012345.6"),
        (1e300, "1e300"),
        (-2.5e-16, "-2.5e-16"),
    ],
)
def test_json_doubles_print_as_mysql_prints_them(value: float, text: str) -> None:
    from jobs.cdc.binlog_values import json_text

    assert json_text(value) == text


def test_json_opaque_temporals_and_char_bytes() -> None:
    from pymysqlreplication.constants import FIELD_TYPE

    from jobs.cdc.binlog_values import json_text, selected_row

    assert json_text([dt.time(23, 24, 25), dt.datetime(2015, 1, 15, 23, 24, 25)]) == (
        '["23:24:25.000000", "2015-01-15 23:24:25.000000"]'
    )
    # CHAR in a charset Python cannot decode stays bytes, unpadded: only BINARY(n) is padded.
    char = _column("c", FIELD_TYPE.STRING, max_length=8, charset="swe7")
    assert selected_row({"values": {"c": b"ab"}, "none_sources": {}}, [char])["values"]["c"] == b"ab"


class _VariablesConnection:
    """A connection whose SHOW GLOBAL VARIABLES answers with `values` (a MySQL or MariaDB server)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def cursor(self):
        values = self.values

        class Cursor:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def execute(self, sql, args=None):
                pass

            def fetchall(self):
                return list(values.items())

        return Cursor()


MYSQL_OK = {
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
    "binlog_transaction_compression": "OFF",
    "binlog_order_commits": "ON",
}


def test_mysql_needs_commits_visible_in_binlog_order_for_the_snapshot_barrier() -> None:
    from jobs.cdc.source_db import binlog_setting_problems

    assert binlog_setting_problems(_VariablesConnection(MYSQL_OK)) == []
    unordered = {**MYSQL_OK, "binlog_order_commits": "OFF"}
    assert binlog_setting_problems(_VariablesConnection(unordered)) == ["binlog_order_commits=OFF (needs ON)"]
    # MariaDB has no such variable: it always commits in binlog order.
    mariadb = {
        k: v
        for k, v in MYSQL_OK.items()
        if k not in ("binlog_order_commits", "binlog_transaction_compression")
    }
    assert binlog_setting_problems(_VariablesConnection({**mariadb, "log_bin_compress": "OFF"})) == []


def test_snapshot_progress_keys_round_trip_as_the_values_they_were() -> None:
    """A resumed snapshot continues after the stored key; MySQL must compare it as the first run
    did (a decimal as text is compared as a double, a TIME as `str(timedelta)` does not parse)."""
    from jobs.cdc.snapshot import WHOLE_TABLE, KeyRange, SnapshotProgress

    position = BinlogPosition("mysql-bin.000003", 4711, "0-1-42")
    after = (
        7,
        "k00010",
        Decimal("1000000000000000000001.2500"),
        dt.datetime(2026, 1, 2, 3, 4, 5, 6),
        dt.date(2026, 1, 2),
        dt.timedelta(days=-2, seconds=64800, microseconds=5),
        b"\x00\xff",
        None,
    )
    upto = (8, "k", Decimal("1E+21"), dt.datetime(2027, 1, 1), dt.date(2027, 1, 1), dt.timedelta(0), b"", 0)
    ranges = (KeyRange(after, upto), KeyRange(upto, None, done=True))
    progress = SnapshotProgress(position, ranges, 20_000, 20)
    back = SnapshotProgress.from_json(progress.to_json())
    assert back.position == position and (back.rows, back.chunks) == (20_000, 20)
    assert back.ranges == ranges
    assert [type(v) for v in back.ranges[0].after] == [type(v) for v in after]
    assert [type(v) for v in back.ranges[1].after] == [type(v) for v in upto]
    assert SnapshotProgress.from_json(SnapshotProgress(position, WHOLE_TABLE, 0, 0).to_json()).ranges == (
        KeyRange(None, None, False),
    )
    # An earlier version's progress: one last key, the whole table left after it.
    earlier = json.dumps({"position": json.loads(position.to_json()), "after": [7], "rows": 5, "chunks": 1})
    assert SnapshotProgress.from_json(earlier).ranges == (KeyRange((7,), None, False),)
    # And back (a rollback): one range still stores `after`, which an earlier version resumes after;
    # several ranges do not, and an earlier version stops on them instead of resuming wrongly.
    one = json.loads(SnapshotProgress(position, (KeyRange((7,)),), 5, 1).to_json())
    assert one["after"] == [7]
    assert "after" not in json.loads(progress.to_json())
    # Progress an earlier version stored as text still reads, marked: such a snapshot starts over.
    legacy = keys_from_json([{"text": "1.2500"}, {"hex": "00ff"}])
    assert legacy == ("1.2500", b"\x00\xff") and isinstance(legacy[0], StoredAsText)
    assert not any(isinstance(v, StoredAsText) for v in keys_from_json(keys_to_json(after)))
    with pytest.raises(TypeError, match="type object cannot be stored"):
        keys_to_json((object(),))


# ---- schema change policies (jobs/cdc/schema_policy.py) ----------------------------------------------


def _col(name: str, kind: str, nullable: bool = True):
    from jobs.cdc.schema_mapping import SourceColumn

    return SourceColumn(name, kind, nullable)


@pytest.mark.parametrize(
    ("old", "new", "preserved"),
    [
        ("int", "bigint", True),
        ("tinyint", "int", True),
        ("int unsigned", "bigint", True),
        ("int unsigned", "int", False),
        ("bigint", "int", False),
        ("float", "double", True),
        ("decimal(10,4)", "decimal(14,4)", True),
        ("decimal(10,4)", "decimal(10,2)", False),
        ("varchar(10)", "varchar(50)", True),
        ("varchar(50)", "varchar(3)", False),
        ("varchar(50)", "text", True),
        ("text", "varchar(50)", False),
        ("datetime", "timestamp", False),
    ],
)
def test_which_type_changes_keep_every_value(old: str, new: str, preserved: bool) -> None:
    from jobs.cdc.schema_policy import preserves_values

    assert preserves_values(_col("c", old), _col("c", new)) is preserved


def test_tightening_to_not_null_rewrites_values() -> None:
    from jobs.cdc.schema_policy import preserves_values

    assert not preserves_values(_col("c", "int"), _col("c", "int", nullable=False))


def test_evolve_plans_each_change_and_stops_on_what_iceberg_cannot_follow() -> None:
    from jobs.cdc.ddl import ColumnChange
    from jobs.cdc.schema_policy import plan

    source = {"id": _col("id", "int"), "qty": _col("qty", "int"), "price": _col("price", "decimal(10,4)")}
    target = {"id": "int", "qty": "int", "price": "decimal(10,4)"}
    widen = (ColumnChange("retype", "qty", column=_col("qty", "bigint")),)
    assert [(a.kind, a.name) for a in plan(widen, "evolve", source, target, ("id",)).actions] == [
        ("promote", "qty")
    ]
    assert plan(widen, "evolve", source, target, ("id",)).resnapshot is None
    rescale = (ColumnChange("retype", "price", column=_col("price", "decimal(12,2)")),)
    assert "cannot promote" in plan(rescale, "evolve", source, target, ("id",)).stop
    to_text = (ColumnChange("retype", "qty", column=_col("qty", "varchar(10)")),)
    assert "cannot promote" in plan(to_text, "evolve", source, target, ("id",)).stop
    key = (ColumnChange("rename", "id", new_name="pk"),)
    assert "primary key" in plan(key, "evolve", source, target, ("id",)).stop
    drop = (ColumnChange("drop", "qty"),)
    assert plan(drop, "evolve", source, target, ("id",)).actions == []  # the lake keeps the column
    assert "strict" in plan(drop, "strict", source, target, ("id",)).stop
    add = (ColumnChange("add", "x", column=_col("x", "int"), fills_existing_rows=True),)
    assert plan(add, "ignore", source, target, ("id",)).actions == []
    assert plan(add, "ignore", source, target, ("id",)).resnapshot is None
    assert plan(add, "evolve", source, target, ("id",)).resnapshot


def test_a_later_clause_sees_the_names_an_earlier_one_gave() -> None:
    """`CHANGE qty quantity VARCHAR(10)` renames, then retypes the renamed column: the type check
    must find it under its new name (int -> string cannot be promoted: stop)."""
    from jobs.cdc.ddl import classify as parse
    from jobs.cdc.schema_policy import plan

    source = {"id": _col("id", "int"), "qty": _col("qty", "int"), "price": _col("price", "decimal(10,4)")}
    target = {"id": "int", "qty": "int", "price": "decimal(10,4)"}
    to_text = parse("ALTER TABLE t CHANGE qty quantity VARCHAR(10)").column_changes
    assert "cannot promote" in plan(to_text, "evolve", source, target, ("id",)).stop
    rounded = parse("ALTER TABLE t CHANGE price cost DECIMAL(12,4), CHANGE qty amount INT(11)").column_changes
    planned = plan(rounded, "evolve", source, target, ("id",))
    assert [(a.kind, a.name) for a in planned.actions] == [
        ("rename", "price"),
        ("promote", "cost"),
        ("rename", "qty"),
    ]
    assert planned.stop is None and planned.resnapshot is None


def test_a_name_the_lake_kept_for_a_dropped_column_re_snapshots() -> None:
    from jobs.cdc.ddl import classify as parse
    from jobs.cdc.schema_policy import plan

    source = {"id": _col("id", "int"), "a": _col("a", "int")}
    target = {"id": "int", "a": "int", "b": "string"}  # b: dropped in the source, kept in the lake
    assert plan(
        parse("ALTER TABLE t ADD COLUMN b INT").column_changes, "evolve", source, target, ("id",)
    ).resnapshot
    renamed = plan(
        parse("ALTER TABLE t RENAME COLUMN a TO b").column_changes, "evolve", source, target, ("id",)
    )
    assert renamed.resnapshot and renamed.actions == []
    same_statement = parse("ALTER TABLE t DROP COLUMN a, ADD COLUMN a VARCHAR(5)").column_changes
    assert plan(same_statement, "evolve", source, target, ("id",)).resnapshot
    case_only = parse("ALTER TABLE t RENAME COLUMN a TO A").column_changes
    assert "letter case" in plan(case_only, "evolve", source, target, ("id",)).stop


def test_a_type_change_against_columns_read_later_re_snapshots() -> None:
    """After a restart the source's columns were read after the statement: widening or not, the
    values may have been rewritten while CDC was away."""
    from jobs.cdc.ddl import classify as parse
    from jobs.cdc.schema_policy import plan

    widen = parse("ALTER TABLE t MODIFY qty BIGINT").column_changes
    source, target = {"qty": _col("qty", "bigint")}, {"qty": "int"}
    assert plan(widen, "evolve", source, target, ("id",), exact=True).resnapshot is None
    assert plan(widen, "evolve", source, target, ("id",), exact=False).resnapshot


def test_referential_actions_are_read_from_show_create_table() -> None:
    """The CDC user sees no REFERENTIAL_CONSTRAINTS rows on MariaDB: the actions come from the DDL."""
    from jobs.cdc.foreign_keys import referential_actions

    ddl = (
        "CREATE TABLE `c` (\n  `id` int(11) NOT NULL,\n  `p` int(11) DEFAULT NULL,\n  `q` int(11),\n"
        "  CONSTRAINT `c_ibfk_1` FOREIGN KEY (`p`) REFERENCES `p` (`id`) ON DELETE CASCADE,\n"
        "  CONSTRAINT `odd``name` FOREIGN KEY (`q`, `p`) REFERENCES `other`.`t` (`a`, `b`) "
        "ON DELETE SET NULL ON UPDATE CASCADE,\n"
        "  CONSTRAINT `plain` FOREIGN KEY (`q`) REFERENCES `p` (`id`)\n) ENGINE=InnoDB"
    )
    assert referential_actions(ddl) == [
        ("c_ibfk_1", "CASCADE", "RESTRICT"),
        ("odd`name", "SET NULL", "CASCADE"),
        ("plain", "RESTRICT", "RESTRICT"),
    ]


def test_cascade_values_are_the_old_and_new_referenced_values_of_deleted_or_re_keyed_parents() -> None:
    from datetime import datetime

    from jobs.cdc.change_batch import DELETE, UPSERT, RowChange, row_changes
    from jobs.cdc.foreign_keys import ForeignKey, cascade_values, key_text, unfollowed_parents

    fk = ForeignKey("f", ("db", "c"), ("p",), ("db", "p"), ("id",), "CASCADE", "CASCADE")
    changes = [
        RowChange(DELETE, (1,), {"id": 1, "v": 0}),
        RowChange(UPSERT, (2,), {"ID": 2, "v": 1}, before={"id": 2, "v": 0}),  # same key: nothing
        RowChange(UPSERT, (3,), {"id": 3}),  # an insert
        RowChange(DELETE, (None,), {"id": None}),  # a NULL references nothing
    ]
    assert cascade_values(fk, changes) == ({(1,)}, set())
    restrict = ForeignKey("f", ("db", "c"), ("p",), ("db", "p"), ("id",), "RESTRICT", "RESTRICT")
    assert cascade_values(restrict, changes) == (set(), set())
    # a primary-key update: a delete of the old key and an upsert carrying both images
    moved = row_changes("update", [{"before_values": {"id": 3}, "after_values": {"id": 60}}], ("id",))
    assert cascade_values(fk, moved) == ({(3,)}, {(60,)})
    set_null = ForeignKey("f", ("db", "c"), ("p",), ("db", "p"), ("id",), "SET NULL", "SET NULL")
    assert cascade_values(set_null, moved) == ({(3,)}, set())  # SET NULL moves nothing anywhere
    # keys compare alike from Spark (bytearray, local time) and from PyMySQL or the binlog (bytes, UTC)
    from jobs.cdc.foreign_keys import as_binlog_values

    spark_row = as_binlog_values({"k": bytearray(b"\x01")})
    assert spark_row == {"k": b"\x01"} and key_text(spark_row, ("k",)) == key_text({"K": b"\x01"}, ("k",))
    assert key_text({"k": datetime(2026, 1, 2, 3, 4, 5)}, ("k",)) == ("2026-01-02T03:04:05",)
    assert unfollowed_parents([fk, restrict], {("db", "c")}) == {("db", "c"): fk}
    assert unfollowed_parents([fk], {("db", "c"), ("db", "p")}) == {}


# ---- the write mode per table (jobs/cdc/target_table.py) -----------------------------------------


@pytest.mark.parametrize(
    ("table", "rows", "current", "mode"),
    [
        ("lakehouse.dim_db.user_member", 10_000, None, "copy-on-write"),  # small: rewrites are cheap
        ("lakehouse.dim_db.orders", 1_000_000, "copy-on-write", "merge-on-read"),  # large and busy
        ("lakehouse.dim_db.orders", None, None, "copy-on-write"),  # no snapshot yet
        ("lakehouse.dim_db.orders", 900_000, "merge-on-read", "merge-on-read"),  # never flips back
        ("lakehouse.dim_db.products", 50_000_000, None, "copy-on-write"),  # the ingest's join, every batch
        ("lakehouse.dim_db.products", 50_000_000, "merge-on-read", "copy-on-write"),
    ],
)
def test_a_table_turns_merge_on_read_at_its_size_unless_the_ingest_joins_it(table, rows, current, mode):
    from jobs.cdc.target_table import write_mode

    assert write_mode(table, rows, current) == mode


def test_a_paced_read_rests_its_ratio_of_each_chunks_read(monkeypatch) -> None:
    """`read_pieces` with `rest_ratio` r: after a chunk read in t seconds, a rest of r * t (gh-ost's
    `--nice-ratio`), summed per piece; none at full speed."""
    from jobs.cdc import chunk_reader
    from jobs.cdc.source_db import SourceTable

    clock, rests = [0.0], []
    reads = iter([0.2, 0.1, 0.3])  # seconds each chunk's read takes

    class Time:
        @staticmethod
        def monotonic() -> float:
            return clock[0]

        @staticmethod
        def sleep(seconds: float) -> None:
            rests.append(seconds)
            clock[0] += seconds

    def read_chunk(conn, source, after, chunk_rows, upto):
        clock[0] += next(reads)
        start = after[0] if after else 0
        rows = [(k,) for k in range(start + 1, start + 1 + (chunk_rows if start < 20 else 5))]
        return rows, (rows[-1][0],)

    monkeypatch.setattr(chunk_reader, "time", Time)
    monkeypatch.setattr(chunk_reader.source_db, "read_chunk", read_chunk)
    table = SourceTable("s", "t", (), ("id",))
    pieces = list(chunk_reader.read_pieces(None, table, None, 10, 20, None, rest_ratio=1.5))
    assert rests == pytest.approx([0.3, 0.15, 0.45])
    assert [(len(rows), done, rested) for rows, _, _, done, rested in pieces] == [
        (10, False, pytest.approx(0.3)),
        (15, True, pytest.approx(0.6)),
    ]
