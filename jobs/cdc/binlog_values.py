"""Binlog row values in the form a SELECT of the same row gives (PyMySQL over the text protocol).

The snapshot reads rows with SELECT and the binlog reader decodes row events: two decoders of one
value. A row must land in the lake the same whichever path brought it, so the binlog side is brought
to the SELECT side here, column by column, using the table map's column metadata (the server writes
it with `binlog_row_metadata=FULL`). Pure: no I/O.

What mysql-replication hands over differently from a SELECT:
- BIT(n): a string of n '0'/'1' characters; a SELECT gives ceil(n/8) big-endian bytes.
- SET: a Python set, and None for the empty set; a SELECT gives the members in definition order
  joined by commas, and '' for the empty set.
- TIMESTAMP '0000-00-00 00:00:00': 1970-01-01 00:00:00 (epoch 0); a SELECT gives the zero date,
  which the mapping stores as NULL. (1970-01-01 00:00:00 UTC itself is outside TIMESTAMP's range.)
- YEAR 0000: 1900; a SELECT gives 0.
- BINARY(n): trailing 0x00 bytes stripped (and the empty value as ''); a SELECT gives all n bytes.
- TIME: a timedelta; the snapshot selects TIME as MySQL's text (`838:59:59.000`), fractional digits
  as the column declares them (see `source_db.select_expression`).
- JSON (MySQL; MariaDB's JSON is text): decoded objects with bytes keys; a SELECT gives MySQL's
  text form (`{"a": 1, "b": [true, null]}`, non-ASCII as is).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal

from pymysqlreplication.constants import FIELD_TYPE, NONE_SOURCE

_TIMESTAMPS = (FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIMESTAMP2)
_TIMES = (FIELD_TYPE.TIME, FIELD_TYPE.TIME2)
_EPOCH = dt.datetime(1970, 1, 1)


def selected_row(row: dict, columns: list) -> dict:
    """One row of a rows event (`values`, or `before_values`/`after_values` for an update, each with
    its `*none_sources`) with every image as a SELECT would return it."""
    out = dict(row)
    for image in ("values", "before_values", "after_values"):
        if image in row:
            sources = row.get(image.replace("values", "none_sources"), {})
            out[image] = as_selected(row[image], sources, columns)
    return out


def as_selected(values: dict, none_sources: dict, columns: list) -> dict:
    """`values` (one row image: name -> decoded value) as a SELECT would return them.
    `columns` are the table map's columns (mysql-replication `Column`s, named)."""
    out = dict(values)
    for column in columns:
        name = column.name
        if name not in out:
            continue
        value = out[name]
        if value is None:
            if column.type == FIELD_TYPE.SET and none_sources.get(name) == NONE_SOURCE.EMPTY_SET:
                out[name] = ""
            continue
        out[name] = _selected(value, column)
    return out


def _selected(value: object, column) -> object:
    kind = column.type
    binary = column.character_set_name == "binary"
    if binary and value == "":
        value = b""  # the library hands over an empty binary string as ''
    if kind == FIELD_TYPE.BIT and isinstance(value, str):
        return int(value, 2).to_bytes((len(value) + 7) // 8, "big") if value else b""
    if kind == FIELD_TYPE.SET and isinstance(value, (set, frozenset)):
        return ",".join(member for member in column.set_values if member in value)
    if kind in _TIMESTAMPS and value == _EPOCH:
        return None
    if kind == FIELD_TYPE.YEAR and value == 1900:
        return 0
    if kind == FIELD_TYPE.STRING and binary and isinstance(value, bytes):
        return value.ljust(getattr(column, "max_length", 0), b"\x00")
    if kind in _TIMES and isinstance(value, dt.timedelta):
        if kind == FIELD_TYPE.TIME2:
            value = _negative_time2_fraction_fixed(value)
        return time_text(value, getattr(column, "fsp", 0) or 0)
    if kind == FIELD_TYPE.JSON and not isinstance(value, str):
        return json_text(value)
    return value


def _negative_time2_fraction_fixed(value: dt.timedelta) -> dt.timedelta:
    """mysql-replication decodes a negative TIME2's whole seconds and fraction separately, so
    -00:00:01.250 arrives as -1.75 s: the fraction is the complement of the true one (only .5, its
    own complement, comes out right). Whole seconds and positive values are decoded correctly."""
    micros = value // dt.timedelta(microseconds=1)
    if micros >= 0:
        return value
    seconds, fraction = divmod(-micros, 1_000_000)
    if not fraction:
        return value
    return -dt.timedelta(seconds=seconds, microseconds=1_000_000 - fraction)


def time_text(value: dt.timedelta, fsp: int) -> str:
    """MySQL's text for a TIME value: [-]HH:MM:SS[.fraction], hours at least two digits."""
    micros = value // dt.timedelta(microseconds=1)
    sign = "-" if micros < 0 else ""
    seconds, micro = divmod(abs(micros), 1_000_000)
    text = f"{sign}{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    return f"{text}.{micro:06d}"[: len(text) + 1 + fsp] if fsp else text


def json_text(value: object) -> str:
    """MySQL's text for a decoded binary JSON value (what `SELECT json_column` returns)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        items = (f"{json_text(_key(k))}: {json_text(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(json_text(v) for v in value) + "]"
    if isinstance(value, float):
        return _double_text(value)
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        return json.dumps(value.strftime("%Y-%m-%d %H:%M:%S.%f"))
    if isinstance(value, dt.date):
        return json.dumps(value.isoformat())
    if isinstance(value, dt.time):
        return json.dumps(value.strftime("%H:%M:%S.%f"))
    if isinstance(value, dt.timedelta):
        return json.dumps(time_text(value, 6))
    return str(value)  # int


def _key(key: object) -> str:
    return key.decode("utf-8") if isinstance(key, bytes) else str(key)


def _double_text(value: float) -> str:
    """A JSON double as MySQL prints it: the shortest digits that read back, in plain notation while
    the decimal point falls within 15 places of them (0.00005, 123.5, 3.0), else in exponent
    notation (1e15, 2.5e-16, 1e300); an integral plain value keeps `.0`."""
    if not math.isfinite(value):
        return repr(value)
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return f"{sign}0.0"
    _, digit_tuple, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + exponent  # where the decimal point falls, counted from the first digit
    if -14 <= point <= 15:
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        if point >= len(digits):
            return f"{sign}{digits}{'0' * (point - len(digits))}.0"
        return f"{sign}{digits[:point]}.{digits[point:]}"
    mantissa = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{point - 1}"
