"""Table schemas and the rules for evolving them.

A `Schema` is an ordered tuple of `Column`s. Every column, and every struct field nested inside a
column's type, has a `field_id` that is unique across the table's *whole history*: the table
keeps a `next_field_id` counter that only grows, so a dropped column's id is never reused and a
renamed column keeps its id. Readers resolve Parquet columns by id, which is what makes rename and
drop safe for files written under an older version.

Column names are unique case-insensitively among siblings (Spark's default resolution), and keep
the case they were given. Uniqueness: from apply version 7, a new name (of CREATE TABLE, ADD
COLUMN with the fields of its type, RENAME's new name, a job's pending column) must differ from
its siblings' under Java's equalsIgnoreCase (`java_case_key`, the table references are matched
with), so `straße` and `STRASSE`, or `ﬁle` and `FILE`, are two names, as to Spark, and no new
pair can make a reference ambiguous. Before, it folded case fully with `str.casefold` (`ß` and
`ss` one name), whose result follows the Unicode release of the Python that runs it: nodes on
two releases could disagree whether a CREATE or ADD COLUMN is valid. Siblings already in a table
keep their names at version 7 even when Java takes them for one (`id` and `id` with a dotless
i, two names to casefold): checks of a whole schema (`validate_schema` of an ALTER's result, a
published version, a snapshot) refuse only identical names from then on (`unique_names_key`).

A name in a change (the column to drop, rename, alter, move after, the struct to add to)
is matched as Spark matches it, with `spark_case` (a `NameMatch`): Java's equalsIgnoreCase,
character by character, so `ss` does not name `ß`. Before apply version 5 it was matched by
casefold too, and `DROP COLUMN strasse` dropped `straße`; version 5 approximated Java with
Python's case tables (`spark_name_key`), which miss `İ` = `i`; version 6 uses Java's own
table (`metastore.java_case`) and refuses a name two siblings match (`id` and `id` with a
dotless i are two names to casefold, both `ID` to Java), as Spark does, unless one of them is
named exactly so; earlier versions took the first.

Evolution operations are pure functions `Schema -> Schema`. Each either returns the evolved schema
or raises a typed error saying why not:

* add column: nullable, or NOT NULL only with a DEFAULT (existing rows need a value); nested adds
  into a struct (`ADD COLUMN s.x INT`) must be nullable and without DEFAULT;
* rename column (nested too), refusing a clash with a sibling;
* drop column, refusing the last column of the table or of a struct;
* change type only along a widening (`widenings_of` lists them); everything else is refused with
  the list of what would be allowed; from apply version 5 also a widening after which the
  column's DEFAULT gives older rows another value than rows written since hold
  (`widened_default_problem`: FLOAT -> DOUBLE of 1.1, DATE -> TIMESTAMP_NTZ of a time of day);
* DROP NOT NULL is allowed; SET NOT NULL is refused (existing rows may hold NULL);
* set or drop a comment; move a column FIRST or AFTER a sibling.

A *path* names a column or nested field: `("s", "x")` is field `x` of struct column `s`.
Paths go through STRUCT types only (not into ARRAY elements or MAP values).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from enum import IntEnum

from metastore import limits
from metastore.errors import (
    CatalogInvariantError,
    ColumnAlreadyExistsError,
    ColumnNotFoundError,
    InvalidArgumentError,
    UnsupportedSchemaChangeError,
    limit_exceeded,
)
from metastore.java_case import java_case_key
from metastore.lexer import quote_identifier, quote_string
from metastore.types import (
    BIGINT,
    DATE,
    DOUBLE,
    FLOAT,
    INT,
    SMALLINT,
    STRING,
    TIMESTAMP_NTZ,
    TINYINT,
    UNASSIGNED_FIELD_ID,
    ArrayType,
    DataType,
    DecimalType,
    MapType,
    NameKey,
    StructField,
    StructType,
    VarcharType,
    assign_field_ids,
    exact_name,
    struct_fields,
    validate_comment,
    validate_name,
    validate_type,
)

Path = tuple[str, ...]


def path_sql(path: Path) -> str:
    return ".".join(quote_identifier(p) for p in path)


@dataclass(frozen=True, slots=True, kw_only=True)
class Column:
    """A top-level column. `default_sql` is the canonical Spark SQL of its DEFAULT, if any."""

    field_id: int = UNASSIGNED_FIELD_ID
    name: str
    type: DataType
    nullable: bool = True
    comment: str | None = None
    default_sql: str | None = None

    def to_sql(self, *, quote_all: bool = False) -> str:
        """The column as DDL. Without `quote_all` only names that are no simple identifier are
        backquoted: that text is stored (version summaries, job statements), so it stays as
        it was; `quote_all` backquotes every name, keywords too (text that reads back)."""
        name = quote_identifier(self.name, always=quote_all)
        out = f"{name} {self.type.to_sql(quote_all=quote_all)}"
        if not self.nullable:
            out += " NOT NULL"
        if self.default_sql is not None:
            out += f" DEFAULT {self.default_sql}"
        if self.comment is not None:
            out += f" COMMENT {quote_string(self.comment)}"
        return out

    def to_spark_ddl(self) -> str:
        # DEFAULT is left out: a DataFrame schema has no defaults, and Spark's DDL schema parser
        # does not accept them in every version.
        out = f"{quote_identifier(self.name, always=True)} {self.type.to_spark_ddl()}"
        if not self.nullable:
            out += " NOT NULL"
        if self.comment is not None:
            out += f" COMMENT {quote_string(self.comment)}"
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class First:
    """Position: before every sibling."""


@dataclass(frozen=True, slots=True, kw_only=True)
class After:
    """Position: right after the sibling named `column`."""

    column: str


ColumnPosition = First | After


def position_sql(position: ColumnPosition | None) -> str:
    match position:
        case None:
            return ""
        case First():
            return " FIRST"
        case After(column=c):
            return f" AFTER {quote_identifier(c)}"


class NameMatch(IntEnum):
    """How a name in a change finds its column (the apply version that introduced each rule).
    Falsy only for CASEFOLD, so `if spark_case` asks "is this a Spark rule"."""

    CASEFOLD = 0  # below apply version 5: str.casefold, as uniqueness is checked
    SPARK_V5 = 5  # apply version 5: `spark_name_key` (Python's case tables)
    JAVA = 6  # apply version 6: `java_case_key` (Java 17's); a name two siblings match refused
    JAVA_UNIQUE = 7  # apply version 7: as 6, and a new name is unique by `java_case_key` too


def new_name_key(spark_case: NameMatch) -> NameKey:
    """The key under which a new name must differ from its siblings' (module docstring)."""
    return java_case_key if spark_case >= NameMatch.JAVA_UNIQUE else str.casefold


