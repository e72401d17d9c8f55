"""Every `--help` names its values by what the usage line and the options show: a text saying
"TABLE's small files" above `Usage: ... NS.TABLE`, or "CONFIG/nodeN.toml" beside
`--config DIRECTORY`, leaves the reader guessing which value is meant.

An upper-case word in a command's help (outside `backticked` commands and example lines, which
may show another command's placeholders) is either a metavar of that command, its first part
(NS of NS.TABLE, but not TABLE alone), or a word listed below as not standing for a value
(acronyms, SQL keywords, error codes, environment variables, signals)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import click
import pytest

from cli.main import cli
from metastore.errors import ErrorCode
from tests.cli.test_cli import _isolated_cwd, run  # noqa: F401 - autouse fixture

NOT_PLACEHOLDERS = frozenset(
    {
        # acronyms and units
        *("CA", "CN", "DD", "GC", "HLC", "IP", "ISO", "JSON", "PEM", "PID", "PKI", "SHA"),
        *("SQL", "TLS", "TTL", "URL", "UTC", "UUID", "ID", "CLI", "DDL"),
        # SQL keywords (DDL statements quoted in the help)
        *("ADD", "ALTER", "AS", "COLUMN", "CREATE", "DEFAULT", "DROP", "NAMESPACE", "NOT"),
        *("NULL", "OF", "STRING"),
        # signals, emphasis
        *("SIGINT", "SIGKILL", "SIGTERM", "NEW"),
        # click's own metavars for typed options
        *("INTEGER", "RANGE", "TEXT", "OPTIONS", "FLOAT"),
        # node config keys named in the text (nodeN.toml), not values of this command
        "DATA_DIR",
        *(code.value for code in ErrorCode),
        # the CLI's own codes for what it checks before it starts nodes (cluster up)
        *("CONFIG_INVALID", "DATA_DIR_UNUSABLE", "PORT_IN_USE", "TLS_CONFIG_INVALID", "BUSY"),
    }
)
PLACEHOLDER = re.compile(r"(?<![\w.:-])[A-Z][A-Z_]*[A-Z](?:[.:][A-Z]+)?(?![\w-])")


def _commands(group: click.Group, prefix: list[str]) -> Iterator[list[str]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, [*prefix, name])
        else:
            yield [*prefix, name]


def _metavars(usage: str, options: list[str]) -> set[str]:
    """The metavars shown: of the usage line's arguments, and of each option line."""
    shown = set(re.findall(r"[A-Z][A-Z_.:,\[\]]*", usage.split("[OPTIONS]", 1)[-1]))
    for line in options:
        match = re.match(r"\s*(?:-\w, )?--[\w-]+(?: / --[\w-]+)? ([A-Z][\w.:,\[\]]*)", line)
        if match:
            shown.add(match.group(1))
    parts: set[str] = set()
    for metavar in shown:
        # The whole, and its first part (HOST of HOST:PORT, NS of NS[.TABLE]); not TABLE of
        # NS.TABLE alone, which reads as a name without its namespace.
        parts.add(metavar.strip("[].,"))
        parts.update(re.findall(r"^\[?([A-Z][A-Z_]*)", metavar))
    return parts


def _body(text: str) -> str:
    """The help without backticked commands, indented example lines, the TABLE of SQL
    statements (CREATE/DROP/ALTER TABLE) and environment variables (METASTORE_...)."""
    text = re.sub(r"`[^`]*`", "", text, flags=re.S)
    text = re.sub(r"\b(ALTER|CREATE|DROP) TABLE\b", r"\1", text)
    text = re.sub(r"\bMETASTORE_[A-Z_]+", "", text)
    return "\n".join(line for line in text.splitlines() if not line.startswith("    "))


@pytest.mark.parametrize("command", list(_commands(cli, [])), ids=" ".join)
def test_help_names_values_by_their_metavars(command: list[str]) -> None:
    help_text = run(*command, "--help").stdout
    usage, _, rest = help_text.partition("\n")
    description, _, options_text = rest.partition("\nOptions:\n")
    options = options_text.splitlines()
    metavars = _metavars(usage, options)
    option_helps = "\n".join(
        re.sub(r"^(?:-\w, )?--\S+(?: \S+)?", "", o.strip()).strip() for o in options
    )
    words = set(PLACEHOLDER.findall(_body(description) + "\n" + _body(option_helps)))
    unknown = sorted(w for w in words - NOT_PLACEHOLDERS if w not in metavars)
    assert unknown == [], f"{' '.join(command)} --help names {unknown}; shown: {sorted(metavars)}"
