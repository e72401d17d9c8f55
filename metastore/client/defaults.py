"""Column defaults for files written before the column existed (existence defaults), outside Spark.

`ALTER TABLE t ADD COLUMN c INT DEFAULT 42` makes every row that existed before the ALTER read
42 in column c: files written earlier lack the column (by field id) and a reader must fill the
default, not NULL. A file written after the ALTER has the column, and a NULL stored there is a
real NULL. That is Spark's rule (its `EXISTS_DEFAULT`), and the bridge hands it to Spark's own
Parquet reader (`conform.pinned_struct` puts the default into each field's metadata), which
evaluates any constant expression.

Readers that do not run Spark SQL - the `metastore` data source's pyarrow reader on executors and
the CLI's `table read` - use `default_array` here. It evaluates the constant expressions people
write as defaults, with Spark's meaning, and refuses the rest with `DefaultNotEvaluableError`
(naming the expression) instead of guessing:

* literals: numbers (INT if it fits, else BIGINT; `1.5` is a DECIMAL, `1.5e3` a DOUBLE),
  strings (adjacent literals concatenate, as in Spark), TRUE/FALSE, NULL, X'..' binary;
* unary minus, + - * on numbers (overflow is an error, as in Spark's ANSI mode);
* CAST / TRY_CAST / typed literals (DATE '..', TIMESTAMP '..', 5L, 10BD) to primitive and
  decimal types; ARRAY(...) of those.

A zone-less TIMESTAMP literal, and any conversion between a TIMESTAMP and a DATE, TIMESTAMP_NTZ,
number or text, is refused here: Spark evaluates those in its session time zone (or counts
seconds, or renders its own way), and taking UTC made two readers of the same rows disagree. The
DDL refuses such defaults for new columns (`metastore.default_values`); a table created before
may have one. Non-constant-looking functions (current_date(), ...) are refused here, where Spark
evaluates them at read time. Both are documented limits of the non-Spark readers.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

# sqlglot's data types of a CAST inside a default -> Arrow (Spark's Arrow mapping).
_CAST_TYPES: Final = {
    exp.DataType.Type.BOOLEAN: pa.bool_(),
    exp.DataType.Type.TINYINT: pa.int8(),
    exp.DataType.Type.SMALLINT: pa.int16(),
    exp.DataType.Type.INT: pa.int32(),
    exp.DataType.Type.BIGINT: pa.int64(),
    exp.DataType.Type.FLOAT: pa.float32(),
    exp.DataType.Type.DOUBLE: pa.float64(),
    exp.DataType.Type.TEXT: pa.string(),
    exp.DataType.Type.VARCHAR: pa.string(),
    exp.DataType.Type.CHAR: pa.string(),
    exp.DataType.Type.BINARY: pa.binary(),
    exp.DataType.Type.DATE: pa.date32(),
    exp.DataType.Type.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    exp.DataType.Type.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
    exp.DataType.Type.TIMESTAMPNTZ: pa.timestamp("us"),
}
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class DefaultNotEvaluableError(ValueError):
    """A DEFAULT this reader cannot evaluate exactly as Spark would, or whose value does not fit
    the column's type. Carries the expression so the message can name it."""

    def __init__(self, default_sql: str, reason: str) -> None:
        super().__init__(
            f"cannot evaluate DEFAULT {default_sql} for rows written before the column existed "
            f"({reason}); read the table through MetastoreBridge (Spark evaluates any constant "
            "default)"
        )
        self.default_sql = default_sql


def default_array(default_sql: str, arrow_type: pa.DataType, rows: int) -> pa.Array:
    """`rows` copies of the default's value as `arrow_type` (the column's reader type)."""
    value = existence_default(default_sql, arrow_type)
    return pa.repeat(value, rows)


@lru_cache(maxsize=256)
def existence_default(default_sql: str, arrow_type: pa.DataType) -> pa.Scalar:
    """The default's value cast to `arrow_type`; raises DefaultNotEvaluableError."""
    try:
        node = sqlglot.parse_one(default_sql, read="spark")
    except sqlglot.errors.ParseError as exc:
        raise DefaultNotEvaluableError(default_sql, f"not parseable: {exc}") from None
    if not isinstance(node, exp.Expression):
        raise DefaultNotEvaluableError(default_sql, "not an expression")
    scalar = _evaluate(node, default_sql)
    return _cast(scalar, arrow_type, default_sql)