def unique_names_key(spark_case: NameMatch) -> NameKey:
    """The key under which the names of a whole schema must differ, old ones included: from
    apply version 7 only identical names are refused (a table may keep two names casefold
    told apart and Java does not); before, casefold."""
    return exact_name if spark_case >= NameMatch.JAVA_UNIQUE else str.casefold


@dataclass(frozen=True, slots=True, kw_only=True)
class Schema:
    columns: tuple[Column, ...]

    def lookup(
        self, path: Path, *, spark_case: NameMatch = NameMatch.CASEFOLD
    ) -> Column | StructField:
        """The column or nested field at `path`; ColumnNotFoundError if there is none.
        `spark_case`: match names as Spark does (module docstring), else by casefold."""
        members: list[Member] = list(self.columns)
        for depth, name in enumerate(path):
            i = _find(members, name, spark_case=spark_case)
            if i < 0:
                raise _not_found(path[: depth + 1])
            member = members[i]
            if depth == len(path) - 1:
                return member
            if not isinstance(member.type, StructType):
                raise _not_a_struct(path[: depth + 1])
            members = list(member.type.fields)
        raise ColumnNotFoundError("empty column path")

    def to_sql(self) -> str:
        """The columns as DDL for people (`CREATE TABLE ns.t (<this>)` reads back as this
        schema): every name backquoted, so keywords such as `select` read as names. Not stored
        in the replicated state."""
        return ", ".join(c.to_sql(quote_all=True) for c in self.columns)

    def to_spark_ddl(self) -> str:
        """The schema as Spark's DDL schema string: `spark.createDataFrame(rows, schema=...)`."""
        return ", ".join(c.to_spark_ddl() for c in self.columns)

    def field_count(self) -> int:
        """Top-level columns plus every nested struct field (what MAX_COLUMNS_PER_TABLE counts)."""
        return sum(1 + sum(1 for _ in struct_fields(c.type)) for c in self.columns)

    def field_ids(self) -> list[int]:
        """Every field id in the schema, top-level and nested, in schema order."""
        ids: list[int] = []
        for c in self.columns:
            ids.append(c.field_id)
            ids.extend(f.field_id for f in struct_fields(c.type))
        return ids


