"""A prepared statement's parameters, bound into its SQL as typed literals.

quarry plans SQL text (its cut is made from DataFusion's plan of it), so a parameter reaches the
plan as a literal in the text. That is safe only if the literal is made from the value's type,
never from text the client sent: a string becomes a quoted literal with every quote doubled, a
number is written from the number (``repr`` of a float, ``str`` of an int), a date or a time from
its ISO form inside a ``CAST``, bytes as hexadecimal, a null as a ``CAST(NULL AS type)`` of the
parameter column's type. Every literal is closed on itself (a negative number is parenthesized:
``x -?`` must not become the comment ``x --5``) and set off by spaces.

Placeholders are ``?`` (JDBC, ODBC, ADBC; in order) or ``$1``, ``$2`` ... (DataFusion's; by
number), not both in one statement. They are found by a small scanner that steps over quoted
strings (``'...'``, ``E'...'`` with its backslash escapes, dollar-quoted ``$tag$...$tag$``),
quoted identifiers and comments, so a ``?`` inside any of those stays text.
"""

from __future__ import annotations

import datetime
import decimal
import math
from dataclasses import dataclass

import pyarrow as pa

from quarry.errors import QueryError

PARAMETERS_MAX = 1024  # placeholders in one statement
SQL_CHARS_MAX = 1 << 20  # the text of one statement
STRING_PARAMETER_CHARS_MAX = 1 << 20  # one string (or bytes) parameter


@dataclass(frozen=True)
class Placeholders:
    """Where a statement's placeholders are: ``spans`` of the text, and which parameter column
    each one takes (``?`` counts up from 0; ``$n`` takes column n - 1)."""

    spans: tuple[tuple[int, int], ...]
    columns: tuple[int, ...]

    @property
    def count(self) -> int:
        """How many parameter columns the statement takes."""
        return max(self.columns) + 1 if self.columns else 0


def find(sql: str) -> Placeholders:
    """The placeholders of ``sql`` outside strings, quoted names and comments."""
    if len(sql) > SQL_CHARS_MAX:
        raise QueryError(f"a statement of {len(sql):,} characters is over {SQL_CHARS_MAX:,}")
    spans: list[tuple[int, int]] = []
    columns: list[int] = []
    styles = set()
    index = 0
    while index < len(sql):
        skipped = _skip_quoted_or_comment(sql, index)
        if skipped > index:
            index = skipped
            continue
        char = sql[index]
        if char == "?":
            styles.add("?")
            spans.append((index, index + 1))
            columns.append(len(columns))
            index += 1
        elif char == "$" and index + 1 < len(sql) and sql[index + 1].isdigit():
            end = index + 1
            while end < len(sql) and sql[end].isdigit():
                end += 1
            number = int(sql[index + 1 : end])
            if not 1 <= number <= PARAMETERS_MAX:
                raise QueryError(f"placeholder ${number}: numbers run from $1 to ${PARAMETERS_MAX}")
            styles.add("$")
            spans.append((index, end))
            columns.append(number - 1)
            index = end
        else:
            index += 1
        if len(spans) > PARAMETERS_MAX:
            raise QueryError(f"more than {PARAMETERS_MAX} placeholders in one statement")
    if len(styles) > 1:
        raise QueryError("use either ? or $1, $2 ... placeholders in a statement, not both")
    return Placeholders(tuple(spans), tuple(columns))


def _skip_quoted_or_comment(sql: str, index: int) -> int:
    """The index after a string, quoted identifier or comment starting at ``index`` (or
    ``index`` itself when none starts there). One left open runs to the end of the text: the
    planner then refuses the statement, with nothing bound inside it."""
    char = sql[index]
    following = sql[index + 1] if index + 1 < len(sql) else ""
    if char == "-" and following == "-":
        end = sql.find("\n", index)
        return len(sql) if end < 0 else end + 1
    if char == "/" and following == "*":
        end = sql.find("*/", index + 2)
        return len(sql) if end < 0 else end + 2
    if char in "'\"":
        escaped = char == "'" and _escape_string(sql, index)
        return _closing_quote(sql, index + 1, char, escaped)
    if char == "$" and not following.isdigit():
        tag_end = sql.find("$", index + 1)
        tag = sql[index : tag_end + 1] if tag_end > 0 else ""
        if tag and (tag == "$$" or tag[1:-1].replace("_", "a").isalnum()):
            end = sql.find(tag, tag_end + 1)
            return len(sql) if end < 0 else end + len(tag)
    return index


def _escape_string(sql: str, quote: int) -> bool:
    """Whether the string opening at ``quote`` is an ``E'...'`` one (backslash escapes)."""
    if quote == 0 or sql[quote - 1] not in "eE":
        return False
    return quote == 1 or not (sql[quote - 2].isalnum() or sql[quote - 2] == "_")


def _closing_quote(sql: str, index: int, quote: str, backslash_escapes: bool) -> int:
    while index < len(sql):
        char = sql[index]
        if backslash_escapes and char == "\\":
            index += 2
        elif char == quote and index + 1 < len(sql) and sql[index + 1] == quote:
            index += 2  # a doubled quote is one quote inside
        elif char == quote:
            return index + 1
        else:
            index += 1
    return len(sql)


