"""Thin I/O over the source MySQL/MariaDB: credentials, table shape, binlog position, table reads."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass

import pymysql

from jobs.cdc.schema_mapping import SourceColumn
from jobs.config import ConfigError, LakehouseConfig


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str

    def __repr__(self) -> str:  # never in logs
        return f"Credentials(user={self.user!r})"


@dataclass(frozen=True)
class SourceTable:
    schema: str
    name: str
    columns: tuple[SourceColumn, ...]
    key: tuple[str, ...]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


def cdc_credentials(config: LakehouseConfig) -> Credentials:
    """The CDC user: from the local state file, or the Secrets Manager secret named in config."""
    mysql = config.mysql
    if mysql.cdc_user and mysql.cdc_password:
        return Credentials(mysql.cdc_user, mysql.cdc_password)
    if mysql.cdc_secret_id:
        import boto3

        client = boto3.client("secretsmanager", region_name=config.region)
        secret = json.loads(client.get_secret_value(SecretId=mysql.cdc_secret_id)["SecretString"])
        return Credentials(secret["username"], secret["password"])
    raise ConfigError("no CDC credentials: run `lakehouse local up`, or pass --mysql-cdc-secret-id on AWS")


def connection_settings(config: LakehouseConfig, creds: Credentials) -> dict:
    return {
        "host": config.mysql.host,
        "port": config.mysql.port,
        "user": creds.user,
        "password": creds.password,
        "connect_timeout": 5,
        **config.mysql.tls_options(),
    }


# What the binlog reader needs of the source's binlog, and the accepted values (on RDS these are
# DB parameter group settings). Compressed transactions (MySQL 8.0.20+) and compressed events
# (MariaDB) are not decoded by python-mysql-replication: followed silently, they would vanish.
REQUIRED_BINLOG_SETTINGS: dict[str, tuple[str, ...]] = {
    "log_bin": ("ON", "1"),
    "binlog_format": ("ROW",),
    "binlog_row_image": ("FULL",),  # MINIMAL/NOBLOB leave columns out of the row images
    "binlog_row_metadata": ("FULL",),  # without it column names arrive as UNKNOWN_COLn
    "binlog_transaction_compression": ("OFF", "0"),  # MySQL
    "log_bin_compress": ("OFF", "0"),  # MariaDB
    # The snapshot's barrier (snapshot.py) relies on commits becoming visible in binlog order:
    # MySQL's default; MariaDB always commits in binlog order (no such variable).
    "binlog_order_commits": ("ON", "1"),
}
_ONE_SERVER_ONLY = {"binlog_transaction_compression", "log_bin_compress", "binlog_order_commits"}


def binlog_setting_problems(conn: pymysql.Connection) -> list[str]:
    """`name=value (needs X)` for every binlog setting CDC cannot follow (empty: all good)."""
    names = ", ".join(f"'{name}'" for name in REQUIRED_BINLOG_SETTINGS)
    with conn.cursor() as cur:
        cur.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")
        values = {str(name).lower(): str(value).upper() for name, value in cur.fetchall()}
    problems = []
    for name, accepted in REQUIRED_BINLOG_SETTINGS.items():
        value = values.get(name)
        if value is None and name not in _ONE_SERVER_ONLY:
            problems.append(f"{name} is not available (needs {accepted[0]})")
        elif value is not None and value not in accepted:
            problems.append(f"{name}={value} (needs {accepted[0]})")
    return problems


def require_binlog_settings(conn: pymysql.Connection) -> None:
    problems = binlog_setting_problems(conn)
    if problems:
        raise ConfigError(
            f"the source's binlog cannot be followed: {'; '.join(problems)}. Change the server's "
            "settings (on RDS: the DB parameter group) and start CDC again"
        )


# Refusals that waiting cannot fix: access denied (1044, 1045, 1698), unknown database (1049).
REFUSALS = frozenset({1044, 1045, 1049, 1698})


def connect(config: LakehouseConfig, creds: Credentials) -> pymysql.Connection:
    """A connection for the CDC user. Raises ConfigError (not retried) when the server refuses the
    credentials, pymysql's OperationalError (retried by callers) when it cannot be reached."""
    try:
        return connect_with(connection_settings(config, creds))
    except pymysql.err.OperationalError as exc:
        if exc.args and exc.args[0] in REFUSALS:
            raise ConfigError(
                f"MySQL {config.mysql.host}:{config.mysql.port} refused user {creds.user!r}: {exc.args[1]}. "
                "Check the CDC credentials (locally `lakehouse local status --json --show-secrets`, on "
                "AWS the secret given by --mysql-cdc-secret-id)"
            ) from None
        raise


