"""Spark SQL DDL -> canonical catalog commands.

`parse_ddl(sql, request_id=..., warehouse=...)` turns exactly one statement into one `Command`.
The statement is parsed with sqlglot's `spark` dialect and its expression tree is read strictly:
every clause of every node must be one we understand, so a clause sqlglot recognises but we do not
(PARTITIONED BY, OR REPLACE, ...) is refused with `UnsupportedStatementError` instead of being
silently dropped.

Table locations: `CREATE TABLE ... LOCATION 'path'` stores that path (trailing "/" removed);
without it the table gets `<warehouse>/<ns>.db/<table>`, the layout of Spark's own warehouse.
`warehouse` is the receiving node's setting; the result is part of the replicated command, so
every replica stores the same location. Empty warehouse and no LOCATION: no location. A URI
location holds no query or fragment, and a file URI no host (`check_new_location`: the daemon
opens locations with its own credentials, and pyarrow reads options from a URI's query).
Whether a location lies in a root the cluster allows is node configuration, checked by the
leader before it proposes (metastore/daemon/allowed_locations.py), not here.

sqlglot gives up on some valid Spark forms and returns an opaque `Command` node (CREATE NAMESPACE
... WITH DBPROPERTIES, ALTER COLUMN ... FIRST/AFTER, nested ALTER COLUMN s.x, UNSET TBLPROPERTIES).
For those, a small recursive-descent parser (`_Fallback`) over `metastore.lexer` tokens reads the
statement following Spark's own grammar. Both paths produce the same command values (the tests
check they agree).

Supported:
  CREATE NAMESPACE|SCHEMA|DATABASE [IF NOT EXISTS] ns [COMMENT '..'] [WITH DBPROPERTIES (..)]
  DROP NAMESPACE|SCHEMA|DATABASE [IF EXISTS] ns [CASCADE|RESTRICT]
  CREATE TABLE [IF NOT EXISTS] ns.t (col type [NOT NULL] [DEFAULT expr] [COMMENT '..'], ...)
      [USING parquet] [LOCATION '..'] [COMMENT '..'] [TBLPROPERTIES (..)]
  DROP TABLE [IF EXISTS] ns.t
  ALTER TABLE ns.t ADD COLUMN(S) ... | RENAME COLUMN a TO b | DROP COLUMN(S) [IF EXISTS] ...
      | ALTER|CHANGE [COLUMN] c (TYPE t | DROP NOT NULL | SET NOT NULL | COMMENT '..' | FIRST
      | AFTER x) | SET TBLPROPERTIES (..) | UNSET TBLPROPERTIES [IF EXISTS] (..)

Safety: parsing runs on the node that received the request, before anything is replicated. Any
input, however hostile, raises only `MetastoreError` subclasses (InvalidDdlError with line/col
when the text does not parse, UnsupportedStatementError, InvalidArgumentError,
LimitExceededError, ...). sqlglot is a large third-party parser, so every call into it is wrapped.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Iterator
from typing import Final, NamedTuple, NoReturn, TypeVar

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from metastore import limits
from metastore.commands import (
    GC_TTL_PROPERTY,
    AddColumn,
    AlterColumnType,
    AlterTable,
    Command,
    CreateNamespace,
    CreateTable,
    DropColumn,
    DropNamespace,
    DropTable,
    MoveColumn,
    Properties,
    RenameColumn,
    SetColumnComment,
    SetNullability,
    SetTableProperties,
    TableChange,
    TableName,
    UnsetTableProperties,
    make_properties,
    normalize_object_name,
    validate_command,
    validate_location,
)
from metastore.default_values import check_default, check_rendering
from metastore.errors import (
    InvalidArgumentError,
    InvalidDdlError,
    MetastoreError,
    UnsupportedStatementError,
    limit_exceeded,
)
from metastore.lexer import Token, TokenCursor, TokenKind, syntax_error, tokenize
from metastore.schema import After, Column, ColumnPosition, First, Path, Schema
from metastore.sqlglot_types import install as _install_sqlglot_type_memo
from metastore.types import (
    BIGINT,
    BINARY,
    BOOLEAN,
    DATE,
    DEFAULT_DECIMAL_PRECISION,
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
    StructField,
    StructType,
    VarcharType,
    parse_type_tokens,
    validate_text,
)

_T = TypeVar("_T")

_install_sqlglot_type_memo()  # see metastore/sqlglot_types.py

SUPPORTED = "CREATE/DROP NAMESPACE, CREATE/DROP TABLE and ALTER TABLE"
# Where what an unsupported statement would look at or write is found instead: a data engineer
# types DESCRIBE, SHOW TABLES or SELECT into `metastore sql` before reading its --help.
_ELSEWHERE = {
    "DESCRIBE": "see a table's schema with `metastore table describe NS.T` (`table history`)",
    "DESC": "see a table's schema with `metastore table describe NS.T` (`table history`)",
    "SHOW": "list with `metastore table list [NS]` or `metastore ns list`",
    "SELECT": "read rows with `metastore table read NS.T`, or in Spark (spark_bridge)",
    "INSERT": "write rows from Spark through spark_bridge (MetastoreBridge.batch)",
}


def _unsupported_message(subject: str) -> str:
    """`subject` ("DESCRIBE statements are", "SHOW TABLES is": the statement's first words and
    a verb) not supported, with where to go instead."""
    elsewhere = _ELSEWHERE.get(subject.split(" ", 1)[0].upper())
    return f"{subject} not supported; supported: {SUPPORTED}" + (
        f"; {elsewhere}" if elsewhere else ""
    )


def parse_ddl(sql: str, *, request_id: str = "", warehouse: str = "") -> Command:
    """Parse one Spark SQL DDL statement into a validated command. `warehouse` (absolute path or
    URI, "" = none) gives CREATE TABLE without LOCATION its default location."""
    if not isinstance(sql, str):
        raise InvalidArgumentError("the statement must be text")
    if not isinstance(warehouse, str):
        raise InvalidArgumentError("the warehouse must be text")
    warehouse = _canonical_location(warehouse, "warehouse") if warehouse else ""
    validate_text(sql, "statement")
    size = len(sql.encode("utf-8"))
    if size > limits.MAX_STATEMENT_BYTES:
        raise limit_exceeded("MAX_STATEMENT_BYTES", limits.MAX_STATEMENT_BYTES, size, "statement")
    _refuse_empty_list_items(sql)
    _check_default_token_count(sql)
    try:
        statements = _sqlglot_parse(_parenthesize_not_defaults(sql))
    except InvalidDdlError as exc:
        # sqlglot stops at a type name it does not know with "Expecting )" (or ">" inside a
        # nested type), a column away from the cause.
        raise _unknown_column_type(sql, request_id) or exc from None
    if not statements:
        raise InvalidDdlError("empty statement", details={"reason": "empty"})
    if len(statements) > 1:
        raise InvalidDdlError(
            f"exactly one statement per call, got {len(statements)}",
            details={"reason": "multiple statements", "count": len(statements)},
        )
    stmt = statements[0]
    try:
        cmd = _statement_command(sql, stmt, request_id, warehouse)
    except InvalidDdlError as exc:
        # sqlglot reads some names Spark lacks as types Spark has (DATETIME as TIMESTAMP, UUID
        # as STRING): "unsupported data type TIMESTAMP" named a type that is supported.
        if exc.details.get("reason") != "unsupported type":
            raise
        raise _unknown_column_type(sql, request_id) or exc from None
    if isinstance(stmt, exp.Create | exp.Alter):
        _check_type_names(sql, stmt)
    # Type names Spark lacks first (TIMESTAMP WITHOUT TIME ZONE is stored as a TIMESTAMP, which
    # the checks of the stored text would judge instead), the rest of the rendering after them.
    written_defaults = _written_defaults(sql, cmd)
    _check_default_renderings(written_defaults, types_only=True)
    _check_defaults(cmd)
    _check_default_renderings(written_defaults, types_only=False)
    validate_command(cmd)
    return cmd


def _statement_command(sql: str, stmt: exp.Expression, request_id: str, warehouse: str) -> Command:
    if isinstance(stmt, exp.Command):
        return _Fallback(sql, request_id).statement()
    if isinstance(stmt, exp.Create):
        return _create(stmt, request_id, warehouse)
    if isinstance(stmt, exp.Drop):
        return _drop(stmt, request_id)
    if isinstance(stmt, exp.Alter) and _changes_a_type(stmt):
        # sqlglot's Spark dialect reads the new type of ALTER COLUMN ... TYPE VARCHAR(n) or
        # CHAR(n) as plain TEXT, which would silently make the column a STRING: the hand
        # parser keeps the type as written.
        return _Fallback(sql, request_id).statement()
    if isinstance(stmt, exp.Alter):
        return _alter(stmt, request_id)
    raise UnsupportedStatementError(
        _unsupported_message(f"{stmt.key.upper()} statements are"),
        details={"statement": stmt.key.upper()},
    )


def _unknown_column_type(sql: str, request_id: str) -> InvalidDdlError | None:
    """For a CREATE or ALTER TABLE that failed to parse or named an unsupported type: the first
    column type that is no Spark type, as the hand parser's type reader says it ("unsupported
    data type; expected one of ..., found 'DATETIME'", with its line and column), or None when
    no column type is at fault (the error found stands). Only reads: the statement was refused
    already, this says why in the user's words."""
    try:
        if re.match(r"\s*ALTER\s", sql, re.IGNORECASE):
            _Fallback(sql, request_id).statement()
            return None
        _scan_create_table_types(TokenCursor(sql))
    except InvalidDdlError as exc:
        return exc if "unsupported data type" in exc.message else None
    except MetastoreError:  # a limit, an unsupported form: not a type's fault
        return None
    return None


