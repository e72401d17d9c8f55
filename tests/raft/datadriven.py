"""A small runner for datadriven test files in the format of etcd's `datadriven` package.

A file is a sequence of test cases. Each case is a directive line (a command and its
arguments), optional input lines, a `----` separator and the expected output, ended by a blank
line::

    # comments and blank lines between cases are kept as they are
    propose 1 hello
    ----
    n1 proposed "hello" as 2/1

An expected output that itself contains blank lines is fenced by a doubled separator::

    status 1
    ----
    ----
    first paragraph

    second paragraph
    ----
    ----

Arguments are `key`, `key=value`, `key=(v1,v2,...)` or a bare group `(v1,v2)`. The handler
turns a `Directive` into its actual output; the runner compares it with the expected output and
stops at the first difference (later cases depend on the state earlier ones built). With
`rewrite=True` (pytest `--rewrite`) it instead writes every actual output back into the file,
leaving directives, inputs and comments untouched: review the diff, then commit it.

Invariant: parsing a file and rewriting it with its own expected outputs reproduces it byte for
byte (`test_scenarios.py` checks this on every scenario file).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SEPARATOR = "----"

# A token is a word, possibly `key=`, followed by one parenthesised group, or a plain word.
_TOKEN = re.compile(r"[^\s()]*\([^)]*\)|\S+")


class DatadrivenError(Exception):
    """The scenario file is malformed, or a handler failed on a directive (a test bug)."""

    code = "datadriven_error"


class ScenarioMismatch(AssertionError):
    """A directive produced different output than the file expects."""

    code = "datadriven_mismatch"


@dataclass(frozen=True, slots=True, kw_only=True)
class Arg:
    key: str
    vals: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Directive:
    pos: str  # "file.txt:LINE" of the directive, for messages
    cmd: str
    args: tuple[Arg, ...]
    input: str
    expected: str
    # Lines [out_start, out_end) of the file hold the expected output (fences included).
    out_start: int
    out_end: int

    def get(self, key: str) -> Arg | None:
        return next((a for a in self.args if a.key == key), None)

    def has(self, key: str) -> bool:
        return self.get(key) is not None

    def positional(self) -> list[str]:
        """Bare words, in order (keys without `=`, excluding parenthesised groups)."""
        return [a.key for a in self.args if not a.vals and not a.key.startswith("(")]

    def numbers(self) -> list[int]:
        """The bare words that are integers, in order (node ids, counts)."""
        return [int(w) for w in self.positional() if w.isdigit()]

    def groups(self) -> list[tuple[str, ...]]:
        """Bare parenthesised groups, in order: `partition (1,2) (3)`."""
        return [a.vals for a in self.args if a.key.startswith("(")]

    def int_pos(self, n: int, default: int | None = None) -> int:
        words = self.positional()
        if n < len(words):
            return self._to_int(words[n], f"argument {n + 1}")
        if default is None:
            raise DatadrivenError(f"{self.pos}: {self.cmd} needs argument {n + 1}")
        return default

    def int_arg(self, key: str, default: int) -> int:
        arg = self.get(key)
        if arg is None:
            return default
        if len(arg.vals) != 1:
            raise DatadrivenError(f"{self.pos}: {key}= takes one value")
        return self._to_int(arg.vals[0], key)

    def bool_arg(self, key: str, default: bool) -> bool:
        arg = self.get(key)
        if arg is None:
            return default
        if not arg.vals:
            return True  # a bare flag
        if arg.vals[0] not in ("true", "false"):
            raise DatadrivenError(f"{self.pos}: {key}= must be true or false")
        return arg.vals[0] == "true"

    def ints(self, key: str) -> tuple[int, ...] | None:
        arg = self.get(key)
        if arg is None:
            return None
        return tuple(self._to_int(v, key) for v in arg.vals)

    def _to_int(self, text: str, what: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise DatadrivenError(f"{self.pos}: {what} must be an integer, not {text!r}") from None


def parse_args(text: str) -> tuple[Arg, ...]:
    out = []
    for token in _TOKEN.findall(text):
        if token.startswith("("):
            out.append(Arg(key=token, vals=_split_group(token)))
            continue
        key, eq, value = token.partition("=")
        if not eq:
            out.append(Arg(key=key))
        elif value.startswith("(") and value.endswith(")"):
            out.append(Arg(key=key, vals=_split_group(value)))
        else:
            out.append(Arg(key=key, vals=(value,)))
    return tuple(out)


def _split_group(token: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in token[1:-1].split(",") if v.strip())


def parse(text: str, name: str) -> list[Directive]:
    lines = text.split("\n")
    cases: list[Directive] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            i += 1
            continue
        pos = f"{name}:{i + 1}"
        cmd, _, rest = line.strip().partition(" ")
        i += 1
        input_lines = []
        while i < n and lines[i] != SEPARATOR:
            if not lines[i].strip():
                raise DatadrivenError(f"{pos}: blank line before {SEPARATOR!r}")
            input_lines.append(lines[i])
            i += 1
        if i >= n:
            raise DatadrivenError(f"{pos}: directive without {SEPARATOR!r}")
        i += 1
        out_start = i
        if i < n and lines[i] == SEPARATOR:  # fenced output, may hold blank lines
            i += 1
            body_start = i
            while i + 1 < n and not (lines[i] == SEPARATOR and lines[i + 1] == SEPARATOR):
                i += 1
            if i + 1 >= n:
                raise DatadrivenError(f"{pos}: fenced output not closed by two {SEPARATOR!r}")
            expected = lines[body_start:i]
            i += 2
        else:
            while i < n and lines[i].strip():
                i += 1
            expected = lines[out_start:i]
        cases.append(
            Directive(
                pos=pos,
                cmd=cmd,
                args=parse_args(rest),
                input="\n".join(input_lines),
                expected="\n".join(expected),
                out_start=out_start,
                out_end=i,
            )
        )
    return cases


def _output_lines(output: str) -> list[str]:
    body = [line.rstrip() for line in output.strip("\n").split("\n")] if output.strip() else []
    if any(not line for line in body):
        return [SEPARATOR, *body, SEPARATOR, SEPARATOR]
    return body


def render(text: str, cases: list[Directive], outputs: list[str]) -> str:
    """The file `text` with each case's expected output replaced by `outputs`."""
    lines = text.split("\n")
    out: list[str] = []
    at = 0
    for case, output in zip(cases, outputs, strict=True):
        out.extend(lines[at : case.out_start])
        out.extend(_output_lines(output))
        at = case.out_end
    out.extend(lines[at:])
    return "\n".join(out)


