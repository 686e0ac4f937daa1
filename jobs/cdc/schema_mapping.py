"""MySQL column types -> Iceberg (Spark SQL) types, and binlog/driver values -> Spark values.

Faithful, not lossy: DECIMAL(p,s) stays decimal(p,s), TIMESTAMP/DATETIME -> timestamp, INT -> int,
BIGINT -> bigint, unsigned types widen so every source value fits.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from decimal import Decimal

from pymysql.converters import convert_date, convert_datetime
from pyspark.sql import types as T

_INT_TYPES = {"tinyint", "smallint", "mediumint", "int", "integer"}
_STRING_TYPES = {
    "char",
    "varchar",
    "tinytext",
    "text",
    "mediumtext",
    "longtext",
    "enum",
    "set",
    "json",
    "time",
}
_BINARY_TYPES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "bit"}


class UnsupportedType(ValueError):
    pass


@dataclass(frozen=True)
class SourceColumn:
    name: str
    column_type: str  # MySQL COLUMN_TYPE, e.g. "decimal(10,4)", "int(10) unsigned", "varchar(10)"
    nullable: bool = True

    @property
    def base_type(self) -> str:
        """The MySQL type without its arguments and attributes: "float", "time", "varchar"."""
        return parse_column_type(self.column_type)[0]

    @property
    def spark_type(self) -> str:
        try:
            return iceberg_type(self.column_type)
        except UnsupportedType as exc:
            raise UnsupportedType(f"column `{self.name}`: {exc}") from None


def parse_column_type(column_type: str) -> tuple[str, str | None, str]:
    """A MySQL COLUMN_TYPE as (base type, arguments, the rest): "int(10) unsigned" ->
    ("int", "10", "unsigned")."""
    match = re.match(r"([a-z]+)\s*(?:\(([^)]*)\))?\s*(.*)", column_type.strip().lower())
    if not match:
        raise UnsupportedType(f"cannot parse MySQL type {column_type!r}")
    return match.group(1), match.group(2), match.group(3)


def iceberg_type(column_type: str) -> str:
    """Spark SQL type (as created in Iceberg) for a MySQL COLUMN_TYPE string."""
    base, args, rest = parse_column_type(column_type)
    unsigned = "unsigned" in rest
    if base in ("decimal", "numeric", "dec", "fixed"):
        parts = [int(p) for p in (args or "10,0").split(",")]
        precision, scale = parts[0], parts[1] if len(parts) > 1 else 0
        if precision > 38:
            return "string"  # Iceberg decimals hold 38 digits: keep MySQL's exact text instead
        return f"decimal({precision},{scale})"
    if base in _INT_TYPES:
        return "bigint" if unsigned and base in ("int", "integer") else "int"
    if base == "bigint":
        return "decimal(20,0)" if unsigned else "bigint"
    if base in ("bool", "boolean"):
        return "boolean"
    if base == "float":
        return "float"
    if base in ("double", "real"):
        return "double"
    if base in ("timestamp", "datetime"):
        return "timestamp"
    if base == "date":
        return "date"
    if base == "year":
        return "int"
    if base in _STRING_TYPES:
        return "string"
    if base in _BINARY_TYPES:
        return "binary"
    raise UnsupportedType(f"MySQL type {column_type!r} has no Iceberg mapping")


def spark_schema(columns: list[tuple[str, str]]) -> T.StructType:
    """StructType from (name, spark SQL type) pairs."""
    return T.StructType([T.StructField(name, T._parse_datatype_string(kind), True) for name, kind in columns])


def to_spark_value(value: object, spark_type: str) -> object:
    """A PyMySQL/binlog value as the Python object Spark expects for `spark_type`."""
    if value is None:
        return None
    if spark_type == "timestamp":
        if isinstance(value, str):  # MySQL's text (a zero date stays text: no instant, NULL)
            value = convert_datetime(value)
        if isinstance(value, dt.datetime):
            # The server runs in UTC; naive values are UTC wall time. Aware -> exact instant in Spark.
            return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value
        return None
    if spark_type == "string":
        if isinstance(value, str):
            return value
        if isinstance(value, bytes):
            return value.decode("utf-8", errors="replace")
        if isinstance(value, Decimal):  # DECIMAL wider than 38 digits, as MySQL writes it
            return format(value, "f")
        return str(value)
    if spark_type.startswith("decimal"):
        return value if isinstance(value, Decimal) else Decimal(str(value))
    if spark_type in ("int", "bigint"):
        return int(value)
    if spark_type in ("float", "double"):
        return float(value)
    if spark_type == "date":
        if isinstance(value, str):  # MySQL's text
            value = convert_date(value)
        # A zero date ('0000-00-00', which PyMySQL hands over as text) is no day: NULL.
        return value if isinstance(value, dt.date) else None
    if spark_type == "boolean":
        return bool(value)
    if spark_type == "binary":
        return bytes(value) if not isinstance(value, str) else value.encode()
    return value
