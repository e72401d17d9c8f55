"""DDL-time checks of a column's DEFAULT value (called by `metastore.ddl.parse_ddl`).

Writers fill a column they do not write with CAST(default AS type) (`spark_bridge.conform`,
`spark_bridge.datasource`), and readers fill it for files written before the column existed
(`metastore.client.defaults`, Spark's EXISTS_DEFAULT). A NOT NULL column whose default is no
value of its type (a DATE column with DEFAULT 'abc', a DECIMAL(3,1) with 12345.6, an INT with
3000000000) therefore breaks every such write (NULL in a NOT NULL column, or an ANSI cast error),
and an ADD COLUMN job's write-only step breaks every writer of the table. So a default that is a
literal under parentheses, casts and a sign is followed through each cast to the column's type
here, with Spark's cast rules, and refused when it is certainly no value. Anything this does not
model (functions, arithmetic, casts between types it does not follow) is left to Spark.

A non-deterministic DEFAULT (rand(), uuid(), ...) is refused on any column: Spark refuses it,
and its Parquet reader fails every read of a table whose schema carries one.

A column added to an existing table may not default to a function of the time or session
(current_timestamp(), current_date(), current_user(), ...): Spark evaluates the existence default
at every read of a file that lacks the column (its own ALTER TABLE evaluates it once, and stores
the value), so rows written before the column existed read a new value at every read, and a read
AS OF one timestamp never returns the same rows twice. CREATE TABLE keeps them: no row predates
the column, and writers evaluate them when they write.

The value checks hold for nullable columns too: Spark's Parquet reader assigns the default (the
field's EXISTS_DEFAULT) to the column for every file written before the column existed, and fails
the whole read (INVALID_DEFAULT_VALUE.DATA_TYPE) when it cannot - a string that is no value of the
type ('abc' or '1.5' for an INT), a BOOLEAN for anything but a BOOLEAN or string column, anything
but a BOOLEAN for a BOOLEAN column ('true' must be written TRUE), a BINARY (X'..') for anything
but a BINARY or string column, a DATE or TIMESTAMP_NTZ for a number column (a TIMESTAMP, a
number of seconds, is assigned). Spark's own ALTER TABLE refuses
the same defaults (measured with pyspark 4). So does Spark's parser: a number literal beyond a
DOUBLE or of more than 38 digits, and a TIMESTAMP (or TIMESTAMP_NTZ) beyond its 64-bit
microseconds (years -290308 to +294247) are refused here too. A FLOAT or DOUBLE default beyond
its type's range (FLOAT DEFAULT 1e40, DOUBLE DEFAULT '1e400') Spark accepts and turns into
Infinity (measured with pyspark 4): never the value written, so it is refused (write
CAST('Infinity' AS FLOAT) for that); integers and decimals beyond their types Spark refuses too.

On any column, a default whose value depends on the session time zone is refused: a TIMESTAMP
from a string without zone or offset (TIMESTAMP '2024-01-01 00:00:00'), from a DATE,
TIMESTAMP_NTZ or number, and a TIMESTAMP turned into a DATE, TIMESTAMP_NTZ or string. Spark
evaluates those in its session time zone, the pyarrow readers and writers
(`metastore.client.defaults`) in UTC, so two readers of the same rows at the same timestamp saw
different instants. With an explicit zone every reader gets the same instant. A default that is a
function or an operator is refused likewise when Spark evaluates any part of it in its session
time zone, so that two Spark sessions with different `spark.sql.session.timeZone` read different
values in the same old rows (measured with pyspark 4): a function that parses or renders local
times or reads the zone (from_unixtime, unix_timestamp of a string, to_timestamp, date_format,
date_trunc, to_json, current_timezone(), make_timestamp without a zone, to_date with a zone
pattern, ...), a field of an instant (hour, year, extract, ...), an instant passed to anything but
a cast to TIMESTAMP or a number, unix_seconds/millis/micros, unix_timestamp, from_utc_timestamp,
to_utc_timestamp or coalesce, an interval added to an instant (or hours to a DATE), a cast to
TIMESTAMP of anything but an instant or a zoned string, and a TIMESTAMP column given a value that
is not an instant (or another column given an instant). Zone-free forms stay: timestamp_seconds(0),
make_timestamp(..., 'UTC'), DATE and TIMESTAMP_NTZ arithmetic, fields of a TIMESTAMP_NTZ.

The stored text of a DEFAULT is sqlglot's Spark rendering of what the user wrote (canonical, so
every reader and the checks here parse one form), not the user's own text: the stored defaults
already in catalogs are such renderings, and the non-Spark readers (`metastore.client.defaults`)
and widening checks (`metastore.schema`) read that form. sqlglot's round trip changes the meaning
of some expressions, so `check_rendering` refuses a DEFAULT whose rendering is not what the user
wrote, found by comparing the user's text with the rendering (measured with pyspark 4, both
evaluated in one session; tests/metastore/test_ddl_default_rendering.py): a string literal of the
user's that the rendering lacks (to_char's and to_date's dropped formats, trunc's 'Q' written
'QUARTER'), a function whose rendering gives another value or type or one Spark refuses
(`_UNFAITHFUL_FUNCTIONS`), a 0x literal (a column name to Spark, a BINARY to sqlglot), an N'..'
literal, and a cast to a type name Spark does not read as written (`_SPARK_CAST_TYPES`: INT8
became TINYINT, TIMESTAMP WITHOUT TIME ZONE a TIMESTAMP, BOOL and TEXT Spark refuses). Renamed
functions with the same meaning (ucase -> UPPER, instr -> LOCATE, space -> REPEAT, ...), typed
literals written as casts, and escapes written another way keep being stored as rendered.

Checked on the receiving node, not in apply: entries already in a log keep applying as they did.
"""

from __future__ import annotations

import itertools
import math
import re
import struct
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from decimal import (
    MAX_EMAX,
    MIN_EMIN,
    ROUND_HALF_UP,
    Context,
    Decimal,
    DecimalException,
    InvalidOperation,
)
from typing import Final, NoReturn

import sqlglot
from sqlglot import exp

