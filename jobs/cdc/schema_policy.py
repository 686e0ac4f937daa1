"""What a source column change does to the Iceberg table, per `--schema-changes` policy.

- `evolve` (default): follow it.
  - ADD: the column is added (any position in the source; Iceberg appends it). If the source
    filled the existing rows (DEFAULT, NOT NULL, ...), the table is re-snapshotted.
  - DROP: the Iceberg column is **kept** (the values already in the lake stay readable, queries
    that name it keep working); rows the source writes afterwards carry NULL in it.
  - RENAME: an Iceberg rename (the same field id: its history is kept under the new name).
  - type change: a widening Iceberg can promote in place (int -> bigint, float -> double,
    decimal(p,s) -> decimal(p',s) with p' > p) or one that keeps the Iceberg type (varchar(10) ->
    varchar(50)) is followed; if MySQL may have rewritten the existing values without row events
    (anything but a known value-preserving widening), the table is re-snapshotted too. A narrowing
    or incompatible change (decimal scale, int -> varchar, ...) stops the table with the fix.
- `strict`: any column change stops the table (the lake schema changes only by a `--resync`).
- `ignore`: the lake schema never changes: added columns are not synced (also one added again
  under the name of a column the lake kept, or renamed onto it: that lake column reads NULL in rows
  changed afterwards, whatever the new column's type), a dropped or renamed column reads NULL in
  rows changed afterwards, a type change is not followed (values MySQL
  rewrote without row events stay as they were until their rows change). An incompatible type
  change still stops the table (its values could not be stored).

A name the lake still holds for a dropped column, added or renamed onto again, re-snapshots the
table (the old values would otherwise stay in rows that never change). A rename that only changes
letter case stops the table. Where the source's column types before a statement are not known (the
job started after it: they were read later), a type change re-snapshots rather than trust them.

Under every policy, a change to a primary-key column stops the table (the MERGE key would change).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from jobs.cdc.ddl import ColumnChange
from jobs.cdc.schema_mapping import SourceColumn, UnsupportedType, parse_column_type

POLICIES = ("evolve", "strict", "ignore")
DEFAULT_POLICY = "evolve"

_INT_RANK = {"tinyint": 1, "smallint": 2, "mediumint": 3, "int": 4, "integer": 4, "bigint": 5}
_TEXT_RANK = {"char": 1, "varchar": 1, "tinytext": 2, "text": 3, "mediumtext": 4, "longtext": 5}


@dataclass(frozen=True)
class Action:
    kind: str  # "add" | "rename" | "promote"
    name: str
    new_name: str | None = None
    column: SourceColumn | None = None  # add: the column; promote: its new definition


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    resnapshot: str | None = None  # why the table must be re-read
    stop: str | None = None  # why the table stops
    # The source's columns after the statement (lower-case name -> column), whatever the policy.
    source_columns: dict[str, SourceColumn] = field(default_factory=dict)
    # `ignore`: lake columns (lower case) whose name a new source column took (added again, or
    # renamed onto): its values are another column's, never written into the lake's.
    unsynced: set[str] = field(default_factory=set)


def iceberg_promotable(old: str, new: str) -> bool:
    """Iceberg's in-place type promotions (spec: int -> long, float -> double, decimal widening)."""
    if old == new:
        return True
    if (old, new) in (("int", "bigint"), ("float", "double")):
        return True
    old_dec, new_dec = (
        re.fullmatch(r"decimal\((\d+),(\d+)\)", old),
        re.fullmatch(r"decimal\((\d+),(\d+)\)", new),
    )
    return bool(old_dec and new_dec and old_dec[2] == new_dec[2] and int(new_dec[1]) >= int(old_dec[1]))


def preserves_values(old: SourceColumn, new: SourceColumn) -> bool:
    """Whether MySQL's ALTER keeps every existing value as it was (so no row events are missing)."""
    (old_base, old_args, old_rest), (new_base, new_args, new_rest) = (
        parse_column_type(old.column_type),
        parse_column_type(new.column_type),
    )
    if not new.nullable and old.nullable:
        return False  # existing NULLs become 0 / '' (non-strict mode) without row events
    old_unsigned, new_unsigned = "unsigned" in old_rest, "unsigned" in new_rest
    if old_base in _INT_RANK and new_base in _INT_RANK:
        if old_unsigned == new_unsigned:
            return _INT_RANK[new_base] >= _INT_RANK[old_base]
        return old_unsigned and not new_unsigned and _INT_RANK[new_base] > _INT_RANK[old_base]
    if old_base == "float" and new_base in ("float", "double"):
        return True
    if old_base in ("decimal", "numeric") and new_base in ("decimal", "numeric"):
        (p1, s1), (p2, s2) = _precision(old_args), _precision(new_args)
        return s2 == s1 and p2 >= p1 and old_unsigned == new_unsigned
    if old_base in _TEXT_RANK and new_base in _TEXT_RANK:
        if old_base in ("char", "varchar") and new_base in ("char", "varchar"):
            return int(new_args or 1) >= int(old_args or 1) and not (
                old_base == "varchar" and new_base == "char"
            )
        return _TEXT_RANK[new_base] >= _TEXT_RANK[old_base] and new_base not in ("char",)
    return old.column_type.lower() == new.column_type.lower()