def _scan_create_table_types(cur: TokenCursor) -> None:
    """Read the type of every column of CREATE TABLE [IF NOT EXISTS] name (col type ..., ...)
    with the hand parser's type reader (which raises on a type it does not know); what follows
    each type up to the next column is skipped, not checked."""
    if not (cur.accept_word("CREATE") and cur.accept_word("TABLE")):
        return
    if cur.accept_word("IF"):
        cur.expect_word("NOT")
        cur.expect_word("EXISTS")
    cur.expect_identifier("table name")
    while cur.accept_punct("."):
        cur.expect_identifier("table name")
    cur.expect_punct("(")
    for _ in range(limits.MAX_COLUMNS_PER_TABLE):
        cur.expect_identifier("column name")
        parse_type_tokens(cur)
        depth = 0
        while True:
            tok = cur.next()
            if tok.kind is TokenKind.EOF:
                return
            if tok.is_punct("(") or tok.is_punct("<"):
                depth += 1
            elif tok.is_punct(")") or tok.is_punct(">"):
                if depth == 0:
                    return  # the end of the column list
                depth -= 1
            elif tok.is_punct(",") and depth == 0:
                break


# Spark's names for each type sqlglot reads in a column definition (keyed by sqlglot's type).
# sqlglot also reads other dialects' names as these types: INT8 (PostgreSQL's 8-byte integer)
# as TINYINT, BOOL, TEXT, INT1/2/4, FLOAT8, DOUBLE PRECISION, ... which Spark refuses.
_SPARK_TYPE_WORDS: Final[dict[str, frozenset[str]]] = {
    "TINYINT": frozenset({"TINYINT", "BYTE"}),
    "SMALLINT": frozenset({"SMALLINT", "SHORT"}),
    "INT": frozenset({"INT", "INTEGER"}),
    "BIGINT": frozenset({"BIGINT", "LONG"}),
    "FLOAT": frozenset({"FLOAT", "REAL"}),
    "DOUBLE": frozenset({"DOUBLE"}),
    "BOOLEAN": frozenset({"BOOLEAN"}),
    "TEXT": frozenset({"STRING"}),
    "BINARY": frozenset({"BINARY"}),
    "DATE": frozenset({"DATE"}),
    "TIMESTAMP": frozenset({"TIMESTAMP"}),
    "TIMESTAMPTZ": frozenset({"TIMESTAMP"}),
    "TIMESTAMPLTZ": frozenset({"TIMESTAMP_LTZ"}),
    "TIMESTAMPNTZ": frozenset({"TIMESTAMP_NTZ"}),
    "DECIMAL": frozenset({"DECIMAL", "DEC", "NUMERIC"}),
    "VARCHAR": frozenset({"VARCHAR"}),
    "CHAR": frozenset({"CHAR", "CHARACTER"}),
}
# What a user of another dialect meant, for the error (the others keep their meaning).
_TYPE_NAME_MEANT: Final = {"INT8": "BIGINT", "INT4": "INT", "INT2": "SMALLINT", "INT1": "TINYINT"}


def _check_type_names(sql: str, stmt: exp.Expression) -> None:
    """Refuse a column type written with a name Spark does not have. sqlglot keeps no
    spelling, so the check counts: each type of a column definition (nested ones included)
    must have a word of one of Spark's names for it in the statement, outside DEFAULT
    expressions (their casts are checked with the default). A count cannot say which word
    was the type, so a column named like a Spark type can hide one; it never refuses a
    statement Spark accepts."""
    seen: dict[int, str] = {}
    for coldef in stmt.find_all(exp.ColumnDef):
        kind = coldef.args.get("kind")
        if isinstance(kind, exp.DataType):
            for node in kind.find_all(exp.DataType):
                seen[id(node)] = str(getattr(node.this, "value", node.this)).upper()
    needed: dict[str, int] = {}
    for name in seen.values():
        needed[name] = needed.get(name, 0) + 1
    tokens = tokenize(sql)
    words: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.is_word("DEFAULT"):
            i = max(_default_expression_end(tokens, i + 1), i + 1)
            continue
        if tok.kind is TokenKind.WORD:
            words.append(tok.value.upper())
        i += 1
    for a, b in itertools.pairwise(words):
        if (a, b) in (("DOUBLE", "PRECISION"), ("CHARACTER", "VARYING"), ("CHAR", "VARYING")):
            raise InvalidDdlError(
                f"{a} {b} is not a Spark type: write {'DOUBLE' if a == 'DOUBLE' else 'VARCHAR(n)'}",
                details={"reason": "unsupported type", "type": f"{a} {b}"},
            )
    for a, b, c, d in zip(words, words[1:], words[2:], words[3:], strict=False):
        if a == "TIMESTAMP" and b in ("WITH", "WITHOUT") and (c, d) == ("TIME", "ZONE"):
            raise InvalidDdlError(
                f"TIMESTAMP {b} TIME ZONE is not a Spark type: write TIMESTAMP_NTZ (no time "
                "zone) or TIMESTAMP (an instant, TIMESTAMP_LTZ)",
                details={"reason": "unsupported type", "type": f"TIMESTAMP {b} TIME ZONE"},
            )
    for name, count in needed.items():
        spark_names = _SPARK_TYPE_WORDS.get(name)
        if spark_names is None:
            continue  # ARRAY, MAP, STRUCT; the rest are refused as unsupported types
        if sum(w in spark_names for w in words) >= count:
            continue
        meant = [
            f"{w} is {_TYPE_NAME_MEANT[w]}" for w in sorted(set(words) & _TYPE_NAME_MEANT.keys())
        ]
        raise InvalidDdlError(
            f"a column type is written with a name Spark does not have: Spark's name for it is "
            f"{' or '.join(sorted(spark_names))}"
            + (f" ({'; '.join(meant)} in other dialects)" if meant else ""),
            details={"reason": "unsupported type name", "type": name},
        )


class _WrittenDefault(NamedTuple):
    column_name: str
    written: str  # the user's text of the DEFAULT expression, quotes as check_rendering reads
    rendered: str  # its stored text


def _written_defaults(sql: str, cmd: Command) -> list[_WrittenDefault]:
    """Each DEFAULT of `cmd`'s new columns with the user's text of it, for
    `_check_default_renderings`. The user's texts are found on the tokens, as Spark ends each
    DEFAULT expression, so both parser paths are covered alike. Computed once per statement,
    each distinct text parsed and rendered once: sqlglot's parse and render of a literal cost
    about 0.1 ms each, so a statement of many or repeated DEFAULTs would otherwise cost seconds
    of a node's CPU."""
    if isinstance(cmd, CreateTable):
        columns = list(cmd.schema.columns)
    elif isinstance(cmd, AlterTable):
        columns = [c.column for c in cmd.changes if isinstance(c, AddColumn)]
    else:
        return []
    names_by_default = {c.default_sql: c.name for c in reversed(columns) if c.default_sql}
    if not names_by_default:
        return []
    rendered_by_written: dict[str, str | None] = {}
    found: list[_WrittenDefault] = []
    for written, _ in _default_texts(sql):
        if written not in rendered_by_written:
            rendered_by_written[written] = _rendered_default_or_none(written)
        rendered = rendered_by_written[written]
        if rendered is not None and rendered in names_by_default:
            found.append(
                _WrittenDefault(
                    names_by_default[rendered], _backslash_doubled_quotes(written), rendered
                )
            )
    return found


