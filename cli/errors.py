"""Exit codes, and the one place that turns an error into `Error: <CODE>: <message>`.

Exit codes are chosen by the kind of failure, so scripts can branch without parsing text:

    0 success, 1 generic, 2 usage (bad flags, bad --as-of, bad config file),
    3 unavailable / not ready / timed out (retry later), 4 not found,
    5 refused change or invalid DDL, 6 not authenticated / forbidden.

Invariant: every `ErrorCode` has an exit code here (a test checks it), so a new wire code is a
deliberate decision rather than a silent "1".
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final, NoReturn

import click

from metastore.errors import ErrorCode, MetastoreError
from metastore.limits import MAX_CLOCK_SKEW_MS, REQUEST_ID_RETENTION_MS
from raft.oserror import errno_text

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

# Keyed by the wire string rather than the enum member, so a code this build does not know yet
# (from a newer node, or one being added) can be mapped without breaking the import.
EXIT_CODE_BY_ERROR: Final[Mapping[str, int]] = {
    "UNKNOWN": EXIT_GENERIC,
    "NAMESPACE_NOT_FOUND": EXIT_NOT_FOUND,
    "NAMESPACE_ALREADY_EXISTS": EXIT_REFUSED,
    "NAMESPACE_NOT_EMPTY": EXIT_REFUSED,
    "TABLE_NOT_FOUND": EXIT_NOT_FOUND,
    "TABLE_ALREADY_EXISTS": EXIT_REFUSED,
    "COLUMN_NOT_FOUND": EXIT_NOT_FOUND,
    "COLUMN_ALREADY_EXISTS": EXIT_REFUSED,
    "INVALID_DDL": EXIT_REFUSED,
    "UNSUPPORTED_STATEMENT": EXIT_REFUSED,
    "UNSUPPORTED_SCHEMA_CHANGE": EXIT_REFUSED,
    "LIMIT_EXCEEDED": EXIT_REFUSED,
    "INVALID_ARGUMENT": EXIT_REFUSED,
    # Retryable: the cluster was busy; the same command may succeed a moment later.
    "STALE_TIMESTAMP": EXIT_UNAVAILABLE,
    "NOT_FOUND_AT_TIMESTAMP": EXIT_NOT_FOUND,
    "MALFORMED_COMMAND": EXIT_REFUSED,
    "MALFORMED_SNAPSHOT": EXIT_GENERIC,
    "CLUSTER_NOT_INITIALIZED": EXIT_UNAVAILABLE,
    "CLUSTER_ALREADY_INITIALIZED": EXIT_REFUSED,
    "REQUEST_ID_REUSED": EXIT_REFUSED,
    # Transaction log: the commit was refused as it stands (contention or a conflict); the
    # message says how to retry.
    "COMMIT_TIMESTAMP_UNAVAILABLE": EXIT_REFUSED,
    "READ_CONFLICT": EXIT_REFUSED,
    "SCHEMA_VERSION_NOT_ACTIVE": EXIT_REFUSED,
    "TXN_ID_REUSED": EXIT_REFUSED,
    "DATA_FILE_CONFLICT": EXIT_REFUSED,
    "BATCH_ALREADY_COMMITTED": EXIT_REFUSED,
    "SESSION_NOT_FOUND": EXIT_NOT_FOUND,
    "LEASE_VERSION_NOT_LATEST": EXIT_REFUSED,
    "SCHEMA_CHANGE_BLOCKED": EXIT_REFUSED,
    "BEFORE_GC_THRESHOLD": EXIT_NOT_FOUND,  # the data of that time may already be deleted
    "PROTECTION_NOT_FOUND": EXIT_NOT_FOUND,
    "SCHEMA_JOB_NOT_FOUND": EXIT_NOT_FOUND,
    "SCHEMA_JOB_CONFLICT": EXIT_REFUSED,  # wait for the job or cancel it
    "SCHEMA_JOB_STATE": EXIT_REFUSED,
    "BACKFILL_INCOMPLETE": EXIT_REFUSED,  # run the backfill again
    "WATCH_START_COMPACTED": EXIT_NOT_FOUND,  # the events asked for are no longer kept
    "MANIFEST_CONFLICT": EXIT_REFUSED,  # the table kept changing: compact again
    "MANIFEST_UNREADABLE": EXIT_GENERIC,  # a manifest file was changed outside the metastore
    "UNAUTHENTICATED": EXIT_AUTH,
    "FORBIDDEN": EXIT_AUTH,
    "BAD_REQUEST": EXIT_GENERIC,
    "UNKNOWN_OP": EXIT_GENERIC,
    "NOT_READY": EXIT_UNAVAILABLE,
    "NOT_LEADER": EXIT_UNAVAILABLE,
    "TIMEOUT": EXIT_UNAVAILABLE,
    "UNAVAILABLE": EXIT_UNAVAILABLE,
    "INTERNAL": EXIT_GENERIC,
    # Retryable within a clock skew; further ahead than any cluster's CSmax: refused (5).
    "TIMESTAMP_AHEAD_OF_CLOCK": EXIT_UNAVAILABLE,
    # The client and the node do not agree on TLS (or on whom to trust): not authenticated.
    "TLS_REQUIRED": EXIT_AUTH,
    "TLS_FAILED": EXIT_AUTH,
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


# The --request-id option of the commands that send one (`sql`, `ns create|drop`,
# `cluster revoke-cert`), and what to do when such a command's outcome is unknown.
REQUEST_ID_HELP: Final = (
    "Idempotency key: the cluster applies a request id once (it remembers one for up to "
    f"{REQUEST_ID_RETENTION_MS // 60_000} minutes), so running the same command again with "
    "the same id after an unknown outcome is safe: it answers the first attempt's result "
    "(deduplicated) or applies it now. Default: a new random id, printed in the error when "
    "the outcome is unknown."
)


@contextlib.contextmanager
def settle_unknown_outcome(flag: str = "--request-id", key: str = "request_id") -> Iterator[None]:
    """A write's error whose outcome is unknown (`details.outcome_unknown`) says, in the CLI's
    terms, how to settle it: the same command again with `flag` and the key the library sent
    (`details[key]`), in place of the library's "retry with the same request_id ...". Errors
    of a write that was not applied, or whose outcome is known, pass unchanged."""
    try:
        yield
    except MetastoreError as exc:
        value = exc.details.get(key)
        if exc.details.get("outcome_unknown") is True and isinstance(value, str) and value:
            cut = exc.message.find(f"retry with the same {key} ")
            said = exc.message[:cut].rstrip("; ") if cut >= 0 else exc.message
            exc.message = (
                f"{said}; to settle it, run the same command again with {flag} "
                f"{shlex.quote(value)} and nothing else changed (the cluster remembers a request "
                f"id for up to {REQUEST_ID_RETENTION_MS // 60_000} minutes): if the first "
                "attempt was applied, that answers its result (deduplicated: true); if not, it "
                "is applied now"
            )
            exc.args = (exc.message,)
        raise


def exit_code_for(error: MetastoreError) -> int:
    code = error.details.get("original_code") if error.code is ErrorCode.UNKNOWN else None
    if error.code is ErrorCode.TIMESTAMP_AHEAD_OF_CLOCK:
        # Retry later only while the time is within a clock skew a cluster may have; a time
        # further ahead (a typo, a year off) stays refused for that long.
        ahead_ms = error.details.get("ahead_ms")
        if isinstance(ahead_ms, int) and ahead_ms > MAX_CLOCK_SKEW_MS:
            return EXIT_REFUSED
    return EXIT_CODE_BY_ERROR.get(str(code or error.code.value), EXIT_GENERIC)


@contextlib.contextmanager
def writing_file(path: Path, *, staged: Path | None = None) -> Iterator[None]:
    """Writes of `path` (through `staged`, a temporary file renamed onto it, if given): an
    OSError is a CliError IO_ERROR naming `path` and the errno. A write or close that fails
    (ENOSPC, EIO) names no file, and the staged file's name would mislead; the staged file
    is removed."""
    try:
        yield
    except OSError as exc:
        if staged is not None:
            with contextlib.suppress(OSError):
                staged.unlink(missing_ok=True)
        raise CliError("IO_ERROR", f"cannot write {path}: {errno_text(exc)}") from None


def fail(code: str, message: str, exit_code: int, details: Mapping[str, object] | None) -> NoReturn:
    """Print the error line (and the details, if any) on stderr and exit with `exit_code`.
    With `-o json` the line after it is one JSON document, `{"error": {"code", "message",
    "exit_code", "details"}}`, in place of the `Details:` line: a script reads the error as it
    reads a result. Stdout stays empty (nothing there to take for a result)."""
    click.echo(f"Error: {code}: {message}", err=True)
    if _json_requested(click.get_current_context(silent=True)):
        _echo_json_error(code, message, exit_code, details)
    else:
        shown = {k: v for k, v in (details or {}).items() if not _already_said(message, v)}
        if shown:
            click.echo(f"Details: {json.dumps(shown, sort_keys=True, default=str)}", err=True)
    raise click.exceptions.Exit(exit_code)


def _json_requested(ctx: click.Context | None) -> bool:
    """Whether the command runs with `-o json` (the global options' object, which every
    context of the command shares, says; before the root options are parsed there is none)."""
    while ctx is not None:
        if getattr(ctx.obj, "output", None) == "json":
            return True
        ctx = ctx.parent
    return False


def _echo_json_error(
    code: str, message: str, exit_code: int, details: Mapping[str, object] | None
) -> None:
    error = {"code": code, "message": message, "exit_code": exit_code, "details": details or {}}
    click.echo(json.dumps({"error": error}, sort_keys=True, default=str), err=True)


def fail_usage(error: click.UsageError, *, as_json: bool = False) -> NoReturn:
    """A usage error (a bad flag or argument, as click finds it) in the same form as every other
    error: `Error: USAGE: <what click says>` first, so a script reads one shape of first line
    (with `-o json`, then its JSON document, as `fail` prints it; `as_json`: the caller found
    -o json in arguments not parsed yet); then the command's usage and the pointer to its
    --help, as click prints them."""
    click.echo(f"Error: USAGE: {error.format_message()}", err=True)
    if as_json or _json_requested(error.ctx):
        _echo_json_error("USAGE", error.format_message(), error.exit_code, None)
    ctx = error.ctx
    if ctx is not None:
        click.echo(ctx.get_usage(), err=True)
        click.echo(f"Try '{ctx.command_path} --help' for help.", err=True)
    raise click.exceptions.Exit(error.exit_code)


def _already_said(message: str, value: object) -> bool:
    # Skip details the message already spells out (the table name, the per-endpoint failures).
    if isinstance(value, Mapping):
        return all(f"{k}: {v}" in message for k, v in value.items())
    if isinstance(value, str | int) and not isinstance(value, bool):
        return str(value) in message
    return False
