"""Spark SQL data types as immutable values, with parsing, rendering and a plain-data form.

Idea: a column's type is a small tree. Leaves are primitives (`INT`, `STRING`, ...) and the
parameterised `DECIMAL(p,s)`, `VARCHAR(n)`, `CHAR(n)`; inner nodes are `ARRAY<e>`, `MAP<k,v>` and
`STRUCT<f: t, ...>`. Struct fields carry a `field_id` like top-level columns do, so a nested field
keeps its identity across renames (Iceberg's rule). Ids are assigned by the catalog when a column
enters a table; a freshly parsed type has every id at `UNASSIGNED_FIELD_ID`.

Three spellings:
* `parse_type(text)` reads Spark's type syntax, case-insensitively, with Spark's aliases
  (INTEGER, LONG, SHORT, BYTE, REAL, DEC/NUMERIC, TIMESTAMP_LTZ).
* `to_sql()` is the canonical rendering: `parse_type(t.to_sql()) == t` for id-less types.
* `to_spark_ddl()` is what `spark.createDataFrame(rows, schema=ddl)` accepts. It differs from
  `to_sql()` in two ways: every name is backquoted (immune to keywords), and CHAR/VARCHAR become
  STRING, because Spark refuses CHAR/VARCHAR outside a table schema.

`type_to_data` / `type_from_data` give the msgpack-able form used in commands and snapshots.

Invariants (checked by `validate_type`, not by the constructors, so building values stays cheap):
decimal 1 <= p <= 38 and 0 <= s <= p; CHAR/VARCHAR length >= 1; a struct has at least one field and
its field names are unique case-insensitively (Spark's default; under which rule: `name_key`,
per apply version, see `metastore.schema`); names are 1..128 characters
without control characters; comments are non-empty when present; nesting depth <= 16.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum

from metastore import limits
from metastore.errors import (
    ColumnAlreadyExistsError,
    InvalidArgumentError,
    MalformedCommandError,
    limit_exceeded,
)
from metastore.java_case import java_case_key
from metastore.lexer import TokenCursor, TokenKind, quote_identifier, quote_string

UNASSIGNED_FIELD_ID = 0


class Primitive(StrEnum):
    """Spark's parameterless atomic types, by canonical name."""

    BOOLEAN = "BOOLEAN"
    TINYINT = "TINYINT"
    SMALLINT = "SMALLINT"
    INT = "INT"
    BIGINT = "BIGINT"
    FLOAT = "FLOAT"
    DOUBLE = "DOUBLE"
    STRING = "STRING"
    BINARY = "BINARY"
    DATE = "DATE"
    TIMESTAMP = "TIMESTAMP"
    TIMESTAMP_NTZ = "TIMESTAMP_NTZ"


@dataclass(frozen=True, slots=True, kw_only=True)
class PrimitiveType:
    kind: Primitive

    def to_sql(self, *, quote_all: bool = False) -> str:
        return self.kind.value

    def to_spark_ddl(self) -> str:
        return self.kind.value


@dataclass(frozen=True, slots=True, kw_only=True)
class DecimalType:
    precision: int
    scale: int

    def to_sql(self, *, quote_all: bool = False) -> str:
        return f"DECIMAL({self.precision},{self.scale})"

    def to_spark_ddl(self) -> str:
        return self.to_sql()


@dataclass(frozen=True, slots=True, kw_only=True)
class VarcharType:
    length: int

    def to_sql(self, *, quote_all: bool = False) -> str:
        return f"VARCHAR({self.length})"

    def to_spark_ddl(self) -> str:
        return "STRING"


@dataclass(frozen=True, slots=True, kw_only=True)
class CharType:
    length: int

    def to_sql(self, *, quote_all: bool = False) -> str:
        return f"CHAR({self.length})"

    def to_spark_ddl(self) -> str:
        return "STRING"