from metastore.errors import InvalidArgumentError, MetastoreError
from metastore.lexer import TokenKind, tokenize
from metastore.schema import Column
from metastore.types import (
    BIGINT,
    BINARY,
    BOOLEAN,
    DATE,
    DOUBLE,
    FLOAT,
    INT,
    SMALLINT,
    STRING,
    TIMESTAMP,
    TIMESTAMP_NTZ,
    TINYINT,
    ArrayType,
    CharType,
    DataType,
    DecimalType,
    MapType,
    PrimitiveType,
    StructType,
    VarcharType,
)

_INT_RANGES: Final = {
    TINYINT: (-(2**7), 2**7 - 1),
    SMALLINT: (-(2**15), 2**15 - 1),
    INT: (-(2**31), 2**31 - 1),
    BIGINT: (-(2**63), 2**63 - 1),
}
# What Spark casts to a boolean (trimmed, case-insensitive); anything else is NULL.
_BOOLEAN_STRINGS: Final = frozenset({"t", "true", "y", "yes", "1", "f", "false", "n", "no", "0"})
# Spark's date and timestamp strings: [+-]yyyy[-[m]m[-[d]d]], then for a timestamp an optional
# ' ' or 'T' and [h]h[:[m]m[:[s]s[.fraction]]], then an optional zone.
_DATE_RE: Final = re.compile(r"([+-]?\d{4,6})(?:-(\d{1,2})(?:-(\d{1,2}))?)?")
_INTEGER_RE: Final = re.compile(r"[+-]?\d+")
_OFFSET_RE: Final = re.compile(r"Z|(?:UTC|GMT|UT)?(?:[+-]\d{1,2}(?::?\d{2}(?::?\d{2})?)?)?")
_TIME_RE: Final = re.compile(r"[ T](\d{1,2})(?::(\d{1,2})(?::(\d{1,2})(?:\.(\d{0,9}))?)?)?")
# Spark's TIMESTAMP and TIMESTAMP_NTZ are 64-bit microseconds since the epoch (years -290308
# to +294247); a string beyond is malformed (CAST_INVALID_INPUT, measured with pyspark 4).
_MICROS_MIN: Final = -(2**63)
_MICROS_MAX: Final = 2**63 - 1
# The largest zone offset (java.time): a zoned time this far beyond the range is beyond it
# whatever its zone.
_MAX_ZONE_OFFSET_MICROS: Final = 18 * 3600 * 1_000_000

# Entries of the system's time zone files that are no zone to Spark (CAST_INVALID_INPUT,
# measured with pyspark 4 on Java 17): the node's own `localtime`, tzdata's `posixrules` and
# `Factory`, the `posix/` and `right/` copies, and `ROC`.
_NOT_SPARK_ZONES: Final = frozenset({"localtime", "posixrules", "Factory", "ROC"})
_NOT_SPARK_ZONE_PREFIXES: Final = ("posix/", "right/")

# Non-deterministic functions (sqlglot's names): Spark refuses them in a DEFAULT.
_NON_DETERMINISTIC: Final = frozenset(
    {
        "RAND",
        "RANDN",
        "RANDOM",
        "RANDSTR",
        "UNIFORM",
        "UUID",
        "SHUFFLE",
        "MONOTONICALLY_INCREASING_ID",
        "SPARK_PARTITION_ID",
        "INPUT_FILE_NAME",
        "INPUT_FILE_BLOCK_START",
        "INPUT_FILE_BLOCK_LENGTH",
    }
)

# Functions whose value depends on when or by whom it is evaluated (sqlglot's names). Spark
# evaluates an existence default at every read of a file that lacks the column.
_READ_TIME: Final = frozenset(
    {
        "CURRENT_TIMESTAMP",
        "CURRENT_DATE",
        "CURRENT_TIME",
        "CURRENT_DATETIME",
        "NOW",
        "LOCALTIMESTAMP",
        "CURRENT_TIMEZONE",
        "CURRENT_USER",
        "USER",
        "SESSION_USER",
        "CURRENT_DATABASE",
        "CURRENT_SCHEMA",
        "CURRENT_CATALOG",
    }
)

# Decimal arithmetic on defaults: exact for any DECIMAL (38 digits), rounding as Spark does.
_EXACT: Final = Context(prec=100, rounding=ROUND_HALF_UP, Emax=MAX_EMAX, Emin=MIN_EMIN)

# What Spark's parser reads as a number (see `_number_spark_refuses`).
_DOUBLE_MAX: Final = Decimal("1.7976931348623157e308")
_MAX_DECIMAL_DIGITS: Final = 38

# Kinds of value followed through the casts.
_STRING: Final = "string"
_NUMBER: Final = "number"
_BOOL: Final = "boolean"
_DATE: Final = "date"
_BINARY: Final = "binary"
_TS: Final = "timestamp"
_NTZ: Final = "timestamp_ntz"
_OTHER: Final = "other"


@dataclass(frozen=True, slots=True)
class _Value:
    kind: str
    text: str | None = None  # a string's text, when known
    number: Decimal | None = None  # a number's value, when known


class _NoValue(Exception):
    """The default is certainly no value of the type it is cast to."""


class _ZoneDependent(Exception):
    """A cast of the default between a TIMESTAMP (an instant) and a zone-less form (a date,
    a local date-time, a string without zone): its result depends on the session time zone."""