def bind(sql: str, placeholders: Placeholders, row: list[pa.Scalar]) -> str:
    """``sql`` with every placeholder replaced by the literal of its parameter."""
    if len(row) < placeholders.count:
        raise QueryError(
            f"the statement takes {placeholders.count} parameter(s), {len(row)} were bound"
        )
    pieces: list[str] = []
    last = 0
    for (start, end), column in zip(placeholders.spans, placeholders.columns):
        pieces += [sql[last:start], " ", literal(row[column]), " "]
        last = end
    pieces.append(sql[last:])
    return "".join(pieces)


_INTEGER_TYPES = {
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INT",
    pa.int64(): "BIGINT",
    pa.uint8(): "TINYINT UNSIGNED",
    pa.uint16(): "SMALLINT UNSIGNED",
    pa.uint32(): "INT UNSIGNED",
    pa.uint64(): "BIGINT UNSIGNED",
}


def sql_type(arrow_type: pa.DataType) -> str:
    """The SQL type DataFusion reads back as ``arrow_type`` (for CASTs and typed nulls)."""
    if arrow_type in _INTEGER_TYPES:
        return _INTEGER_TYPES[arrow_type]
    if pa.types.is_float64(arrow_type):
        return "DOUBLE"
    if pa.types.is_float32(arrow_type) or pa.types.is_float16(arrow_type):
        return "REAL"
    if pa.types.is_boolean(arrow_type):
        return "BOOLEAN"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "VARCHAR"
    if pa.types.is_string_view(arrow_type):
        return "VARCHAR"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "BYTEA"
    if pa.types.is_decimal(arrow_type):
        return f"DECIMAL({arrow_type.precision}, {arrow_type.scale})"
    if pa.types.is_date(arrow_type):
        return "DATE"
    if pa.types.is_timestamp(arrow_type):
        return "TIMESTAMP"
    raise QueryError(
        f"a parameter of type {arrow_type} cannot be bound: use a number, string, boolean, "
        "decimal, date, timestamp or binary value"
    )


def literal(value: pa.Scalar) -> str:
    """The SQL literal of one parameter value, made from its type (see the module's doc)."""
    arrow_type = value.type
    if pa.types.is_null(arrow_type):
        return "NULL"
    if not value.is_valid:
        return f"CAST(NULL AS {sql_type(arrow_type)})"
    python = value.as_py()
    if pa.types.is_boolean(arrow_type):
        return "TRUE" if python else "FALSE"
    if arrow_type in _INTEGER_TYPES:
        number = int(python)
        text = f"({number})" if number < 0 else str(number)
        return text if arrow_type == pa.int64() else f"CAST({text} AS {_INTEGER_TYPES[arrow_type]})"
    if pa.types.is_floating(arrow_type):
        return _float(float(python), sql_type(arrow_type))
    if pa.types.is_decimal(arrow_type):
        assert isinstance(python, decimal.Decimal)
        return f"CAST('{python}' AS {sql_type(arrow_type)})"
    if isinstance(python, str):
        return _quoted(python)
    if isinstance(python, bytes):
        _check_length(python)
        return f"X'{python.hex()}'"
    if pa.types.is_date(arrow_type):
        assert isinstance(python, datetime.date)
        return f"CAST('{python.isoformat()}' AS DATE)"
    if pa.types.is_timestamp(arrow_type):
        return _timestamp(value)
    return sql_type(arrow_type)  # raises: no literal for this type


def _float(number: float, type_name: str) -> str:
    if math.isnan(number):
        return f"CAST('NaN' AS {type_name})"
    if math.isinf(number):
        return f"CAST('{'-' if number < 0 else ''}Infinity' AS {type_name})"
    text = repr(number)  # the shortest text that reads back as the same double
    if number < 0 or text.startswith("-"):
        text = f"({text})"
    return text if type_name == "DOUBLE" else f"CAST({text} AS {type_name})"


def _timestamp(value: pa.Scalar) -> str:
    """A timestamp from its integer count of its unit (no rounding through Python's
    microseconds), in UTC when the column has a time zone."""
    unit = value.type.unit
    count = value.cast(pa.int64()).as_py()
    seconds, fraction = divmod(count, {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[unit])
    moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=seconds)
    digits = {"s": 0, "ms": 3, "us": 6, "ns": 9}[unit]
    text = moment.isoformat(sep=" ") + (f".{fraction:0{digits}d}" if digits else "")
    return f"CAST('{text}' AS TIMESTAMP)"


def _check_length(value: str | bytes) -> None:
    if len(value) > STRING_PARAMETER_CHARS_MAX:
        raise QueryError(
            f"a parameter of {len(value):,} characters is over {STRING_PARAMETER_CHARS_MAX:,}"
        )


def _quoted(text: str) -> str:
    """A standard SQL string: quotes doubled; a backslash is an ordinary character in one."""
    _check_length(text)
    if "\x00" in text:
        raise QueryError("a string parameter holds a NUL character, which SQL text cannot")
    return "'" + text.replace("'", "''") + "'"