Member = Column | StructField


# --------------------------------------------------------------------------------------------
# Validation and id assignment
# --------------------------------------------------------------------------------------------


def validate_schema(
    schema: Schema, *, ids_assigned: bool, name_key: NameKey = str.casefold
) -> None:
    """Names, types, limits; ids all assigned and unique, or (for commands) all unassigned.
    Sibling names must differ under `name_key` (`new_name_key`, `unique_names_key`)."""
    if not schema.columns:
        raise InvalidArgumentError("a table needs at least one column")
    count = schema.field_count()
    if count > limits.MAX_COLUMNS_PER_TABLE:
        raise limit_exceeded(
            "MAX_COLUMNS_PER_TABLE", limits.MAX_COLUMNS_PER_TABLE, count, "columns incl. nested"
        )
    seen: set[str] = set()
    for c in schema.columns:
        validate_column(c, nested=False, name_key=name_key)
        folded = name_key(c.name)
        if folded in seen:
            raise ColumnAlreadyExistsError(
                f"duplicate column name {c.name!r} (names are case-insensitive)",
                details={"column": c.name},
            )
        seen.add(folded)
    ids = schema.field_ids()
    if ids_assigned:
        if any(i <= UNASSIGNED_FIELD_ID for i in ids) or len(set(ids)) != len(ids):
            raise CatalogInvariantError(f"field ids not assigned or not unique: {ids}")
    elif any(i != UNASSIGNED_FIELD_ID for i in ids):
        raise InvalidArgumentError("field ids are assigned by the catalog; send them as 0")


def validate_column(column: Column, *, nested: bool, name_key: NameKey = str.casefold) -> None:
    validate_name(column.name, "column")
    validate_comment(column.comment, f"column {column.name}")
    validate_type(column.type, name_key=name_key)
    if column.default_sql is not None:
        if nested:
            raise UnsupportedSchemaChangeError(
                "DEFAULT is only supported on top-level columns",
                details={"column": column.name, "reason": "nested default"},
            )
        if not column.default_sql:
            raise InvalidArgumentError("empty DEFAULT expression")
        if len(column.default_sql) > limits.MAX_DEFAULT_SQL_CHARS:
            raise limit_exceeded(
                "MAX_DEFAULT_SQL_CHARS",
                limits.MAX_DEFAULT_SQL_CHARS,
                len(column.default_sql),
                f"DEFAULT of column {column.name}",
            )


def assign_schema_ids(schema: Schema, next_id: int) -> tuple[Schema, int]:
    """Assign ids to every column and nested field in order, starting at `next_id`."""
    columns: list[Column] = []
    for c in schema.columns:
        dtype, after = assign_field_ids(c.type, next_id + 1)
        columns.append(replace(c, field_id=next_id, type=dtype))
        next_id = after
    return Schema(columns=tuple(columns)), next_id


# --------------------------------------------------------------------------------------------
# Widening
# --------------------------------------------------------------------------------------------

_INTEGRAL = (TINYINT, SMALLINT, INT, BIGINT)


def is_widening(old: DataType, new: DataType) -> bool:
    """True if every value of `old` is a value of `new` and Parquet readers upcast it."""
    if old in _INTEGRAL and new in _INTEGRAL:
        return _INTEGRAL.index(new) > _INTEGRAL.index(old)
    if old == FLOAT:
        return new == DOUBLE
    if old == DATE:
        return new == TIMESTAMP_NTZ
    if isinstance(old, DecimalType):
        return (
            isinstance(new, DecimalType)
            and new.scale == old.scale
            and new.precision > old.precision
        )
    if isinstance(old, VarcharType):
        return new == STRING or (isinstance(new, VarcharType) and new.length > old.length)
    return False