def check_default(
    column: Column,
    *,
    cast_type: Callable[[exp.DataType], DataType | None],
    added: bool,
) -> None:
    """Refuse (InvalidArgumentError) a DEFAULT that is not deterministic, depends on the session
    time zone, or is certainly no value Spark can assign to the column; NULL on a NOT NULL
    column; and, for a column `added` to an existing table (ALTER TABLE ... ADD COLUMN: rows
    written before read the default), one that depends on when or by whom it is evaluated.
    `cast_type` reads a CAST's target type (None: unsupported)."""
    if column.default_sql is None:
        return
    try:
        node: object = sqlglot.parse_one(column.default_sql, read="spark")
    except Exception:  # noqa: BLE001  (canonical text we rendered; see ddl._sqlglot_parse)
        return
    if not isinstance(node, exp.Expression):
        return
    unreadable = _number_spark_refuses(node)
    if unreadable is not None:
        raise InvalidArgumentError(
            f"DEFAULT {column.default_sql} of column {column.name} holds a number Spark's parser "
            f"refuses ({unreadable}), so every read and write of the table would fail",
            details={"column": column.name, "default": column.default_sql},
        )
    functions = _function_names(node)
    if functions & _NON_DETERMINISTIC:
        raise InvalidArgumentError(
            f"DEFAULT {column.default_sql} of column {column.name} is not deterministic "
            f"({', '.join(sorted(functions & _NON_DETERMINISTIC))}): Spark refuses it, and "
            "fails every read of a table that has it",
            details={"column": column.name, "default": column.default_sql},
        )
    if _literal_and_casts(node, cast_type) is None:
        # Not a literal under casts (followed exactly below): a function or an operator.
        reason = _session_zone_reason(node, column.type, cast_type)
        if reason is not None:
            _refuse_zone_dependent(column, reason)
    if added and functions & _READ_TIME:
        raise InvalidArgumentError(
            f"DEFAULT {column.default_sql} of added column {column.name} changes with time or "
            f"session ({', '.join(sorted(functions & _READ_TIME))}): rows written before the "
            "column existed read their default when read, so they would read another value at "
            "every read; give a constant (e.g. TIMESTAMP '2024-01-01 00:00:00Z')",
            details={"column": column.name, "default": column.default_sql},
        )
    _check_cast_under_sign(column, node, cast_type)
    found = _literal_and_casts(node, cast_type)
    if found is None:
        return
    value, targets = found
    if value is None:
        if column.nullable:
            return
        raise InvalidArgumentError(
            f"column {column.name} is NOT NULL but its DEFAULT is NULL",
            details={"column": column.name, "default": column.default_sql},
        )
    try:
        for target in targets:
            if target is None:
                return  # a type not followed: left to Spark
            next_value = _cast(value, target)
            if next_value is None:
                return
            value = next_value
        _check_assignable(value, column.type)
        _cast(value, column.type)
    except _NoValue as exc:
        raise InvalidArgumentError(
            f"DEFAULT {column.default_sql} of column {column.name} is no "
            f"{column.type.to_sql()} value ({exc}): Spark refuses it, so every read of files "
            "written before the column existed, and every write filling it, would fail",
            details={"column": column.name, "default": column.default_sql},
        ) from None
    except _ZoneDependent as exc:
        _refuse_zone_dependent(column, str(exc))


# Functions (as the user writes them, lower case) whose sqlglot rendering means something else in
# Spark (measured with pyspark 4): to_char loses its format (or, without one, which
# Spark refuses, become a CAST), log10/log2 become LOG(10|2, x) (a different last digit),
# unix_date becomes DATEDIFF (BIGINT instead of INT), collate(s, c) becomes s COLLATE 'c' (refused
# by Spark), parse_json(s) (a VARIANT) becomes s (a STRING).
_UNFAITHFUL_FUNCTIONS: Final = frozenset(
    {"to_char", "log10", "log2", "unix_date", "collate", "parse_json"}
)
_STRING_TOKENS: Final = frozenset({"STRING", "RAW_STRING", "NATIONAL_STRING", "UNICODE_STRING"})


def check_rendering(column_name: str, written: str, rendered: str, *, types_only: bool) -> None:
    """Refuse (InvalidArgumentError) a DEFAULT whose rendering `rendered` (the text stored) means
    something else in Spark than `written`, the user's text of it. See the module docstring.
    `types_only`: check only the types of its casts."""

    def refuse(why: str) -> NoReturn:
        raise InvalidArgumentError(
            f"DEFAULT {written[:200]} of column {column_name} cannot be stored as written: "
            f"{why}; write it another way (e.g. a constant, or a cast of one)",
            details={
                "column": column_name,
                "default": written[:200],
                "stored": rendered[:200],
                "reason": f"rendering: {why}",
            },
        )

    try:
        tokenizer = sqlglot.Dialect.get_or_raise("spark")
        written_tokens = tokenizer.tokenize(written)
        rendered_tokens = tokenizer.tokenize(rendered)
    except Exception:  # noqa: BLE001  (third-party tokenizer; the parser already read both)
        return
    for token, following in itertools.pairwise(written_tokens):
        name = token.text.lower()
        if following.token_type.name == "L_PAREN" and name in _UNFAITHFUL_FUNCTIONS:
            refuse(f"{name}() would be stored as something Spark evaluates differently")
    for token in written_tokens:
        if token.token_type.name == "NATIONAL_STRING":
            refuse("Spark has no N'..' literal")
        if token.token_type.name == "HEX_STRING" and written[token.start : token.start + 2] in (
            "0x",
            "0X",
        ):
            refuse(f"Spark reads {written[token.start : token.end + 1]} as a column name")
    for type_name in _cast_type_names_spark_lacks(written):
        refuse(f"Spark has no type {type_name}")
    if types_only:
        return
    remaining = [t.text for t in rendered_tokens if t.token_type.name in _STRING_TOKENS]
    # named_struct('a', 1) is rendered STRUCT(1 AS a): a field name becomes an identifier.
    names = [t.text for t in rendered_tokens if t.token_type.name in ("VAR", "IDENTIFIER")]
    for token in written_tokens:
        if token.token_type.name not in _STRING_TOKENS:
            continue
        if token.text in remaining:
            remaining.remove(token.text)
        elif token.text.isalpha() and token.text.upper() in remaining:
            # A unit upper-cased (trunc(d, 'week') -> 'WEEK'): Spark reads units in any case.
            remaining.remove(token.text.upper())
        elif token.text in names:
            names.remove(token.text)
        else:
            refuse(
                f"the string {token.text[:40]!r} would not be in the stored text {rendered[:120]}"
            )


def _check_cast_under_sign(
    column: Column, node: exp.Expression, cast_type: Callable[[exp.DataType], DataType | None]
) -> None:
    """Spark evaluates -CAST(x AS t) cast first: -CAST(128 AS TINYINT) overflows, although
    -128 is a TINYINT. sqlglot stores -128Y, -32768S and -9223372036854775808L in that form, so
    each would fail every write and read (CAST_OVERFLOW, measured with pyspark 4). The casts
    under the sign are followed here without it; `_literal_and_casts` then checks the whole."""
    while isinstance(node, exp.Paren):
        node = node.this
    if not isinstance(node, exp.Neg):
        return
    operand = node.this
    while isinstance(operand, exp.Paren):
        operand = operand.this
    if not isinstance(operand, exp.Cast) or operand.args.get("safe"):
        return  # (sqlglot reads Spark's CAST as a TryCast; TRY_CAST, `safe`, gives NULL)
    found = _literal_and_casts(operand, cast_type)
    if found is None or found[0] is None:
        return
    value: _Value | None = found[0]
    try:
        for target in found[1]:
            if target is None or value is None:
                return
            value = _cast(value, target)
    except _NoValue as exc:
        raise InvalidArgumentError(
            f"DEFAULT {column.default_sql} of column {column.name}: Spark casts before it "
            f"applies the sign, and the cast fails ({exc}); write the sign inside the cast, "
            "e.g. CAST(-128 AS TINYINT)",
            details={"column": column.name, "default": column.default_sql},
        ) from None
    except _ZoneDependent:
        return  # judged on the whole below


