"""Starting and stopping local node processes for `cluster up` / `cluster down`.

A node is started as `python -m cli.main node start --config <nodeN.toml>` in a new session
(so a Ctrl-C in the starting terminal does not reach it), with stdout and stderr appended to its
log file, and its PID written to a pid file in its data directory (a node whose pid file cannot
be written is stopped again at once: nothing else would find it). Stopping signals exactly that
PID: SIGINT, a bounded wait, then SIGKILL. Nothing is ever killed by name. SIGINT, not SIGTERM:
on SIGTERM a leader first hands leadership to another voter (a rolling restart), which cannot
succeed while every node stops and would wait out a whole election timeout
(metastore.daemon.node); on SIGINT it stops at once.

A pid file can outlive its process, and the PID can then be reused by an unrelated program. Before
treating a PID as our node we check that its command line (from /proc, or from `ps` where there
is none) is a `node start` of this cluster's config directory; otherwise (also when it cannot be
read: ours always can) the pid file is stale and is removed without signalling anyone. A PID we
may not signal (another user's process) is reported and skipped; the other nodes still stop.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cli.errors import EXIT_REFUSED, CliError, writing_file
from metastore.daemon.config import ClusterConfig, NodeAddress, node_file_name
from metastore.daemon.ports import port_in_use
from raft.node import IDENTITY_FILE
from raft.oserror import errno_text
from raft.wal import SYNC_FAILED_FILE

# How long `cluster down` waits after SIGINT before SIGKILL, and after SIGKILL before giving up.
STOP_GRACE_MS_DEFAULT: Final = 10_000
STOP_GRACE_MS_MAX: Final = 5 * 60 * 1000
KILL_WAIT_MS: Final = 3_000
POLL_INTERVAL_MS: Final = 50
# A pid file holds one decimal PID; anything longer is not ours.
PID_FILE_BYTES_MAX: Final = 32
LOG_TAIL_LINES: Final = 20
LOG_TAIL_BYTES_MAX: Final = 16 * 1024
# The WAL's lock file (raft.wal), empty: not state.
WAL_LOCK_FILE: Final = "LOCK"
# In the cluster's data_dir: held (flock) by the one `cluster up`/`down` running; it holds
# what runs, for the error of another.
LIFECYCLE_LOCK_FILE: Final = ".lifecycle.lock"
LIFECYCLE_LOCK_BYTES_MAX: Final = 256
# The words that identify our node processes in /proc/<pid>/cmdline.
_NODE_CMDLINE_MARKERS: Final = (b"cli.main", b"node", b"start")


@dataclass(frozen=True, slots=True, kw_only=True)
class StartedNode:
    node_id: int
    pid: int
    log_file: Path
    process: subprocess.Popen[bytes]


@dataclass(frozen=True, slots=True, kw_only=True)
class StopResult:
    node_id: int
    pid: int | None
    # stopped | killed | not running | stale pid file | still running | NOT_OURS |
    # PID_FILE_UNREADABLE: ...
    outcome: str


# The outcome (then ": why") for a pid file that exists but cannot be read: whether its node
# runs is unknown, so `cluster down` fails (exit 1) after stopping the others.
PID_FILE_UNREADABLE: Final = "pid file unreadable"
# The outcome for a PID the kernel does not let us signal: another user's process, so not a
# node `cluster up` started as us.
NOT_OURS: Final = "not ours (no permission to signal)"
# Where the command lines and working directories of processes are read (Linux); without it,
# `ps` is asked, for at most PS_TIMEOUT_S.
PROC_DIR: Final = Path("/proc")
PS_TIMEOUT_S: Final = 5.0


def node_command(
    config_dir: Path, cluster: ClusterConfig, node_id: int, *, bootstrap: bool = False
) -> list[str]:
    """The argv that runs node `node_id` in the foreground (`--bootstrap`: its first start).
    The config path is absolute, so the command line names the cluster on its own (see
    `looks_like_node`)."""
    node_file = config_dir.absolute() / node_file_name(node_id)
    extra = ["--bootstrap"] if bootstrap else []
    if node_file.exists():
        return [
            sys.executable,
            "-m",
            "cli.main",
            "node",
            "start",
            "--config",
            str(node_file),
            *extra,
        ]
    return [
        sys.executable,
        "-m",
        "cli.main",
        "node",
        "start",
        "--config",
        str(cluster.path),
        "--node-id",
        str(node_id),
        *extra,
    ]


def node_has_state(data_dir: Path) -> bool:
    """Whether a node's data directory holds anything of a member that ran: its identity
    (written at its first start, before it takes part in any election), or a log with any
    bytes in it (a log from before identities: the node adopts it). An interrupted or failed
    first start leaves neither (at most an empty segment and the log file, and SYNC_FAILED if
    its log could not sync: a marker, not a record)."""
    if (data_dir / IDENTITY_FILE).exists():
        return True
    wal = data_dir / "wal"
    try:
        files = list(wal.iterdir())
    except FileNotFoundError:
        return False
    not_records = (WAL_LOCK_FILE, SYNC_FAILED_FILE)
    return any(f.name not in not_records and f.is_file() and f.stat().st_size > 0 for f in files)


def log_held_by_a_process(data_dir: Path) -> bool:
    """Whether some process holds the node's write-ahead log (its flock on wal/LOCK): a node of
    this data directory runs, whether or not a pid file says so (`metastore node start` in a
    terminal or under a service manager writes none). The probe takes a shared lock and drops
    it at once; a node starting in that instant is refused (WAL_LOCKED), which only `cluster
    up` itself could be doing, and it holds the cluster's lifecycle lock."""
    try:
        fd = os.open(data_dir / "wal" / WAL_LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # no log yet (or none we may read): nothing can hold it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases a lock we got
    return False


def read_pid(pid_file: Path) -> int | None:
    """The PID in `pid_file`, or None if there is no (readable, well-formed) pid file."""
    try:
        text = pid_file.read_bytes()[: PID_FILE_BYTES_MAX + 1]
    except FileNotFoundError:
        return None
    stripped = text.strip()
    if len(text) > PID_FILE_BYTES_MAX or not stripped.isdigit():
        return None
    pid = int(stripped)
    return pid if pid > 0 else None


def is_alive(pid: int) -> bool:
    """Whether `pid` is a running process. An exited child not yet reaped (a zombie) is not
    running; it is left for its parent to reap, so this check has no side effects."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        stat_text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): kill(0) is all we know
    # The state follows the parenthesised command name, which may itself contain ')'.
    state = stat_text.rpartition(")")[2].split()[:1]
    return state != ["Z"]


def looks_like_node(pid: int, config_dir: Path, node_id: int | None = None) -> bool:
    """Whether `pid` runs `... cli.main node start --config FILE ...` with FILE in `config_dir`
    (as `cluster up` starts the nodes of the cluster configured there), and not a node of
    another cluster that got the PID of a stale pid file; with `node_id`, node `node_id`
    (FILE is its nodeN.toml, or `--node-id N` follows), not another node of this cluster that
    got the PID of that node's stale pid file. From /proc, or without it (macOS) from `ps`;
    False whenever it cannot be told (a /proc entry that cannot be read is gone, or another
    user's process hidden from us: never one of our nodes)."""
    if not PROC_DIR.joinpath("self").exists():
        return _ps_shows_node(pid, config_dir, node_id)
    try:
        cmdline = (PROC_DIR / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    args = [os.fsdecode(a) for a in cmdline.split(b"\0")]
    if not all(os.fsdecode(marker) in args for marker in _NODE_CMDLINE_MARKERS):
        return False
    config = _option(args, "--config")
    if config is None:
        return False
    try:
        # A relative --config is relative to the node's working directory, not ours.
        path = os.path.join(os.readlink(PROC_DIR / str(pid) / "cwd"), config)
    except OSError:
        return False  # its cmdline was readable, its cwd not: gone meanwhile, or not ours
    return _names_node(path, _option(args, "--node-id"), config_dir, node_id)


def _option(args: list[str], name: str) -> str | None:
    """The value of the last `name VALUE` or `name=VALUE` in `args`."""
    value: str | None = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(f"{name}="):
            value = arg.removeprefix(f"{name}=")
    return value


def _names_node(
    config: str, node_id_arg: str | None, config_dir: Path, node_id: int | None
) -> bool:
    """Whether a node's absolute --config and its --node-id (if any) are of `config_dir`'s
    cluster and, with `node_id`, of that node."""
    if os.path.realpath(os.path.dirname(config)) != os.path.realpath(config_dir):
        return False
    if node_id is None:
        return True
    if node_id_arg is not None:
        return node_id_arg == str(node_id)
    return os.path.basename(config) == node_file_name(node_id)


def _ps_shows_node(pid: int, config_dir: Path, node_id: int | None) -> bool:
    """`looks_like_node` without /proc: `ps` shows the arguments joined by spaces, so the
    markers are words of it and the config file runs from `--config ` to the next option
    `cluster up` passes (or the end). It must be absolute (as `node_command` passes it): a
    relative one cannot be placed without the process's working directory."""
    try:
        shown = subprocess.run(
            ["ps", "-ww", "-o", "args=", "-p", str(pid)],
            capture_output=True,
            timeout=PS_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    text = os.fsdecode(shown.stdout).strip()
    words = text.split()
    if shown.returncode != 0 or not all(os.fsdecode(m) in words for m in _NODE_CMDLINE_MARKERS):
        return False
    _, found, rest = text.partition(" --config ")
    config = re.split(r" --(?:node-id|bootstrap)\b", rest, maxsplit=1)[0]
    if not found or not os.path.isabs(config):
        return False
    node_id_arg = re.search(r" --node-id[ =](\d+)", text)
    return _names_node(config, node_id_arg and node_id_arg.group(1), config_dir, node_id)


def running_node_pid(pid_file: Path, config_dir: Path, node_id: int | None = None) -> int | None:
    """The PID recorded in `pid_file` if that process is alive and is a node of the cluster
    configured in `config_dir` (with `node_id`: that node, see `looks_like_node`)."""
    pid = read_pid(pid_file)
    if pid is None or not is_alive(pid) or not looks_like_node(pid, config_dir, node_id):
        return None
    return pid


@dataclass(frozen=True, slots=True, kw_only=True)
class TakenPort:
    node_id: int
    what: str  # "Raft" | "client" | "metrics"
    address: str


def taken_ports(nodes: list[NodeAddress]) -> list[TakenPort]:
    """The listeners of `nodes` another process already holds, tried as the node will bind them
    (every address the host resolves to, SO_REUSEADDR as asyncio sets it, so ports a stopped
    node left in TIME_WAIT count as free). A bind that fails otherwise (a host that does not
    resolve, or is not this machine's) is left to the node, which says so itself. A check, not
    a reservation: a port taken after it still stops that node (ADDRESS_IN_USE)."""
    taken: list[TakenPort] = []
    for node in nodes:
        for what, port, address in (
            ("Raft", node.raft_port, node.raft_address),
            ("client", node.client_port, node.client_address),
            ("metrics", node.metrics_port, node.metrics_address),
        ):
            if port_in_use(node.host, port):
                taken.append(TakenPort(node_id=node.id, what=what, address=address))
    return taken


def prepare_node_files(data_dir: Path, log_file: Path) -> None:
    """Make a node's data directory (0700) and open its log file for appending, as
    `start_node` does: run for every node before any starts, so a path that cannot be made or
    opened (OSError, naming it) stops `cluster up` before it started anything."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with log_file.open("ab"):
        pass


@contextlib.contextmanager
def lifecycle_lock(data_dir: Path, what: str) -> Iterator[None]:
    """Hold the cluster's lifecycle lock (`data_dir/LIFECYCLE_LOCK_FILE`, an flock the kernel
    drops when its process exits, however it exits) while `what` ("cluster up"/"cluster down")
    runs; CliError BUSY naming the holder if another process holds it (nothing is done)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LIFECYCLE_LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, LIFECYCLE_LOCK_BYTES_MAX, 0).decode(errors="replace").strip()
            raise CliError(
                "BUSY",
                f"{holder or 'another cluster up/down'} is running for this cluster (it holds "
                f"{path}): nothing was done; let it finish, or stop it, and run {what} again",
                exit_code=EXIT_REFUSED,
            ) from None
        with writing_file(path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{what} (pid {os.getpid()})\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def start_node(
    node_id: int, command: list[str], *, data_dir: Path, log_file: Path, pid_file: Path
) -> StartedNode:
    """Start one node in the background (see the module docstring) and record its PID."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    with log_file.open("ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    try:
        write_pid_file(pid_file, process.pid)
    except CliError as exc:
        # Without its pid file `cluster down` cannot find the node: left running, it would
        # hold its ports and data directory untracked. Stop the process this call started.
        message = f"{exc.message}; {_stop_untracked(node_id, process)}"
        raise CliError(exc.code, message, exit_code=exc.exit_code, details=exc.details) from None
    return StartedNode(node_id=node_id, pid=process.pid, log_file=log_file, process=process)


def _stop_untracked(node_id: int, process: subprocess.Popen[bytes]) -> str:
    """Stop `process` (a node just started, whose pid file could not be written) by its PID:
    STOP_SIGNAL, up to KILL_WAIT_MS, then SIGKILL. What happened, for the error."""
    pid = process.pid
    for sig in (STOP_SIGNAL, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        try:
            process.wait(timeout=KILL_WAIT_MS / 1000)
        except subprocess.TimeoutExpired:
            continue
        return f"node {node_id} (pid {pid}) was stopped again, as nothing would track it"
    return (
        f"node {node_id} (pid {pid}) was started but could not be stopped: stop it yourself "
        f"(kill {pid}); `cluster down` does not know it"
    )


def write_pid_file(pid_file: Path, pid: int) -> None:
    # Write-then-rename: a reader never sees a half-written PID.
    tmp = pid_file.with_name(f".{pid_file.name}.{os.getpid()}.tmp")
    with writing_file(pid_file, staged=tmp):
        tmp.write_text(f"{pid}\n")
        os.replace(tmp, pid_file)


# The whole cluster stops: a node's stop without a leadership hand-over (see the module
# docstring).
STOP_SIGNAL: Final = signal.SIGINT


def stop_nodes(pid_files: dict[int, Path], *, config_dir: Path, grace_ms: int) -> list[StopResult]:
    """Send STOP_SIGNAL to every live node of the cluster configured in `config_dir`, wait up
    to `grace_ms`, SIGKILL the rest; remove pid files."""
    results: dict[int, StopResult] = {}
    signalled: dict[int, int] = {}
    for node_id, pid_file in pid_files.items():
        try:
            pid = read_pid(pid_file)
        except OSError as exc:  # not "not running": we cannot tell; the other nodes still stop
            outcome = f"{PID_FILE_UNREADABLE}: {errno_text(exc)}"
            results[node_id] = StopResult(node_id=node_id, pid=None, outcome=outcome)
            continue
        if pid is None or not is_alive(pid):
            outcome = "not running"
        elif not looks_like_node(pid, config_dir, node_id):
            outcome = "stale pid file"
        else:
            try:
                os.kill(pid, STOP_SIGNAL)
            except ProcessLookupError:
                outcome = "not running"
            except PermissionError:
                outcome = NOT_OURS
            else:
                signalled[node_id] = pid
                continue
        results[node_id] = StopResult(node_id=node_id, pid=pid, outcome=outcome)
    remaining = _wait_gone(signalled, grace_ms)
    for node_id, pid in signalled.items():
        if node_id not in remaining:
            results[node_id] = StopResult(node_id=node_id, pid=pid, outcome="stopped")
    for pid in remaining.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    still = _wait_gone(remaining, KILL_WAIT_MS)
    for node_id, pid in remaining.items():
        outcome = "still running" if node_id in still else "killed"
        results[node_id] = StopResult(node_id=node_id, pid=pid, outcome=outcome)
    for node_id, pid_file in pid_files.items():
        outcome = results[node_id].outcome
        if outcome != "still running" and not outcome.startswith(PID_FILE_UNREADABLE):
            with contextlib.suppress(FileNotFoundError):
                pid_file.unlink()
    return [results[n] for n in sorted(results)]


def _wait_gone(pids: dict[int, int], wait_ms: int) -> dict[int, int]:
    """Poll until every PID has exited or `wait_ms` passed; return those still alive."""
    deadline = time.monotonic() + wait_ms / 1000
    alive = dict(pids)
    while alive:
        alive = {n: p for n, p in alive.items() if is_alive(p)}
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(POLL_INTERVAL_MS / 1000)
    return alive


def log_tail(log_file: Path) -> str:
    """The last lines of a node's log, to show why it did not start."""
    try:
        with log_file.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES_MAX))
            data = f.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:])
