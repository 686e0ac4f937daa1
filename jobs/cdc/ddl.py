"""Classify DDL statements from the binlog: which synced table they touch and what they change.

Column changes (`ColumnChange`): ADD (any position), DROP, RENAME COLUMN, CHANGE (rename and/or new
type), MODIFY (new type); what the sync does with each is its `--schema-changes` policy
(`schema_policy.py`). An added column with a DEFAULT or NOT NULL fills the existing rows without any
row events, so such a change is flagged for a backfill (`fills_existing_rows`, which parses the
column definition with sqlglot rather than matching text). TRUNCATE is its own kind; DROP TABLE,
DROP DATABASE (`dropped_schema`) and a RENAME (`renamed`: the old name is gone) mark the tables
dropped (`drops`); anything else that changes a synced table's shape (a primary key change in any
spelling, ALTER IGNORE adding a unique key, a clause not understood) is `unsupported`: that table
stops. DROP TEMPORARY TABLE changes no synced table. A
statement that makes a table exist under a name (CREATE TABLE, also `... LIKE` and `... AS SELECT`;
the new name of a RENAME) lists it in `created`, so a selection by pattern can pick it up; CREATE OR
REPLACE also `replaces` what was there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from jobs.cdc.schema_mapping import SourceColumn

_IDENT = r"`(?:[^`]|``)+`|[A-Za-z0-9_$]+"
_NAME = rf"(?:({_IDENT})\s*\.\s*)?({_IDENT})"
_COMMENTS = re.compile(r"/\*.*?\*/|--[^\n]*|#[^\n]*", re.S)
_ALTER = re.compile(
    rf"^ALTER\s+((?:ONLINE\s+|IGNORE\s+)*)TABLE\s+(?:IF\s+EXISTS\s+)?{_NAME}\s*(.*)$", re.I | re.S
)
# A temporary table is the session's own: dropping one never touches the table it may shadow.
_DROP_TEMPORARY = re.compile(r"^DROP\s+TEMPORARY\s+TABLE\b", re.I)
_DROP_DATABASE = re.compile(rf"^DROP\s+(?:DATABASE|SCHEMA)\s+(?:IF\s+EXISTS\s+)?({_IDENT})\s*$", re.I | re.S)
# `DROP INDEX \`PRIMARY\` ON t`: the primary key goes (MySQL's other spelling of DROP PRIMARY KEY).
_DROP_PRIMARY_INDEX = re.compile(rf"^DROP\s+INDEX\s+(?:`PRIMARY`|PRIMARY)\s+ON\s+{_NAME}", re.I | re.S)
# An ALTER clause dropping the primary key by its index name (`DROP INDEX \`PRIMARY\``, `DROP KEY PRIMARY`).
_DROPS_PRIMARY_INDEX = re.compile(r"^DROP\s+(?:INDEX|KEY)\s+(?:`PRIMARY`|PRIMARY)\s*$", re.I)
# ALTER IGNORE ... ADD UNIQUE / PRIMARY KEY (MariaDB) deletes the rows that duplicate a key, and the
# binlog shows no row event for them.
_ADDS_UNIQUE = re.compile(
    r"^(?:ADD\s+(?:CONSTRAINT\s+(?:(?!UNIQUE\b|PRIMARY\b)(?:`(?:[^`]|``)+`|\S+)\s+)?)?(?:UNIQUE|PRIMARY)\b"
    r"|(?:MODIFY|CHANGE|ADD)\b.*\b(?:UNIQUE|PRIMARY\s+KEY)\b)",
    re.I | re.S,
)
_OTHER = [
    re.compile(r"^(DROP)\s+TABLE\s+(?:IF\s+EXISTS\s+)?(.*)$", re.I | re.S),
    re.compile(r"^(RENAME)\s+TABLES?\s+(.*)$", re.I | re.S),
    re.compile(rf"^(CREATE)\s+(OR\s+REPLACE\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?{_NAME}", re.I | re.S),
    re.compile(rf"^(TRUNCATE)\s+(?:TABLE\s+)?{_NAME}", re.I | re.S),
]
# ALTER clauses that do not change the rows we copy.
_HARMLESS = re.compile(
    r"^(ADD\s+(INDEX|KEY|FULLTEXT|SPATIAL|UNIQUE|CONSTRAINT|FOREIGN|PRIMARY|CHECK)\b"
    r"|DROP\s+(INDEX|KEY|FOREIGN|CONSTRAINT|CHECK)\b"
    r"|RENAME\s+(INDEX|KEY)\b"
    r"|ALTER\s+(COLUMN\s+)?\S+\s+(SET|DROP)\s+DEFAULT\b"
    r"|ENGINE\b|COMMENT\b|AUTO_INCREMENT\b|ALGORITHM\b|LOCK\b|ROW_FORMAT\b|FORCE\b)",
    re.I,
)
# A primary key added (`ADD PRIMARY KEY (id)`, `ADD CONSTRAINT pk PRIMARY KEY ...`, or a column
# added or modified `... PRIMARY KEY`): for a followed table harmless (it has one), for a table
# without one the moment it can be synced.
_ADD_PRIMARY_KEY = re.compile(r"^(ADD|MODIFY|CHANGE)\b.*\bPRIMARY\s+KEY\b", re.I | re.S)
_FOREIGN_KEY = re.compile(r"^(ADD|DROP)\b.*\bFOREIGN\s+KEY\b", re.I | re.S)
_TYPE = r"\w+(?:\s*\([^)]*\))?(?:\s+UNSIGNED)?"
_ADD_COLUMN = re.compile(
    rf"^ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?({_IDENT})\s+({_TYPE})(.*)$",
    re.I | re.S,
)
_DROP_COLUMN = re.compile(rf"^DROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_IDENT})\s*$", re.I | re.S)
_RENAME_COLUMN = re.compile(rf"^RENAME\s+COLUMN\s+({_IDENT})\s+TO\s+({_IDENT})\s*$", re.I | re.S)
_CHANGE_COLUMN = re.compile(
    rf"^CHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_IDENT})\s+({_IDENT})\s+({_TYPE})(.*)$", re.I | re.S
)
_MODIFY_COLUMN = re.compile(
    rf"^MODIFY\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_IDENT})\s+({_TYPE})(.*)$", re.I | re.S
)
_NOT_NULL = re.compile(r"\bNOT\s+NULL\b", re.I)
_RENAME_TABLE_CLAUSE = re.compile(rf"^RENAME\s+(?:TO\s+|AS\s+)?{_NAME}\s*$", re.I | re.S)


def fills_existing_rows(column_definition: str) -> bool:
    """Whether adding this column gives the existing rows a value the binlog never shows: NOT
    NULL, a DEFAULT other than NULL (literal, `DEFAULT(7)`, an expression, CURRENT_TIMESTAMP),
    AUTO_INCREMENT or a generated column. The definition (`name type ...`) is parsed with sqlglot's
    MySQL dialect, so a COMMENT that only reads like a default is not one; a definition it cannot
    parse counts as filling (a needless re-snapshot costs time, a missed fill costs correctness)."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(f"ALTER TABLE t ADD COLUMN {column_definition}", read="mysql")
    except sqlglot.errors.SqlglotError:
        return True
    column = next(iter(tree.find_all(exp.ColumnDef)), None)
    if column is None:
        return True
    if column.args.get("kind") is not None and column.args["kind"].sql("mysql").upper().startswith("SERIAL"):
        return True  # BIGINT UNSIGNED NOT NULL AUTO_INCREMENT UNIQUE
    for constraint in column.args.get("constraints") or []:
        kind = constraint.kind
        if isinstance(kind, exp.NotNullColumnConstraint) and not kind.args.get("allow_null"):
            return True
        if isinstance(kind, exp.ComputedColumnConstraint | exp.AutoIncrementColumnConstraint):
            return True
        if isinstance(kind, exp.GeneratedAsIdentityColumnConstraint):
            return True
        if isinstance(kind, exp.DefaultColumnConstraint):
            value = kind.this
            while isinstance(value, exp.Paren):
                value = value.this
            if not isinstance(value, exp.Null):
                return True
    return False


