"""A small Spark SQL lexer for the hand-written parsers (data types and the DDL fallback).

sqlglot parses most DDL, but it has no entry point for a bare Spark type string and falls back to
an opaque `Command` for several valid `ALTER TABLE` forms. Both gaps are filled by tiny
recursive-descent parsers over the tokens produced here.

Spark lexical rules followed: unquoted identifiers are ASCII letters, digits and `_`;
backquoted identifiers may hold anything, with ```` `` ```` for a backquote; string literals use
single or double quotes with backslash escapes, and a doubled quote stands for one quote;
`--` and `/* */` comments are skipped. `<` and `>` are always single tokens so `ARRAY<ARRAY<INT>>`
closes cleanly.

Invariant: tokens are in text order and `text[tok.start:tok.end]` is the token's source, so a
parser can slice out a sub-expression verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from metastore.errors import InvalidDdlError


class TokenKind(Enum):
    WORD = "word"  # unquoted identifier or keyword
    QUOTED = "quoted"  # backquoted identifier; value is unescaped
    STRING = "string"  # string literal; value is unescaped
    NUMBER = "number"  # unsigned integer literal
    PUNCT = "punct"  # any other single character
    EOF = "eof"


@dataclass(frozen=True, slots=True, kw_only=True)
class Token:
    kind: TokenKind
    value: str
    start: int
    end: int

    def is_word(self, *words: str) -> bool:
        return self.kind is TokenKind.WORD and self.value.upper() in words

    def is_punct(self, char: str) -> bool:
        return self.kind is TokenKind.PUNCT and self.value == char


_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_DIGITS = frozenset("0123456789")
# Spark's unescapeSQLString for the common escapes; any other escaped char stands for itself.
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "0": "\0", "Z": "\x1a"}


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of a character offset (for error messages)."""
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, col


def syntax_error(text: str, offset: int, message: str) -> InvalidDdlError:
    line, col = line_col(text, offset)
    return InvalidDdlError(
        f"{message} (line {line}, col {col})",
        details={"reason": message, "line": line, "col": col, "offset": offset},
    )


def tokenize(text: str) -> list[Token]:
    """Split `text` into tokens, ending with one EOF token. Raises InvalidDdlError."""
    tokens: list[Token] = []
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith("--", i):
            nl = text.find("\n", i)
            i = n if nl < 0 else nl + 1
        elif text.startswith("/*", i):
            close = text.find("*/", i + 2)
            if close < 0:
                raise syntax_error(text, i, "unterminated comment")
            i = close + 2
        elif c in _WORD_CHARS:
            j = i
            while j < n and text[j] in _WORD_CHARS:
                j += 1
            word = text[i:j]
            kind = TokenKind.NUMBER if all(ch in _DIGITS for ch in word) else TokenKind.WORD
            tokens.append(Token(kind=kind, value=word, start=i, end=j))
            i = j
        elif c == "`":
            i = _quoted_identifier(text, i, tokens)
        elif c in "'\"":
            i = _string_literal(text, i, tokens)
        else:
            tokens.append(Token(kind=TokenKind.PUNCT, value=c, start=i, end=i + 1))
            i += 1
    tokens.append(Token(kind=TokenKind.EOF, value="", start=n, end=n))
    return tokens


def _quoted_identifier(text: str, start: int, out: list[Token]) -> int:
    parts: list[str] = []
    i = start + 1
    while True:
        close = text.find("`", i)
        if close < 0:
            raise syntax_error(text, start, "unterminated quoted identifier")
        parts.append(text[i:close])
        if text.startswith("``", close):
            parts.append("`")
            i = close + 2
            continue
        out.append(Token(kind=TokenKind.QUOTED, value="".join(parts), start=start, end=close + 1))
        return close + 1


def _string_literal(text: str, start: int, out: list[Token]) -> int:
    quote = text[start]
    parts: list[str] = []
    i = start + 1
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            e = text[i + 1]
            parts.append(_ESCAPES.get(e, e))
            i += 2
        elif c == quote and text.startswith(quote, i + 1):
            parts.append(quote)  # a doubled quote stands for one (Spark; see ddl._sqlglot_parse)
            i += 2
        elif c == quote:
            out.append(Token(kind=TokenKind.STRING, value="".join(parts), start=start, end=i + 1))
            return i + 1
        else:
            parts.append(c)
            i += 1
    raise syntax_error(text, start, "unterminated string literal")


def quote_string(value: str) -> str:
    """Render a Spark string literal that `tokenize` (and Spark) reads back as `value`."""
    out = ["'"]
    for c in value:
        if c in "\\'":
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif c == "\0":
            out.append("\\0")
        else:
            out.append(c)
    out.append("'")
    return "".join(out)


def is_simple_identifier(name: str) -> bool:
    return bool(name) and all(c in _WORD_CHARS for c in name) and not name[0].isdigit()


def quote_identifier(name: str, *, always: bool = False) -> str:
    """Backquote `name` when needed (or always), doubling embedded backquotes."""
    if not always and is_simple_identifier(name):
        return name
    return "`" + name.replace("`", "``") + "`"


class TokenCursor:
    """A position in a token list with the small helpers every hand parser needs."""

    __slots__ = ("pos", "text", "tokens")

    def __init__(self, text: str, tokens: list[Token] | None = None) -> None:
        self.text = text
        self.tokens = tokens if tokens is not None else tokenize(text)
        self.pos = 0

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def next(self) -> Token:
        tok = self.peek()
        if tok.kind is not TokenKind.EOF:
            self.pos += 1
        return tok

    def error(self, message: str, tok: Token | None = None) -> InvalidDdlError:
        at = tok if tok is not None else self.peek()
        found = "end of input" if at.kind is TokenKind.EOF else repr(self.text[at.start : at.end])
        return syntax_error(self.text, at.start, f"{message}, found {found}")

    def accept_word(self, *words: str) -> bool:
        if self.peek().is_word(*words):
            self.pos += 1
            return True
        return False

    def expect_word(self, *words: str) -> Token:
        tok = self.peek()
        if not tok.is_word(*words):
            raise self.error("expected " + " or ".join(words))
        self.pos += 1
        return tok

    def accept_punct(self, char: str) -> bool:
        if self.peek().is_punct(char):
            self.pos += 1
            return True
        return False

    def expect_punct(self, char: str) -> Token:
        tok = self.peek()
        if not tok.is_punct(char):
            raise self.error(f"expected {char!r}")
        self.pos += 1
        return tok

    def expect_identifier(self, what: str = "identifier") -> str:
        tok = self.peek()
        if tok.kind not in (TokenKind.WORD, TokenKind.QUOTED):
            raise self.error(f"expected {what}")
        self.pos += 1
        return tok.value

    def expect_string(self, what: str = "string literal") -> str:
        tok = self.peek()
        if tok.kind is not TokenKind.STRING:
            raise self.error(f"expected {what}")
        self.pos += 1
        return tok.value

    def expect_int(self, what: str = "integer") -> int:
        tok = self.peek()
        if tok.kind is not TokenKind.NUMBER or len(tok.value) > 12:
            raise self.error(f"expected {what}")
        self.pos += 1
        return int(tok.value)

    def at_end(self) -> bool:
        """True at EOF, allowing trailing semicolons (consumed)."""
        while self.peek().is_punct(";"):
            self.pos += 1
        return self.peek().kind is TokenKind.EOF
