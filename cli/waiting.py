"""Waiting for the leases in a schema change's way, shared by `metastore sql` and `metastore job`.

A change that would publish a table's next schema version while a running batch holds a lease
on the version before the current one is refused with SCHEMA_CHANGE_BLOCKED (the two-version
invariant, metastore.leases). The commands that make such changes (an ALTER, a job's cancel)
retry for up to `--wait` and show on stderr who is in the way, the same way everywhere.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Final, TypeVar

import click

from cli.leases import blocker_summary
from cli.output import end_progress, progress
from metastore.client import DDL_BLOCKED_RETRY_MS
from metastore.errors import ErrorCode, MetastoreError

T = TypeVar("T")

# How long a schema change waits for blocking leases unless --wait says otherwise.
WAIT_DEFAULT: Final = "5m"
_DURATION: Final = re.compile(r"([0-9]+)(ms|s|m|h)?")
_UNIT_MS: Final = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}
# The longest `--wait`/`--timeout` a command accepts: longer is a typo (99999999 is three
# years), not a plan; a script that must wait longer runs the command again.
WAIT_MAX: Final = "24h"
WAIT_MAX_MS: Final = 24 * 3_600_000


def parse_wait_ms(text: str) -> int:
    """'0', '90s', '5m', '1500ms', '1h' (a bare number is seconds) -> milliseconds, at most
    WAIT_MAX; anything else is a usage error (exit 2)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise click.BadParameter(f"{text!r} is not a duration like 30s, 5m, 1500ms or 0")
    digits, unit = match.group(1).lstrip("0") or "0", match.group(2) or "s"
    # The length is checked before int(): hundreds of digits are refused, not overflowed.
    ms = int(digits) * _UNIT_MS[unit] if len(digits) <= len(str(WAIT_MAX_MS)) else None
    if ms is None or ms > WAIT_MAX_MS:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise click.BadParameter(f"{shown!r} is longer than the longest wait, {WAIT_MAX}")
    return ms


class WaitDuration(click.ParamType[str]):
    """A `--wait`/`--timeout` option: checked by `parse_wait_ms` while click parses, so a bad
    value names its flag (`Invalid value for '--wait': ...`) before anything is sent; the
    command gets the text back and converts it with `parse_wait_ms`."""

    name = "DURATION"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        text = str(value)
        try:
            parse_wait_ms(text)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)
        return text


WAIT_DURATION: Final = WaitDuration()


def format_wait(ms: int) -> str:
    """A duration as `parse_wait_ms` reads it, for messages."""
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:g} s"


class BlockedProgress:
    """The `on_blocked` callback of a change waiting for leases: one progress line on stderr
    naming the blocking sessions (rewritten in place on a terminal; elsewhere a new line only
    when the set of blockers changes). Call `close()` when the wait is over."""

    def __init__(self, wait_ms: int, *, now_tm: Callable[[], int] | None = None) -> None:
        self.wait_ms = wait_ms
        self.started = time.monotonic()
        self.refusals = 0
        self._now_tm = now_tm
        self._last_shown = ""

    def __call__(self, error: MetastoreError) -> None:
        self.refusals += 1
        blockers = error.details.get("blockers")
        listed = blockers if isinstance(blockers, list) else []
        now = self._now_tm() if self._now_tm is not None else None
        who = "; ".join(blocker_summary(b, now) for b in listed if isinstance(b, dict))
        # What changes between refusals without news (how long each lease is held) does not
        # make a new line in a log.
        key = "; ".join(blocker_summary(b, None) for b in listed if isinstance(b, dict))
        progress(
            f"waiting {time.monotonic() - self.started:.0f}s of {self.wait_ms / 1000:.0f}s for "
            f"{len(listed)} lease(s) to drain: {who}",
            changed=key != self._last_shown,
        )
        self._last_shown = key

    def close(self) -> None:
        if self.refusals:
            end_progress()


def retry_while_blocked(
    call: Callable[[], T], *, wait_ms: int, on_blocked: Callable[[MetastoreError], None]
) -> T:
    """`call()`, retried while it is refused with SCHEMA_CHANGE_BLOCKED, for up to `wait_ms`
    (0: once), calling `on_blocked` with each refusal. A refusal changed nothing, so retrying
    it is safe; every other error is raised as is. (`SyncMetastoreClient.ddl` does the same for
    DDL statements.)"""
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        try:
            return call()
        except MetastoreError as exc:
            left_s = deadline - time.monotonic()
            if exc.code != ErrorCode.SCHEMA_CHANGE_BLOCKED or left_s <= 0:
                raise
            on_blocked(exc)
            time.sleep(min(DDL_BLOCKED_RETRY_MS / 1000, left_s))