def _rendered_default_or_none(written: str) -> str | None:
    """The stored text `written` renders as, or None if it is no DEFAULT expression (a column
    named default: the parse of the statement judged it). Only a rendering that some column of
    the statement stores is used, and that one `_default_sql` already read back, so it is not
    read back again here."""
    try:
        parsed = _sqlglot_parse("SELECT " + written)
        select = parsed[0] if len(parsed) == 1 else None
        if not isinstance(select, exp.Select) or len(select.expressions) != 1:
            return None
        return _rendered_default(select.expressions[0])
    except MetastoreError:
        return None


def _check_default_renderings(written_defaults: list[_WrittenDefault], *, types_only: bool) -> None:
    """Refuse a DEFAULT whose stored text (sqlglot's rendering) means something else in Spark
    than the user's text (`default_values.check_rendering`)."""
    passed: set[tuple[str, str]] = set()
    for column_name, written, rendered in written_defaults:
        if (written, rendered) in passed:
            continue  # the same text again (a wide table's DEFAULT 0): judged alike
        check_rendering(column_name, written, rendered, types_only=types_only)
        passed.add((written, rendered))


def _check_defaults(cmd: Command) -> None:
    """A NOT NULL column whose DEFAULT is NULL, or no value of its type: writers fill a column
    they do not write with CAST(default AS type) and check NOT NULL row by row, so every such
    write would fail (an ADD COLUMN job's write-only step would break every writer of the
    table). See `metastore.default_values`."""
    if isinstance(cmd, CreateTable):
        columns, added = list(cmd.schema.columns), False
    elif isinstance(cmd, AlterTable):
        columns = [c.column for c in cmd.changes if isinstance(c, AddColumn) and not c.parent]
        added = True
    else:
        return
    # What check_default decides depends on these alone (the column's name is only quoted):
    # a wide table repeating one DEFAULT is checked once.
    passed: set[tuple[str | None, DataType, bool]] = set()
    for column in columns:
        key = (column.default_sql, column.type, column.nullable)
        if key in passed:
            continue
        check_default(column, cast_type=_cast_target_type, added=added)
        passed.add(key)


def _cast_target_type(node: exp.DataType) -> DataType | None:
    """The type a CAST inside a DEFAULT converts to, or None if we do not support it."""
    try:
        return _data_type(node, 0)
    except MetastoreError:
        return None


# --------------------------------------------------------------------------------------------
# sqlglot wrappers
# --------------------------------------------------------------------------------------------


def _default_texts(sql: str) -> Iterator[tuple[str, int]]:
    """Each DEFAULT expression of `sql` as the user wrote it, with its token count, in order:
    found on the tokens where Spark ends each expression (`_default_expression_end`)."""
    tokens = tokenize(sql)
    for i, tok in enumerate(tokens):
        if not tok.is_word("DEFAULT"):
            continue
        end = _default_expression_end(tokens, i + 1)
        if end > i + 1:
            yield sql[tokens[i + 1].start : tokens[end - 1].end], end - (i + 1)


def _default_expression_end(tokens: list[Token], start: int) -> int:
    """Index of the first token after the DEFAULT expression starting at `tokens[start]`: where
    Spark ends it, at a `,` or `)` of its list, a COMMENT, FIRST or AFTER clause, or a NOT NULL
    constraint (Spark has no postfix NOT NULL operator, only IS NOT NULL)."""
    depth = 0
    i = start
    while True:
        tok = tokens[i]
        if tok.kind is TokenKind.EOF or tok.is_punct(";"):
            return i
        if depth == 0 and (
            tok.is_punct(",")
            or tok.is_punct(")")
            or tok.is_word("COMMENT", "FIRST", "AFTER")
            or (
                tok.is_word("NOT")
                and tokens[i + 1].is_word("NULL")
                and not (i > 0 and tokens[i - 1].is_word("IS"))
            )
        ):
            return i
        if tok.is_punct("("):
            depth += 1
        elif tok.is_punct(")"):
            depth -= 1
        i += 1


def _check_default_token_count(sql: str) -> None:
    """Refuse (LIMIT_EXCEEDED) a statement whose DEFAULT expressions hold more than
    MAX_DEFAULT_TOKENS_PER_STATEMENT tokens, or whose distinct DEFAULT texts hold more than
    MAX_DISTINCT_DEFAULT_TOKENS_PER_STATEMENT, before sqlglot spends its time on them (each
    distinct text is checked once). Counted where Spark ends each expression; a column named
    `default` counts its type too (harmless: a few tokens more)."""
    count = 0
    by_text: dict[str, int] = {}
    for written, token_count in _default_texts(sql):
        count += token_count
        by_text[written] = token_count
    distinct = sum(by_text.values())
    for limit, maximum, value, what in (
        ("MAX_DEFAULT_TOKENS_PER_STATEMENT", limits.MAX_DEFAULT_TOKENS_PER_STATEMENT, count, ""),
        (
            "MAX_DISTINCT_DEFAULT_TOKENS_PER_STATEMENT",
            limits.MAX_DISTINCT_DEFAULT_TOKENS_PER_STATEMENT,
            distinct,
            "distinct ",
        ),
    ):
        if value > maximum:
            raise limit_exceeded(
                limit, maximum, value, f"tokens of the statement's {what}DEFAULT expressions"
            )


def _parenthesize_not_defaults(sql: str) -> str:
    """`sql` with every DEFAULT expression holding a NOT outside parentheses put in parentheses.
    sqlglot reads `DEFAULT NOT FALSE NOT NULL` as the one expression NOT (FALSE IS NOT NULL),
    losing the column's NOT NULL and changing its default; Spark ends the expression before
    NOT NULL (`_default_expression_end`). `_default_sql` drops the parentheses again."""
    tokens = tokenize(sql)
    spans: list[tuple[int, int]] = []
    for i, tok in enumerate(tokens):
        if not tok.is_word("DEFAULT"):
            continue
        end = _default_expression_end(tokens, i + 1)
        depth = 0
        for t in tokens[i + 1 : end]:
            depth += t.is_punct("(") - t.is_punct(")")
            if depth == 0 and t.is_word("NOT"):  # a NOT inside parentheses stays there
                spans.append((tokens[i + 1].start, tokens[end - 1].end))
                break
    if not spans:
        return sql
    out: list[str] = []
    copied = 0
    for start, end in spans:
        out += [sql[copied:start], "(", sql[start:end], ")"]
        copied = end
    out.append(sql[copied:])
    return "".join(out)


def _refuse_empty_list_items(sql: str) -> None:
    """Spark refuses an empty item in any comma list (`(a INT,)`, `(a INT,,)`, `STRUCT<x: INT,>`,
    `(, a INT)`); sqlglot skips it, so `(a INT,,)` would create a table Spark itself could not
    have been asked for. Checked on the tokens, so commas inside strings and quoted names do not
    count."""
    for tok, following in itertools.pairwise(tokenize(sql)):
        after_comma = following.kind is TokenKind.EOF or any(following.is_punct(c) for c in ",)>;")
        if (tok.is_punct(",") and after_comma) or (
            (tok.is_punct("(") or tok.is_punct("<")) and following.is_punct(",")
        ):
            raise syntax_error(sql, following.start, "empty item in a list")


# What sqlglot puts in its messages: the repr of a token (`<Token token_type: TokenType.L_PAREN,
# text: (, line: 1, col: 14, start: 13, end: 13, comments: []>`) and of an expression class
# (`Required keyword: 'this' missing for <class 'sqlglot.expressions...LocationProperty'>`).
_SQLGLOT_TOKEN: Final = re.compile(
    r"<Token token_type: TokenType\.(\w+), text: .*?, line: \d+, col: \d+, "
    r"start: (\d+), end: (\d+), comments: \[.*?\]>"
)
_SQLGLOT_MISSING: Final = re.compile(r"Required keyword: '\w+' missing for <class '[\w.]*?(\w+)'>")
_SQLGLOT_REPR: Final = re.compile(r"<(?:Token|class)\b[^>]*>")
_CLAUSE_SUFFIXES: Final = ("ColumnConstraint", "Constraint", "Property")
_QUOTED_TEXT_MAX: Final = 40