def widenings_of(old: DataType) -> list[str]:
    """Human-readable list of the types `old` may be widened to (empty: none)."""
    if old in _INTEGRAL:
        return [t.to_sql() for t in _INTEGRAL[_INTEGRAL.index(old) + 1 :]]
    if old == FLOAT:
        return [DOUBLE.to_sql()]
    if old == DATE:
        return [TIMESTAMP_NTZ.to_sql()]
    if isinstance(old, DecimalType):
        if old.precision >= limits.MAX_DECIMAL_PRECISION:
            return []
        return [
            f"DECIMAL(p,{old.scale}) with {old.precision} < p <= {limits.MAX_DECIMAL_PRECISION}"
        ]
    if isinstance(old, VarcharType):
        return [f"VARCHAR(n) with n > {old.length}", STRING.to_sql()]
    return []


# --------------------------------------------------------------------------------------------
# Evolution operations
# --------------------------------------------------------------------------------------------


def add_column(
    schema: Schema,
    *,
    parent: Path,
    column: Column,
    position: ColumnPosition | None,
    next_field_id: int,
    spark_case: NameMatch = NameMatch.CASEFOLD,
) -> tuple[Schema, int]:
    """Add `column` under `parent` (() for top level). Returns the schema and the next free id.
    `spark_case`: how `parent` and an AFTER sibling are matched (module docstring)."""
    nested = bool(parent)
    validate_column(column, nested=nested, name_key=new_name_key(spark_case))
    path = (*parent, column.name)
    if not column.nullable:
        if nested:
            raise UnsupportedSchemaChangeError(
                f"cannot add NOT NULL field {path_sql(path)}: existing rows have no value for it "
                "and nested fields take no DEFAULT; add it as nullable",
                details={"column": list(path), "reason": "not null nested add"},
            )
        if column.default_sql is None:
            raise UnsupportedSchemaChangeError(
                f"cannot add NOT NULL column {path_sql(path)} without a DEFAULT: existing rows "
                "have no value for it; add a DEFAULT or make it nullable",
                details={"column": list(path), "reason": "not null without default"},
            )
    dtype, after = assign_field_ids(column.type, next_field_id + 1)
    member: Member
    if nested:
        member = StructField(
            field_id=next_field_id,
            name=column.name,
            type=dtype,
            nullable=column.nullable,
            comment=column.comment,
        )
    else:
        member = replace(column, field_id=next_field_id, type=dtype)

    def edit(members: list[Member]) -> list[Member]:
        if _name_taken(members, column.name, spark_case, but=-1):
            raise ColumnAlreadyExistsError(
                f"column {path_sql(path)} already exists (names are case-insensitive)",
                details={"column": list(path)},
            )
        members.insert(_insert_index(members, parent, position, spark_case), member)
        return members

    return _edit(schema, parent, edit, spark_case), after


def rename_column(
    schema: Schema, *, path: Path, new_name: str, spark_case: NameMatch = NameMatch.CASEFOLD
) -> Schema:
    validate_name(new_name, "column")
    if len(path) > 1:
        # Top-level columns are matched to file columns by field id; nested fields are not (the
        # type strings carry no nested ids, so Spark and pyarrow match them by name). A renamed
        # nested field would read as NULL in every row written before the rename, and an
        # optimize or backfill would then write those NULLs for good.
        raise UnsupportedSchemaChangeError(
            f"cannot rename the nested field {path_sql(path)}: files written before the rename "
            "would read it as NULL (nested fields are matched by name). Add a new field, fill "
            "it, then drop the old one",
            details={"column": list(path), "new_name": new_name, "reason": "nested_rename"},
        )

    def edit(members: list[Member]) -> list[Member]:
        i = _require(members, path, spark_case)
        if _name_taken(members, new_name, spark_case, but=i):
            raise ColumnAlreadyExistsError(
                f"cannot rename {path_sql(path)} to {new_name!r}: a sibling has that name "
                "(names are case-insensitive)",
                details={"column": list(path), "new_name": new_name},
            )
        members[i] = replace(members[i], name=new_name)
        return members

    return _edit(schema, path[:-1], edit, spark_case)


