"""The Iceberg side of a synced table: creation, table properties, identifier fields, added columns."""

from __future__ import annotations

import logging

from jobs.cdc.schema_mapping import SourceColumn
from jobs.common import progress_keys
from jobs.common.lake_tables import PRODUCTS_TABLE, load_iceberg_table
from jobs.common.snapshot_progress import progress_as_of
from jobs.common.sql_text import identifier, properties

# Snapshot summary key holding the binlog position a commit brings the table up to (JSON: file,
# pos, gtid). Written in the same commit as the rows, so data and position never disagree.
POSITION_KEY = progress_keys.CDC_POSITION

log = logging.getLogger("cdc_sync")

# Tables are created copy-on-write: a MERGE rewrites the data files it touches and readers get plain
# data files. That suits the small dimensions (thousands of rows), and the products dimension the
# ingest joins on every micro-batch whatever its size. A large busy table is another matter: with
# updates spread over its keys, every one-second MERGE rewrites a large share of its files. So
# `write_mode` turns a table of MERGE_ON_READ_MIN_ROWS rows or more merge-on-read when CDC starts on
# it or publishes its snapshot: a MERGE then writes position delete files (format v2, which Spark
# on EMR, Trino and Athena all read), and table maintenance rewrites every data file that has
# deletes (jobs/maintain/procedures.py), so delete files never pile up past one maintenance period.
# Numbers: `make bench` (write_mode_bench).
TABLE_PROPERTIES = {
    "format-version": "2",
    "write.merge.mode": "copy-on-write",
    "write.update.mode": "copy-on-write",
    "write.delete.mode": "copy-on-write",
    # One commit per second at most: keep the metadata directory from growing without bound.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
}


WRITE_MODE_KEYS = ("write.merge.mode", "write.update.mode", "write.delete.mode")
MERGE_ON_READ_MIN_ROWS = 1_000_000
# Read in full by the ingest on every batch: stays copy-on-write whatever its size.
JOINED_EVERY_BATCH = frozenset({".".join(PRODUCTS_TABLE)})


def write_mode(table: str, rows: int | None, current: str | None) -> str:
    """ "copy-on-write" or "merge-on-read" for `table` (`catalog.namespace.name`) of `rows` rows (None:
    no snapshot yet) whose merge mode is `current`. Once merge-on-read, a table stays so: a table
    hovering around the threshold must not flip its mode on every start."""
    if ".".join(table.split(".")[-2:]) in JOINED_EVERY_BATCH:
        return "copy-on-write"
    if current == "merge-on-read" or (rows or 0) >= MERGE_ON_READ_MIN_ROWS:
        return "merge-on-read"
    return "copy-on-write"


# Table property naming the source table (`schema.table`) a CDC target mirrors.
SOURCE_PROPERTY = "lakehouse.cdc.source"


def synced_source(spark, target: str, database: str) -> str | None:
    """The source table (`schema.table`) the lake table `target` mirrors: its SOURCE_PROPERTY, or,
    for a `dim_db` table CDC made before it recorded that property, `<database>.<name>` when the
    table stores a binlog position. None: not a CDC table."""
    source = dict(spark.sql(f"SHOW TBLPROPERTIES {target}").collect()).get(SOURCE_PROPERTY)
    namespace, name = target.split(".")[-2:]
    if source is None and namespace == "dim_db" and progress_as_of(spark, target, None, POSITION_KEY):
        source = f"{database}.{name}"
    return source


# Table property: where the source table was dropped (`at <binlog position>`, or `after <position>
# (while the job was stopped)`). The lake table keeps its rows; CDC and verify leave it alone.
DROPPED_PROPERTY = "lakehouse.cdc.source-dropped"


# Table property (`--schema-changes ignore`): lake columns whose name a new source column took; their
# source values are never written (a comma-separated list, lower case).
UNSYNCED_PROPERTY = "lakehouse.cdc.unsynced-columns"


def set_unsynced_columns(spark, table: str, names: frozenset[str]) -> None:
    value = ",".join(sorted(names))
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({properties({UNSYNCED_PROPERTY: value})})")


def unsynced_columns(spark, table: str) -> frozenset[str]:
    value = dict(spark.sql(f"SHOW TBLPROPERTIES {table}").collect()).get(UNSYNCED_PROPERTY, "")
    return frozenset(n for n in value.split(",") if n)


# The parents whose changes cascade to this table in the source (InnoDB writes no row events for
# them): read while the source table exists, kept for when it is gone (the source forgets its keys).
CASCADED_FROM_PROPERTY = "lakehouse.cdc.cascaded-from"


def cascaded_from(spark, table: str) -> str:
    return dict(spark.sql(f"SHOW TBLPROPERTIES {table}").collect()).get(CASCADED_FROM_PROPERTY, "")


def set_cascaded_from(spark, table: str, parents: str) -> None:
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({properties({CASCADED_FROM_PROPERTY: parents})})")


def clear_marks(spark, table: str) -> None:
    """A table snapshotted anew mirrors its source again: no longer dropped, every column synced."""
    spark.sql(
        f"ALTER TABLE {table} UNSET TBLPROPERTIES IF EXISTS ('{DROPPED_PROPERTY}', '{UNSYNCED_PROPERTY}')"
    )


# Table properties: a resync asked of the running CDC job (`--request-resync`: when, UTC, and a
# unique suffix), and the last request the job answered. A request is pending while they differ; the
# job never removes the user's key, so a request made while it answers the last one is not lost.
RESYNC_REQUEST_PROPERTY = "lakehouse.cdc.resync-requested"
RESYNC_DONE_PROPERTY = "lakehouse.cdc.resync-done"