def _readable_reason(reason: str, sql: str) -> str:
    """sqlglot's message with its object reprs replaced by what the user wrote: a token by its
    text (`'('`, or `end of input`), a clause missing its value by `incomplete LOCATION`."""

    def token(m: re.Match[str]) -> str:
        if m.group(1) == "SENTINEL":
            return "end of input"
        text = sql[int(m.group(2)) : int(m.group(3)) + 1]
        if len(text) > _QUOTED_TEXT_MAX:
            text = text[: _QUOTED_TEXT_MAX - 3] + "..."
        return repr(text)

    missing = _SQLGLOT_MISSING.fullmatch(reason)
    if missing is not None:
        name = missing.group(1)
        for suffix in _CLAUSE_SUFFIXES:
            name = name.removesuffix(suffix)
        words = " ".join(re.findall(r"[A-Z][a-z]*|[a-z]+|[0-9]+", name)).upper()
        return f"incomplete {words}" if words else "incomplete property"
    reason = _SQLGLOT_TOKEN.sub(token, reason)
    # Any other repr (a form not foreseen above) is left out rather than shown.
    return _SQLGLOT_REPR.sub("...", reason)


def _backslash_doubled_quotes(sql: str) -> str:
    """`sql` with every doubled quote inside a string literal (`'it''s'`) written as a backslash
    escape (`'it\\'s'`). Spark reads a doubled quote as one quote; sqlglot's Spark dialect reads
    it as two adjacent literals, which Spark concatenates: `'it''s'` became CONCAT('it', 's'),
    "its", in a stored DEFAULT, and a COMMENT or property the tree path refused. Found by the
    lexer, so quotes in comments and backquoted names are left alone."""
    if "''" not in sql and '""' not in sql:
        return sql
    out: list[str] = []
    copied = 0
    for tok in tokenize(sql):
        if tok.kind is not TokenKind.STRING:
            continue
        quote = sql[tok.start]
        body = sql[tok.start + 1 : tok.end - 1]
        if quote * 2 not in body:
            continue
        escaped: list[str] = []
        i = 0
        while i < len(body):
            if body[i] == "\\":
                escaped.append(body[i : i + 2])  # the lexer: a backslash takes the next char
                i += 2
            elif body[i] == quote:  # the lexer guarantees it is doubled here
                escaped.append("\\" + quote)
                i += 2
            else:
                escaped.append(body[i])
                i += 1
        out.append(sql[copied : tok.start + 1])
        out.append("".join(escaped))
        copied = tok.end - 1
    out.append(sql[copied:])
    return "".join(out)


def _sqlglot_parse(sql: str) -> list[exp.Expression]:
    """The statements sqlglot finds (empty ones dropped). Raises InvalidDdlError."""
    sql = _backslash_doubled_quotes(sql)
    try:
        parsed = sqlglot.parse(sql, read="spark")
    except ParseError as e:
        first = e.errors[0] if e.errors else {}
        line, col = first.get("line"), first.get("col")
        reason = _readable_reason(str(first.get("description") or e).split("\n")[0], sql)
        details: dict[str, object] = {"reason": reason}
        where = ""
        if isinstance(line, int) and isinstance(col, int):
            details |= {"line": line, "col": col}
            where = f" (line {line}, col {col})"
        raise InvalidDdlError(f"cannot parse statement: {reason}{where}", details=details) from None
    # sqlglot is a large third-party parser: whatever it raises on hostile input (TokenError,
    # RecursionError, ValueError, ...) must reach the client as InvalidDdlError.
    except Exception as e:  # noqa: BLE001
        reason = str(e).split("\n")[0][:200]
        raise InvalidDdlError(
            f"cannot parse statement: {reason}", details={"reason": reason}
        ) from None
    statements: list[exp.Expression] = []
    for stmt in parsed:
        if stmt is None:
            continue
        if not isinstance(stmt, exp.Expression):
            raise InvalidDdlError("not a SQL statement", details={"reason": "not a statement"})
        statements.append(stmt)
    return statements


def _expression_sql(expr: exp.Expression) -> str:
    try:
        return expr.sql(dialect="spark")
    except Exception as e:  # noqa: BLE001  (third-party generator; see _sqlglot_parse)
        raise InvalidDdlError(f"cannot render expression: {type(e).__name__}") from None


# --------------------------------------------------------------------------------------------
# Tree path
# --------------------------------------------------------------------------------------------


def _present(value: object) -> bool:
    """sqlglot leaves an absent clause as None, False or an empty list."""
    if value is None or value is False:
        return False
    return not (isinstance(value, list | tuple | str) and not value)


def _only(node: exp.Expression, allowed: set[str], what: str) -> None:
    """Refuse any clause of `node` that is present but not in `allowed`."""
    for key, value in node.args.items():
        if key in allowed or not _present(value):
            continue
        shown = value.sql(dialect="spark") if isinstance(value, exp.Expression) else key.upper()
        raise UnsupportedStatementError(
            f"{what}: clause {shown[:80]!r} is not supported",
            details={"clause": key, "statement": what},
        )


def _unsupported(message: str, **details: object) -> NoReturn:
    raise UnsupportedStatementError(message, details=details)


def _kind(node: exp.Expression) -> str:
    kind = node.args.get("kind")
    return kind.upper() if isinstance(kind, str) else ""


def _identifier(node: object, what: str) -> str:
    if isinstance(node, exp.Identifier) and isinstance(node.this, str):
        return node.this
    raise InvalidDdlError(f"expected a {what} name", details={"reason": f"bad {what} name"})


def _path(node: object) -> Path:
    """A (possibly nested) column reference: Identifier, Column or Dot chain."""
    if isinstance(node, exp.Identifier):
        return (_identifier(node, "column"),)
    if isinstance(node, exp.Dot):
        # `a.b.c...` is a left-leaning chain of Dots, as deep as the name has parts: walk it
        # without recursion, so a hostile name of thousands of parts is a typed error later
        # (depth or length limits), not a RecursionError.
        tails: list[Path] = []
        while isinstance(node, exp.Dot):
            tails.append(_path(node.expression))
            node = node.this
        head = _path(node)
        return tuple(part for p in (head, *reversed(tails)) for part in p)
    if isinstance(node, exp.Column):
        parts = node.parts
        if not parts:
            raise InvalidDdlError("expected a column name")
        return tuple(_identifier(p, "column") for p in parts)
    raise InvalidDdlError("expected a column name", details={"reason": "bad column reference"})


def _table_parts(table: object, what: str) -> list[str]:
    if not isinstance(table, exp.Table):
        raise InvalidDdlError(f"expected a {what} name")
    _only(table, {"this", "db", "catalog"}, what)
    return [_identifier(p, what) for p in table.parts]


def _table_name(table: object) -> TableName:
    return _table_from_parts(_table_parts(table, "table"))


def _namespace_name(table: object) -> str:
    return _namespace_from_parts(_table_parts(table, "namespace"))


def _table_from_parts(parts: list[str]) -> TableName:
    if len(parts) != 2:
        raise InvalidArgumentError(
            f"table name must have two parts, namespace.table; got {'.'.join(parts)!r}",
            details={"name": ".".join(parts)},
        )
    return TableName.of(parts[0], parts[1])


def _namespace_from_parts(parts: list[str]) -> str:
    if len(parts) != 1:
        raise InvalidArgumentError(
            f"namespace name must be a single name; got {'.'.join(parts)!r}",
            details={"name": ".".join(parts)},
        )
    return normalize_object_name(parts[0], "namespace")


def _string(node: object, what: str) -> str:
    if isinstance(node, exp.Literal) and node.is_string and isinstance(node.this, str):
        return node.this
    raise InvalidDdlError(f"{what} must be a string literal", details={"reason": what})


def _comment(node: object) -> str | None:
    return _string(node, "comment") or None


def _property_key(node: object) -> str:
    if isinstance(node, exp.Literal) and node.is_string:
        return _canonical_property_key(_string(node, "property key"))
    if isinstance(node, exp.Var) and isinstance(node.this, str):
        return _canonical_property_key(node.this)
    if isinstance(node, exp.Identifier | exp.Dot | exp.Column):
        return _canonical_property_key(".".join(_path(node)))
    raise InvalidDdlError("property key must be a string or a dotted name")


def _canonical_property_key(key: str) -> str:
    """Property keys are case-sensitive, but GC takes the TTL from any spelling of `gc.ttl`
    (`commands.gc_ttl_ms_of`): a table created with 'GC.TTL' and later set to 'gc.ttl' held
    both, and GC used the first in sorted order ('GC.TTL'), not the one set last. Every
    spelling is written as `gc.ttl`, so a SET replaces it and an UNSET removes it."""
    return GC_TTL_PROPERTY if key.lower() == GC_TTL_PROPERTY else key


