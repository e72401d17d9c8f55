"""The driver's keeper of `format("metastore")` append sessions: heartbeats from the planning of
an append to its commit or abort, stages without any of its tasks included.

Why a process of its own is needed: an append's session is opened when the write is planned
(spark_bridge.datasource `writer()`) and its files go to that session's attempt directory. Its
tasks heartbeat it while they run, but the stages before the write (a shuffle, a slow join) run
none of them, so a stage longer than the session's TTL let it expire: the first write task then
failed (SessionNotFoundError) and the job's work was lost. Spark calls the data source's
driver-side steps in short-lived Python worker processes (PySpark 4: `writer()` in a planner
worker that is killed about a minute after it goes idle, `commit()`/`abort()` in another), so no
thread started there outlives the planning for long, and none can be stopped by the commit. The
application's Python process, where `register()` runs, lives as long as its jobs: `register()`
starts one `SessionKeeper` there (per cluster and token; a daemon thread) and hands its
directory to the workers as a class attribute of the registered data source.

The handshake is a file per append in that directory (private: 0700, made by `mkdtemp`):
`writer()` writes `<session id>.keep` (`keep`) right after opening the session; the keeper
notices it within KEEP_POLL_MS and heartbeats the session then and every third of its TTL (as
the tasks do); `commit()` and `abort()` remove the file (`unkeep`) before closing the session,
and the keeper forgets it. A killed driver takes its keeper with it: nothing heartbeats its
appends' sessions, which expire after their TTL, as before.

An append Spark never commits nor aborts is kept for its `keep_max_ms` at most (the append's
option; default 24 h, spark_bridge.datasource APPEND_KEEP_MS_DEFAULT), then let go: the keeper
gives it up (an `.ended` note saying why, as below) and closes its session, so GC may clear its
attempt directory. Without that bound it was kept until the application ended: in a driver that
runs for weeks (a streaming application), every such append held a session (counted against
the cluster's MAX_SESSIONS) and kept its files from GC all that time. Such appends are those
whose commit or abort worker died before it removed the file (killed, out of memory), or whose
query failed between the planning and the write (a planning that fails in `writer()` itself
releases its session there). Nothing is committed for them either way. A stage before the
write longer than `keep_max_ms` loses the keeper's heartbeats: the job then fails at its write
with SessionNotFoundError quoting the reason (raise the option for such jobs). `.ended` notes
nobody removed (their append never ended) are tidied after ENDED_NOTE_KEEP_S.

When keeping fails for good, the keeper stops heartbeating that session and renames its file to
`<session id>.ended`, holding the reason: the metastore said the session ended
(SESSION_NOT_FOUND: it expired, e.g. the driver's process stalled or the cluster answered none
of its heartbeats for a whole TTL), or no heartbeat got through for a whole TTL (the session
expired then unless the tasks' own heartbeats kept it). The job's next task then fails at its
start, or its commit is refused, with SessionNotFoundError; the commit's error quotes the
reason (`unkeep`). Other failures are logged and retried every interval.

The directory also carries commit positions back: `commit()` runs in a worker process, so the
driver's clients would not know the append's commit timestamp and a bridge batch right after it
could read below it (metastore.client.floors). After a commit, `commit()` writes
`<session id>.floor` (`note_commit`: the cluster id and the client's own-writes position) before
it returns to Spark; the keeper is a floor source of its process (`floor_notes`), so the next
lookup of that cluster's floors by any client of the driver takes it in (and the keeper's own
polls tidy what no client asked for).

Where the keeper's directory is not reachable from the planner (Spark Connect: the planner runs
on the server's host), `writer()` logs a warning and the append runs as before: kept by its
tasks and its commit only.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from metastore.client.floors import (
    FloorNote,
    add_floor_source,
    remove_floor_source,
    shared_floors,
)
from metastore.errors import ErrorCode, MetastoreError

log = logging.getLogger(__name__)

# How often the keeper looks for appends planned since (a listing of a small local directory):
# the first heartbeat of a new append's session comes within this, well inside the smallest TTL
# the metastore accepts (metastore.limits SESSION_TTL_MS_MIN, 500 ms).
KEEP_POLL_MS: Final = 200
# How long `stop()` waits for the thread: a heartbeat on the wire may take the client's whole
# budget (a cluster that does not answer), and an exiting interpreter should not wait that
# long for a daemon thread whose sessions then expire on their own.
KEEPER_STOP_WAIT_S: Final = 5.0
KEEP_SUFFIX: Final = ".keep"
ENDED_SUFFIX: Final = ".ended"
FLOOR_SUFFIX: Final = ".floor"
# A note in an `.ended` file longer than this is cut (it is quoted in an error message).
ENDED_NOTE_CHARS_MAX: Final = 2_000
# How long an `.ended` note stays for the commit or abort that removes it: one that came to
# neither (an append Spark never ended) is removed then, so notes do not pile up in a driver
# that runs for weeks.
ENDED_NOTE_KEEP_S: Final = 24 * 3_600.0
# How long a session is kept when its `.keep` file does not say (one of an earlier release).
KEEP_MAX_MS_DEFAULT: Final = 24 * 3_600_000


def keep(
    directory: Path,
    session_id: str,
    *,
    ttl_ms: int,
    table: str,
    keep_max_ms: int = KEEP_MAX_MS_DEFAULT,
) -> None:
    """Ask the keeper of `directory` to heartbeat `session_id` (TTL `ttl_ms`) until `unkeep`,
    for `keep_max_ms` at most (then it closes the session). Raises OSError when the directory
    cannot be written (not on this host, or gone)."""
    data = json.dumps(
        {
            "session_id": session_id,
            "ttl_ms": int(ttl_ms),
            "table": table,
            "keep_max_ms": int(keep_max_ms),
        }
    )
    path = directory / f"{session_id}{KEEP_SUFFIX}"
    # Written whole, then renamed into place: the keeper never reads half a file.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{session_id}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def note_commit(directory: Path, session_id: str, *, cluster_id: str, ts: int) -> None:
    """Leave the position `ts` a commit of `session_id`'s append reached in `cluster_id` for the
    driver's clients (module docstring). Raises OSError when the directory cannot be written."""
    data = json.dumps({"cluster_id": cluster_id, "own_writes_ts": int(ts)})
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{session_id}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.replace(tmp, directory / f"{session_id}{FLOOR_SUFFIX}")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ended_note(directory: Path, session_id: str) -> str | None:
    """Why the keeper of `directory` stopped keeping `session_id`, if it did."""
    try:
        return (directory / f"{session_id}{ENDED_SUFFIX}").read_text()[:ENDED_NOTE_CHARS_MAX]
    except OSError:
        return None