def drop_column(
    schema: Schema, *, path: Path, spark_case: NameMatch = NameMatch.CASEFOLD
) -> Schema:
    def edit(members: list[Member]) -> list[Member]:
        i = _require(members, path, spark_case)
        if len(members) == 1:
            where = "the table" if len(path) == 1 else f"struct {path_sql(path[:-1])}"
            raise UnsupportedSchemaChangeError(
                f"cannot drop {path_sql(path)}: it is the last column of {where}",
                details={"column": list(path), "reason": "last column"},
            )
        del members[i]
        return members

    return _edit(schema, path[:-1], edit, spark_case)


def alter_column_type(
    schema: Schema,
    *,
    path: Path,
    new_type: DataType,
    spark_case: NameMatch = NameMatch.CASEFOLD,
    keep_default: bool = False,
) -> Schema:
    """Widen the column at `path` to `new_type`. `keep_default` (apply version 5): refuse a
    widening after which the column's DEFAULT gives older rows another value than the one
    rows written since hold, or no value (`widened_default_problem`)."""
    validate_type(new_type, name_key=new_name_key(spark_case))

    def edit(members: list[Member]) -> list[Member]:
        i = _require(members, path, spark_case)
        old = members[i].type
        if old == new_type:
            return members
        if isinstance(old, StructType | ArrayType | MapType) or isinstance(
            new_type, StructType | ArrayType | MapType
        ):
            raise UnsupportedSchemaChangeError(
                f"cannot change the type of {path_sql(path)} from {old.to_sql()} to "
                f"{new_type.to_sql()}: only atomic types can be widened; change nested fields "
                "one by one",
                details={
                    "column": list(path),
                    "from": old.to_sql(),
                    "to": new_type.to_sql(),
                    "allowed": [],
                    "reason": "complex type",
                },
            )
        if not is_widening(old, new_type):
            allowed = widenings_of(old)
            hint = ", ".join(allowed) if allowed else "none"
            raise UnsupportedSchemaChangeError(
                f"cannot change the type of {path_sql(path)} from {old.to_sql()} to "
                f"{new_type.to_sql()}: existing files could not be read as the new type; "
                f"allowed widenings: {hint}",
                details={
                    "column": list(path),
                    "from": old.to_sql(),
                    "to": new_type.to_sql(),
                    "allowed": allowed,
                    "reason": "not a widening",
                },
            )
        member = members[i]
        default_sql = member.default_sql if isinstance(member, Column) else None
        problem = (
            widened_default_problem(
                default_sql, old, new_type, ascii_only=spark_case >= NameMatch.JAVA_UNIQUE
            )
            if keep_default and default_sql is not None
            else None
        )
        if problem is not None:
            raise UnsupportedSchemaChangeError(
                f"cannot change the type of {path_sql(path)} from {old.to_sql()} to "
                f"{new_type.to_sql()}: its DEFAULT {default_sql} {problem}; rows written "
                "before the column existed read the DEFAULT as the new type, and rows written "
                "since hold it as the old one, so they would no longer agree",
                details={
                    "column": list(path),
                    "from": old.to_sql(),
                    "to": new_type.to_sql(),
                    "default": default_sql,
                    "reason": "default changes",
                },
            )
        members[i] = replace(member, type=new_type)
        return members

    return _edit(schema, path[:-1], edit, spark_case)


# A number as `metastore.ddl` stores a DEFAULT literal: digits, a fraction, an exponent.
_NUMBER_RE = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
# A date as Spark reads one ([+-]yyyy[-[m]m[-[d]d]]): midnight as a DATE and as a TIMESTAMP_NTZ.
_DATE_ONLY_RE = re.compile(r"([+-]?\d{4,6})(?:-(\d{1,2})(?:-(\d{1,2}))?)?")
# TIMESTAMP_NTZ is 64-bit microseconds since the epoch (years -290308 to +294247).
_NTZ_MICROS_MIN, _NTZ_MICROS_MAX = -(2**63), 2**63 - 1
# The same in ASCII alone (apply version 7): `\d` of a str pattern is any Unicode decimal digit,
# a set each Unicode release may grow (15.0 added the Kawi and Nag Mundari digits), and int()
# and Decimal() read them all; Spark reads a number or a date in ASCII digits only.
_NUMBER_ASCII_RE = re.compile(_NUMBER_RE.pattern, re.ASCII)
_DATE_ONLY_ASCII_RE = re.compile(_DATE_ONLY_RE.pattern, re.ASCII)
# What apply version 7 strips: str.strip() without arguments strips what the running Python's
# Unicode data calls whitespace.
_ASCII_WHITESPACE = " \t\n\r\x0b\x0c"