# The type names Spark's parser reads in a CAST (a complex type's elements are not looked at).
# sqlglot reads many more and stores one of Spark's instead, measured with pyspark 4: some Spark
# refuses (BOOL, TEXT, INT4, VARCHAR without a length, DOUBLE PRECISION, BYTEA, ...), and some it
# reads as something else (INT8 became TINYINT; Spark's TIMESTAMP WITHOUT TIME ZONE, a
# TIMESTAMP_NTZ, became TIMESTAMP).
_SPARK_CAST_TYPES: Final = frozenset(
    {
        "BOOLEAN",
        "TINYINT",
        "BYTE",
        "SMALLINT",
        "SHORT",
        "INT",
        "INTEGER",
        "BIGINT",
        "LONG",
        "FLOAT",
        "REAL",
        "DOUBLE",
        "DECIMAL",
        "DEC",
        "NUMERIC",
        "STRING",
        "CHAR",
        "CHARACTER",
        "VARCHAR",
        "BINARY",
        "DATE",
        "TIMESTAMP",
        "TIMESTAMP_NTZ",
        "TIMESTAMP_LTZ",
        "INTERVAL",
        "ARRAY",
        "MAP",
        "STRUCT",
        "VOID",
        "VARIANT",
    }
)
_SIZED_TYPES: Final = frozenset({"CHAR", "CHARACTER", "VARCHAR"})  # Spark needs the length


def _cast_type_names_spark_lacks(written: str) -> list[str]:
    """The target types of the CASTs (`AS t`, `::t`) in `written` that Spark does not read as
    written (see `_SPARK_CAST_TYPES`)."""
    try:
        tokens = tokenize(written)
    except MetastoreError:
        return []
    found: list[str] = []
    for i, tok in enumerate(tokens):
        double_colon = tok.is_punct(":") and i > 0 and tokens[i - 1].is_punct(":")
        if not (tok.is_word("AS") or double_colon):
            continue
        name_token = tokens[i + 1]
        name = name_token.value.upper()
        if name_token.kind is not TokenKind.WORD:
            continue
        if name not in _SPARK_CAST_TYPES:
            found.append(name)
            continue
        following = tokens[i + 2]
        if name in _SIZED_TYPES and not following.is_punct("("):
            found.append(f"{name} without a length")
        elif name not in ("INTERVAL", "STRING") and following.kind is TokenKind.WORD:
            found.append(f"{name} {following.value.upper()}")  # DOUBLE PRECISION, TIMESTAMP WITH..
    return found


def _refuse_zone_dependent(column: Column, reason: str) -> NoReturn:
    raise InvalidArgumentError(
        f"DEFAULT {column.default_sql} of column {column.name} depends on the session time "
        f"zone ({reason}): Spark fills it in its session time zone (each session its own) and "
        "the other readers and writers in UTC, so the same rows would read differently; give "
        "a constant with an explicit zone or offset (e.g. TIMESTAMP '2024-01-01 00:00:00Z' or "
        "'2024-01-01 00:00:00+01:00'), or make the column TIMESTAMP_NTZ",
        details={"column": column.name, "default": column.default_sql, "reason": reason},
    )


# --- defaults that are functions or operators: the session time zone ---------------------------
#
# Spark evaluates a default in its session time zone (spark.sql.session.timeZone) wherever an
# instant (a TIMESTAMP) meets a local form (a date, a local date-time, a string, a field such as
# the hour): each session, and each reader outside Spark, would give old rows another value.
# Which expressions do, measured with pyspark 4 in one session at America/Los_Angeles and at
# Asia/Tokyo (tests/metastore/test_ddl_session_zone_defaults.py lists the cases):

# Functions whose value depends on the session time zone whatever their arguments (sqlglot's
# names and Spark's): they parse or render local times, or read the zone itself.
_SESSION_ZONE_FUNCTIONS: Final = frozenset(
    {
        "CURRENT_TIMEZONE",
        "UNIX_TO_STR",  # from_unixtime
        "STR_TO_TIME",  # to_timestamp with a format
        "TO_TIMESTAMP",
        "TRY_TO_TIMESTAMP",
        "TO_TIMESTAMP_LTZ",
        "TIME_TO_STR",  # date_format (on a DATE or TIMESTAMP_NTZ too: read as an instant)
        "DATE_FORMAT",
        "TO_CHAR",
        "TO_VARCHAR",
        "TIMESTAMP_TRUNC",  # date_trunc
        "JSON_FORMAT",  # to_json
        "TO_JSON",
        "FROM_JSON",
        "TO_CSV",
        "FROM_CSV",
        "SCHEMA_OF_JSON",
        "SCHEMA_OF_CSV",
        "WINDOW",
        "SESSION_WINDOW",
        "WINDOW_TIME",
        "MONTHS_BETWEEN",
        "TIMESTAMP_ADD",  # timestampadd
        "TIMESTAMP_DIFF",  # timestampdiff
        "TIMESTAMPADD",
        "TIMESTAMPDIFF",
    }
)
# Fields of a date-time: of an instant they are taken in the session time zone, and a string
# argument is read as an instant; only a TIMESTAMP_NTZ (or, for EXTRACT, a DATE) is zone-free.
_TIME_FIELD_FUNCTIONS: Final = frozenset({"HOUR", "MINUTE", "SECOND"})
_FIELD_FUNCTIONS: Final = _TIME_FIELD_FUNCTIONS | {"EXTRACT", "DATE_PART", "DATEPART"}
# Functions taking an instant that give the same value in every session, provided their
# argument is an instant (a string or date argument is read as one in the session time zone).
# (unix_timestamp parses a string argument as a local time; of an instant it is unix_seconds.)
_INSTANT_CONSUMERS: Final = frozenset(
    {
        "UNIX_SECONDS",
        "UNIX_MILLIS",
        "UNIX_MICROS",
        "STR_TO_UNIX",  # unix_timestamp, to_unix_timestamp
        "UNIX_TIMESTAMP",
        "TO_UNIX_TIMESTAMP",
    }
)
# Pattern letters of a zone or offset (java.time): to_date with such a format reads an instant
# and takes its date in the session time zone.
_ZONE_PATTERN_LETTERS: Final = frozenset("VzOXxZ")
# Functions returning an instant; make_timestamp and make_timestamp_ltz only with a zone.
_INSTANT_PRODUCERS: Final = frozenset(
    {
        "TIMESTAMP_SECONDS",
        "TIMESTAMP_MILLIS",
        "TIMESTAMP_MICROS",
        "TIMESTAMP_FROM_PARTS",  # make_timestamp
        "MAKE_TIMESTAMP_LTZ",
        "TO_TIMESTAMP_LTZ",
        "TRY_TO_TIMESTAMP",
        "STR_TO_TIME",
        "CURRENT_TIMESTAMP",
        "NOW",
    }
)
_PASS_THROUGH: Final = frozenset({"COALESCE", "NVL", "IFNULL", "GREATEST", "LEAST"})
_DATE_PRODUCERS: Final = frozenset(
    {
        "TS_OR_DS_TO_DATE",
        "TS_OR_DS_ADD",
        "DATE_FROM_UNIX_DATE",
        "MAKE_DATE",
        "LAST_DAY",
        "NEXT_DAY",
        "ADD_MONTHS",
        "DATE_TRUNC",
        "CURRENT_DATE",
    }
)
_NTZ_PRODUCERS: Final = frozenset({"TO_TIMESTAMP_NTZ", "LOCALTIMESTAMP", "CONVERT_TIMEZONE"})
_SUB_DAY_UNITS: Final = ("HOUR", "MINUTE", "SECOND")


