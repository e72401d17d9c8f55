"""Cheap checks that keep the docs from drifting away from the code.

* Every module is on a codemap: ARCHITECTURE.md's for hlc/, raft/, metastore/, spark_bridge/
  and bench/, the package docstring's for cli/ (ARCHITECTURE.md points there).
* Every wire error code (`metastore.errors.ErrorCode`) has a row in docs/protocol.md's error
  tables.
"""

from __future__ import annotations

import re
from pathlib import Path

import cli
from metastore.errors import ErrorCode

ROOT = Path(__file__).resolve().parents[2]
PACKAGES_ON_ARCHITECTURE_CODEMAP = ("hlc", "raft", "metastore", "spark_bridge", "bench")


def _architecture_codemap() -> str:
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    match = re.search(r"## Codemap\n+```\n(.*?)\n```", text, re.S)
    assert match, "ARCHITECTURE.md has no ## Codemap code block"
    return match.group(1)


def _codemap_paths(codemap: str) -> set[str]:
    """The module paths a codemap names: a line starting at column 0 with `dir/` (or
    `dir/file.py`) sets the directory the indented lines below it are relative to."""
    named: set[str] = set()
    directory = ""
    for line in codemap.splitlines():
        words = re.findall(r"(?<![\w/.])([\w/]+\.py)\b", line)
        if line and not line[0].isspace():
            head = line.split()[0]
            directory = head if head.endswith("/") else head.rsplit("/", 1)[0] + "/"
            named.update(word for word in words if "/" in word)  # full paths
            continue
        # An indented line names modules relative to the directory (a few share a line).
        named.update(word if "/" in word else directory + word for word in words)
    return named


def _modules(package: str) -> list[str]:
    return sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py" and "testdata" not in path.parts
    )


def test_every_module_is_on_the_architecture_codemap() -> None:
    named = _codemap_paths(_architecture_codemap())
    missing = [
        module
        for package in PACKAGES_ON_ARCHITECTURE_CODEMAP
        for module in _modules(package)
        if module not in named
    ]
    assert not missing, f"modules not on ARCHITECTURE.md's codemap: {missing}"


def test_every_cli_module_is_on_the_cli_codemap() -> None:
    doc = cli.__doc__ or ""
    codemap = doc.split("Codemap", 1)[-1].split("Invariant", 1)[0]
    named = set(re.findall(r"\b(\w+)\b", codemap))
    missing = [m for m in _modules("cli") if Path(m).stem not in named]
    assert not missing, f"cli modules not on cli/__init__.py's codemap: {missing}"


def test_every_error_code_is_in_the_protocol_doc() -> None:
    protocol = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    table = protocol.split("## Error codes", 1)[-1].split("\n## ", 1)[0]
    missing = [code.value for code in ErrorCode if f"| `{code.value}` |" not in table]
    assert not missing, f"error codes docs/protocol.md does not explain: {missing}"