# The processlist's Command of a binlog dump thread (a replica or a CDC reader streaming the binlog):
# MySQL's and MariaDB's names. A user sees its own threads without the PROCESS privilege
# (https://dev.mysql.com/doc/refman/8.4/en/show-processlist.html,
# https://mariadb.com/kb/en/show-processlist/).
BINLOG_DUMP_COMMANDS = ("Binlog Dump", "Binlog Dump GTID")


def binlog_readers(conn: pymysql.Connection, user: str) -> list[tuple[int, str, int]]:
    """(thread id, client host:port, seconds connected) of every binlog reader connected as `user`.
    SHOW PROCESSLIST, not information_schema's (deprecated in MySQL 8): Id, User, Host, db, Command,
    Time come first on both servers."""
    with conn.cursor() as cur:
        cur.execute("SHOW PROCESSLIST")
        rows = cur.fetchall()
    return [
        (int(row[0]), str(row[2]), int(row[5] or 0))
        for row in rows
        if row[1] == user and row[4] in BINLOG_DUMP_COMMANDS
    ]


def connect_with(settings: dict) -> pymysql.Connection:
    """A connection from `connection_settings` (also in the snapshot's reader process)."""
    # The settings may carry keys of their own for these (the binlog library adds its charset).
    conn = pymysql.connect(**{**settings, "autocommit": True, "charset": "utf8mb4"})
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")  # TIMESTAMPs as UTC wall time, like the binlog
    return conn


class MissingTable(ConfigError):
    """The table is not in the source (or the CDC user may not see it)."""


class NoPrimaryKey(ConfigError):
    """A table CDC cannot follow: without a key, an update or delete names no row in the lake."""


def list_tables(conn: pymysql.Connection, schemas: tuple[str, ...] | None) -> list[tuple[str, str]]:
    """(schema, table) of the base tables the CDC user can see (views and sequences are not synced),
    in the given schemas or, with None, in all of them."""
    where, args = "", ()
    if schemas is not None:
        if not schemas:
            return []
        where = f" AND TABLE_SCHEMA IN ({', '.join(['%s'] * len(schemas))})"
        args = tuple(schemas)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
            f"WHERE TABLE_TYPE = 'BASE TABLE'{where} ORDER BY TABLE_SCHEMA, TABLE_NAME",
            args,
        )
        return [(r[0], r[1]) for r in cur.fetchall()]


def rows_by_key(
    connect, schema: str, name: str, key: tuple[str, ...], keys: list[tuple], chunk: int = 500
) -> dict[tuple[str, ...], dict]:
    """The source's rows of these primary keys now, by `foreign_keys.key_text` (so the lake's values
    and the source's compare whatever their Python types)."""
    return _rows_in(connect, schema, name, key, key, keys, chunk)


def rows_where(
    connect, schema: str, name: str, key: tuple[str, ...], columns: tuple[str, ...], values: list[tuple]
) -> dict[tuple[str, ...], dict]:
    """The source's rows whose `columns` hold one of `values` now, by their primary key's text."""
    return _rows_in(connect, schema, name, key, columns, values, 500)