def _session_zone_reason(
    node: exp.Expression,
    column_type: DataType,
    cast_type: Callable[[exp.DataType], DataType | None],
) -> str | None:
    """Why the default `node` (a function or an operator, not a literal under casts) has a
    value that depends on Spark's session time zone, or None when it does not."""
    for sub in node.walk():
        if not isinstance(sub, exp.Expression):
            continue
        reason = _sub_expression_reason(sub, cast_type)
        if reason is not None:
            return reason
    kind = _kind(node, cast_type)
    if column_type == TIMESTAMP and kind != _TS:
        return f"a {kind} value assigned to a TIMESTAMP column is read as a local time"
    numeric = column_type in _INT_RANGES or column_type in (FLOAT, DOUBLE)
    numeric = numeric or isinstance(column_type, DecimalType)  # seconds, as Spark counts
    if kind == _TS and column_type != TIMESTAMP and not numeric:
        return f"a TIMESTAMP assigned to a {column_type.to_sql()} column"
    return None


def _sub_expression_reason(
    sub: exp.Expression, cast_type: Callable[[exp.DataType], DataType | None]
) -> str | None:
    name = _name(sub)
    # Rendered only for the reason returned: every sub-expression of a DEFAULT is checked, and
    # rendering each one would cost time quadratic in the DEFAULT's size.
    shown = _LazyShown(sub)
    if name in _SESSION_ZONE_FUNCTIONS:
        return f"{shown} is evaluated in the session time zone"
    if name in _FIELD_FUNCTIONS:
        argument = _datetime_argument(sub)
        allowed = (_NTZ,) if name in _TIME_FIELD_FUNCTIONS else (_NTZ, _DATE)
        if argument is None or _kind(argument, cast_type) not in allowed:
            return f"{shown} takes the field of an instant in the session time zone"
    if name == "TS_OR_DS_TO_DATE" and isinstance(sub.args.get("format"), exp.Expression):
        pattern = _last_string_argument(_spark_sql(sub))
        if pattern is None or _ZONE_PATTERN_LETTERS & set(pattern):
            return f"{shown} reads an instant and takes its date in the session time zone"
    if name == "TIMESTAMP_FROM_PARTS" and _argument_count(sub) < 7:
        return f"{shown} without a zone makes a local time in the session time zone"
    if name == "MAKE_TIMESTAMP_LTZ" and _argument_count(sub) < 7:
        return f"{shown} without a zone makes a local time in the session time zone"
    if isinstance(sub, exp.ConvertTimezone) and sub.args.get("source_tz") is None:
        return f"{shown} without a source zone converts from the session time zone"
    reads_an_instant = name in _INSTANT_CONSUMERS or isinstance(
        sub, exp.AtTimeZone | exp.FromTimeZone
    )
    if reads_an_instant and _kind(sub.this, cast_type) != _TS:
        return f"{shown} reads its argument as a local time in the session time zone"
    if isinstance(sub, exp.Cast | exp.TryCast) and cast_type(sub.to) == TIMESTAMP:
        reason = _cast_to_instant_reason(sub, cast_type)
        if reason is not None:
            return reason
    if isinstance(sub, exp.Add | exp.Sub):
        reason = _interval_arithmetic_reason(sub, cast_type)
        if reason is not None:
            return reason
    if _kind(sub, cast_type) == _TS:
        parent = sub.parent
        while isinstance(parent, exp.Paren):
            parent = parent.parent
        if isinstance(parent, exp.Expression) and not _takes_an_instant_as_is(parent, cast_type):
            return f"a TIMESTAMP passed to {_shown(parent)} is converted in the session time zone"
    return None


def _cast_to_instant_reason(
    cast: exp.Cast, cast_type: Callable[[exp.DataType], DataType | None]
) -> str | None:
    if _kind(cast.this, cast_type) == _TS:
        return None
    found = _literal_and_casts(cast, cast_type)
    if found is None:
        return f"{_shown(cast)} reads a local time in the session time zone"
    value, targets = found
    if value is None:
        return None
    try:
        for target in targets:
            if target is None:
                return None
            next_value = _cast(value, target)
            if next_value is None:
                return None
            value = next_value
    except _ZoneDependent as exc:
        return str(exc)
    except _NoValue:
        return None  # left to Spark, as for any function
    return None


