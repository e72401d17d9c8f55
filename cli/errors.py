"""Exit codes, and the one place that turns an error into `Error: <CODE>: <message>`.

Exit codes are chosen by the kind of failure, so scripts can branch without parsing text:

    0 success, 1 generic, 2 usage (bad flags, bad --as-of, bad config file),
    3 unavailable / not ready / timed out (retry later), 4 not found,
    5 refused change or invalid DDL, 6 not authenticated / forbidden.

Invariant: every `ErrorCode` has an exit code here (a test checks it), so a new wire code is a
deliberate decision rather than a silent "1".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final, NoReturn

import click

from metastore.errors import ErrorCode, MetastoreError

EXIT_OK: Final = 0
EXIT_GENERIC: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = 3
EXIT_NOT_FOUND: Final = 4
EXIT_REFUSED: Final = 5
EXIT_AUTH: Final = 6

EXIT_CODES_HELP: Final = (
    "Exit codes: 0 ok, 1 generic error, 2 usage or configuration error, "
    "3 unavailable / not ready / timed out, 4 not found, 5 refused change or invalid DDL, "
    "6 not authenticated or forbidden."
)

EXIT_CODE_BY_ERROR: Final[Mapping[ErrorCode, int]] = {
    ErrorCode.UNKNOWN: EXIT_GENERIC,
    ErrorCode.NAMESPACE_NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.NAMESPACE_ALREADY_EXISTS: EXIT_REFUSED,
    ErrorCode.NAMESPACE_NOT_EMPTY: EXIT_REFUSED,
    ErrorCode.TABLE_NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.TABLE_ALREADY_EXISTS: EXIT_REFUSED,
    ErrorCode.COLUMN_NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.COLUMN_ALREADY_EXISTS: EXIT_REFUSED,
    ErrorCode.INVALID_DDL: EXIT_REFUSED,
    ErrorCode.UNSUPPORTED_STATEMENT: EXIT_REFUSED,
    ErrorCode.UNSUPPORTED_SCHEMA_CHANGE: EXIT_REFUSED,
    ErrorCode.LIMIT_EXCEEDED: EXIT_REFUSED,
    ErrorCode.INVALID_ARGUMENT: EXIT_REFUSED,
    # Retryable: the cluster was busy; the same command may succeed a moment later.
    ErrorCode.STALE_TIMESTAMP: EXIT_UNAVAILABLE,
    ErrorCode.NOT_FOUND_AT_TIMESTAMP: EXIT_NOT_FOUND,
    ErrorCode.MALFORMED_COMMAND: EXIT_REFUSED,
    ErrorCode.MALFORMED_SNAPSHOT: EXIT_GENERIC,
    ErrorCode.CLUSTER_NOT_INITIALIZED: EXIT_UNAVAILABLE,
    ErrorCode.CLUSTER_ALREADY_INITIALIZED: EXIT_REFUSED,
    ErrorCode.REQUEST_ID_REUSED: EXIT_REFUSED,
    ErrorCode.UNAUTHENTICATED: EXIT_AUTH,
    ErrorCode.FORBIDDEN: EXIT_AUTH,
    ErrorCode.BAD_REQUEST: EXIT_GENERIC,
    ErrorCode.UNKNOWN_OP: EXIT_GENERIC,
    ErrorCode.NOT_READY: EXIT_UNAVAILABLE,
    ErrorCode.NOT_LEADER: EXIT_UNAVAILABLE,
    ErrorCode.TIMEOUT: EXIT_UNAVAILABLE,
    ErrorCode.UNAVAILABLE: EXIT_UNAVAILABLE,
    ErrorCode.INTERNAL: EXIT_GENERIC,
}


class CliError(Exception):
    """A failure of the CLI itself (a node already running, files in the way...)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        exit_code: int = EXIT_GENERIC,
        details: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code
        self.details: dict[str, object] = dict(details) if details else {}


def exit_code_for(error: MetastoreError) -> int:
    return EXIT_CODE_BY_ERROR.get(error.code, EXIT_GENERIC)


def fail(code: str, message: str, exit_code: int, details: Mapping[str, object] | None) -> NoReturn:
    """Print the error line (and the details, if any) on stderr and exit with `exit_code`."""
    click.echo(f"Error: {code}: {message}", err=True)
    shown = {k: v for k, v in (details or {}).items() if not _already_said(message, v)}
    if shown:
        click.echo(f"Details: {json.dumps(shown, sort_keys=True, default=str)}", err=True)
    raise click.exceptions.Exit(exit_code)


def _already_said(message: str, value: object) -> bool:
    # Skip details the message already spells out (the table name, the per-endpoint failures).
    if isinstance(value, Mapping):
        return all(f"{k}: {v}" in message for k, v in value.items())
    if isinstance(value, str | int) and not isinstance(value, bool):
        return str(value) in message
    return False