def widened_default_problem(
    default_sql: str, old: DataType, new: DataType, *, ascii_only: bool = False
) -> str | None:
    """Why `default_sql` (a stored DEFAULT) gives older rows a value after a widening from
    `old` to `new` that differs from the old type's value widened, or no value; None if it
    gives the same. Deterministic text rules, no SQL parser: a form not recognised here is
    refused, not guessed. Integer and DECIMAL (same scale) widenings keep every value, and
    the readers treat VARCHAR as STRING (no trimming), so only FLOAT -> DOUBLE and
    DATE -> TIMESTAMP_NTZ are checked. `ascii_only` (apply version 7): digits and whitespace
    are ASCII's, so the verdict does not follow the Unicode release of the running Python;
    before, `\\d` and `strip()` took any Unicode digit and space (2020-01-01 written in
    fullwidth digits was that date, and Kawi digits are digits from Python 3.12 on)."""
    strip: Callable[[str], str] = str.strip
    number_re, date_re = _NUMBER_RE, _DATE_ONLY_RE
    if ascii_only:
        strip = lambda text: text.strip(_ASCII_WHITESPACE)  # noqa: E731
        number_re, date_re = _NUMBER_ASCII_RE, _DATE_ONLY_ASCII_RE
    text = strip(default_sql)
    while text.startswith("(") and text.endswith(")") and _one_group(text):
        text = strip(text[1:-1])
    if text.upper() == "NULL" and (text.isascii() or not ascii_only):
        return None
    if old == FLOAT and new == DOUBLE:
        cast_to_float = re.fullmatch(r"CAST\((-?[0-9.eE+-]+) AS FLOAT\)", text)
        if cast_to_float and number_re.fullmatch(cast_to_float.group(1)):
            return None  # a FLOAT in every row, widened alike
        number = strip(text[1:-1]) if _is_plain_string(text) else text
        if not number_re.fullmatch(number):
            return "is not a number literal, so its value as a DOUBLE cannot be checked here"
        if not _exactly_a_float(number):
            return "is no exact FLOAT value, so as a DOUBLE it reads another number"
        return None
    if old == DATE and new == TIMESTAMP_NTZ:
        cast_to_date = re.fullmatch(r"CAST\(('[^'\\]*') AS DATE\)", text)
        literal = cast_to_date.group(1) if cast_to_date else text
        if not _is_plain_string(literal):
            return "is not a date literal, so its value as a TIMESTAMP_NTZ cannot be checked here"
        date = date_re.fullmatch(strip(literal[1:-1]))
        if date is None:
            return "is not a date alone: as a TIMESTAMP_NTZ it keeps the time of day"
        year, month, day = int(date.group(1)), int(date.group(2) or 1), int(date.group(3) or 1)
        if not 1 <= month <= 12 or not 1 <= day <= _days_in_month(year, month):
            return "is no date"
        micros = _days_from_civil(year, month, day) * 86_400_000_000
        if not _NTZ_MICROS_MIN <= micros <= _NTZ_MICROS_MAX:
            return "is beyond the years of a TIMESTAMP_NTZ (-290308 to +294247)"
        return None
    return None


def _one_group(text: str) -> bool:
    """Does the "(" that starts `text` close at its end (outside string literals)?"""
    depth = 0
    quote = ""
    escaped = False
    for i, c in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
            continue
        if c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i == len(text) - 1
    return False


def _is_plain_string(text: str) -> bool:
    """A single-quoted literal without escapes or inner quotes."""
    return len(text) >= 2 and text[0] == text[-1] == "'" and not re.search(r"['\\]", text[1:-1])