def _interval_arithmetic_reason(
    operation: exp.Add | exp.Sub, cast_type: Callable[[exp.DataType], DataType | None]
) -> str | None:
    """A local date-time plus an interval stays local; a DATE plus hours (or anything but a
    DATE or TIMESTAMP_NTZ plus an interval) is an instant of the session time zone."""
    left, right = operation.this, operation.expression
    interval = right if isinstance(right, exp.Interval) else left
    if not isinstance(interval, exp.Interval):
        return None
    other = left if interval is right else right
    kind = _kind(other, cast_type)
    unit = interval.args.get("unit")
    unit_sql = unit.sql(dialect="spark").upper() if isinstance(unit, exp.Expression) else ""
    if kind == _NTZ:
        return None
    if kind == _DATE and unit_sql and not any(u in unit_sql for u in _SUB_DAY_UNITS):
        return None
    return f"{_shown(operation)} is computed in the session time zone"


def _takes_an_instant_as_is(
    parent: exp.Expression, cast_type: Callable[[exp.DataType], DataType | None]
) -> bool:
    """Does `parent` use an instant argument without converting it to local time?"""
    if isinstance(parent, exp.Cast | exp.TryCast):
        target = cast_type(parent.to)
        return target == TIMESTAMP or target in _INT_RANGES or target in (FLOAT, DOUBLE)
    name = _name(parent)
    return (
        name in _INSTANT_CONSUMERS
        or name in _PASS_THROUGH
        or isinstance(parent, exp.AtTimeZone | exp.FromTimeZone)
    )


def _kind(node: object, cast_type: Callable[[exp.DataType], DataType | None]) -> str:
    """What kind of value an expression gives, as far as the session time zone matters."""
    while isinstance(node, exp.Paren):
        node = node.this
    if not isinstance(node, exp.Expression):
        return _OTHER
    match node:
        case exp.Cast() | exp.TryCast():
            target = cast_type(node.to)
            if target == TIMESTAMP:
                return _TS
            if target == TIMESTAMP_NTZ:
                return _NTZ
            if target == DATE:
                return _DATE
            if target == STRING or isinstance(target, VarcharType | CharType):
                return _STRING
            return _NUMBER if target in _INT_RANGES or target in (FLOAT, DOUBLE) else _OTHER
        case exp.Literal():
            return _STRING if node.is_string else _NUMBER
        case exp.AtTimeZone() | exp.FromTimeZone():
            return _TS
        case exp.Add() | exp.Sub():
            for side in (node.this, node.expression):
                if isinstance(side, exp.Interval):
                    other = node.expression if side is node.this else node.this
                    kind = _kind(other, cast_type)
                    unit = side.args.get("unit")
                    unit_sql = unit.sql(dialect="spark").upper() if unit is not None else ""
                    if kind == _DATE and any(u in unit_sql for u in _SUB_DAY_UNITS):
                        return _TS
                    return kind
            return _OTHER
    name = _name(node)
    if name in _INSTANT_PRODUCERS:
        return _TS
    if name in _NTZ_PRODUCERS:
        return _NTZ
    if name in _DATE_PRODUCERS:
        return _DATE
    if name in _PASS_THROUGH:  # the kind of the first argument that is not NULL
        arguments = [node.this, *node.expressions]
        kinds = [_kind(a, cast_type) for a in arguments if not isinstance(a, exp.Null)]
        return kinds[0] if kinds else _OTHER
    return _OTHER


def _name(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.name).upper()
    return node.sql_name() if isinstance(node, exp.Func) else ""


def _spark_sql(node: exp.Expression) -> str:
    try:
        return node.sql(dialect="spark")
    except Exception:  # noqa: BLE001  (third-party generator; see ddl._sqlglot_parse)
        return node.key.upper()


class _LazyShown:
    """`_shown(node)`, rendered when formatted into a message."""

    __slots__ = ("node",)

    def __init__(self, node: exp.Expression) -> None:
        self.node = node

    def __format__(self, spec: str) -> str:
        return format(_shown(self.node), spec)

    def __str__(self) -> str:
        return _shown(self.node)


def _shown(node: exp.Expression) -> str:
    """`node` as Spark SQL, shortened for a message."""
    text = _spark_sql(node)
    return text if len(text) <= 80 else text[:77] + "..."


def _argument_count(node: exp.Expression) -> int:
    if isinstance(node, exp.Anonymous):
        return len(node.expressions)
    return sum(1 for value in node.args.values() if value is not None)


def _last_string_argument(call_sql: str) -> str | None:
    """The text of the last string literal argument of a rendered call, or None."""
    found = re.search(r"'((?:[^'\\]|\\.)*)'\)$", call_sql)
    return found.group(1) if found else None


def _datetime_argument(node: exp.Expression) -> exp.Expression | None:
    """The date-time a field function reads: EXTRACT(f FROM x), DATE_PART('f', x), HOUR(x)."""
    if isinstance(node, exp.Extract):
        found = node.expression
    elif isinstance(node, exp.Anonymous):
        found = node.expressions[1] if len(node.expressions) > 1 else None
    else:
        found = node.this
    return found if isinstance(found, exp.Expression) else None


def _number_spark_refuses(node: exp.Expression) -> str | None:
    """Why Spark's parser refuses a number literal in `node`, or None. Spark reads a literal
    with an exponent as a DOUBLE and refuses one beyond Double.MAX_VALUE (ParseException), and
    any other as an INT, BIGINT or DECIMAL, refusing more than 38 digits of precision, counted
    as Java's BigDecimal does (DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION); measured, pyspark 4."""
    for literal in node.find_all(exp.Literal):
        if literal.is_string:
            continue
        text = str(literal.this)
        try:
            number = Decimal(text)
        except InvalidOperation:
            continue
        if not number.is_finite():
            continue
        if "e" in text.lower():
            if number.copy_abs() > _DOUBLE_MAX:
                return f"{text} is beyond DOUBLE's range"
            continue
        digits, exponent = len(number.as_tuple().digits), number.as_tuple().exponent
        scale = -exponent if isinstance(exponent, int) and exponent < 0 else 0
        if max(digits, scale) > _MAX_DECIMAL_DIGITS:
            return f"{text} has more than {_MAX_DECIMAL_DIGITS} digits"
    return None


def _function_names(node: exp.Expression) -> set[str]:
    """The names (upper case, sqlglot's canonical ones) of the functions `node` calls."""
    return {
        f.name.upper() if isinstance(f, exp.Anonymous) else f.sql_name()
        for f in node.walk()
        if isinstance(f, exp.Func)
    }