def _unquote(ident: str | None) -> str | None:
    if ident is None:
        return None
    return ident[1:-1].replace("``", "`") if ident.startswith("`") else ident


def split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses and quotes."""
    parts, depth, quote, current = [], 0, "", []
    for ch in text:
        if quote:
            current.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


@dataclass(frozen=True)
class ColumnChange:
    """One column clause of an ALTER TABLE."""

    kind: str  # "add" | "drop" | "rename" | "retype"
    name: str  # the column as it was (add: the new column)
    new_name: str | None = None  # rename
    column: SourceColumn | None = None  # add, retype: the new definition (MySQL type)
    fills_existing_rows: bool = False  # add: existing rows got a value no row event shows


@dataclass(frozen=True)
class DdlChange:
    """What a DDL statement means for the synced tables (schema, table) it names."""

    statement: str
    tables: tuple[tuple[str | None, str], ...]
    column_changes: tuple[ColumnChange, ...] = ()
    unsupported: bool = False
    reason: str = field(default="")
    truncate: bool = False
    # Tables that exist under these names after the statement (CREATE TABLE, RENAME's new names).
    created: tuple[tuple[str | None, str], ...] = ()
    replaces: bool = False  # CREATE OR REPLACE: a table of that name was replaced, rows and all
    adds_key: bool = False  # ALTER ... ADD PRIMARY KEY: a table without one may be synced now
    dropped_schema: str | None = None  # DROP DATABASE: every synced table of that schema is gone
    foreign_keys_changed: bool = False  # a FOREIGN KEY added or dropped: cascades to re-read
    renamed: bool = False  # RENAME TABLE, ALTER TABLE … RENAME TO: the tables named are gone under it

    @property
    def drops(self) -> bool:
        """The tables it names are gone under their names (DROP, or renamed away)."""
        return self.reason == "DROP" or self.renamed

    @property
    def added_columns(self) -> tuple[SourceColumn, ...]:
        return tuple(c.column for c in self.column_changes if c.kind == "add" and c.column is not None)

    @property
    def fills_existing_rows(self) -> bool:
        """Existing rows got a non-NULL value the binlog does not show (an added column)."""
        return any(c.fills_existing_rows for c in self.column_changes)


def _column_changes(clause: str) -> list[ColumnChange] | None:
    """The changes of one ALTER clause; None if it is not a column change we understand."""
    if re.match(r"^ADD\s+(COLUMN\s+)?\(", clause, re.I):
        return None  # ADD (a INT, b INT): not parsed; stops the table rather than guess
    if match := _ADD_COLUMN.match(clause):
        name, kind, rest = _unquote(match.group(1)), match.group(2), match.group(3)
        column = SourceColumn(name, kind, nullable=_NOT_NULL.search(rest) is None)
        fills = fills_existing_rows(f"{match.group(1)} {kind}{rest}")
        return [ColumnChange("add", name, column=column, fills_existing_rows=fills)]
    if match := _DROP_COLUMN.match(clause):
        return [ColumnChange("drop", _unquote(match.group(1)))]
    if match := _RENAME_COLUMN.match(clause):
        return [ColumnChange("rename", _unquote(match.group(1)), new_name=_unquote(match.group(2)))]
    if match := _CHANGE_COLUMN.match(clause):
        old, new = _unquote(match.group(1)), _unquote(match.group(2))
        column = SourceColumn(new, match.group(3), nullable=_NOT_NULL.search(match.group(4)) is None)
        renamed = [ColumnChange("rename", old, new_name=new)] if old.lower() != new.lower() else []
        return [*renamed, ColumnChange("retype", new, column=column)]
    if match := _MODIFY_COLUMN.match(clause):
        name = _unquote(match.group(1))
        column = SourceColumn(name, match.group(2), nullable=_NOT_NULL.search(match.group(3)) is None)
        return [ColumnChange("retype", name, column=column)]
    return None


def classify(statement: str) -> DdlChange | None:
    """None for statements that change no table (BEGIN, GRANT, CREATE TEMPORARY TABLE, ...)."""
    text = _COMMENTS.sub(" ", statement).strip().rstrip(";").strip()
    if _DROP_TEMPORARY.match(text):
        return None
    if match := _DROP_DATABASE.match(text):
        schema = _unquote(match.group(1))
        return DdlChange(statement, (), unsupported=True, reason="DROP", dropped_schema=schema)
    if match := _DROP_PRIMARY_INDEX.match(text):
        table = (_unquote(match.group(1)), _unquote(match.group(2)))
        return DdlChange(statement, (table,), unsupported=True, reason="the primary key was dropped")
    match = _ALTER.match(text)
    if match:
        ignore = "IGNORE" in match.group(1).upper()
        table = (_unquote(match.group(2)), _unquote(match.group(3)))
        changes, problems, renamed_to = [], [], []
        clauses = split_top_level(match.group(4))
        for clause in clauses:
            if _DROPS_PRIMARY_INDEX.match(clause):
                problems.append(f"{clause} (the primary key changes)")
                continue
            if ignore and _ADDS_UNIQUE.match(clause):
                problems.append(f"ALTER IGNORE … {clause} (deletes duplicate rows without row events)")
                continue
            if not clause or _HARMLESS.match(clause):
                continue
            if rename := _RENAME_TABLE_CLAUSE.match(clause):
                renamed_to.append((_unquote(rename.group(1)) or table[0], _unquote(rename.group(2))))
                continue
            understood = _column_changes(clause)
            if understood is None:
                problems.append(clause)
            else:
                changes += understood
        if renamed_to:  # the table is gone under its old name, whatever else the statement did
            reason = "; ".join(["RENAME", *problems])
            return DdlChange(
                statement, (table,), unsupported=True, reason=reason, created=tuple(renamed_to), renamed=True
            )
        adds_key = any(_ADD_PRIMARY_KEY.search(clause) for clause in clauses)
        foreign = any(_FOREIGN_KEY.search(clause) for clause in clauses)
        if problems:
            return DdlChange(
                statement, (table,), unsupported=True, reason="; ".join(problems), adds_key=adds_key
            )
        if not changes and not adds_key and not foreign:
            return None
        return DdlChange(
            statement,
            (table,),
            column_changes=tuple(changes),
            adds_key=adds_key,
            foreign_keys_changed=foreign,
        )
    for pattern in _OTHER:
        match = pattern.match(text)
        if not match:
            continue
        verb = match.group(1).upper()
        if verb == "TRUNCATE":
            tables = ((_unquote(match.group(2)), _unquote(match.group(3))),)
            return DdlChange(statement, tables, truncate=True, reason=verb)
        if verb == "CREATE":
            tables = ((_unquote(match.group(3)), _unquote(match.group(4))),)
            return DdlChange(statement, tables, reason=verb, created=tables, replaces=bool(match.group(2)))
        names = _names_in(match.group(2))
        if verb == "RENAME":  # RENAME TABLE a TO b, c TO d: a and c are gone, b and d are new
            return DdlChange(
                statement, tuple(names[0::2]), unsupported=True, reason=verb, created=tuple(names[1::2]),
                renamed=True,
            )  # fmt: skip
        return DdlChange(statement, tuple(names), unsupported=True, reason=verb)
    return None


def _names_in(text: str) -> list[tuple[str | None, str]]:
    names = []
    for part in re.split(r",|\bTO\b", text, flags=re.I):
        match = re.match(rf"\s*{_NAME}", part)
        if match:
            names.append((_unquote(match.group(1)), _unquote(match.group(2))))
    return names
