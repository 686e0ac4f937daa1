"""`lakehouse sql`: ad-hoc queries over the local lake, the local stand-in for Trino/Athena.

DuckDB (default) starts in well under a second: every catalog table becomes a view
`namespace.table` over `iceberg_scan(<current metadata.json>)`. Spark is there for queries that
need Iceberg metadata tables or the exact engine the jobs use.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

from jobs.config import LakehouseConfig
from lakehouse.local import catalog


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]


def duckdb_connection(catalog_path: Path, extension_dir: Path):
    import duckdb
    from duckdb_extensions import import_extension

    extension_dir.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(
        config={
            "extension_directory": str(extension_dir),
            # Offline machines: never try to download an extension.
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        }
    )
    for name in ("avro", "iceberg"):
        import_extension(name, con=con)
        con.sql(f"LOAD {name}")
    for qualified, location in catalog.table_metadata_locations(catalog_path).items():
        namespace, table = qualified.split(".", 1)
        con.sql(f'CREATE SCHEMA IF NOT EXISTS "{namespace}"')
        con.sql(
            f'CREATE OR REPLACE VIEW "{namespace}"."{table}" AS SELECT * FROM iceberg_scan(\'{location}\')'
        )
    return con


def query_duckdb(config: LakehouseConfig, sql: str, extension_dir: Path) -> QueryResult:
    con = duckdb_connection(Path(config.catalog.sqlite_path or ""), extension_dir)
    try:
        relation = con.sql(sql)
        if relation is None:  # a statement without a result
            return QueryResult([], [])
        return QueryResult(list(relation.columns), relation.fetchall())
    finally:
        con.close()


def query_spark(config: LakehouseConfig, sql: str) -> QueryResult:
    from jobs.common.spark_session import build_spark

    spark = build_spark(config, "lakehouse-sql")
    frame = spark.sql(sql)
    return QueryResult(frame.columns, [tuple(row) for row in frame.collect()])


def _plain(value: object) -> object:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return value.hex()
    return value


def render(result: QueryResult, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(
            [{c: _plain(v) for c, v in zip(result.columns, row, strict=False)} for row in result.rows],
            indent=2,
        )
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(result.columns)
        writer.writerows([[_plain(v) for v in row] for row in result.rows])
        return out.getvalue().rstrip("\n")
    raise ValueError(f"unknown format {fmt!r}")


def rich_table(result: QueryResult, title: str | None = None):
    from rich.table import Table

    table = Table(title=title)
    for column in result.columns:
        table.add_column(column)
    for row in result.rows:
        table.add_row(*["NULL" if v is None else str(_plain(v)) for v in row])
    return table