def _evaluate(node: exp.Expression, sql: str) -> pa.Scalar:
    match node:
        case exp.Paren():
            return _evaluate(node.this, sql)
        case exp.Null():
            return pa.scalar(None)
        case exp.Boolean():
            return pa.scalar(bool(node.this))
        case exp.Literal(is_string=True):
            return pa.scalar(str(node.this))
        case exp.Literal():
            return _number(str(node.this), sql)
        case exp.HexString():
            try:
                return pa.scalar(bytes.fromhex(str(node.this)))
            except ValueError:
                raise DefaultNotEvaluableError(sql, "malformed binary literal") from None
        case exp.Neg():
            inner = _evaluate(node.this, sql)
            try:
                return pc.negate_checked(inner)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise DefaultNotEvaluableError(sql, "minus of a non-number") from None
        case exp.Add() | exp.Sub() | exp.Mul():
            function = {exp.Add: "add_checked", exp.Sub: "subtract_checked"}.get(
                type(node), "multiply_checked"
            )
            left, right = _evaluate(node.this, sql), _evaluate(node.expression, sql)
            try:
                result: pa.Scalar = pc.call_function(function, [left, right])
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise DefaultNotEvaluableError(sql, f"arithmetic: {exc}") from None
            return result
        case exp.Concat() if all(_is_string_literal(e) for e in node.expressions):
            return pa.scalar("".join(str(e.this) for e in node.expressions))
        case exp.Cast() | exp.TryCast():
            target = _cast_type(node.to, sql)
            return _cast(_evaluate(node.this, sql), target, sql)
        case exp.Array():
            items = [_evaluate(e, sql) for e in node.expressions]
            try:
                return pa.scalar([s.as_py() for s in items])
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                raise DefaultNotEvaluableError(sql, "array of mixed types") from None
    raise DefaultNotEvaluableError(sql, f"{node.key} expressions are evaluated only by Spark")


def _is_string_literal(node: exp.Expression) -> bool:
    return isinstance(node, exp.Literal) and node.is_string


def _number(text: str, sql: str) -> pa.Scalar:
    if text.lstrip("-").isdigit():
        value = int(text)
        return pa.scalar(value, pa.int32() if _INT32_MIN <= value <= _INT32_MAX else pa.int64())
    if "e" in text.lower():
        return pa.scalar(float(text), pa.float64())
    try:
        return pa.scalar(Decimal(text))
    except (InvalidOperation, pa.ArrowInvalid):
        raise DefaultNotEvaluableError(sql, f"number {text!r}") from None


def _cast_type(dtype: exp.DataType, sql: str) -> pa.DataType:
    if dtype.this == exp.DataType.Type.DECIMAL:
        params = [int(p.name) for p in dtype.expressions]
        precision, scale = (params + [10, 0][len(params) :])[:2]
        return pa.decimal128(precision, scale)
    found = _CAST_TYPES.get(dtype.this)
    if found is None:
        raise DefaultNotEvaluableError(sql, f"CAST to {dtype.sql(dialect='spark')}")
    return found


def _cast(scalar: pa.Scalar, target: pa.DataType, sql: str) -> pa.Scalar:
    if scalar.type == target:
        return scalar
    why = _cast_differs_from_spark(scalar.type, target)
    if why:
        raise DefaultNotEvaluableError(sql, why)
    if pa.types.is_timestamp(target) and pa.types.is_string(scalar.type) and scalar.is_valid:
        return _timestamp(str(scalar.as_py()), target, sql)
    try:
        return scalar.cast(target)  # a safe cast: overflow or truncation raises
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise DefaultNotEvaluableError(sql, f"its value does not fit {target}: {exc}") from None


def _is_number(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


def _cast_differs_from_spark(source: pa.DataType, target: pa.DataType) -> str:
    """Why Arrow's cast from `source` to `target` would not give Spark's value ("" if it does):
    Spark counts a timestamp as a number in seconds (Arrow: its unit), renders a double and a
    timestamp as text its own way, and converts between instants and dates or local times in
    the session time zone (Arrow: UTC)."""

    def instant(t: pa.DataType) -> bool:  # Spark's TIMESTAMP
        return bool(pa.types.is_timestamp(t) and t.tz is not None)

    def local(t: pa.DataType) -> bool:  # a DATE or TIMESTAMP_NTZ
        return bool(pa.types.is_date(t) or (pa.types.is_timestamp(t) and t.tz is None))

    if (pa.types.is_timestamp(source) or pa.types.is_date(source)) and _is_number(target):
        return f"{source} as a number (Spark counts seconds, or refuses a DATE)"
    if _is_number(source) and (pa.types.is_timestamp(target) or pa.types.is_date(target)):
        return f"a number as {target} (Spark counts seconds, or refuses a DATE)"
    if pa.types.is_string(target) and (
        pa.types.is_floating(source) or pa.types.is_timestamp(source)
    ):
        return f"{source} as text (Spark renders it differently)"
    if (instant(source) and local(target)) or (local(source) and instant(target)):
        return f"{source} as {target} (Spark converts in the session time zone)"
    return ""


def _timestamp(text: str, target: pa.DataType, sql: str) -> pa.Scalar:
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise DefaultNotEvaluableError(sql, f"timestamp {text!r}") from None
    if target.tz is not None and value.tzinfo is None:
        # Spark reads it in its session time zone: taking UTC here gave other instants.
        raise DefaultNotEvaluableError(sql, "a TIMESTAMP without a time zone or offset")
    if target.tz is None and value.tzinfo is not None:
        raise DefaultNotEvaluableError(sql, "a TIMESTAMP_NTZ default with a zone offset")
    return pa.scalar(value, target)