def _exactly_a_float(number: str) -> bool:
    """Is the decimal `number` exactly a 32-bit float (so FLOAT and DOUBLE read it alike)?"""
    value = Decimal(number)
    if not value.is_finite():
        return False
    as_double = float(value)  # correctly rounded
    if Decimal(as_double) != value:
        return False
    try:
        as_float = struct.unpack("<f", struct.pack("<f", as_double))[0]
    except OverflowError:
        return False
    return bool(as_float == as_double)


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (Spark's calendar), any year."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def set_nullability(
    schema: Schema, *, path: Path, nullable: bool, spark_case: NameMatch = NameMatch.CASEFOLD
) -> Schema:
    """DROP NOT NULL (nullable=True) is always allowed; SET NOT NULL only as a no-op."""

    def edit(members: list[Member]) -> list[Member]:
        i = _require(members, path, spark_case)
        if members[i].nullable == nullable:
            return members
        if not nullable:
            raise UnsupportedSchemaChangeError(
                f"cannot SET NOT NULL on {path_sql(path)}: existing rows may hold NULL and are "
                "not checked; DROP NOT NULL is allowed",
                details={"column": list(path), "reason": "set not null"},
            )
        members[i] = replace(members[i], nullable=True)
        return members

    return _edit(schema, path[:-1], edit, spark_case)


def set_column_comment(
    schema: Schema, *, path: Path, comment: str | None, spark_case: NameMatch = NameMatch.CASEFOLD
) -> Schema:
    validate_comment(comment, f"column {path_sql(path)}")

    def edit(members: list[Member]) -> list[Member]:
        i = _require(members, path, spark_case)
        members[i] = replace(members[i], comment=comment)
        return members

    return _edit(schema, path[:-1], edit, spark_case)


def move_column(
    schema: Schema,
    *,
    path: Path,
    position: ColumnPosition,
    spark_case: NameMatch = NameMatch.CASEFOLD,
) -> Schema:
    def edit(members: list[Member]) -> list[Member]:
        i = _require(members, path, spark_case)
        if (
            isinstance(position, After)
            and _find(members, position.column, spark_case=spark_case) == i
        ):
            raise InvalidArgumentError(
                f"cannot move {path_sql(path)} after itself", details={"column": list(path)}
            )
        member = members.pop(i)
        members.insert(_insert_index(members, path[:-1], position, spark_case), member)
        return members

    return _edit(schema, path[:-1], edit, spark_case)


# --------------------------------------------------------------------------------------------
# Helpers: edit the sibling list at a path
# --------------------------------------------------------------------------------------------


def spark_name_key(name: str) -> str:
    """The key of apply version 5 (from version 6, `java_case_key`): Java's equalsIgnoreCase
    takes two characters for equal when their upper cases, or the lower cases of those, are
    equal, with one-character (simple) case mappings; this stands Python's full mappings in
    for them, keeping a character whose mapping has more than one. So `straße` does not name
    `strasse` (str.casefold folds `ß` to `ss`), and `ﬁle` (a ligature) does not name `file`
    (measured: pyspark 4, UNRESOLVED_COLUMN). But `İ`, whose full lowercase is `i` plus a dot
    and simple one `i`, names no `i` here, where Java finds it; and the key follows the Unicode
    release of the Python that runs it."""
    return "".join(_spark_fold(c) for c in name)


def _spark_fold(char: str) -> str:
    upper = char.upper()
    if len(upper) != 1:  # a full mapping (ß -> SS): the simple one leaves the character alone
        upper = char
    lower = upper.lower()
    return lower if len(lower) == 1 else upper


def _find(members: list[Member], name: str, *, spark_case: NameMatch = NameMatch.CASEFOLD) -> int:
    """Index of the sibling named `name`, or -1, as `spark_case` says (`NameMatch`). With
    `NameMatch.JAVA`, when several siblings match, the one named exactly `name`, else
    InvalidArgumentError (reason `ambiguous_column`)."""
    key: Callable[[str], str]
    if spark_case >= NameMatch.JAVA:
        key = java_case_key
    elif spark_case:
        key = spark_name_key
    else:
        key = str.casefold
    wanted = key(name)
    matches = [i for i, m in enumerate(members) if key(m.name) == wanted]
    if len(matches) > 1 and spark_case >= NameMatch.JAVA:
        # Spark (case-insensitive) refuses such a reference; the one sibling named exactly so
        # is taken, as Spark with caseSensitive would, so every column stays reachable.
        exact = [i for i in matches if members[i].name == name]
        if len(exact) == 1:
            return exact[0]
        names = [members[i].name for i in matches]
        raise InvalidArgumentError(
            f"column name {quote_identifier(name)} is ambiguous: it matches "
            f"{', '.join(quote_identifier(n) for n in names)} (Spark's case-insensitive "
            "match); name one exactly, in its own case",
            details={"column": name, "matches": names, "reason": "ambiguous_column"},
        )
    return matches[0] if matches else -1