def _rows_in(connect, schema, name, key, columns, values, chunk) -> dict[tuple[str, ...], dict]:
    from jobs.cdc.foreign_keys import key_text

    if not values:
        return {}
    found: dict[tuple[str, ...], dict] = {}
    conn = connect()
    try:
        with conn.cursor() as cur:
            for start in range(0, len(values), chunk):
                part = values[start : start + chunk]
                row = "(" + ", ".join(["%s"] * len(columns)) + ")"
                try:
                    cur.execute(
                        f"SELECT * FROM {_quoted(schema)}.{_quoted(name)} WHERE "
                        f"({', '.join(map(_quoted, columns))}) IN ({', '.join([row] * len(part))})",
                        [value for tuple_ in part for value in tuple_],
                    )
                except pymysql.err.ProgrammingError as exc:
                    if exc.args[0] == NO_SUCH_TABLE:
                        raise MissingTable(f"source table {schema}.{name} does not exist") from exc
                    raise
                names = [d[0] for d in cur.description]
                for record in cur.fetchall():
                    as_dict = dict(zip(names, record, strict=True))
                    found[key_text(as_dict, key)] = as_dict
    finally:
        conn.close()
    return found


def table_exists(conn: pymysql.Connection, schema: str, name: str) -> bool:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (schema, name),
        )
        return cur.fetchone() is not None


def describe_table(conn: pymysql.Connection, schema: str, name: str) -> SourceTable:
    with conn.cursor() as cur:
        cur.execute(
            """SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_KEY FROM information_schema.COLUMNS
               WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION""",
            (schema, name),
        )
        rows = cur.fetchall()
        cur.execute(
            """SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE
               WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY'
               ORDER BY ORDINAL_POSITION""",
            (schema, name),
        )
        key = tuple(r[0] for r in cur.fetchall())
    if not rows:
        raise MissingTable(f"source table {schema}.{name} does not exist")
    if not key:
        raise NoPrimaryKey(
            f"source table {schema}.{name} has no primary key: CDC applies changes by key; add one "
            f"(ALTER TABLE {schema}.{name} ADD PRIMARY KEY (...)) or leave the table out (--exclude)"
        )
    columns = tuple(SourceColumn(r[0], r[1], r[2] == "YES") for r in rows)
    return SourceTable(schema, name, columns, key)


MYSQL_PARSE_ERROR = 1064
NO_SUCH_TABLE = 1146


def master_position(conn: pymysql.Connection) -> tuple[str, int, str]:
    """(binlog file, position, GTID set) at the end of the binlog right now."""
    with conn.cursor() as cur:
        try:
            cur.execute("SHOW BINARY LOG STATUS")  # MySQL 8.2+; 8.4 (RDS) has no SHOW MASTER STATUS
        except pymysql.err.ProgrammingError as exc:
            if not exc.args or exc.args[0] != MYSQL_PARSE_ERROR:
                raise
            cur.execute("SHOW MASTER STATUS")  # MariaDB, MySQL 8.0
        row = cur.fetchone()
        if row is None:
            raise ConfigError("the source has no binary log: enable log_bin with binlog_format=ROW")
        file, position = row[0], int(row[1])
        # The GTID set of exactly that position, not read apart from it: a transaction committing
        # between two reads would be inside the GTID set and after the file position, and a resume
        # by GTID would skip it. MySQL's status row carries it (Executed_Gtid_Set); MariaDB computes
        # it from the file and offset.
        if len(row) > 4:
            return file, position, (row[4] or "").replace("\n", "")
        try:
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, position))  # MariaDB
            gtid = cur.fetchone()[0] or ""
        except pymysql.MySQLError:
            cur.execute("SELECT @@global.gtid_executed")  # a MySQL without the column (not seen)
            gtid = cur.fetchone()[0] or ""
    return file, position, gtid


def binary_logs(conn: pymysql.Connection) -> dict[str, int]:
    """Binlog file -> its size in bytes (SHOW BINARY LOGS), oldest first.

    The file being written can report less than what has been committed to it (not yet flushed),
    so its size is the end position from the binary log status, read after it.
    """
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        logs = {r[0]: int(r[1]) for r in cur.fetchall()}
    file, pos, _gtid = master_position(conn)
    logs[file] = max(logs.get(file, 0), pos)
    return logs


