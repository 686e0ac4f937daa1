"""`lakehouse verify --repair` for the dimension tables: the differing keys only, beside the running CDC.

What verify found wrong in a CDC table is a set of keys whose lake rows cannot be explained by any
change CDC has yet to apply (`jobs/cdc/reconcile.py`: none of them changed in the binlog between the lake's
position P and the end E of verify's source read). For those keys the rows verify just read from
the source (the snapshot's lock-free chunk reader, converted as the snapshot converts) are the
source's rows as of E. The repair writes them in one commit:

- every lake row of each key is deleted and the source's row, if the source has one, inserted (a
  key the lake holds twice ends with one row; a key the source lacks ends with none);
- the commit carries `lineage.verify-repair` in its summary (what, how many, from which position),
  outside the `lakehouse.` progress keys, so snapshot expiry treats it like any data commit.

No race with the running CDC: CDC applies row images in binlog order, and an image overwrites the
whole row. If CDC's stored position is still at or before E when the repair commits, every later
change of these keys is applied after it. If CDC got past E meanwhile, the keys the binlog changed
between E and CDC's position are left to CDC (it already wrote newer rows). A CDC commit landing
between that check and the repair's commit could still be overwritten: verify checks the table
again after the repair and repairs what remains (at most `ROUNDS` times).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.cdc.binlog_reader import BinlogPosition
from jobs.cdc.position_commit import stored_position
from jobs.cdc.reconcile import canonical
from jobs.cdc.source_db import SourceTable
from jobs.common.lake_tables import REPAIR_KEY
from jobs.common.snapshot_progress import find_lineage, retry_commit, with_snapshot_properties
from jobs.common.sql_text import identifier

log = logging.getLogger("verify.repair")

# More differing keys than this: a re-snapshot (`lakehouse run cdc --resync`) is the better repair.
MAX_REPAIR_KEYS = 100_000
ROUNDS = 3  # check, repair, check again: a repair that raced a CDC commit is redone
OP = "_lakehouse_repair_op"  # a repair MERGE source row's role: 'delete' or 'insert'


@dataclass
class DimensionRepair:
    """What to write into `target`: for every key, its lake rows go; the source's row comes."""

    target: str
    source: SourceTable
    columns: dict[str, str]  # source column -> its lake column (those both have)
    key_rows: list[tuple[tuple[str, ...], tuple]]  # (key text, key values in source types)
    source_rows: list[tuple[tuple[str, ...], tuple]]  # (key text, the row over `columns`)
    schema: object  # the source rows' Spark schema (over `columns`)
    end: BinlogPosition  # the end of verify's read: the rows are the source's as of here
    lake_only_columns: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RepairOutcome:
    written: int  # source rows inserted
    deleted: int  # keys whose lake rows went without a source row to replace them
    left_to_cdc: int  # keys the binlog changed after E, which CDC had already applied
    snapshot_id: int | None

    def note(self) -> str:
        parts = [f"repaired {self.written + self.deleted} keys: {self.written} rows written from the source"]
        parts.append(f"{self.deleted} deleted")
        if self.left_to_cdc:
            parts.append(f"{self.left_to_cdc} left to CDC (changed since the read, already applied)")
        return ", ".join(parts) + (f" (snapshot {self.snapshot_id})" if self.snapshot_id else "")


def plan_repair(
    target: str,
    source: SourceTable,
    source_frame: DataFrame,
    lake_columns: dict[str, str],
    real: dict[tuple[str, ...], tuple],
    key_text_columns,
    end: BinlogPosition,
) -> DimensionRepair:
    """The repair of the keys `real` ({key text: key values}) from `source_frame` (the rows verify
    read, over the columns both sides have). The rows are collected: at most MAX_REPAIR_KEYS."""
    spark = source_frame.sparkSession
    key = source.key
    key_schema = source_frame.select(*(identifier(k) for k in key)).schema
    keys = spark.createDataFrame([values for values in real.values()], key_schema)
    texts = [c.alias(f"_lakehouse_key{i}") for i, c in enumerate(key_text_columns(source_frame, key))]
    wanted = source_frame.join(keys, on=list(key), how="left_semi").select(*source_frame.columns, *texts)
    width = len(source_frame.columns)
    source_rows = []
    for row in wanted.collect():
        text = tuple(row[width:])
        source_rows.append((tuple(canonical(v) for v in text), tuple(row[:width])))
    return DimensionRepair(
        target=target,
        source=source,
        columns={name: lake_columns[name.lower()] for name in source_frame.columns},
        key_rows=list(real.items()),
        source_rows=source_rows,
        schema=source_frame.schema,
        end=end,
        lake_only_columns=sorted(set(lake_columns) - {n.lower() for n in source_frame.columns}),
    )