@dataclass(frozen=True, slots=True, kw_only=True)
class ArrayType:
    element: DataType

    def to_sql(self, *, quote_all: bool = False) -> str:
        return f"ARRAY<{self.element.to_sql(quote_all=quote_all)}>"

    def to_spark_ddl(self) -> str:
        return f"ARRAY<{self.element.to_spark_ddl()}>"


@dataclass(frozen=True, slots=True, kw_only=True)
class MapType:
    key: DataType
    value: DataType

    def to_sql(self, *, quote_all: bool = False) -> str:
        return (
            f"MAP<{self.key.to_sql(quote_all=quote_all)}, {self.value.to_sql(quote_all=quote_all)}>"
        )

    def to_spark_ddl(self) -> str:
        return f"MAP<{self.key.to_spark_ddl()}, {self.value.to_spark_ddl()}>"


@dataclass(frozen=True, slots=True, kw_only=True)
class StructField:
    field_id: int = UNASSIGNED_FIELD_ID
    name: str
    type: DataType
    nullable: bool = True
    comment: str | None = None

    def to_sql(self, *, quote_all: bool = False) -> str:
        type_sql = self.type.to_sql(quote_all=quote_all)
        return _field_sql(self.name, type_sql, self.nullable, self.comment, ": ", quote_all)

    def to_spark_ddl(self) -> str:
        ddl = self.type.to_spark_ddl()
        return _field_sql(self.name, ddl, self.nullable, self.comment, ": ", True)


@dataclass(frozen=True, slots=True, kw_only=True)
class StructType:
    fields: tuple[StructField, ...]

    def to_sql(self, *, quote_all: bool = False) -> str:
        return "STRUCT<" + ", ".join(f.to_sql(quote_all=quote_all) for f in self.fields) + ">"

    def to_spark_ddl(self) -> str:
        return "STRUCT<" + ", ".join(f.to_spark_ddl() for f in self.fields) + ">"


DataType = PrimitiveType | DecimalType | VarcharType | CharType | ArrayType | MapType | StructType

BOOLEAN = PrimitiveType(kind=Primitive.BOOLEAN)
TINYINT = PrimitiveType(kind=Primitive.TINYINT)
SMALLINT = PrimitiveType(kind=Primitive.SMALLINT)
INT = PrimitiveType(kind=Primitive.INT)
BIGINT = PrimitiveType(kind=Primitive.BIGINT)
FLOAT = PrimitiveType(kind=Primitive.FLOAT)
DOUBLE = PrimitiveType(kind=Primitive.DOUBLE)
STRING = PrimitiveType(kind=Primitive.STRING)
BINARY = PrimitiveType(kind=Primitive.BINARY)
DATE = PrimitiveType(kind=Primitive.DATE)
TIMESTAMP = PrimitiveType(kind=Primitive.TIMESTAMP)
TIMESTAMP_NTZ = PrimitiveType(kind=Primitive.TIMESTAMP_NTZ)

# Spark's spellings (case-insensitive) of the parameterless types.
_PRIMITIVE_NAMES: dict[str, PrimitiveType] = {
    "BOOLEAN": BOOLEAN,
    "TINYINT": TINYINT,
    "BYTE": TINYINT,
    "SMALLINT": SMALLINT,
    "SHORT": SMALLINT,
    "INT": INT,
    "INTEGER": INT,
    "BIGINT": BIGINT,
    "LONG": BIGINT,
    "FLOAT": FLOAT,
    "REAL": FLOAT,
    "DOUBLE": DOUBLE,
    "STRING": STRING,
    "BINARY": BINARY,
    "DATE": DATE,
    "TIMESTAMP": TIMESTAMP,
    "TIMESTAMP_LTZ": TIMESTAMP,
    "TIMESTAMP_NTZ": TIMESTAMP_NTZ,
}
_DECIMAL_NAMES = ("DECIMAL", "DEC", "NUMERIC")
# Spark's DECIMAL without parameters is DECIMAL(10,0).
DEFAULT_DECIMAL_PRECISION = 10