def is_mariadb(conn: pymysql.Connection) -> bool:
    return "mariadb" in conn.get_server_info().lower()


def lower_case_table_names(conn: pymysql.Connection) -> int:
    """0: table names are case-sensitive; 1: stored in lower case; 2: compared in lower case."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@lower_case_table_names")
        return int(cur.fetchone()[0])


def mariadb_gtid_state(conn: pymysql.Connection) -> str:
    """MariaDB's GTID state at the end of its binlog (last GTID per domain)."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        return cur.fetchone()[0] or ""


# CDC's one write on the source: its snapshot barrier (infra/seed_data.py creates it and grants
# SELECT, INSERT, UPDATE on it to the CDC user, on RDS and locally alike; a test keeps the names equal).
SNAPSHOT_BARRIER = "lakehouse_meta.cdc_snapshot_barrier"
# pymysql error numbers that mean the barrier table is missing or not writable by this user.
_BARRIER_REFUSALS = frozenset({1044, 1049, 1142, 1143, 1146, 1290})  # 1290: read-only server


def write_barrier(conn: pymysql.Connection) -> None:
    """Commit one write and return once it is committed (the connection autocommits)."""
    try:
        with conn.cursor() as cur:
            cur.execute(
                # Always a change (a row written in the same microsecond would not be one).
                f"INSERT INTO {SNAPSHOT_BARRIER} (id, written_at) VALUES (1, NOW(6)) "
                "ON DUPLICATE KEY UPDATE written_at = GREATEST(NOW(6), written_at + INTERVAL 1 MICROSECOND)"
            )
    except (pymysql.err.ProgrammingError, pymysql.err.OperationalError) as exc:
        if not exc.args or exc.args[0] not in _BARRIER_REFUSALS:
            raise
        database = SNAPSHOT_BARRIER.split(".")[0]
        raise ConfigError(
            f"CDC's snapshot cannot write its barrier row to {SNAPSHOT_BARRIER} ({exc.args[1]}). As an "
            f"administrator run: CREATE DATABASE IF NOT EXISTS {database}; CREATE TABLE IF NOT EXISTS "
            f"{SNAPSHOT_BARRIER} (id TINYINT PRIMARY KEY, written_at TIMESTAMP(6) NOT NULL); "
            f"GRANT SELECT, INSERT, UPDATE ON {SNAPSHOT_BARRIER} TO <the CDC user>. (On AWS the "
            "SourceDatabase stack's seeding does this: `cdk deploy` it again.)"
        ) from None