def merge_statement(target: str, view: str, columns: dict[str, str], key: tuple[str, ...]) -> str:
    """Each key's lake rows are matched by its one 'delete' row (so one source row per target row),
    the 'insert' rows never match and are inserted."""
    on = " AND ".join(f"t.{identifier(columns[k])} = s.{identifier(k)}" for k in key)
    names = ", ".join(identifier(lake) for lake in columns.values())
    values = ", ".join(f"s.{identifier(source)}" for source in columns)
    return (
        f"MERGE INTO {target} t USING {view} s ON {on} AND s.{OP} = 'delete' "
        "WHEN MATCHED THEN DELETE "
        f"WHEN NOT MATCHED AND s.{OP} = 'insert' THEN INSERT ({names}) VALUES ({values})"
    )


def repair_dimension(spark, plan: DimensionRepair, changed_since) -> RepairOutcome:
    """Write `plan` in one commit. `changed_since(start, end)`: the keys (as text) of the table the
    binlog changed after `start` up to `end` (verify's own binlog reader)."""
    repair_id = uuid.uuid4().hex
    key = plan.source.key
    view = "verify_repair_" + re.sub(r"\W", "_", plan.target)
    outcome: RepairOutcome | None = None

    @retry_commit()
    def attempt() -> None:
        nonlocal outcome
        if outcome is not None and find_lineage(spark, plan.target, REPAIR_KEY, repair_id) is not None:
            return  # an attempt whose outcome was unknown did land
        cdc_at = stored_position(spark, plan.target)
        skip: set[tuple[str, ...]] = set()
        if cdc_at is not None and cdc_at.order > plan.end.order:
            skip = changed_since(plan.end, cdc_at)
        keys = [values for text, values in plan.key_rows if text not in skip]
        rows = [row for text, row in plan.source_rows if text not in skip]
        left = len(plan.key_rows) - len(keys)
        outcome = RepairOutcome(len(rows), len(keys) - len(rows), left, None)
        if not keys:
            return
        key_names = [identifier(k) for k in key]
        deletes = spark.createDataFrame(keys, _key_schema(plan))
        others = [c for c in plan.columns if c not in key]
        deletes = deletes.select(
            *key_names, *(F.lit(None).cast(plan.schema[c].dataType).alias(c) for c in others)
        ).withColumn(OP, F.lit("delete"))
        inserts = spark.createDataFrame(rows, plan.schema).withColumn(OP, F.lit("insert"))
        deletes.select(*inserts.columns).unionByName(inserts).createOrReplaceTempView(view)
        summary = {
            "id": repair_id,
            "keys": len(keys),
            "written": len(rows),
            "source": plan.source.qualified,
            "source_position": plan.end.to_json(),
        }
        statement = merge_statement(plan.target, view, plan.columns, key)
        try:
            with_snapshot_properties(spark, {REPAIR_KEY: json.dumps(summary)}, lambda: spark.sql(statement))
        finally:
            spark.catalog.dropTempView(view)

    attempt()
    assert outcome is not None
    landed = (
        find_lineage(spark, plan.target, REPAIR_KEY, repair_id) if outcome.written + outcome.deleted else None
    )
    outcome = RepairOutcome(outcome.written, outcome.deleted, outcome.left_to_cdc, landed)
    log.info("%s: %s", plan.target, outcome.note())
    return outcome


def _key_schema(plan: DimensionRepair):
    from pyspark.sql import types as T

    return T.StructType([plan.schema[k] for k in plan.source.key])