def _property_value(node: object) -> str:
    if isinstance(node, exp.Literal) and isinstance(node.this, str):
        return node.this
    if isinstance(node, exp.Boolean):
        return "true" if node.this else "false"
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return "-" + str(node.this.this)
    if isinstance(node, exp.Var) and isinstance(node.this, str):
        return node.this
    raise InvalidDdlError("property value must be a string, number or boolean literal")


def _properties_of(nodes: list[exp.Expression]) -> Properties:
    pairs: list[tuple[str, str]] = []
    for prop in nodes:
        if type(prop) is not exp.Property:
            _unsupported(f"unsupported property clause {_expression_sql(prop)[:80]!r}")
        pairs.append((_property_key(prop.this), _property_value(prop.args.get("value"))))
    return make_properties(tuple(pairs))


# --- CREATE ---------------------------------------------------------------------------------


def _canonical_location(location: str, what: str) -> str:
    """Drop trailing slashes (`/data/t/` and `/data/t` are one directory) and lowercase a URI's
    scheme (case-insensitive: Spark writes `FILE:///t` at `/t`, while readers, the GC and the
    catalog's overlap rule know only `file://` as a local path), then validate."""
    canonical = location.rstrip("/")
    scheme, sep, rest = canonical.partition("://")
    if sep and "/" not in scheme:
        canonical = f"{scheme.lower()}{sep}{rest}"
    if not canonical:
        raise InvalidArgumentError(
            f"{what} {location!r} is a root, not a directory", details={"location": location}
        )
    validate_location(canonical, what)
    check_new_location(canonical, what)
    return canonical


def check_new_location(location: str, what: str) -> None:
    """The rules a new table's location meets beyond what apply accepts (apply still accepts
    what older entries hold). Checked where a CreateTable enters the cluster: here at parse
    time, and by the leader for one sent through `_propose`. InvalidArgumentError."""
    if location.startswith("file://") and not location.startswith("file:///"):
        # Readers, writers and GC all take a file URI's path after "file://", so a host there
        # would become a relative directory, resolved against each process's own working
        # directory.
        raise InvalidArgumentError(
            f"{what} {location!r}: a file URI names a local path and has no host; write "
            "file:///absolute/path (or the path itself)",
            details={"location": location[:200]},
        )
    if "://" in location and ("?" in location or "#" in location):
        # The daemon opens a location itself (the leader's GC, the removal check), with its
        # own credentials, and pyarrow takes options from a URI's query: endpoint_override
        # would send its signed requests to any host a writer names.
        raise InvalidArgumentError(
            f"{what} {location[:200]!r}: a URI location may hold no query ('?') or fragment "
            "('#'); set store options in the environment of the processes that read it",
            details={"location": location[:200]},
        )


def _create(stmt: exp.Create, request_id: str, warehouse: str) -> Command:
    kind = _kind(stmt)
    if kind in ("SCHEMA", "DATABASE", "NAMESPACE"):
        _only(stmt, {"this", "kind", "exists", "properties"}, f"CREATE {kind}")
        comment: str | None = None
        pairs: list[exp.Expression] = []
        seen: set[str] = set()
        for prop in _property_nodes(stmt):
            if isinstance(prop, exp.SchemaCommentProperty):
                _once(seen, "COMMENT")
                comment = _comment(prop.this)
            elif type(prop) is exp.Property:
                pairs.append(prop)
            else:
                _unsupported(
                    f"CREATE {kind}: clause {_expression_sql(prop)[:80]!r} is not supported"
                )
        return CreateNamespace(
            request_id=request_id,
            namespace=_namespace_name(stmt.this),
            if_not_exists=bool(stmt.args.get("exists")),
            comment=comment,
            properties=_properties_of(pairs),
        )
    if kind != "TABLE":
        _unsupported(f"CREATE {kind} is not supported; supported: {SUPPORTED}", kind=kind)
    _only(stmt, {"this", "kind", "exists", "properties"}, "CREATE TABLE")
    target = stmt.this
    if not isinstance(target, exp.Schema):
        _unsupported("CREATE TABLE needs an explicit column list (no LIKE / AS SELECT)")
    _only(target, {"this", "expressions"}, "CREATE TABLE")
    table = _table_name(target.this)
    columns: list[Column] = []
    for coldef in target.expressions:
        if isinstance(coldef, exp.Identifier):
            raise InvalidDdlError(
                f"column {coldef.name!r} needs a data type", details={"reason": "missing type"}
            )
        if not isinstance(coldef, exp.ColumnDef):
            _unsupported(f"CREATE TABLE: {_expression_sql(coldef)[:80]!r} is not supported")
        path, column, position = _column_def(coldef)
        if len(path) != 1 or position is not None:
            raise InvalidDdlError("CREATE TABLE columns take a plain name and no position")
        columns.append(column)
    comment = None
    location = ""
    pairs = []
    seen = set()
    for prop in _property_nodes(stmt):
        if isinstance(prop, exp.LocationProperty):
            _once(seen, "LOCATION")
            location = _canonical_location(_string(prop.this, "LOCATION"), "LOCATION")
        elif isinstance(prop, exp.FileFormatProperty):
            _once(seen, "USING")
            fmt = prop.this
            name = fmt.name.lower() if isinstance(fmt, exp.Var | exp.Identifier) else ""
            if name != "parquet":
                _unsupported("only USING parquet tables are supported", format=name or "unknown")
        elif isinstance(prop, exp.SchemaCommentProperty):
            _once(seen, "COMMENT")
            comment = _comment(prop.this)
        elif type(prop) is exp.Property:
            pairs.append(prop)
        else:
            _unsupported(f"CREATE TABLE: clause {_expression_sql(prop)[:80]!r} is not supported")
    if not location and warehouse:
        location = f"{warehouse}/{table.namespace}.db/{table.name}"
    return CreateTable(
        request_id=request_id,
        table=table,
        schema=Schema(columns=tuple(columns)),
        if_not_exists=bool(stmt.args.get("exists")),
        comment=comment,
        properties=_properties_of(pairs),
        location=location,
    )


def _property_nodes(stmt: exp.Expression) -> list[exp.Expression]:
    props = stmt.args.get("properties")
    if props is None:
        return []
    if not isinstance(props, exp.Properties):
        raise InvalidDdlError("malformed properties")
    return list(props.expressions)


def _column_def(
    coldef: exp.ColumnDef, level: int = 0
) -> tuple[Path, Column, ColumnPosition | None]:
    """A column definition: its full path, the column (path's last name), its position.
    `level` is the nesting level of the type (for struct fields)."""
    _only(coldef, {"this", "kind", "constraints", "position"}, "column definition")
    path = _path(coldef.this)
    dtype_node = coldef.args.get("kind")
    if not isinstance(dtype_node, exp.DataType):
        raise InvalidDdlError(f"column {'.'.join(path)} needs a data type")
    dtype = _data_type(dtype_node, level)
    nullable = True
    comment: str | None = None
    default_sql: str | None = None
    seen: set[str] = set()
    for constraint in coldef.args.get("constraints") or []:
        kind = constraint.args.get("kind") if isinstance(constraint, exp.ColumnConstraint) else None
        if isinstance(kind, exp.NotNullColumnConstraint):
            _once(seen, "NOT NULL")
            nullable = bool(kind.args.get("allow_null"))
        elif isinstance(kind, exp.DefaultColumnConstraint):
            _once(seen, "DEFAULT")
            default_sql = _default_sql(kind.this)
        elif isinstance(kind, exp.CommentColumnConstraint):
            _once(seen, "COMMENT")
            comment = _comment(kind.this)
        else:
            shown = _expression_sql(constraint)[:80]
            _unsupported(f"column constraint {shown!r} is not supported")
    position = _position(coldef.args.get("position"))
    column = Column(
        name=path[-1], type=dtype, nullable=nullable, comment=comment, default_sql=default_sql
    )
    return path, column, position


def _once(seen: set[str], clause: str) -> None:
    if clause in seen:
        raise InvalidDdlError(f"{clause} given twice", details={"reason": "duplicate clause"})
    seen.add(clause)


def _position(node: object) -> ColumnPosition | None:
    if node is None:
        return None
    if not isinstance(node, exp.ColumnPosition):
        raise InvalidDdlError("malformed column position")
    where = str(node.args.get("position") or "").upper()
    if where == "FIRST":
        return First()
    if where == "AFTER":
        target = _path(node.this)
        if len(target) != 1:
            raise InvalidDdlError("AFTER takes the name of a sibling column")
        return After(column=target[0])
    raise InvalidDdlError(f"unsupported column position {where!r}")