def estimated_rows(conn: pymysql.Connection, table: SourceTable) -> int:
    """InnoDB's estimate of the table's rows (free; exact counts cost a full scan)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (table.schema, table.name),
        )
        row = cur.fetchone()
    return int(row[0] or 0) if row else 0


def select_expression(column: SourceColumn) -> str:
    """How the snapshot selects `column` so it reads as the binlog decodes it (`binlog_values`).
    FLOAT: as DOUBLE, since the text protocol prints a FLOAT with 6 digits (123456.789 -> 123457)
    while the binlog holds its exact value. TIME: as MySQL's text, with the column's fractional
    digits (the driver's timedelta has no precision)."""
    quoted = "`" + column.name.replace("`", "``") + "`"
    if column.base_type == "float":
        return f"CAST({quoted} AS DOUBLE)"
    if column.base_type == "time":
        return f"CAST({quoted} AS CHAR)"
    return quoted


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _continuation(column: SourceColumn) -> tuple[str, str]:
    """How a key column's last value is read and compared again, so that `(keys) > (last)` orders
    as `ORDER BY keys` does: an ENUM, SET or BIT by its number (ORDER BY sorts an ENUM by declared
    position, while its text compares as text), a FLOAT as the DOUBLE it is exactly (the text
    protocol prints 6 digits), a TIME as a TIME (sent as text)."""
    quoted = _quoted(column.name)
    if column.base_type in ("enum", "set", "bit"):
        return f"{quoted}+0", "%s"
    if column.base_type == "float":
        return f"CAST({quoted} AS DOUBLE)", "%s"
    if column.base_type == "time":
        return quoted, "CAST(%s AS TIME(6))"
    return quoted, "%s"


def _key_argument(value: object) -> object:
    """A key value as pymysql should send it. pymysql renders a negative timedelta wrongly (-1 s
    as '-1:59:59'), so a TIME goes as its exact text, which MySQL converts to the column's TIME."""
    if isinstance(value, datetime.timedelta):
        sign, span = ("-", -value) if value < datetime.timedelta(0) else ("", value)
        seconds, micros = divmod(span // datetime.timedelta(microseconds=1), 1_000_000)
        return f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{micros:06d}"
    return value


INTEGER_TYPES = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint")


def split_points(conn: pymysql.Connection, table: SourceTable, parts: int) -> list[tuple]:
    """Keys that cut the table's key range into up to `parts` ranges of equal width, for readers
    reading side by side: the ranges are (None, p1], (p1, p2], …, (pn, None). Only a key of one
    integer column has a width (MIN and MAX come from the index's ends); any other key, or a range
    narrower than `parts`, is one range (no points)."""
    if parts < 2 or len(table.key) != 1:
        return []
    column = next(c for c in table.columns if c.name == table.key[0])
    if column.base_type not in INTEGER_TYPES:
        return []
    key = _quoted(column.name)
    with conn.cursor() as cur:
        cur.execute(f"SELECT MIN({key}), MAX({key}) FROM {_quoted(table.schema)}.{_quoted(table.name)}")
        low, high = cur.fetchone()
    if low is None or high - low < parts:
        return []
    return [(low + (high - low) * i // parts,) for i in range(1, parts)]


def read_chunk(
    conn: pymysql.Connection, table: SourceTable, after: tuple | None, rows: int, upto: tuple | None = None
) -> tuple[list[tuple], tuple | None]:
    """The next `rows` rows by primary key after the key `after` (None: from the start) and up to
    the key `upto` included (None: to the end), in column order, and the last key read (None when
    the range has no more rows). One statement on its own (autocommit): its read view lives only
    while it runs, it takes no lock, and with the key's index it reads only the chunk (a row
    comparison `(k1, k2) > (…)` is an index range since MySQL 5.7)."""
    selects = [select_expression(c) for c in table.columns]
    keys = ", ".join(_quoted(k) for k in table.key)
    position = {c.name: i for i, c in enumerate(table.columns)}
    continuation = [_continuation(table.columns[position[k]]) for k in table.key]
    # Each key column as the WHERE compares it: the column as selected when that is the same
    # expression (most keys), else that expression selected once more after the columns.
    extra: list[str] = []
    key_at: list[int] = []
    for key, (select, _) in zip(table.key, continuation, strict=True):
        if select == selects[position[key]]:
            key_at.append(position[key])
        else:
            key_at.append(len(selects) + len(extra))
            extra.append(select)
    placeholders = ", ".join(placeholder for _, placeholder in continuation)
    conditions, args = [], []
    if after is not None:
        conditions.append(f"({keys}) > ({placeholders})")
        args += [_key_argument(v) for v in after]
    if upto is not None:
        conditions.append(f"({keys}) <= ({placeholders})")
        args += [_key_argument(v) for v in upto]
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    with conn.cursor() as cur:
        try:
            cur.execute(
                f"SELECT {', '.join([*selects, *extra])} "
                f"FROM {_quoted(table.schema)}.{_quoted(table.name)} "
                f"{where} ORDER BY {keys} LIMIT {int(rows)}",
                tuple(args),
            )
        except pymysql.err.ProgrammingError as exc:
            if exc.args and exc.args[0] == NO_SUCH_TABLE:  # dropped while it was being read
                raise MissingTable(f"source table {table.qualified} was dropped while read") from None
            raise
        fetched = cur.fetchall()
    last = tuple(fetched[-1][i] for i in key_at) if fetched else None
    if extra:
        width = len(selects)
        fetched = [row[:width] for row in fetched]
    return list(fetched), last