def _normalise(output: str) -> str:
    return "\n".join(line.rstrip() for line in output.strip("\n").split("\n")).strip("\n")


def run_file(path: Path, handler: Callable[[Directive], str], *, rewrite: bool = False) -> None:
    """Run every directive of `path` through `handler`; compare, or rewrite the file."""
    text = path.read_text()
    cases = parse(text, path.name)
    if not cases:
        raise DatadrivenError(f"{path.name}: no test cases")
    outputs = []
    for case in cases:
        try:
            actual = handler(case)
        except DatadrivenError:
            raise
        except Exception as e:
            raise DatadrivenError(f"{case.pos}: {case.cmd} failed: {e!r}") from e
        if not rewrite and _normalise(actual) != _normalise(case.expected):
            diff = "\n".join(
                difflib.unified_diff(
                    _normalise(case.expected).split("\n"),
                    _normalise(actual).split("\n"),
                    "expected",
                    "actual",
                    lineterm="",
                )
            )
            raise ScenarioMismatch(
                f"{case.pos}: output of `{case.cmd}` differs (run pytest with --rewrite to "
                f"accept the new output, then review the diff):\n{diff}"
            )
        outputs.append(actual)
    if rewrite:
        new = render(text, cases, outputs)
        if new != text:
            path.write_text(new)