def _name_taken(members: list[Member], name: str, spark_case: NameMatch, *, but: int) -> bool:
    """Whether a sibling other than `members[but]` has `name` as a new name must not
    (`new_name_key`). Below apply version 7 the first casefold match decides, as it did."""
    if spark_case < NameMatch.JAVA_UNIQUE:
        clash = _find(members, name)
        return clash >= 0 and clash != but
    key = java_case_key(name)
    others = [m.name for m in members]
    if 0 <= but < len(others):
        del others[but]
    # Each column an ALTER adds is compared with every sibling: half a million comparisons for
    # the widest ALTER, in every node's event loop (0.6 s of it cost leaders their term). Among
    # ASCII names the key is `str.lower` (`java_case_key`), so they are compared in C.
    if "".join(others).isascii():
        return key in map(str.lower, others)
    return key in map(java_case_key, others)


def _require(members: list[Member], path: Path, spark_case: NameMatch) -> int:
    i = _find(members, path[-1], spark_case=spark_case)
    if i < 0:
        raise _not_found(path)
    return i


def _not_found(path: Path) -> ColumnNotFoundError:
    return ColumnNotFoundError(
        f"column {path_sql(path)} does not exist", details={"column": list(path)}
    )


def _not_a_struct(path: Path) -> ColumnNotFoundError:
    return ColumnNotFoundError(
        f"column {path_sql(path)} is not a STRUCT, so it has no nested fields",
        details={"column": list(path)},
    )


def _insert_index(
    members: list[Member], parent: Path, position: ColumnPosition | None, spark_case: NameMatch
) -> int:
    match position:
        case None:
            return len(members)
        case First():
            return 0
        case After(column=name):
            j = _find(members, name, spark_case=spark_case)
            if j < 0:
                raise _not_found((*parent, name))
            return j + 1


def _edit(
    schema: Schema,
    parent: Path,
    edit: Callable[[list[Member]], list[Member]],
    spark_case: NameMatch,
) -> Schema:
    """Apply `edit` to the sibling list under `parent` and rebuild the tree above it."""
    if not parent:
        return Schema(columns=tuple(_as_columns(edit(list(schema.columns)))))
    edited = _edit_in(list(schema.columns), parent, 0, edit, spark_case)
    return Schema(columns=tuple(_as_columns(edited)))


def _edit_in(
    members: list[Member],
    parent: Path,
    depth: int,
    edit: Callable[[list[Member]], list[Member]],
    spark_case: NameMatch,
) -> list[Member]:
    i = _find(members, parent[depth], spark_case=spark_case)
    if i < 0:
        raise _not_found(parent[: depth + 1])
    member = members[i]
    if not isinstance(member.type, StructType):
        raise _not_a_struct(parent[: depth + 1])
    fields: list[Member] = list(member.type.fields)
    if depth == len(parent) - 1:
        fields = edit(fields)
    else:
        fields = _edit_in(fields, parent, depth + 1, edit, spark_case)
    members[i] = replace(member, type=StructType(fields=tuple(_as_fields(fields))))
    return members


def _as_columns(members: list[Member]) -> list[Column]:
    # Run once per change an ALTER makes, over every sibling: a comprehension, not appends.
    out = [m for m in members if isinstance(m, Column)]
    if len(out) != len(members):
        stray = next(m for m in members if not isinstance(m, Column))
        raise CatalogInvariantError(f"struct field {stray.name!r} among top-level columns")
    return out


def _as_fields(members: list[Member]) -> list[StructField]:
    out = [m for m in members if isinstance(m, StructField)]
    if len(out) != len(members):
        stray = next(m for m in members if not isinstance(m, StructField))
        raise CatalogInvariantError(f"column {stray.name!r} among struct fields")
    return out