_FORBIDDEN_IN_DEFAULT = (
    exp.Column,
    exp.Subquery,
    exp.Select,
    exp.AggFunc,
    exp.Window,
    exp.Star,
    exp.Placeholder,
    exp.Parameter,
    exp.Alias,
)


def _default_sql(node: object) -> str:
    """Canonical SQL of a DEFAULT expression, which must be constant (Spark's rule)."""
    text = _rendered_default(node)
    # The stored text is what Spark and every reader evaluate, and what the DEFAULT checks
    # re-parse: a rendering that reads back as a column name would mean something else there.
    if _reads_back_as_a_column(text):
        raise InvalidArgumentError(
            f"DEFAULT {text[:200]} cannot be stored: it would read back as a column name",
            details={"default": text[:200]},
        )
    return text


@functools.lru_cache(maxsize=1024)
def _reads_back_as_a_column(text: str) -> bool:
    """Does the stored text `text` of a DEFAULT read back with a column name in it? Cached: a
    wide table repeating one DEFAULT reads it back once (sqlglot's parse is deterministic)."""
    reparsed = _sqlglot_parse("SELECT " + text)
    return any(isinstance(sub, exp.Column) for stmt in reparsed for sub in stmt.walk())


def _rendered_default(node: object) -> str:
    """`_default_sql` without reading the text back."""
    if not isinstance(node, exp.Expression):
        raise InvalidDdlError("DEFAULT needs an expression")
    if isinstance(node, exp.Paren) and isinstance(node.this, exp.Not):
        node = node.this  # see _parenthesize_not_defaults
    for sub in node.walk():
        if isinstance(sub, _FORBIDDEN_IN_DEFAULT):
            raise InvalidArgumentError(
                "DEFAULT must be a constant expression (no column references, subqueries, "
                "aggregates or parameters)",
                details={"default": _expression_sql(node)[:200]},
            )
    if any(isinstance(sub, _BARE_FUNCTIONS) for sub in node.walk()):
        node = node.transform(_with_parentheses)  # a copy of the whole tree: only when needed
    return _expression_sql(node)


# Functions sqlglot's Spark generator renders without parentheses, which Spark reads as a
# column name (measured: LOCALTIMESTAMP and CURRENT_CATALOG are UNRESOLVED_COLUMN in pyspark 4).
_BARE_FUNCTIONS: Final = (exp.Localtimestamp, exp.CurrentCatalog)


def _with_parentheses(node: exp.Expression) -> exp.Expression:
    if isinstance(node, _BARE_FUNCTIONS) and not any(_present(v) for v in node.args.values()):
        return exp.Anonymous(this=node.sql_name(), expressions=[])
    return node


# sqlglot type names (spark dialect) -> our primitives.
_SQLGLOT_PRIMITIVES: dict[str, DataType] = {
    "BOOLEAN": BOOLEAN,
    "TINYINT": TINYINT,
    "SMALLINT": SMALLINT,
    "INT": INT,
    "BIGINT": BIGINT,
    "FLOAT": FLOAT,
    "DOUBLE": DOUBLE,
    "TEXT": STRING,
    "BINARY": BINARY,
    "DATE": DATE,
    "TIMESTAMP": TIMESTAMP,
    "TIMESTAMPTZ": TIMESTAMP,
    "TIMESTAMPLTZ": TIMESTAMP,
    "TIMESTAMPNTZ": TIMESTAMP_NTZ,
}


def _data_type(node: exp.DataType, level: int) -> DataType:
    """Convert sqlglot's DataType to ours. `level` counts enclosing complex types."""
    _only(node, {"this", "expressions", "nested"}, "data type")
    name = str(getattr(node.this, "value", node.this)).upper()
    args = list(node.expressions)
    if name in ("ARRAY", "MAP", "STRUCT"):
        if level + 1 > limits.MAX_NESTING_DEPTH:
            raise limit_exceeded(
                "MAX_NESTING_DEPTH", limits.MAX_NESTING_DEPTH, level + 1, "type nesting depth"
            )
        if name == "ARRAY" and len(args) == 1 and isinstance(args[0], exp.DataType):
            return ArrayType(element=_data_type(args[0], level + 1))
        if name == "MAP" and len(args) == 2:
            key, value = args
            if isinstance(key, exp.DataType) and isinstance(value, exp.DataType):
                return MapType(key=_data_type(key, level + 1), value=_data_type(value, level + 1))
        if name == "STRUCT" and args:
            return StructType(fields=tuple(_struct_field(f, level + 1) for f in args))
        raise InvalidDdlError(f"malformed {name} type", details={"reason": f"malformed {name}"})
    params = [_type_param(a) for a in args]
    if name == "DECIMAL":
        if len(params) > 2:
            raise InvalidDdlError("DECIMAL takes at most (precision, scale)")
        precision = params[0] if params else DEFAULT_DECIMAL_PRECISION
        return DecimalType(precision=precision, scale=params[1] if len(params) > 1 else 0)
    if name in ("VARCHAR", "CHAR"):
        if len(params) != 1:
            raise InvalidDdlError(f"{name} needs a length, as in {name}(10)")
        return VarcharType(length=params[0]) if name == "VARCHAR" else CharType(length=params[0])
    primitive = _SQLGLOT_PRIMITIVES.get(name)
    if primitive is None:
        raise InvalidDdlError(
            f"unsupported data type {_expression_sql(node)[:60]}",
            details={"reason": "unsupported type", "type": name},
        )
    if params:
        raise InvalidDdlError(f"{primitive.to_sql()} takes no parameters")
    return primitive


def _type_param(node: object) -> int:
    if isinstance(node, exp.DataTypeParam) and node.args.get("expression") is not None:
        # sqlglot reads `DECIMAL(1 foo, 1)` as the parameter 1 with a trailing `foo`.
        raise InvalidDdlError("type parameters must be integers")
    inner = node.this if isinstance(node, exp.DataTypeParam) else node
    if isinstance(inner, exp.Literal) and not inner.is_string:
        text = str(inner.this)
        if text.isdigit() and len(text) <= 12:
            return int(text)
    raise InvalidDdlError("type parameters must be integers")


def _struct_field(node: object, level: int) -> StructField:
    if not isinstance(node, exp.ColumnDef):
        raise InvalidDdlError("STRUCT fields need a name and a type, as in STRUCT<a: INT>")
    path, column, position = _column_def(node, level)
    if len(path) != 1 or position is not None or column.default_sql is not None:
        raise InvalidDdlError("STRUCT fields take a plain name, a type, NOT NULL and COMMENT")
    return StructField(
        name=column.name,
        type=column.type,
        nullable=column.nullable,
        comment=column.comment,
    )


# --- DROP -----------------------------------------------------------------------------------


def _drop(stmt: exp.Drop, request_id: str) -> Command:
    kind = _kind(stmt)
    tables = stmt.args.get("tables") or []
    if len(tables) != 1:
        raise InvalidDdlError("DROP takes exactly one name")
    if kind in ("SCHEMA", "DATABASE", "NAMESPACE"):
        _only(stmt, {"tables", "kind", "exists", "cascade", "restrict"}, f"DROP {kind}")
        if stmt.args.get("cascade") and stmt.args.get("restrict"):
            raise InvalidDdlError("CASCADE and RESTRICT together")
        return DropNamespace(
            request_id=request_id,
            namespace=_namespace_name(tables[0]),
            if_exists=bool(stmt.args.get("exists")),
            cascade=bool(stmt.args.get("cascade")),
        )
    if kind != "TABLE":
        _unsupported(f"DROP {kind} is not supported; supported: {SUPPORTED}", kind=kind)
    _only(stmt, {"tables", "kind", "exists"}, "DROP TABLE")
    return DropTable(
        request_id=request_id,
        table=_table_name(tables[0]),
        if_exists=bool(stmt.args.get("exists")),
    )


# --- ALTER TABLE ----------------------------------------------------------------------------


def _alter(stmt: exp.Alter, request_id: str) -> Command:
    kind = _kind(stmt)
    if kind != "TABLE":
        _unsupported(f"ALTER {kind} is not supported; supported: {SUPPORTED}", kind=kind)
    _only(stmt, {"this", "kind", "actions"}, "ALTER TABLE")
    table = _table_name(stmt.this)
    changes: list[TableChange] = []
    for action in stmt.args.get("actions") or []:
        changes.extend(_alter_action(action))
    if not changes:
        raise InvalidDdlError("ALTER TABLE needs an action")
    return AlterTable(request_id=request_id, table=table, changes=tuple(changes))


