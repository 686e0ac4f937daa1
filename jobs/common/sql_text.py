"""Names and values spliced into Spark SQL text, quoted so that no source name or value can change
the statement (a table or column name comes from the source database, which the lake does not
control)."""

from __future__ import annotations


def identifier(name: str) -> str:
    """A Spark SQL identifier: backticks, a backtick inside doubled."""
    return "`" + name.replace("`", "``") + "`"


def literal(text: str) -> str:
    """A Spark SQL string literal: quotes, a backslash and a quote inside escaped."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def properties(values: dict[str, str]) -> str:
    """The inside of TBLPROPERTIES (...): each key and value a literal."""
    return ", ".join(f"{literal(k)}={literal(v)}" for k, v in values.items())
