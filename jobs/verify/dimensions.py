"""MySQL -> dimension tables: the lake equals the source, on a live source, without false alarms.

For each CDC table, CDC's own comparison (`jobs/cdc/reconcile.py`: the lake at its stored position
against a lock-free read of the source, keys changed in the binlog since counted as in flight), told
as findings; with `--repair`, the repair of what it finds (`repair.py`).
"""

from __future__ import annotations

from jobs.cdc import source_db, target_table
from jobs.cdc.binlog_reader import BinlogPosition
from jobs.cdc.reconcile import CannotCompare, compare, key_columns
from jobs.cdc.target_table import POSITION_KEY
from jobs.common.snapshot_progress import main_snapshot, progress_as_of
from jobs.verify.findings import EXAMPLES, CheckResult, Finding
from jobs.verify.repair import MAX_REPAIR_KEYS, DimensionRepair, plan_repair


def check_dimension(
    spark,
    conn,
    target: str,
    source_name: tuple[str, str],
    connection_settings: dict,
    server_id: int,
    is_mariadb: bool,
    repairs: list[DimensionRepair] | None = None,
) -> CheckResult:
    """The check; with `repairs`, also the repair of its real mismatches is appended there."""
    result = CheckResult("mysql -> dimension", ".".join(target.split(".")[-2:]))
    qualified = ".".join(source_name)
    try:
        snapshot = main_snapshot(spark, target)
        stored = progress_as_of(spark, target, snapshot, POSITION_KEY) if snapshot is not None else None
        if stored is None:
            raise CannotCompare("the lake table has no stored binlog position: CDC never synced it")
        position = BinlogPosition.from_json(stored)
        try:
            source = source_db.describe_table(conn, *source_name)
        except source_db.MissingTable:
            # A table CDC saw dropped is not a failure: the lake keeps its rows on purpose.
            dropped = target_table.source_dropped(spark, target)
            if dropped is None:  # renamed, a wrong source database, or a DROP CDC has not read yet
                raise CannotCompare(
                    f"the source table {qualified} does not exist (dropped, renamed?) and CDC has not marked "
                    "the lake table dropped: run CDC, or check the source database"
                ) from None
            result.notes.append(
                f"not compared: the source table {qualified} was dropped {dropped}; the lake table keeps its "
                f"rows (`lakehouse run cdc --drop-orphaned {result.table}` removes it)"
            )
            return result
        except source_db.NoPrimaryKey:
            raise CannotCompare(f"the source table {qualified} has no primary key any more") from None
        comparison = compare(
            spark, conn, target, snapshot, position, source, connection_settings, server_id, is_mariadb
        )
        result.notes.extend(comparison.notes)
        result.compared = comparison.compared
        real = comparison.real
        if repairs is not None and real:
            if len(real) > MAX_REPAIR_KEYS:
                result.notes.append(
                    f"not repaired: {len(real):,} keys differ (more than {MAX_REPAIR_KEYS:,}): re-snapshot it"
                )
            else:
                lake_values = dict(comparison.lake_keys)
                values = {k: lake_values.get(k, comparison.source_keys.get(k)) for k in real}
                repairs.append(
                    plan_repair(
                        target,
                        source,
                        comparison.source_rows,
                        comparison.lake_columns,
                        values,
                        key_columns,
                        comparison.end,
                    )  # fmt: skip
                )
    except CannotCompare as exc:
        result.error = str(exc)
        return result
    except Exception as exc:  # noqa: BLE001 - this check cannot run; the others still do
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return result
    explained = comparison.differing & comparison.in_flight
    if explained:
        result.notes.append(
            f"{len(explained)} differing keys changed in the source after the lake's position "
            f"{position}: in flight, not counted"
        )
    hint = f"re-snapshot the table: `lakehouse run cdc --resync {qualified}`"
    for kind, keys in comparison.kinds():
        examples = tuple("key " + ", ".join(k) for k in sorted(keys)[:EXAMPLES])
        result.findings.append(Finding(kind, len(keys), examples, hint, row_values=True))
    return result