def _alter_action(action: exp.Expression) -> list[TableChange]:
    if isinstance(action, exp.ColumnDef):  # ADD COLUMN x ... / ADD COLUMNS x ..., y ...
        return [_add_column(action)]
    if isinstance(action, exp.Schema) and action.this is None:  # ADD COLUMNS (x ..., y ...)
        return [_add_column(c) for c in action.expressions]
    if isinstance(action, exp.RenameColumn):
        _only(action, {"this", "to"}, "RENAME COLUMN")
        new = _path(action.args.get("to"))
        if len(new) != 1:
            raise InvalidDdlError("RENAME COLUMN ... TO takes a plain new name")
        return [RenameColumn(path=_path(action.this), new_name=new[0])]
    if isinstance(action, exp.Drop) and _kind(action) in ("COLUMN", "COLUMNS"):
        _only(action, {"tables", "kind", "exists"}, "DROP COLUMN")
        if_exists = bool(action.args.get("exists"))
        paths: list[Path] = []
        for target in action.args.get("tables") or []:
            if isinstance(target, exp.Schema):
                paths.extend(_path(p) for p in target.expressions)
            else:
                paths.append(_path(target))
        return [DropColumn(path=p, if_exists=if_exists) for p in paths]
    if isinstance(action, exp.AlterColumn):
        return [_alter_column(action)]
    if isinstance(action, exp.AlterSet):
        _only(action, {"expressions"}, "ALTER TABLE SET")
        nodes = action.expressions
        if len(nodes) != 1 or not isinstance(nodes[0], exp.Properties):
            _unsupported("only ALTER TABLE ... SET TBLPROPERTIES is supported")
        return [SetTableProperties(properties=_properties_of(list(nodes[0].expressions)))]
    _unsupported(
        f"ALTER TABLE action {_expression_sql(action)[:80]!r} is not supported",
        action=action.key,
    )


def _add_column(node: object) -> AddColumn:
    if not isinstance(node, exp.ColumnDef):
        raise InvalidDdlError("ADD COLUMNS takes column definitions")
    path, column, position = _column_def(node)
    return AddColumn(parent=path[:-1], column=column, position=position)


def _changes_a_type(stmt: exp.Alter) -> bool:
    actions = stmt.args.get("actions") or []
    return any(isinstance(a, exp.AlterColumn) and _present(a.args.get("dtype")) for a in actions)


def _alter_column(action: exp.AlterColumn) -> TableChange:
    path = _path(action.this)
    args = {k for k, v in action.args.items() if _present(v) and k != "this"}
    dtype = action.args.get("dtype")
    if "rename_to" in args:
        # Hive's `CHANGE COLUMN a a BIGINT`: allowed only without a rename, like Spark.
        new = _path(action.args.get("rename_to"))
        if len(new) != 1 or new[0].casefold() != path[-1].casefold():
            _unsupported("CHANGE COLUMN cannot rename; use RENAME COLUMN")
        args.discard("rename_to")
    if args == {"dtype"} and isinstance(dtype, exp.DataType):
        return AlterColumnType(path=path, new_type=_data_type(dtype, 0))
    allow_null = action.args.get("allow_null")
    if args == {"drop", "allow_null"} and allow_null is True:
        return SetNullability(path=path, nullable=True)
    if not args and allow_null is False:  # SET NOT NULL: sqlglot's only trace is allow_null=False
        return SetNullability(path=path, nullable=False)
    if args == {"comment"}:
        return SetColumnComment(path=path, comment=_comment(action.args.get("comment")))
    _unsupported(
        f"ALTER COLUMN {_expression_sql(action)[:80]!r} is not supported",
        clauses=sorted(args),
    )


# --------------------------------------------------------------------------------------------
# Fallback path: a hand parser for the statements sqlglot returns as an opaque Command
# --------------------------------------------------------------------------------------------