def _precision(args: str | None) -> tuple[int, int]:
    parts = [int(p) for p in (args or "10,0").split(",")]
    return parts[0], parts[1] if len(parts) > 1 else 0


def plan(
    changes: tuple[ColumnChange, ...],
    policy: str,
    source_columns: dict[str, SourceColumn],
    target_types: dict[str, str],
    key: tuple[str, ...],
    exact: bool = True,
) -> Plan:
    """What to do on the Iceberg table for `changes`, clause after clause (a later clause sees the
    names an earlier one gave). `source_columns` / `target_types` are keyed by lower-case name as
    they were before the statement (a lake column the source lacks is one it dropped). `exact`:
    whether `source_columns` are the source's columns as of this statement (else they were read
    later, and a type change is assumed to have rewritten values)."""
    result = Plan()
    keys = {k.lower() for k in key}
    source, lake = dict(source_columns), dict(target_types)
    for change in changes:
        name = change.name.lower()
        new_name = (change.new_name or "").lower()
        if name in keys or new_name in keys:
            result.stop = f"it changes the primary key column `{change.name}`"
            return result
        if policy == "strict":
            result.stop = "--schema-changes strict follows no column change"
            return result
        if change.kind == "add":
            if policy == "ignore" and name in lake:
                result.unsynced.add(name)
            if policy == "evolve":
                if name in lake:
                    # The lake still holds a dropped column of that name, with its old values.
                    result.resnapshot = f"`{change.name}` was added again while the lake kept its old values"
                else:
                    try:
                        lake[name] = change.column.spark_type
                    except UnsupportedType as exc:
                        result.stop = f"{exc}; change that column's type (or drop it)"
                        return result
                    result.actions.append(Action("add", change.name, column=change.column))
                    if change.fills_existing_rows:
                        result.resnapshot = f"the added column `{change.name}` filled the existing rows"
            source[name] = change.column
        elif change.kind == "drop":
            source.pop(name, None)  # the lake keeps the column
        elif change.kind == "rename":
            if policy == "ignore" and new_name in lake:
                result.unsynced.add(new_name)
            if policy == "evolve":
                if new_name == name:
                    result.stop = f"renaming `{change.name}` to `{change.new_name}` changes only letter case"
                    return result
                if new_name in lake:
                    result.resnapshot = (
                        f"`{change.name}` was renamed onto `{change.new_name}`, which the lake kept"
                    )
                elif name in lake:
                    result.actions.append(Action("rename", change.name, new_name=change.new_name))
                    lake[new_name] = lake.pop(name)
            if name in source:
                old = source.pop(name)
                source[new_name] = SourceColumn(change.new_name, old.column_type, old.nullable)
        elif change.kind == "retype":
            if name in result.unsynced:  # not the lake's column: nothing to follow
                source[name] = change.column
                continue
            stop, resnapshot, promote = _retype(change, source, lake, exact)
            if stop is not None:
                result.stop = stop
                return result
            if policy == "evolve":
                if promote:
                    result.actions.append(Action("promote", change.name, column=change.column))
                    lake[name] = change.column.spark_type
                result.resnapshot = result.resnapshot or resnapshot
            source[name] = change.column
    result.source_columns = source
    return result


def _retype(
    change: ColumnChange, source_columns: dict[str, SourceColumn], target_types: dict[str, str], exact: bool
) -> tuple[str | None, str | None, bool]:
    """(why it stops, why it re-snapshots, whether the Iceberg type is promoted)."""
    new = change.column
    try:
        new_type = new.spark_type
    except UnsupportedType as exc:
        return f"{exc}", None, False
    old_type = target_types.get(change.name.lower())
    if old_type is None:  # a column the lake does not have (added under `ignore`)
        return None, None, False
    if not iceberg_promotable(old_type, new_type):
        return (
            f"`{change.name}` changes from {old_type} to {new_type}, which Iceberg cannot promote "
            "(only int -> bigint, float -> double, decimal precision widening)",
            None,
            False,
        )
    old = source_columns.get(change.name.lower())
    rewritten = not exact or old is None or not preserves_values(old, new)
    why = (
        f"`{change.name}` became {new.column_type}: MySQL may have rewritten its values"
        if rewritten
        else None
    )
    return None, why, old_type != new_type
