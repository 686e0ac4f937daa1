"""Foreign-key cascades, which the binlog does not carry.

InnoDB applies `ON DELETE CASCADE`, `ON DELETE SET NULL` and their `ON UPDATE` twins inside the storage
engine, and the binlog holds only the parent's row event (MySQL bug #32506; every MariaDB): the child
rows it deleted or changed never reach a reader. The sync emulates them: after a batch, for each parent
row the batch deleted (or whose referenced columns it changed), the child rows the lake holds under the
old values are read again from the source by their primary keys, and merged as they are there now (a
row the source no longer has is deleted). What was read goes on to the grandchildren the same way, so a
chain of cascades, or a table referencing itself, is followed until nothing more changes.

Rows read from the source are its current ones (possibly newer than the batch's binlog position); any
later change to them is in the binlog after that position and applied in its turn, so the table equals
its source at every quiet point. RESTRICT and NO ACTION need nothing (the parent's change fails while
children exist); SET DEFAULT is not supported by InnoDB.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from jobs.cdc import source_db
from jobs.cdc.change_batch import DELETE, RowChange

CASCADING = frozenset({"CASCADE", "SET NULL"})


@dataclass(frozen=True)
class ForeignKey:
    """One constraint: `child`.`child_columns` references `parent`.`parent_columns`."""

    name: str
    child: tuple[str, str]
    child_columns: tuple[str, ...]
    parent: tuple[str, str]
    parent_columns: tuple[str, ...]
    on_delete: str
    on_update: str

    @property
    def cascades(self) -> bool:
        return self.on_delete in CASCADING or self.on_update in CASCADING

    def describe(self) -> str:
        rules = (("DELETE", self.on_delete), ("UPDATE", self.on_update))
        actions = [f"ON {what} {rule}" for what, rule in rules if rule in CASCADING]
        return (
            f"{self.name}: {'.'.join(self.child)}({', '.join(self.child_columns)}) references "
            f"{'.'.join(self.parent)}({', '.join(self.parent_columns)}) {' '.join(actions)}"
        )


def read_foreign_keys(conn, schemas: Iterable[str]) -> list[ForeignKey]:
    """Every foreign key of the child tables in `schemas`, in constraint-column order. The columns come
    from KEY_COLUMN_USAGE; the referential actions from SHOW CREATE TABLE, because a user with SELECT
    only (the CDC user) sees no rows of REFERENTIAL_CONSTRAINTS on MariaDB."""
    schemas = tuple(schemas)
    if not schemas:
        return []
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, COLUMN_NAME, "
            "REFERENCED_TABLE_SCHEMA, REFERENCED_TABLE_NAME, REFERENCED_COLUMN_NAME "
            "FROM information_schema.KEY_COLUMN_USAGE "
            f"WHERE TABLE_SCHEMA IN ({', '.join(['%s'] * len(schemas))}) "
            "AND REFERENCED_TABLE_NAME IS NOT NULL "
            "ORDER BY TABLE_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, ORDINAL_POSITION",
            schemas,
        )
        rows = cur.fetchall()
        grouped: dict[tuple, list] = {}
        for schema, table, name, column, ref_schema, ref_table, ref_column in rows:
            grouped.setdefault((schema, table, name, ref_schema, ref_table), []).append((column, ref_column))
        rules: dict[tuple[str, str, str], tuple[str, str]] = {}
        for schema, table in sorted({(k[0], k[1]) for k in grouped}):
            cur.execute(f"SHOW CREATE TABLE {source_db._quoted(schema)}.{source_db._quoted(table)}")
            for name, on_delete, on_update in referential_actions(cur.fetchone()[1]):
                rules[(schema, table, name)] = (on_delete, on_update)
    conn.commit()
    return [
        ForeignKey(name, (schema, table), tuple(c for c, _ in pairs), (ref_schema, ref_table),
                   tuple(r for _, r in pairs), *rules.get((schema, table, name), ("RESTRICT", "RESTRICT")))
        for (schema, table, name, ref_schema, ref_table), pairs in grouped.items()
    ]  # fmt: skip


_CONSTRAINT = re.compile(
    r"CONSTRAINT\s+`((?:[^`]|``)+)`\s+FOREIGN\s+KEY\s*\([^)]*\)\s+REFERENCES\s+[^(]+\([^)]*\)"
    r"((?:\s+ON\s+(?:DELETE|UPDATE)\s+(?:CASCADE|SET\s+NULL|SET\s+DEFAULT|RESTRICT|NO\s+ACTION))*)",
    re.I,
)
_ACTION = re.compile(r"ON\s+(DELETE|UPDATE)\s+(CASCADE|SET\s+NULL|SET\s+DEFAULT|RESTRICT|NO\s+ACTION)", re.I)


def referential_actions(create_table: str) -> list[tuple[str, str, str]]:
    """(constraint name, ON DELETE, ON UPDATE) of each foreign key in a SHOW CREATE TABLE text; an
    action it does not print is RESTRICT (the server's default)."""
    found = []
    for match in _CONSTRAINT.finditer(create_table):
        actions = {"DELETE": "RESTRICT", "UPDATE": "RESTRICT"}
        for what, rule in _ACTION.findall(match.group(2)):
            actions[what.upper()] = " ".join(rule.upper().split())
        found.append((match.group(1).replace("``", "`"), actions["DELETE"], actions["UPDATE"]))
    return found


def referenced(row: dict, columns: tuple[str, ...]) -> tuple | None:
    """The row's values of `columns` (any letter case), or None when one is NULL (it references nothing)."""
    lowered = {k.lower(): v for k, v in row.items()}
    values = tuple(lowered.get(c.lower()) for c in columns)
    return None if any(v is None for v in values) else values


def cascade_values(fk: ForeignKey, parent_changes: Iterable[RowChange]) -> tuple[set[tuple], set[tuple]]:
    """(old, new) referenced values: the child rows under `old` were changed by the source without row
    events (parents deleted, or whose referenced columns changed: ON DELETE / ON UPDATE CASCADE or SET
    NULL), and ON UPDATE CASCADE moved them under `new` (which a child key holding the foreign key
    follows). A primary-key update arrives as a delete of the old key and an upsert carrying both."""
    old, new = set(), set()
    for change in parent_changes:
        if change.op == DELETE:
            if fk.on_delete in CASCADING or fk.on_update in CASCADING:
                value = referenced(change.row, fk.parent_columns)
                if value is not None:
                    old.add(value)
        elif change.before is not None and fk.on_update in CASCADING:
            before, after = (
                referenced(change.before, fk.parent_columns),
                referenced(change.row, fk.parent_columns),
            )
            if before is not None and before != after:
                old.add(before)
                if after is not None and fk.on_update == "CASCADE":
                    new.add(after)
    return old, new


def as_binlog_values(row: dict) -> dict:
    """A row collected from Spark with values as the binlog gives them: bytes, not bytearray, and
    timestamps as UTC wall time (PySpark hands them over in the process's local time)."""
    from datetime import UTC, datetime

    def value(v):
        if isinstance(v, bytearray):
            return bytes(v)
        if isinstance(v, datetime) and v.tzinfo is None:
            return v.astimezone(UTC).replace(tzinfo=None)
        return v

    return {k: value(v) for k, v in row.items()}


def key_text(row: dict, key: tuple[str, ...]) -> tuple[str, ...]:
    """A primary key as text that compares alike from the binlog, the source (PyMySQL) and a lake row
    passed through `as_binlog_values`: bytes as hex, timestamps as UTC wall time."""
    from datetime import UTC, datetime
    from decimal import Decimal

    def text(value) -> str:
        if isinstance(value, bytes | bytearray | memoryview):
            return "x" + bytes(value).hex()
        if isinstance(value, datetime) and value.tzinfo is not None:
            return value.astimezone(UTC).replace(tzinfo=None).isoformat()
        if isinstance(value, Decimal):
            return str(value.normalize())
        return value.isoformat() if isinstance(value, datetime) else str(value)

    lowered = {k.lower(): v for k, v in row.items()}
    return tuple(text(lowered.get(k.lower())) for k in key)


def unfollowed_parents(keys: list[ForeignKey], followed: set[tuple[str, str]]) -> dict[tuple, ForeignKey]:
    """Followed child tables with a cascading key whose parent is not followed: the parent's deletes
    are never read, so the cascade cannot be emulated. Child -> the first such key."""
    found: dict[tuple, ForeignKey] = {}
    for fk in keys:
        if fk.cascades and fk.child in followed and fk.parent not in followed:
            found.setdefault(fk.child, fk)
    return found