class _Fallback(TokenCursor):
    """Spark's grammar for the forms sqlglot does not build a tree for. Reads the whole text."""

    __slots__ = ("request_id",)

    def __init__(self, text: str, request_id: str) -> None:
        super().__init__(text)
        self.request_id = request_id

    def statement(self) -> Command:
        first = self.peek()
        cmd: Command
        if self.accept_word("CREATE"):
            if self.peek().is_word("TABLE"):
                # A form sqlglot would have built a tree for, had it been valid.
                raise InvalidDdlError(
                    "cannot parse statement: not a valid CREATE TABLE statement",
                    details={"reason": "invalid CREATE TABLE"},
                )
            if not self.peek().is_word("NAMESPACE", "SCHEMA", "DATABASE"):
                self._unsupported_statement(first)
            self.next()
            cmd = self._create_namespace()
        elif self.accept_word("DROP"):
            cmd = self._drop()
        elif self.accept_word("ALTER"):
            if not self.peek().is_word("TABLE"):
                self._unsupported_statement(first)
            self.next()
            cmd = self._alter_table()
        else:
            self._unsupported_statement(first)
        if not self.at_end():
            raise self.error("unexpected text at the end of the statement")
        return cmd

    def _unsupported_statement(self, first: Token) -> NoReturn:
        words = [t.value.upper() for t in self.tokens[:3] if t.kind is TokenKind.WORD]
        shown = " ".join(words[:2]) or first.value
        raise UnsupportedStatementError(
            _unsupported_message(f"{shown} is"), details={"statement": shown}
        )

    # --- names ---

    def _name_parts(self, what: str) -> list[str]:
        parts = [self.expect_identifier(f"{what} name")]
        while self.accept_punct("."):
            parts.append(self.expect_identifier(f"{what} name"))
        return parts

    def _table_name(self) -> TableName:
        return _table_from_parts(self._name_parts("table"))

    def _namespace_name(self) -> str:
        return _namespace_from_parts(self._name_parts("namespace"))

    def _path(self) -> Path:
        parts = [self.expect_identifier("column name")]
        while self.accept_punct("."):
            parts.append(self.expect_identifier("column name"))
            if len(parts) > limits.MAX_NESTING_DEPTH + 1:
                raise limit_exceeded(
                    "MAX_NESTING_DEPTH", limits.MAX_NESTING_DEPTH, len(parts) - 1, "column path"
                )
        return tuple(parts)

    def _if_exists(self) -> bool:
        if self.accept_word("IF"):
            self.expect_word("EXISTS")
            return True
        return False

    def _if_not_exists(self) -> bool:
        if self.accept_word("IF"):
            self.expect_word("NOT")
            self.expect_word("EXISTS")
            return True
        return False

    # --- properties ---

    def _property_list(self, *, values: bool) -> list[tuple[str, str]]:
        """`(key = value, ...)`; with values=False, `(key, ...)` (UNSET) and value is ""."""
        self.expect_punct("(")
        pairs: list[tuple[str, str]] = []
        while True:
            key = self._property_key()
            value = ""
            if values:
                self.accept_punct("=")
                value = self._property_value()
            pairs.append((key, value))
            if len(pairs) > limits.MAX_PROPERTIES_PER_TABLE:
                raise limit_exceeded(
                    "MAX_PROPERTIES_PER_TABLE",
                    limits.MAX_PROPERTIES_PER_TABLE,
                    len(pairs),
                    "properties in one clause",
                )
            if self.accept_punct(")"):
                return pairs
            self.expect_punct(",")

    def _property_key(self) -> str:
        if self.peek().kind is TokenKind.STRING:
            return _canonical_property_key(self.next().value)
        parts = [self.expect_identifier("property key")]
        while self.accept_punct("."):
            parts.append(self.expect_identifier("property key"))
        return _canonical_property_key(".".join(parts))

    def _property_value(self) -> str:
        tok = self.peek()
        if tok.kind is TokenKind.STRING:
            return self.next().value
        if tok.is_word("TRUE", "FALSE"):
            return self.next().value.lower()
        sign = "-" if self.accept_punct("-") else ""
        if self.peek().kind is TokenKind.NUMBER:
            start = self.next()
            end = start
            if self.peek().is_punct(".") and self.peek(1).kind is TokenKind.NUMBER:
                self.next()
                end = self.next()
            return sign + self.text[start.start : end.end]
        raise self.error("expected a property value (string, number or boolean)")

    # --- statements ---

    def _create_namespace(self) -> CreateNamespace:
        if_not_exists = self._if_not_exists()
        namespace = self._namespace_name()
        comment: str | None = None
        properties: list[tuple[str, str]] = []
        seen: set[str] = set()
        while not self.at_end():
            tok = self.peek()
            if self.accept_word("COMMENT"):
                _once(seen, "COMMENT")
                comment = self.expect_string("comment") or None
            elif self.accept_word("WITH"):
                _once(seen, "DBPROPERTIES")
                self.expect_word("DBPROPERTIES", "PROPERTIES")
                properties = self._property_list(values=True)
            elif tok.is_word("LOCATION"):
                raise UnsupportedStatementError(
                    "LOCATION is not supported: namespaces live in the warehouse",
                    details={"clause": "LOCATION"},
                )
            else:
                raise self.error("expected COMMENT or WITH DBPROPERTIES")
        return CreateNamespace(
            request_id=self.request_id,
            namespace=namespace,
            if_not_exists=if_not_exists,
            comment=comment,
            properties=make_properties(tuple(properties)),
        )

    def _drop(self) -> Command:
        tok = self.peek()
        if self.accept_word("NAMESPACE", "SCHEMA", "DATABASE"):
            if_exists = self._if_exists()
            namespace = self._namespace_name()
            cascade = self.accept_word("CASCADE")
            if not cascade:
                self.accept_word("RESTRICT")
            return DropNamespace(
                request_id=self.request_id,
                namespace=namespace,
                if_exists=if_exists,
                cascade=cascade,
            )
        if self.accept_word("TABLE"):
            if_exists = self._if_exists()
            return DropTable(
                request_id=self.request_id, table=self._table_name(), if_exists=if_exists
            )
        if tok.kind is TokenKind.WORD:
            raise UnsupportedStatementError(
                f"DROP {tok.value.upper()} is not supported; supported: {SUPPORTED}",
                details={"statement": f"DROP {tok.value.upper()}"},
            )
        raise self.error("expected TABLE or NAMESPACE after DROP")

    def _alter_table(self) -> AlterTable:
        table = self._table_name()
        tok = self.peek()
        changes: list[TableChange]
        if self.accept_word("ADD"):
            self.expect_word("COLUMN", "COLUMNS")
            changes = list(self._items(self._add_column))
        elif self.accept_word("DROP"):
            self.expect_word("COLUMN", "COLUMNS")
            if_exists = self._if_exists()
            paths = self._items(self._path)
            changes = [DropColumn(path=p, if_exists=if_exists) for p in paths]
        elif self.accept_word("RENAME"):
            if not self.accept_word("COLUMN"):
                raise UnsupportedStatementError(
                    "only RENAME COLUMN is supported (tables cannot be renamed)",
                    details={"clause": "RENAME"},
                )
            path = self._path()
            self.expect_word("TO")
            changes = [RenameColumn(path=path, new_name=self.expect_identifier("new name"))]
        elif self.peek().is_word("ALTER", "CHANGE"):
            hive_style = self.next().is_word("CHANGE")
            self.accept_word("COLUMN")
            changes = [self._alter_column(self._path(), hive_style=hive_style)]
        elif self.accept_word("SET"):
            self.expect_word("TBLPROPERTIES")
            props = make_properties(tuple(self._property_list(values=True)))
            changes = [SetTableProperties(properties=props)]
        elif self.accept_word("UNSET"):
            self.expect_word("TBLPROPERTIES")
            if_exists = self._if_exists()
            keys = tuple(k for k, _ in self._property_list(values=False))
            changes = [UnsetTableProperties(keys=keys, if_exists=if_exists)]
        elif tok.kind is TokenKind.WORD:
            raise UnsupportedStatementError(
                f"ALTER TABLE ... {tok.value.upper()} is not supported",
                details={"clause": tok.value.upper()},
            )
        else:
            raise self.error("expected an ALTER TABLE action")
        return AlterTable(request_id=self.request_id, table=table, changes=tuple(changes))

    def _items(self, parse_item: Callable[[], _T]) -> list[_T]:
        """`item, item, ...` or `(item, item, ...)`, as Spark accepts both after ADD/DROP."""
        paren = self.accept_punct("(")
        items = [parse_item()]
        while self.accept_punct(","):
            if len(items) >= limits.MAX_CHANGES_PER_ALTER:
                raise limit_exceeded(
                    "MAX_CHANGES_PER_ALTER",
                    limits.MAX_CHANGES_PER_ALTER,
                    len(items) + 1,
                    "columns in one ALTER TABLE",
                )
            items.append(parse_item())
        if paren:
            self.expect_punct(")")
        return items

    def _add_column(self) -> AddColumn:
        path = self._path()
        dtype = parse_type_tokens(self)
        nullable = True
        comment: str | None = None
        default_sql: str | None = None
        position: ColumnPosition | None = None
        seen: set[str] = set()
        while True:
            if self.accept_word("NOT"):
                _once(seen, "NOT NULL")
                self.expect_word("NULL")
                nullable = False
            elif self.accept_word("DEFAULT"):
                _once(seen, "DEFAULT")
                default_sql = self._default_expression()
            elif self.accept_word("COMMENT"):
                _once(seen, "COMMENT")
                comment = self.expect_string("comment") or None
            elif self.peek().is_word("FIRST", "AFTER"):
                _once(seen, "position")
                position = self._position()
            else:
                break
        column = Column(
            name=path[-1], type=dtype, nullable=nullable, comment=comment, default_sql=default_sql
        )
        return AddColumn(parent=path[:-1], column=column, position=position)

    def _position(self) -> ColumnPosition:
        if self.accept_word("FIRST"):
            return First()
        self.expect_word("AFTER")
        return After(column=self.expect_identifier("column name"))

    def _default_expression(self) -> str:
        """Slice the DEFAULT expression's text (up to the next clause or list end) and let
        sqlglot parse it, so both paths canonicalise defaults identically."""
        start = self.peek()
        end_index = _default_expression_end(self.tokens, self.pos)
        if end_index == self.pos:
            raise self.error("expected an expression after DEFAULT")
        end = self.tokens[end_index - 1]
        self.pos = end_index
        text = self.text[start.start : end.end]
        parsed = _sqlglot_parse("SELECT " + text)
        select = parsed[0] if len(parsed) == 1 else None
        if not isinstance(select, exp.Select) or any(
            _present(v) for k, v in select.args.items() if k != "expressions"
        ):
            raise syntax_error(self.text, start.start, "malformed DEFAULT expression")
        items = select.expressions
        if len(items) != 1:
            raise syntax_error(self.text, start.start, "malformed DEFAULT expression")
        return _default_sql(items[0])

    def _alter_column(self, path: Path, *, hive_style: bool) -> TableChange:
        tok = self.peek()
        keywords = ("TYPE", "COMMENT", "FIRST", "AFTER", "SET", "DROP")
        if (
            hive_style
            and tok.kind in (TokenKind.WORD, TokenKind.QUOTED)
            and not tok.is_word(*keywords)
        ):
            # Hive's `CHANGE [COLUMN] old new type`: Spark allows it only without a rename.
            new_name = self.expect_identifier("column name")
            if new_name.casefold() != path[-1].casefold():
                raise UnsupportedStatementError(
                    "CHANGE COLUMN cannot rename; use RENAME COLUMN",
                    details={"clause": "CHANGE COLUMN"},
                )
            return AlterColumnType(path=path, new_type=parse_type_tokens(self))
        if self.accept_word("TYPE"):
            return AlterColumnType(path=path, new_type=parse_type_tokens(self))
        if self.accept_word("COMMENT"):
            return SetColumnComment(path=path, comment=self.expect_string("comment") or None)
        if self.peek().is_word("FIRST", "AFTER"):
            return MoveColumn(path=path, position=self._position())
        if self.accept_word("SET"):
            if self.peek().is_word("DEFAULT"):
                raise UnsupportedStatementError(
                    "ALTER COLUMN ... SET DEFAULT is not supported", details={"clause": "DEFAULT"}
                )
            self.expect_word("NOT")
            self.expect_word("NULL")
            return SetNullability(path=path, nullable=False)
        if self.accept_word("DROP"):
            if self.peek().is_word("DEFAULT"):
                raise UnsupportedStatementError(
                    "ALTER COLUMN ... DROP DEFAULT is not supported", details={"clause": "DEFAULT"}
                )
            self.expect_word("NOT")
            self.expect_word("NULL")
            return SetNullability(path=path, nullable=True)
        raise self.error(
            "expected TYPE, COMMENT, FIRST, AFTER, SET NOT NULL or DROP NOT NULL after the column"
        )