def _literal_and_casts(
    node: object, cast_type: Callable[[exp.DataType], DataType | None]
) -> tuple[_Value | None, list[DataType | None]] | None:
    """A default that is a literal under parentheses, casts and a sign: the literal (None for
    NULL) and the cast targets from the innermost out (None: a type not followed). None when
    the default is anything else."""
    casts: list[DataType | None] = []
    negative = False
    while True:
        match node:
            case exp.Paren():
                node = node.this
            case exp.Cast() | exp.TryCast():
                casts.append(cast_type(node.to))
                node = node.this
            case exp.Neg() if not negative:
                negative = True
                node = node.this
            case _:
                break
    casts.reverse()
    match node:
        case exp.Null():
            return None, casts
        case exp.Literal(is_string=True) if not negative:
            return _Value(_STRING, text=str(node.this)), casts
        case exp.Literal():
            try:
                number = Decimal(str(node.this))
            except InvalidOperation:
                return None
            return _Value(_NUMBER, number=number.copy_negate() if negative else number), casts
        case exp.Boolean() if not negative:
            return _Value(_BOOL), casts
        case exp.HexString() if not negative:  # X'1F' (and 0x1F, which sqlglot reads alike)
            return _Value(_BINARY), casts
    return None


def _decimal(text: str) -> Decimal:
    try:
        return Decimal(text.strip())
    except InvalidOperation:
        raise _NoValue(f"{text!r} is no number") from None


def _check_assignable(value: _Value, column_type: DataType) -> None:
    """Spark assigns a default to its column only by a safe implicit cast or from a literal of
    a wider type whose value fits - never a BOOLEAN from or to anything but a string column."""
    if column_type == BOOLEAN and value.kind != _BOOL:
        raise _NoValue(f"a {value.kind} is not assigned to a BOOLEAN column (write TRUE/FALSE)")
    if isinstance(column_type, ArrayType | MapType | StructType):
        raise _NoValue(f"a {value.kind} is not assigned to a {column_type.to_sql()} column")
    textual = column_type == STRING or isinstance(column_type, VarcharType | CharType)
    if value.kind == _BOOL and column_type != BOOLEAN and not textual:
        raise _NoValue(f"a BOOLEAN is not assigned to a {column_type.to_sql()} column")
    # Measured with pyspark 4: a BINARY goes only to BINARY and string columns, and a date or
    # timestamp never to a BINARY column.
    if value.kind == _BINARY and column_type != BINARY and not textual:
        raise _NoValue(f"a BINARY is not assigned to a {column_type.to_sql()} column")
    if column_type == BINARY and value.kind in (_DATE, _TS, _NTZ):
        raise _NoValue(f"a {value.kind.upper()} is not assigned to a BINARY column")
    # A TIMESTAMP is (a number of seconds) but a date or a local date-time is not.
    numeric = column_type in _INT_RANGES or column_type in (FLOAT, DOUBLE)
    if value.kind in (_DATE, _NTZ) and (numeric or isinstance(column_type, DecimalType)):
        raise _NoValue(f"a {value.kind.upper()} is not assigned to a {column_type.to_sql()} column")


def _cast(value: _Value, target: DataType) -> _Value | None:
    """`value` cast to `target` as Spark casts, or None when not followed. Raises _NoValue."""
    textual = target in (STRING, BINARY) or isinstance(target, VarcharType | CharType)
    if value.kind == _BINARY and not textual:
        # Spark casts a BINARY only to a string (CAST(X'41' AS INT) does not resolve).
        raise _NoValue(f"a BINARY does not cast to {target.to_sql()}")
    if isinstance(target, PrimitiveType) and target in _INT_RANGES:
        return _to_integer(value, target)
    if target in (FLOAT, DOUBLE):
        number = value.number
        if value.kind == _STRING and value.text is not None:
            number = _decimal(value.text)  # Decimal reads 'NaN', 'inf', 'Infinity' too, as Spark
        if number is not None and number.is_finite() and _beyond_float_range(number, target):
            # Spark makes it Infinity (FLOAT DEFAULT 1e40 reads inf, measured with pyspark 4):
            # never the value written. CAST('Infinity' AS FLOAT) says so.
            raise _NoValue(
                f"{number} is beyond {target.to_sql()}'s range (Spark makes it Infinity)"
            )
        if number is not None and number.is_finite() and value.kind in (_STRING, _NUMBER):
            # Followed further as the float it became (CAST(1e39 AS DOUBLE) into a FLOAT).
            return _Value(_NUMBER, number=_as_float(number, target))
        return _Value(_NUMBER) if value.kind in (_STRING, _NUMBER, _BOOL) else None
    if isinstance(target, DecimalType):
        return _to_decimal(value, target)
    if target == BOOLEAN:
        text = value.text if value.kind == _STRING else None
        if text is not None and text.strip().lower() not in _BOOLEAN_STRINGS:
            raise _NoValue(f"{value.text!r} is no boolean")
        return _Value(_BOOL) if value.kind in (_STRING, _NUMBER, _BOOL) else None
    if target in (STRING, BINARY) or isinstance(target, VarcharType | CharType):
        if value.kind == _TS and target != BINARY:
            raise _ZoneDependent("a TIMESTAMP cast to a string")
        text = value.text if value.kind == _STRING else None
        sized = target if isinstance(target, VarcharType | CharType) else None
        if sized is not None and text is not None and len(text.rstrip(" ")) > sized.length:
            raise _NoValue(f"longer than {sized.length} characters")
        if target == BINARY:
            return _Value(_BINARY)
        return _Value(_STRING, text=text)
    if target == DATE:
        if value.kind == _TS:
            raise _ZoneDependent("a TIMESTAMP cast to DATE")
        if value.kind == _STRING and value.text is not None:
            _parse_date_time(value.text, date_only=True)
        elif value.kind in (_NUMBER, _BOOL):
            raise _NoValue(f"a {value.kind} does not cast to a DATE")
        return _Value(_DATE) if value.kind in (_STRING, _DATE, _TS, _NTZ) else None
    if target in (TIMESTAMP, TIMESTAMP_NTZ):
        kind = _TS if target == TIMESTAMP else _NTZ
        if value.kind == _STRING and value.text is not None:
            zone = _parse_date_time(value.text, date_only=False)
            if kind == _TS and not zone:
                raise _ZoneDependent(f"{value.text!r} has no time zone")
            if zone and not _is_zone(zone):
                raise _NoValue(f"{zone!r} is no time zone")
        elif value.kind == _BOOL or (value.kind == _NUMBER and kind == _NTZ):
            raise _NoValue(f"a {value.kind} does not cast to {target.to_sql()}")
        elif kind == _TS and value.kind in (_DATE, _NTZ):
            raise _ZoneDependent(f"a {value.kind.upper()} cast to TIMESTAMP")
        elif kind == _TS and value.kind == _NUMBER:
            raise _ZoneDependent(
                "a number cast to TIMESTAMP: seconds since the epoch in Spark, microseconds in "
                "the other readers"
            )
        elif kind == _NTZ and value.kind == _TS:
            raise _ZoneDependent("a TIMESTAMP cast to TIMESTAMP_NTZ")
        return _Value(kind) if value.kind in (_STRING, _NUMBER, _DATE, _TS, _NTZ) else None
    return None