def pending_resync_request(spark, table: str) -> str | None:
    """The request not answered yet, or None; one catalog load (the job looks at every table)."""
    from jobs.common.lake_tables import load_iceberg_table

    props = load_iceberg_table(spark, table).properties()
    requested = props.get(RESYNC_REQUEST_PROPERTY)
    return requested if requested is not None and requested != props.get(RESYNC_DONE_PROPERTY) else None


def request_resync(spark, table: str, request: str) -> None:
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({properties({RESYNC_REQUEST_PROPERTY: request})})")


def answer_resync_request(spark, table: str, request: str) -> None:
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({properties({RESYNC_DONE_PROPERTY: request})})")


def mark_source_dropped(spark, table: str, where: str) -> None:
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({properties({DROPPED_PROPERTY: where})})")


def source_dropped(spark, table: str) -> str | None:
    """Where the lake table's source table was dropped, or None (still synced, or not a CDC table)."""
    return dict(spark.sql(f"SHOW TBLPROPERTIES {table}").collect()).get(DROPPED_PROPERTY)


def table_exists(spark, table: str) -> bool:
    return spark.catalog.tableExists(table)


def target_columns(spark, table: str) -> list[tuple[str, str]]:
    """(name, Spark SQL type) of the Iceberg table, in table order (always fresh: no catalog cache)."""
    return [(f.name, f.dataType.simpleString()) for f in spark.table(table).schema.fields]


def create_table(spark, table: str, columns: tuple[SourceColumn, ...], key: tuple[str, ...]) -> None:
    """Create the target if missing (another job may create it first: IF NOT EXISTS)."""
    create_iceberg_table(spark, table, [(c.name, c.spark_type) for c in columns], key)


def create_iceberg_table(spark, table: str, columns: list[tuple[str, str]], key: tuple[str, ...]) -> None:
    """A table of (name, Spark SQL type) columns, the key NOT NULL, with our table properties."""
    cols = ", ".join(
        f"{identifier(name)} {kind}{' NOT NULL' if name in key else ''}" for name, kind in columns
    )
    props = properties(TABLE_PROPERTIES)
    spark.sql(f"CREATE TABLE IF NOT EXISTS {table} ({cols}) USING iceberg TBLPROPERTIES ({props})")


def identifier_fields(spark, table: str) -> set[str]:
    """The lake table's identifier fields: the key CDC merges by (set from the source's primary key)."""
    return set(load_iceberg_table(spark, table).schema().identifierFieldNames())


def configure_table(spark, table: str, key: tuple[str, ...], source: str | None = None) -> None:
    """Our table properties and identifier fields = the primary key (also on a table others made);
    `source` (`schema.table`) is recorded as the table's SOURCE_PROPERTY (`lakehouse verify` reads it)."""
    current = dict(spark.sql(f"SHOW TBLPROPERTIES {table}").collect())
    iceberg = load_iceberg_table(spark, table)
    snapshot = iceberg.currentSnapshot()
    rows = int(snapshot.summary().get("total-records") or 0) if snapshot is not None else None
    mode = write_mode(table, rows, current.get("write.merge.mode"))
    values = {
        **TABLE_PROPERTIES,
        **dict.fromkeys(WRITE_MODE_KEYS, mode),
        **({SOURCE_PROPERTY: source} if source else {}),
    }
    wanted = {k: v for k, v in values.items() if k != "format-version" and current.get(k) != v}
    if current.get("format-version", "2") != "2":
        wanted["format-version"] = "2"
    if wanted:
        if mode != current.get("write.merge.mode", "copy-on-write"):
            log.info("%s: %s rows, writes %s from now on", table, f"{rows:,}" if rows else "no", mode)
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({properties(wanted)})")
        iceberg = load_iceberg_table(spark, table)
    jvm = spark.sparkContext._jvm
    if set(iceberg.schema().identifierFieldNames()) == set(key):
        return
    # A table created by someone else may have a nullable key column; the key is never null.
    update = iceberg.updateSchema().allowIncompatibleChanges()
    for column in key:
        update = update.requireColumn(column)
    fields = jvm.java.util.ArrayList()
    for column in key:
        fields.add(column)
    update.setIdentifierFields(fields).commit()


def add_columns(spark, table: str, columns: tuple[SourceColumn, ...]) -> list[str]:
    """Add the columns the table does not have yet (idempotent: a replayed ADD COLUMN is a no-op)."""
    existing = {name.lower() for name, _ in target_columns(spark, table)}
    added = []
    for column in columns:
        if column.name.lower() in existing:
            continue
        spark.sql(f"ALTER TABLE {table} ADD COLUMN {identifier(column.name)} {column.spark_type}")
        added.append(column.name)
    return added


def rename_column(spark, table: str, old: str, new: str) -> bool:
    """Rename `old` to `new` (idempotent: a replayed rename finds `new` already there)."""
    names = {name.lower() for name, _ in target_columns(spark, table)}
    if old.lower() not in names or new.lower() in names:
        return False
    spark.sql(f"ALTER TABLE {table} RENAME COLUMN {identifier(old)} TO {identifier(new)}")
    return True


def promote_column(spark, table: str, name: str, spark_type: str) -> bool:
    """Widen `name` to `spark_type` in place (Iceberg's promotions; idempotent)."""
    current = dict((n.lower(), t) for n, t in target_columns(spark, table)).get(name.lower())
    if current is None or current == spark_type:
        return False
    spark.sql(f"ALTER TABLE {table} ALTER COLUMN {identifier(name)} TYPE {spark_type}")
    return True