def _field_sql(
    name: str, type_sql: str, nullable: bool, comment: str | None, sep: str, quote_all: bool
) -> str:
    out = quote_identifier(name, always=quote_all) + sep + type_sql
    if not nullable:
        out += " NOT NULL"
    if comment is not None:
        out += " COMMENT " + quote_string(comment)
    return out


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def parse_type(text: str) -> DataType:
    """Parse one Spark data type. Raises InvalidDdlError, LimitExceededError or
    InvalidArgumentError (e.g. DECIMAL(40,0)); never anything else."""
    validate_text(text, "type text")
    size = len(text.encode("utf-8"))
    if size > limits.MAX_STATEMENT_BYTES:
        raise limit_exceeded("MAX_STATEMENT_BYTES", limits.MAX_STATEMENT_BYTES, size, "type text")
    cur = TokenCursor(text)
    dtype = parse_type_tokens(cur)
    if cur.peek().kind is not TokenKind.EOF:
        raise cur.error("unexpected text after the type")
    # Clients read back types the catalog accepted by the rule of its apply version (from 7,
    # `ß` and `ss` may be two fields; before, `id` and `id` with a
    # dotless i): refuse what every rule refuses.
    validate_type(dtype, name_key=any_version_name_key)
    return dtype


def parse_type_tokens(cur: TokenCursor, level: int = 0) -> DataType:
    """Parse a type at the cursor. `level` counts the enclosing ARRAY/MAP/STRUCT types."""
    tok = cur.peek()
    if tok.kind is not TokenKind.WORD:
        raise cur.error("expected a data type")
    name = tok.value.upper()
    if name in ("ARRAY", "MAP", "STRUCT"):
        if level + 1 > limits.MAX_NESTING_DEPTH:
            raise limit_exceeded(
                "MAX_NESTING_DEPTH", limits.MAX_NESTING_DEPTH, level + 1, "type nesting depth"
            )
        cur.next()
        cur.expect_punct("<")
        if name == "ARRAY":
            element = parse_type_tokens(cur, level + 1)
            cur.expect_punct(">")
            return ArrayType(element=element)
        if name == "MAP":
            key = parse_type_tokens(cur, level + 1)
            cur.expect_punct(",")
            value = parse_type_tokens(cur, level + 1)
            cur.expect_punct(">")
            return MapType(key=key, value=value)
        return _parse_struct_body(cur, level + 1)
    cur.next()
    if name in _DECIMAL_NAMES:
        if not cur.accept_punct("("):
            return DecimalType(precision=DEFAULT_DECIMAL_PRECISION, scale=0)
        precision = cur.expect_int("decimal precision")
        scale = cur.expect_int("decimal scale") if cur.accept_punct(",") else 0
        cur.expect_punct(")")
        return DecimalType(precision=precision, scale=scale)
    if name in ("VARCHAR", "CHAR", "CHARACTER"):
        if not cur.accept_punct("("):
            raise cur.error(f"{name} needs a length, as in {name}(10)")
        length = cur.expect_int("length")
        cur.expect_punct(")")
        return VarcharType(length=length) if name == "VARCHAR" else CharType(length=length)
    primitive = _PRIMITIVE_NAMES.get(name)
    if primitive is None:
        raise cur.error("unsupported data type; expected one of " + _SUPPORTED_TYPES, tok)
    return primitive


_SUPPORTED_TYPES = (
    ", ".join(sorted(_PRIMITIVE_NAMES)) + ", DECIMAL(p,s), VARCHAR(n), CHAR(n), ARRAY, MAP, STRUCT"
)