def _as_float(number: Decimal, target: DataType) -> Decimal:
    """`number` rounded to a DOUBLE, or to a float32 for FLOAT (within their ranges)."""
    as_double = float(number)
    if target == FLOAT:
        as_double = struct.unpack("<f", struct.pack("<f", as_double))[0]
    return Decimal(as_double)


def _beyond_float_range(number: Decimal, target: DataType) -> bool:
    """Does the finite `number` round to an infinity as a DOUBLE, or (for FLOAT) as a float32?
    Both round to nearest, as Java's conversions Spark uses do."""
    as_double = float(number)  # inf when beyond DOUBLE (never raises)
    if math.isinf(as_double):
        return True
    if target != FLOAT:
        return False
    try:
        struct.pack("<f", as_double)  # OverflowError when it rounds beyond float32
    except OverflowError:
        return True
    return False


def _to_integer(value: _Value, target: PrimitiveType) -> _Value | None:
    number = value.number
    if value.kind == _STRING and value.text is not None:
        if not _INTEGER_RE.fullmatch(value.text.strip()):
            raise _NoValue(f"{value.text!r} is no integer")
        number = Decimal(value.text.strip())
    if number is not None:
        if not number.is_finite():
            raise _NoValue(f"{number} is no integer")
        low, high = _INT_RANGES[target]
        # Spark truncates the fraction. No int() of a huge exponent (1e999999999): it would
        # build the whole number; anything of 19 digits or more is out of range anyway.
        whole = int(number) if number.adjusted() < 19 else high + 1
        if not low <= whole <= high:
            raise _NoValue(f"{number} is out of {target.to_sql()}'s range")
        return _Value(_NUMBER, number=Decimal(whole))
    return _Value(_NUMBER) if value.kind in (_STRING, _NUMBER, _BOOL) else None


def _to_decimal(value: _Value, target: DecimalType) -> _Value | None:
    number = value.number
    if value.kind == _STRING and value.text is not None:
        number = _decimal(value.text)
    if number is None:
        return _Value(_NUMBER) if value.kind in (_STRING, _NUMBER, _BOOL) else None
    if not number.is_finite():
        raise _NoValue(f"{number} is no decimal")
    whole_digits = target.precision - target.scale
    # Checked before any arithmetic (the exponent may be huge): 10**whole_digits never fits.
    if number and number.adjusted() >= whole_digits:
        raise _NoValue(f"{number} does not fit {target.to_sql()}")
    try:
        rounded = number.quantize(Decimal(1).scaleb(-target.scale), context=_EXACT)
    except DecimalException:
        raise _NoValue(f"{number} is no {target.to_sql()} value") from None
    if rounded.copy_abs() >= Decimal(1).scaleb(whole_digits):  # 99.96 -> 100.0
        raise _NoValue(f"{number} does not fit {target.to_sql()}")
    return _Value(_NUMBER, number=rounded)


def _parse_date_time(text: str, *, date_only: bool) -> str:
    """Check `text` is a date (or timestamp) as Spark reads one; return what follows the date
    and time (a timestamp's zone, "" if none). Raises _NoValue."""
    s = text.strip()
    what = "date" if date_only else "timestamp"
    m = _DATE_RE.match(s)
    if m is None:
        raise _NoValue(f"{text!r} is no {what}")
    year, month, day = int(m.group(1)), int(m.group(2) or 1), int(m.group(3) or 1)
    if not 1 <= month <= 12 or not 1 <= day <= _days_in_month(year, month):
        raise _NoValue(f"{text!r} is no {what}")
    rest = s[m.end() :]
    if date_only:
        if rest and (m.group(3) is None or rest[0] not in " T"):
            raise _NoValue(f"{text!r} is no {what}")
        return ""
    t = _TIME_RE.match(rest) if m.group(3) is not None else None
    hour = minute = second = micros = 0
    if t is not None:
        hour, minute, second = (int(g or 0) for g in t.groups()[:3])
        if hour > 23 or minute > 59 or second > 59:
            raise _NoValue(f"{text!r} is no {what}")
        micros = int((t.group(4) or "").ljust(6, "0")[:6])
        rest = rest[t.end() :]
    elif rest and m.group(3) is not None and rest in (" ", "T"):
        rest = ""
    zone = rest.strip()
    seconds = _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second
    local_micros = seconds * 1_000_000 + micros
    margin = _MAX_ZONE_OFFSET_MICROS if zone else 0
    if local_micros - margin > _MICROS_MAX or local_micros + margin < _MICROS_MIN:
        raise _NoValue(f"{text!r} is beyond the range of Spark's timestamps")
    return zone


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (Spark's calendar), any year."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def _is_zone(zone: str) -> bool:
    """Is `zone` a zone Spark reads: Z, an offset (optionally after UTC/GMT/UT), or a region?"""
    if _OFFSET_RE.fullmatch(zone):
        return True
    if zone in _NOT_SPARK_ZONES or zone.startswith(_NOT_SPARK_ZONE_PREFIXES):
        return False
    try:
        zoneinfo.ZoneInfo(zone)
    except (ValueError, OSError, KeyError):  # ZoneInfoNotFoundError is a KeyError
        return False
    return True


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        return 29 if leap else 28
    return 30 if month in (4, 6, 9, 11) else 31
