"""The local Iceberg catalog: Iceberg's JDBC catalog schema in one SQLite file.

Spark (JdbcCatalog), pyiceberg (SqlCatalog) and `lakehouse sql` (DuckDB) all read the same file.
Several jobs commit from separate processes, so the file runs in WAL mode (readers never block
the writer) and every client waits on a lock instead of failing (busy timeout).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping
from pathlib import Path

from jobs.config import CATALOG_NAME, NAMESPACES
from jobs.config import SQLITE_BUSY_TIMEOUT_MS as BUSY_TIMEOUT_MS

# Iceberg's JdbcCatalog schema V0 (the one pyiceberg's SqlCatalog also creates). Not V1: Iceberg
# 1.10's JdbcCatalog probes for V1's `iceberg_type` column with DatabaseMetaData.getColumns() and never
# closes the result set, so when the column exists that pooled SQLite connection keeps a read
# transaction open for good and its later commits fail with SQLITE_BUSY_SNAPSHOT. V1 only adds views,
# which this lake does not use. The same leak sits in its table-exists probe, hence
# `jdbc.init-catalog-tables=false` in the Spark conf: the schema is created here instead.
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS iceberg_tables (
         catalog_name VARCHAR(255) NOT NULL,
         table_namespace VARCHAR(255) NOT NULL,
         table_name VARCHAR(255) NOT NULL,
         metadata_location VARCHAR(1000),
         previous_metadata_location VARCHAR(1000),
         PRIMARY KEY (catalog_name, table_namespace, table_name))""",
    """CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
         catalog_name VARCHAR(255) NOT NULL,
         namespace VARCHAR(255) NOT NULL,
         property_key VARCHAR(255),
         property_value VARCHAR(1000),
         PRIMARY KEY (catalog_name, namespace, property_key))""",
)


def connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)


def ensure_catalog(path: Path, warehouse: Path, locations: Mapping[str, str] | None = None) -> None:
    """Create the catalog file, its schema and the namespaces (idempotent): `locations` maps each
    namespace to its location; default: the project's namespaces under `warehouse`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    warehouse.mkdir(parents=True, exist_ok=True)
    with connect(path) as conn:
        # Persistent in the file: every later connection, Java's included, uses WAL.
        conn.execute("PRAGMA journal_mode=WAL")
        for ddl in _SCHEMA:
            conn.execute(ddl)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(iceberg_tables)")}
        if "iceberg_type" in columns:  # state made by an earlier version with the V1 schema
            conn.execute("ALTER TABLE iceberg_tables DROP COLUMN iceberg_type")
        if locations is None:
            locations = {namespace: str(warehouse / f"{namespace}.db") for namespace in NAMESPACES}
        for namespace, location in locations.items():
            conn.execute(
                "INSERT OR IGNORE INTO iceberg_namespace_properties VALUES (?, ?, 'exists', 'true')",
                (CATALOG_NAME, namespace),
            )
            conn.execute(
                "INSERT OR IGNORE INTO iceberg_namespace_properties VALUES (?, ?, 'location', ?)",
                (CATALOG_NAME, namespace, location),
            )
    conn.close()


def journal_mode(path: Path) -> str:
    with connect(path) as conn:
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    conn.close()
    return mode


def namespaces(path: Path) -> list[str]:
    if not path.exists():
        return []
    with connect(path) as conn:
        rows = conn.execute(
            "SELECT DISTINCT namespace FROM iceberg_namespace_properties WHERE catalog_name = ?",
            (CATALOG_NAME,),
        ).fetchall()
    conn.close()
    return sorted(r[0] for r in rows)


def table_metadata_locations(path: Path) -> dict[str, str]:
    """`namespace.table` -> current metadata.json for every table in the catalog."""
    with connect(path) as conn:
        rows = conn.execute(
            "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables "
            "WHERE catalog_name = ?",
            (CATALOG_NAME,),
        ).fetchall()
    conn.close()
    return {f"{ns}.{name}": loc for ns, name, loc in rows}


def pyiceberg_catalog(path: Path, warehouse: Path):
    """A pyiceberg SqlCatalog over the same file (imported lazily: pyiceberg is heavy)."""
    from pyiceberg.catalog.sql import SqlCatalog

    # The file has the JdbcCatalog's V0 schema (tables, no views); pyiceberg warns on every open.
    logging.getLogger("pyiceberg.catalog.sql").setLevel(logging.ERROR)
    return SqlCatalog(
        CATALOG_NAME,
        uri=f"sqlite:///{path}?timeout={BUSY_TIMEOUT_MS // 1000}",
        warehouse=f"file://{warehouse}",
    )