def _parse_struct_body(cur: TokenCursor, level: int) -> StructType:
    fields: list[StructField] = []
    if cur.peek().is_punct(">"):
        raise cur.error("STRUCT needs at least one field")
    while True:
        name = cur.expect_identifier("field name")
        cur.accept_punct(":")
        ftype = parse_type_tokens(cur, level)
        nullable = True
        comment: str | None = None
        if cur.accept_word("NOT"):
            cur.expect_word("NULL")
            nullable = False
        if cur.accept_word("COMMENT"):
            comment = cur.expect_string("comment") or None
        fields.append(StructField(name=name, type=ftype, nullable=nullable, comment=comment))
        if cur.accept_punct(">"):
            return StructType(fields=tuple(fields))
        cur.expect_punct(",")


# --------------------------------------------------------------------------------------------
# Validation and walking
# --------------------------------------------------------------------------------------------


def validate_text(value: str, what: str) -> None:
    """Every string the catalog stores must be encodable as UTF-8 (no lone surrogates), or the
    command or snapshot holding it could not be encoded."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgumentError(
                f"{what} is not valid Unicode text", details={"what": what}
            ) from None


def validate_name(name: str, what: str) -> None:
    """A column or field name: 1..MAX_IDENTIFIER_CHARS characters, no control characters."""
    validate_text(name, f"{what} name")
    if not name:
        raise InvalidArgumentError(f"{what} name must not be empty", details={"what": what})
    if len(name) > limits.MAX_IDENTIFIER_CHARS:
        raise limit_exceeded(
            "MAX_IDENTIFIER_CHARS", limits.MAX_IDENTIFIER_CHARS, len(name), f"{what} name"
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise InvalidArgumentError(
            f"{what} name {name!r} contains a control character", details={"name": name}
        )


def validate_comment(comment: str | None, what: str) -> None:
    if comment is None:
        return
    validate_text(comment, f"{what} comment")
    if not comment:
        # Canonical form: "no comment" is None, never "", so equal schemas compare equal.
        raise InvalidArgumentError(f"{what} comment must be None rather than empty")
    if len(comment) > limits.MAX_COMMENT_CHARS:
        raise limit_exceeded(
            "MAX_COMMENT_CHARS", limits.MAX_COMMENT_CHARS, len(comment), f"{what} comment"
        )


# The key under which the field names of one STRUCT must differ (`metastore.schema`,
# "Uniqueness"): `str.casefold` below apply version 7, `java_case_key` from 7, and the name
# itself where only a type already accepted is read back (it holds under every rule).
NameKey = Callable[[str], str]


def exact_name(name: str) -> str:
    """The key that tells only identical names apart."""
    return name


def any_version_name_key(name: str) -> str:
    """Equal for two names exactly when they are equal under casefold and under Java's
    equalsIgnoreCase: two fields no apply version lets a struct hold (`a` and `A`). NUL joins
    the keys: no name holds a control character."""
    return f"{name.casefold()}\0{java_case_key(name)}"


def validate_type(dtype: DataType, *, name_key: NameKey = str.casefold) -> None:
    """Check the invariants listed in the module docstring (not field-id rules); the fields
    of a STRUCT must have names that differ under `name_key`."""
    depth = nesting_depth(dtype)
    if depth > limits.MAX_NESTING_DEPTH:
        raise limit_exceeded("MAX_NESTING_DEPTH", limits.MAX_NESTING_DEPTH, depth, "nesting")
    _validate(dtype, name_key)


def _validate(dtype: DataType, name_key: NameKey) -> None:
    match dtype:
        case PrimitiveType():
            pass
        case DecimalType(precision=p, scale=s):
            if not 1 <= p <= limits.MAX_DECIMAL_PRECISION or not 0 <= s <= p:
                raise InvalidArgumentError(
                    f"DECIMAL({p},{s}) is invalid: need 1 <= precision <= "
                    f"{limits.MAX_DECIMAL_PRECISION} and 0 <= scale <= precision",
                    details={"precision": p, "scale": s},
                )
        case VarcharType(length=n) | CharType(length=n):
            if not 1 <= n <= limits.MAX_CHAR_LENGTH:
                raise InvalidArgumentError(
                    f"{dtype.to_sql()}: length must be 1..{limits.MAX_CHAR_LENGTH}",
                    details={"length": n},
                )
        case ArrayType(element=e):
            _validate(e, name_key)
        case MapType(key=k, value=v):
            _validate(k, name_key)
            _validate(v, name_key)
        case StructType(fields=fields):
            if not fields:
                raise InvalidArgumentError("STRUCT needs at least one field")
            seen: set[str] = set()
            for f in fields:
                validate_name(f.name, "field")
                validate_comment(f.comment, f"field {f.name}")
                folded = name_key(f.name)
                if folded in seen:
                    raise ColumnAlreadyExistsError(
                        f"duplicate field name {f.name!r} in STRUCT (names are case-insensitive)",
                        details={"name": f.name},
                    )
                seen.add(folded)
                _validate(f.type, name_key)


def nesting_depth(dtype: DataType) -> int:
    """Levels of ARRAY/MAP/STRUCT: 0 for a primitive."""
    match dtype:
        case ArrayType(element=e):
            return 1 + nesting_depth(e)
        case MapType(key=k, value=v):
            return 1 + max(nesting_depth(k), nesting_depth(v))
        case StructType(fields=fields):
            return 1 + max((nesting_depth(f.type) for f in fields), default=0)
        case _:
            return 0


def contains_type(dtype: DataType, kinds: type | tuple[type, ...]) -> bool:
    """Whether `dtype` is, or holds at any depth (struct fields, array elements, map keys and
    values), a type of `kinds` (e.g. `(VarcharType, CharType)`)."""
    match dtype:
        case ArrayType(element=e):
            return isinstance(dtype, kinds) or contains_type(e, kinds)
        case MapType(key=k, value=v):
            return isinstance(dtype, kinds) or contains_type(k, kinds) or contains_type(v, kinds)
        case StructType(fields=fields):
            return isinstance(dtype, kinds) or any(contains_type(f.type, kinds) for f in fields)
        case _:
            return isinstance(dtype, kinds)


def struct_fields(dtype: DataType) -> Iterator[StructField]:
    """Every struct field nested anywhere inside `dtype`, depth-first."""
    match dtype:
        case ArrayType(element=e):
            yield from struct_fields(e)
        case MapType(key=k, value=v):
            yield from struct_fields(k)
            yield from struct_fields(v)
        case StructType(fields=fields):
            for f in fields:
                yield f
                yield from struct_fields(f.type)
        case _:
            pass


def assign_field_ids(dtype: DataType, next_id: int) -> tuple[DataType, int]:
    """Give every nested struct field a fresh id, depth-first from `next_id`.

    Returns the new type and the next unused id. Deterministic: the same type and start id always
    yield the same ids on every replica.
    """
    match dtype:
        case ArrayType(element=e):
            e2, next_id = assign_field_ids(e, next_id)
            return ArrayType(element=e2), next_id
        case MapType(key=k, value=v):
            k2, next_id = assign_field_ids(k, next_id)
            v2, next_id = assign_field_ids(v, next_id)
            return MapType(key=k2, value=v2), next_id
        case StructType(fields=fields):
            out: list[StructField] = []
            for f in fields:
                field_id = next_id
                t2, next_id = assign_field_ids(f.type, next_id + 1)
                out.append(replace(f, field_id=field_id, type=t2))
            return StructType(fields=tuple(out)), next_id
        case _:
            return dtype, next_id


def strip_field_ids(dtype: DataType) -> DataType:
    """The same type with every nested id set to UNASSIGNED_FIELD_ID (for comparisons)."""
    match dtype:
        case ArrayType(element=e):
            return ArrayType(element=strip_field_ids(e))
        case MapType(key=k, value=v):
            return MapType(key=strip_field_ids(k), value=strip_field_ids(v))
        case StructType(fields=fields):
            return StructType(
                fields=tuple(
                    replace(f, field_id=UNASSIGNED_FIELD_ID, type=strip_field_ids(f.type))
                    for f in fields
                )
            )
        case _:
            return dtype


# --------------------------------------------------------------------------------------------
# Plain data (msgpack-able)
# --------------------------------------------------------------------------------------------

_PRIMITIVE_BY_TAG = {p.value.lower(): PrimitiveType(kind=p) for p in Primitive}


def type_to_data(dtype: DataType) -> object:
    """Compact plain form: "int", ["decimal", p, s], ["array", e], ["struct", [[id, name, t,
    nullable, comment], ...]], ..."""
    match dtype:
        case PrimitiveType(kind=kind):
            return kind.value.lower()
        case DecimalType(precision=p, scale=s):
            return ["decimal", p, s]
        case VarcharType(length=n):
            return ["varchar", n]
        case CharType(length=n):
            return ["char", n]
        case ArrayType(element=e):
            return ["array", type_to_data(e)]
        case MapType(key=k, value=v):
            return ["map", type_to_data(k), type_to_data(v)]
        case StructType(fields=fields):
            return [
                "struct",
                [[f.field_id, f.name, type_to_data(f.type), f.nullable, f.comment] for f in fields],
            ]


def type_from_data(data: object, level: int = 0) -> DataType:
    """Inverse of `type_to_data`. Any shape error raises MalformedCommandError.

    Only the shape is checked here; `validate_type` checks the value rules.
    """
    if level > limits.MAX_NESTING_DEPTH:
        raise MalformedCommandError("type nested too deeply")
    if isinstance(data, str):
        primitive = _PRIMITIVE_BY_TAG.get(data)
        if primitive is None:
            raise MalformedCommandError(f"unknown type tag {data!r}")
        return primitive
    if not isinstance(data, list | tuple) or not data or not isinstance(data[0], str):
        raise MalformedCommandError("type must be a tag string or a tagged list")
    tag, args = data[0], data[1:]
    if tag == "decimal" and len(args) == 2:
        return DecimalType(precision=_int(args[0]), scale=_int(args[1]))
    if tag == "varchar" and len(args) == 1:
        return VarcharType(length=_int(args[0]))
    if tag == "char" and len(args) == 1:
        return CharType(length=_int(args[0]))
    if tag == "array" and len(args) == 1:
        return ArrayType(element=type_from_data(args[0], level + 1))
    if tag == "map" and len(args) == 2:
        return MapType(
            key=type_from_data(args[0], level + 1), value=type_from_data(args[1], level + 1)
        )
    if tag == "struct" and len(args) == 1 and isinstance(args[0], list | tuple):
        if len(args[0]) > limits.MAX_COLUMNS_PER_TABLE:
            raise MalformedCommandError("struct has too many fields")
        return StructType(fields=tuple(_field_from_data(f, level + 1) for f in args[0]))
    raise MalformedCommandError(f"malformed type {tag!r} with {len(args)} arguments")


def _field_from_data(data: object, level: int) -> StructField:
    if not isinstance(data, list | tuple) or len(data) != 5:
        raise MalformedCommandError("struct field must be [id, name, type, nullable, comment]")
    field_id, name, dtype, nullable, comment = data
    if not isinstance(name, str) or not isinstance(nullable, bool):
        raise MalformedCommandError("struct field name must be str and nullable bool")
    if comment is not None and not isinstance(comment, str):
        raise MalformedCommandError("struct field comment must be str or nil")
    return StructField(
        field_id=_int(field_id),
        name=name,
        type=type_from_data(dtype, level),
        nullable=nullable,
        comment=comment,
    )


def _int(value: object) -> int:
    # bool is an int subclass; a True where a length belongs is malformed, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedCommandError(f"expected an integer, got {type(value).__name__}")
    return value