def unkeep(directory: Path, session_id: str) -> None:
    """Stop keeping `session_id` (its append committed or aborted). Never raises: a file left
    behind only keeps the session alive until the application ends."""
    for suffix in (KEEP_SUFFIX, ENDED_SUFFIX):
        try:
            (directory / f"{session_id}{suffix}").unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot stop keeping metastore session %s: %s", session_id, exc)


@dataclass(slots=True, kw_only=True)
class _Kept:
    session_id: str
    ttl_ms: int
    interval_s: float
    due: float  # monotonic s: the next heartbeat
    last_ok: float  # monotonic s: the last heartbeat that got through (or when first seen)
    until: float  # monotonic s: let go then, if its append has not ended (`keep_max_ms`)
    keep_max_ms: int


class SessionKeeper:
    """One daemon thread heartbeating the sessions named by `.keep` files in `directory` (see
    the module docstring). `client_factory` makes the metastore client it heartbeats with: made
    when there is a session to keep, closed when there is none."""

    def __init__(
        self,
        client_factory: Callable[[], Any],
        *,
        poll_ms: int = KEEP_POLL_MS,
        name: str = "metastore-append-sessions",
    ) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="metastore-keep-"))  # 0700
        self._client_factory = client_factory
        self._client: Any = None
        self._poll_s = poll_ms / 1000
        self._kept: dict[str, _Kept] = {}
        self._lock = threading.Lock()  # `_kept`, read by `kept()` from other threads
        self._stop = threading.Event()
        self.heartbeats = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        add_floor_source(self.floor_notes)
        atexit.register(self.stop)

    def kept(self) -> list[str]:
        """The ids of the sessions being kept."""
        with self._lock:
            return sorted(self._kept)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop the thread (idempotent) and remove the directory: appends still running are kept
        by their tasks and commit only from now on."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=KEEPER_STOP_WAIT_S)
        remove_floor_source(self.floor_notes)
        shutil.rmtree(self.directory, ignore_errors=True)
        atexit.unregister(self.stop)

    def floor_notes(self) -> list[FloorNote]:
        """The commit positions appends' `commit()` left here (`note_commit`), each handed over
        once (its file removed); a floor source of metastore.client.floors. Never raises."""
        try:
            names = [n for n in os.listdir(self.directory) if n.endswith(FLOOR_SUFFIX)]
        except OSError:
            return []
        notes: list[FloorNote] = []
        for name in names:
            path = self.directory / name
            try:
                data = json.loads(path.read_text())
                path.unlink()
            except FileNotFoundError:
                continue  # handed over by another thread meanwhile
            except (OSError, ValueError) as exc:
                log.warning("cannot read the commit position %s: %s", path, exc)
                path.unlink(missing_ok=True)
                continue
            cluster_id, ts = data.get("cluster_id"), data.get("own_writes_ts")
            if isinstance(cluster_id, str) and cluster_id and type(ts) is int and ts > 0:
                notes.append((cluster_id, "own_writes", ts))
        return notes

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._wait_s()):
                try:
                    self._round()
                except Exception:  # a daemon thread must not die on a surprise
                    log.exception("keeping format('metastore') append sessions failed")
        finally:
            self._drop_client()

    def _wait_s(self) -> float:
        with self._lock:
            due = min((k.due for k in self._kept.values()), default=None)
        if due is None:
            return self._poll_s
        return max(0.0, min(self._poll_s, due - time.monotonic()))

    def _round(self) -> None:
        for cluster_id, kind, ts in self.floor_notes():  # those no client asked for yet
            shared_floors(cluster_id).raise_to(kind, ts)
        listed = self._listed()
        now = time.monotonic()
        with self._lock:
            for session_id in [s for s in self._kept if s not in listed]:
                del self._kept[session_id]  # committed or aborted: `unkeep` removed its file
            new = [s for s in listed if s not in self._kept]
        for session_id in new:
            wanted = self._wanted(session_id)
            if wanted is None:
                continue
            ttl_ms, keep_max_ms = wanted
            kept = _Kept(
                session_id=session_id,
                ttl_ms=ttl_ms,
                interval_s=max(1, ttl_ms // 3) / 1000,  # as the tasks beat (datasource)
                due=now,  # at once: the session was opened a poll ago at most
                last_ok=now,
                until=now + keep_max_ms / 1000,
                keep_max_ms=keep_max_ms,
            )
            with self._lock:
                self._kept[session_id] = kept
        with self._lock:
            overdue = [k for k in self._kept.values() if k.until <= now]
        for kept in overdue:
            self._let_go(kept)
        with self._lock:
            due = [k for k in self._kept.values() if k.due <= now]
        for kept in due:
            if self._stop.is_set():
                return
            self._beat(kept)
        self._tidy_notes()
        with self._lock:
            idle = not self._kept
        if idle:
            self._drop_client()

    def _listed(self) -> set[str]:
        try:
            names = os.listdir(self.directory)
        except OSError as exc:
            if self._stop.is_set():
                return set()
            # Removed under us (a temporary-files cleaner): made again, so later appends are
            # kept; the ones whose files went with it are kept by their tasks only. Logged once
            # per removal, not at every poll.
            try:
                self.directory.mkdir(mode=0o700)
            except OSError:
                return set()
            log.warning(
                "the session keeper's directory %s was gone (%s): made again", self.directory, exc
            )
            return set()
        return {n[: -len(KEEP_SUFFIX)] for n in names if n.endswith(KEEP_SUFFIX)}

    def _wanted(self, session_id: str) -> tuple[int, int] | None:
        """(TTL, keep_max_ms) of a newly kept session; None when not to be kept."""
        try:
            data = json.loads((self.directory / f"{session_id}{KEEP_SUFFIX}").read_text())
            return int(data["ttl_ms"]), int(data.get("keep_max_ms") or KEEP_MAX_MS_DEFAULT)
        except FileNotFoundError:
            return None  # unkept meanwhile
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._give_up(session_id, f"the keeper cannot read what to keep: {exc}")
            return None

    def _beat(self, kept: _Kept) -> None:
        now = time.monotonic()
        try:
            if self._client is None:
                self._client = self._client_factory()
            self._client.session_heartbeat(kept.session_id)
        except MetastoreError as exc:
            if exc.code == ErrorCode.SESSION_NOT_FOUND:
                self._give_up(kept.session_id, f"the metastore says the session ended: {exc}")
                return
            self._failed(kept, now, exc)
            return
        except (OSError, ValueError) as exc:  # e.g. TLS files unreadable
            self._failed(kept, now, exc)
            return
        self.heartbeats += 1
        kept.last_ok = now
        kept.due = now + kept.interval_s

    def _failed(self, kept: _Kept, now: float, exc: Exception) -> None:
        kept.due = now + kept.interval_s
        if now - kept.last_ok >= kept.ttl_ms / 1000:
            self._give_up(
                kept.session_id,
                f"no heartbeat of the driver's keeper got through for {kept.ttl_ms} ms (the "
                f"session's TTL; the last error: {exc})",
            )
            return
        log.warning("heartbeat of metastore session %s failed (retried): %s", kept.session_id, exc)

    def _let_go(self, kept: _Kept) -> None:
        """Stop keeping an append that neither committed nor aborted within its keep_max_ms,
        and close its session (module docstring). Closing is best effort: a session not closed
        expires after its TTL without heartbeats."""
        self._give_up(
            kept.session_id,
            f"its append neither committed nor aborted within {kept.keep_max_ms} ms of its "
            "planning (keep_max_ms: Spark never ended it, or a stage before its write ran "
            "longer), so the driver's keeper let it go and closed its session",
        )
        try:
            if self._client is None:
                self._client = self._client_factory()
            self._client.session_close(kept.session_id)
        except (MetastoreError, OSError, ValueError) as exc:
            log.warning("closing session %s failed (it expires): %s", kept.session_id, exc)

    def _tidy_notes(self) -> None:
        """Remove `.ended` notes older than ENDED_NOTE_KEEP_S (their append never ended)."""
        cutoff = time.time() - ENDED_NOTE_KEEP_S
        try:
            names = [n for n in os.listdir(self.directory) if n.endswith(ENDED_SUFFIX)]
        except OSError:
            return
        for name in names:
            path = self.directory / name
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
            except OSError:
                continue  # removed meanwhile by its commit or abort

    def _give_up(self, session_id: str, reason: str) -> None:
        """Stop keeping `session_id`, leaving `reason` for its commit's error (`ended_note`)."""
        with self._lock:
            self._kept.pop(session_id, None)
        keep_path = self.directory / f"{session_id}{KEEP_SUFFIX}"
        ended_path = self.directory / f"{session_id}{ENDED_SUFFIX}"
        try:
            ended_path.write_text(reason[:ENDED_NOTE_CHARS_MAX])
            # The `.keep` file goes last: it may be gone (the append committed or aborted
            # meanwhile, which is why the session ended), and then the note must go too.
            keep_path.unlink()
        except FileNotFoundError:
            ended_path.unlink(missing_ok=True)
            return
        except OSError as exc:
            log.warning("cannot record why session %s is no longer kept: %s", session_id, exc)
        log.warning("stopped keeping metastore session %s: %s", session_id, reason)

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing only frees sockets
                log.exception("closing the session keeper's client failed")
