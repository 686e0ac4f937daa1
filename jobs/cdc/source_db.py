"""Thin I/O over the source MySQL/MariaDB: credentials, table shape, binlog position, table reads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
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
}
_ONE_SERVER_ONLY = {"binlog_transaction_compression", "log_bin_compress"}


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
        conn = pymysql.connect(
            host=config.mysql.host,
            port=config.mysql.port,
            user=creds.user,
            password=creds.password,
            connect_timeout=5,
            autocommit=True,
            charset="utf8mb4",
            **config.mysql.tls_options(),
        )
    except pymysql.err.OperationalError as exc:
        if exc.args and exc.args[0] in REFUSALS:
            raise ConfigError(
                f"MySQL {config.mysql.host}:{config.mysql.port} refused user {creds.user!r}: {exc.args[1]}. "
                "Check the CDC credentials (locally in `lakehouse local status --json`, on AWS the "
                "secret given by --mysql-cdc-secret-id)"
            ) from None
        raise
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")  # TIMESTAMPs as UTC wall time, like the binlog
    return conn


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
        raise ConfigError(f"source table {schema}.{name} does not exist")
    if not key:
        raise ConfigError(f"source table {schema}.{name} has no primary key: CDC needs one to MERGE on")
    columns = tuple(SourceColumn(r[0], r[1], r[2] == "YES") for r in rows)
    return SourceTable(schema, name, columns, key)


MYSQL_PARSE_ERROR = 1064


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
        gtid = ""
        try:
            cur.execute("SELECT @@gtid_binlog_pos")  # MariaDB
            gtid = cur.fetchone()[0] or ""
        except pymysql.MySQLError:
            cur.execute("SELECT @@global.gtid_executed")  # MySQL
            gtid = cur.fetchone()[0] or ""
    return row[0], int(row[1]), gtid


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


def mariadb_gtid_state(conn: pymysql.Connection) -> str:
    """MariaDB's GTID state at the end of its binlog (last GTID per domain)."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        return cur.fetchone()[0] or ""


@contextmanager
def consistent_snapshot(conn: pymysql.Connection) -> Iterator[tuple[str, int, str]]:
    """A transaction whose reads see the source exactly at the yielded (file, pos, GTID state).

    MariaDB reports the binlog position of its consistent snapshot itself. MySQL has no such
    status: commits are blocked (FLUSH TABLES WITH READ LOCK, needs RELOAD) while the snapshot
    starts and the position is read; where that is not allowed (RDS), the position is read before
    the snapshot starts, so changes in between are replayed (row images are idempotent) - only a
    transaction written to the binlog but not yet visible at that instant could be missed.
    """
    with conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        if is_mariadb(conn):
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = {name.lower(): value for name, value in cur.fetchall()}
            file, pos = status["binlog_snapshot_file"], int(status["binlog_snapshot_position"])
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, pos))
            gtid = cur.fetchone()[0] or ""
        else:
            locked = _try_global_read_lock(cur)
            try:
                if not locked:
                    file, pos, gtid = master_position(conn)
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                if locked:
                    file, pos, gtid = master_position(conn)
            finally:
                if locked:
                    cur.execute("UNLOCK TABLES")
    try:
        yield file, pos, gtid
    finally:
        with conn.cursor() as cur:
            cur.execute("COMMIT")


def _try_global_read_lock(cur) -> bool:
    try:
        cur.execute("FLUSH TABLES WITH READ LOCK")
        return True
    except pymysql.err.OperationalError:  # no RELOAD privilege (e.g. RDS)
        return False


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


def read_rows(conn: pymysql.Connection, table: SourceTable, fetch: int = 5000) -> Iterator[tuple]:
    """All rows of `table` in column order, streamed (unbuffered cursor)."""
    cols = ", ".join(select_expression(c) for c in table.columns)
    with conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(f"SELECT {cols} FROM `{table.schema}`.`{table.name}`")
        while True:
            batch = cur.fetchmany(fetch)
            if not batch:
                return
            yield from batch
