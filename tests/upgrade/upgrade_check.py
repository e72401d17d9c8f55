"""A rolling upgrade from a real older release to this tree: `make upgrade-check FROM=<rev>`.

The unit tests simulate a newer release in-process (this code, told it supports one apply version
more: tests/daemon/test_apply_version_members.py). This check runs two real releases instead:

1. `git archive FROM` into a temporary directory (FROM missing, e.g. in a shallow clone: exit 2
   with what to fetch);
2. the OLD tree's `metastore cluster init` writes the cluster's files, and three OLD nodes run
   (`python -m cli.main node start`, working directory and PYTHONPATH at the old tree; both
   releases use this .venv's packages);
3. namespaces, tables, DDL (ADD, RENAME, widening, TBLPROPERTIES, DROP + CREATE again, a
   DROP COLUMN job) and commits (atomic over two tables, removals, an overwrite);
4. each node in turn is stopped by PID (SIGTERM: a leader hands over) and started with the NEW
   code on the same data directory and config; after each step a DDL and a commit go through
   every node (so through old and new, leader and followers), with input apply version 9
   refuses (`_refused_from_9`: an older leader proposes it), and leadership is moved once to
   a new node while old ones follow;
   the first node upgraded goes back to the old release once and is upgraded again (a
   rollback before finalizing: the old release reads what the new one wrote);
5. `cluster version --finalize` (the client's `finalize_apply_version`), then the same checks;
6. every node stopped and started again on the new code, then the same checks.

Each check reads, on every node separately, the namespaces, tables, `schema_at`, `describe` and
`files` AS OF sampled timestamps of everything done so far, and each table's `history` and the
transaction log once every node's safe time passed the newest write; the answers must be equal
(node-local fields such as `safe_time` or `waited_ms` left out). Every call goes through this
tree's client library (metastore.client), so the check also shows whether the new client works
against old nodes. A table of the steps is printed; exit 1 on any divergence or failed write.

Processes are stopped by PID only, every listener is on 127.0.0.1, every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metastore.apply_version import APPLY_VERSION_SUPPORTED
from metastore.client.manifest_files import compact_table
from metastore.client.protocol import SyncMetastoreClient
from metastore.commands import ReleaseProtection, encode_command
from metastore.errors import (
    ForbiddenError,
    InvalidArgumentError,
    MetastoreError,
    NotLeaderError,
    TxnIdReusedError,
    WatchStartCompactedError,
)
from raft.tls import ClientTls
from tests.ports import free_ports

NEW_TREE = Path(__file__).resolve().parents[2]
NODE_IDS = (1, 2, 3)
# Either release's CLI, run with the working directory and PYTHONPATH at its tree.
_CLI = (sys.executable, "-m", "cli.main")
# Exit codes: every step agreed; a divergence or a failed step; FROM is not usable.
EXIT_OK, EXIT_DIVERGED, EXIT_NO_REVISION = 0, 1, 2
# Bounds of every wait.
READY_WAIT_S = 60.0
STOP_WAIT_S = 20.0
KILL_WAIT_S = 5.0
JOBS_WAIT_S = 60.0
SAFE_TIME_WAIT_S = 30.0
GIT_TIMEOUT_S = 60.0
CALL_TIMEOUT_MS = 20_000
POLL_S = 0.1
# How many of the recorded timestamps each check reads at (the newest few always).
SAMPLED_TS_MAX = 14
NEWEST_TS_ALWAYS = 4
# Result fields that say where, when or how a node answered, not what its state holds: left
# out of comparisons (`last_run`: the leader's own last GC run; `next_threshold`: from the
# answering node's clock).
NODE_LOCAL_FIELDS = frozenset(
    {
        "safe_time",
        "waited_ms",
        "node_id",
        "leader_id",
        "now",
        "upper",
        "last_commit_ts",
        "last_run",
        "next_threshold",
    }
)
WATCH_PAGES_MAX = 100
BEHIND_SNAPSHOT_WAIT_S = 90.0
CLI_TIMEOUT_S = 60.0
# Reads of the current state that differ are read again (the state may move between the
# nodes' reads), this many times in all, this far apart.
CURRENT_READS_ATTEMPTS = 4
CURRENT_READS_PAUSE_S = 0.5
# How many differences the report quotes in full.
DIFFS_QUOTED_MAX = 12


class RevisionMissing(Exception):
    """FROM does not name a commit of this clone."""


def resolve_revision(rev: str, repo: Path = NEW_TREE) -> str:
    """The full commit id FROM names, or RevisionMissing with a message saying what to do (a
    shallow clone lacks older commits: fetch them)."""
    if not rev or rev.startswith("-"):
        raise RevisionMissing(f"FROM={rev!r}: give a git revision, e.g. FROM=10532c2")
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    )
    if found.returncode == 0:
        return found.stdout.strip()
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    ).stdout.strip()
    hint = (
        "this clone is shallow: `git fetch --unshallow` (or `git fetch origin <rev>`) first"
        if shallow == "true"
        else "`git fetch` the revision, or name one `git log --oneline` lists"
    )
    raise RevisionMissing(f"revision {rev!r} is not in this clone; {hint}")


def export_tree(commit: str, into: Path, repo: Path = NEW_TREE) -> None:
    """The tree of `commit` as files under `into` (`git archive`, no checkout)."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit],
        cwd=repo,
        capture_output=True,
        timeout=GIT_TIMEOUT_S,
        check=True,
    ).stdout
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


# ---- comparing answers ---------------------------------------------------------------------


def normalized(answer: Any, leave_out: frozenset[str] = NODE_LOCAL_FIELDS) -> Any:
    """`answer` without the fields named in `leave_out` (at any depth): by default those that
    say where or how a node answered, for comparing nodes."""
    if isinstance(answer, dict):
        return {k: normalized(v, leave_out) for k, v in answer.items() if k not in leave_out}
    if isinstance(answer, list):
        return [normalized(v, leave_out) for v in answer]
    return answer


def field_names(answer: Any) -> set[str]:
    """Every map key in `answer`, at any depth."""
    if isinstance(answer, dict):
        return set(answer).union(*(field_names(v) for v in answer.values()))
    if isinstance(answer, list):
        return set().union(*(field_names(v) for v in answer))
    return set()


@dataclass(frozen=True, slots=True)
class Difference:
    """One read whose answers differ between nodes. `shape_only`: they agree once the fields
    only some nodes' releases send (`fields_not_everywhere`) are left out: a newer reply
    format, not a divergence of state."""

    read: str  # e.g. "files sales.orders @ 1234"
    answers: dict[int, Any]  # node id -> its (normalized) answer
    fields_not_everywhere: frozenset[str] = frozenset()
    shape_only: bool = False

    def describe(self, width: int = 400) -> str:
        if self.shape_only:
            return (
                f"  {self.read}: equal but for fields only some releases send: "
                f"{sorted(self.fields_not_everywhere)}"
            )
        lines = [f"  {self.read}:"]
        (first, reference), *others = sorted(self.answers.items())
        for node_id, answer in others:
            where = first_difference(reference, answer)
            if where is not None:
                path, mine, theirs = where
                lines.append(
                    f"    at {path or '(top)'}: node {first}: {_brief(mine, width)}; "
                    f"node {node_id}: {_brief(theirs, width)}"
                )
        return "\n".join(lines)


def _brief(value: Any, width: int) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= width else text[:width] + "..."


_ABSENT = "<absent>"


def first_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """Where `a` and `b` first differ (a path such as `versions[2].schema`) and the two
    values there; None when they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = first_difference(a.get(key, _ABSENT), b.get(key, _ABSENT), f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found is not None:
                return found
        if len(a) != len(b):
            return f"{path} (length)", len(a), len(b)
        return None
    return None if a == b else (path.lstrip("."), a, b)


def _all_equal(values: list[Any]) -> bool:
    return len({json.dumps(v, sort_keys=True, default=str) for v in values}) <= 1


def differences(
    answers: dict[int, dict[str, Any]], releases: dict[int, str] | None = None
) -> list[Difference]:
    """The reads (keys) whose normalized answers are not the same on every node; a read one
    node did not answer counts as a difference. With `releases` (node id -> release), a
    difference is in shape only when the answers agree once the fields that one release's
    answers have and another's lack are left out, and none or all of them are refusals."""
    reads = sorted({read for per_node in answers.values() for read in per_node})
    out = []
    for read in reads:
        per_node = {n: normalized(a.get(read, "<not asked>")) for n, a in answers.items()}
        if _all_equal(list(per_node.values())):
            continue
        by_release: dict[str, set[str]] = {}
        for node_id, answer in per_node.items():
            release = (releases or {}).get(node_id, "")
            by_release.setdefault(release, set()).update(field_names(answer))
        names = list(by_release.values())
        uneven = frozenset(set().union(*names) - set.intersection(*names))
        refusals = {isinstance(v, dict) and "error" in v for v in per_node.values()}
        shape_only = (
            bool(uneven)
            and len(refusals) == 1
            and _all_equal([normalized(v, uneven) for v in per_node.values()])
        )
        out.append(Difference(read, per_node, uneven, shape_only))
    return out


# ---- the report -----------------------------------------------------------------------------


@dataclass(slots=True)
class StepOutcome:
    step: str
    nodes: str = ""  # e.g. "1:new* 2:old 3:old" (* leads)
    apply_version: str = ""
    writes: str = ""
    cli: str = ""
    reads: str = ""
    problems: list[str] = field(default_factory=list)
    # Not failures: e.g. answers that differ only in fields a newer release added.
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def render_table(steps: list[StepOutcome]) -> str:
    """The steps as a plain-text table, then each step's problems."""
    header = ("step", "nodes (* leads)", "apply v", "writes", "CLIs", "reads compared", "outcome")
    rows = [
        (s.step, s.nodes, s.apply_version, s.writes, s.cli, s.reads, "ok" if s.ok else "FAILED")
        for s in steps
    ]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    rule = "  ".join("-" * w for w in widths)
    head = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [head, rule, *lines]
    out.extend(f"\n[{s.step}] {problem}" for s in steps for problem in s.problems)
    out.extend(f"\n[{s.step}] note:{note}" for s in steps for note in s.notes)
    return "\n".join(out)


# ---- the cluster of two releases ------------------------------------------------------------


class Cluster:
    """Three node processes, each running the old or the new tree on its own data dir."""

    def __init__(self, work: Path, old_tree: Path, *, tls: bool = False) -> None:
        self.work = work
        self.tls = tls
        self.old_tree = old_tree
        self.config_dir = work / "cluster"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.release: dict[int, str] = {}
        self.endpoints: dict[int, str] = {}
        self._clients: dict[int | None, SyncMetastoreClient] = {}
        self.cluster_id = f"upgrade-{os.getpid()}"
        # Which release each node process ran (log records name their pid).
        self.release_of_pid: dict[int, str] = {}
        self._log_offsets: dict[Path, int] = {}

    # -- files --
    def init(self) -> None:
        """The old release's `cluster init` writes the config; ports are made free ones, and
        DD/CSmax the test harness's (each DDL waits DD + CSmax)."""
        run = subprocess.run(
            [*_CLI, "cluster", "init", str(self.config_dir), "--cluster-id", self.cluster_id]
            + (["--tls"] if self.tls else []),
            cwd=self.old_tree,
            env=self._env(self.old_tree),
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
        if run.returncode != 0:
            raise RuntimeError(f"old cluster init failed: {run.stdout}{run.stderr}")
        toml = self.config_dir / "cluster.toml"
        text = toml.read_text()
        ports = iter(free_ports(9))
        text = re.sub(
            r"(?m)^(\s*(raft|client|metrics)_port\s*=\s*)\d+",
            lambda m: m.group(1) + str(next(ports)),
            text,
        )
        text = re.sub(r"(?m)^dd_ms = \d+", "dd_ms = 300", text)
        text = re.sub(r"(?m)^cs_max_ms = \d+", "cs_max_ms = 100", text)
        # Snapshots early and no entries kept behind them: every node takes some (read again
        # by the other release at its restart), and a node restarted behind one installs the
        # leader's (a new leader's snapshot to an old node: the "behind a snapshot" step).
        text = re.sub(r"(?m)^snapshot_every_entries = \d+", "snapshot_every_entries = 100", text)
        text = text.replace("\n[[nodes]]", "\nsnapshot_keep_entries = 0\n\n[[nodes]]", 1)
        toml.write_text(text)
        for node_file in self.config_dir.glob("node*.toml"):
            node_file.unlink()  # every node starts from cluster.toml + --node-id
        client_ports = re.findall(r"(?m)^\s*client_port\s*=\s*(\d+)", text)
        self.endpoints = {n: f"127.0.0.1:{p}" for n, p in zip(NODE_IDS, client_ports, strict=True)}

    def token(self) -> str:
        return (self.config_dir / "secrets" / "admin.token").read_text().strip()

    @staticmethod
    def _env(tree: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("METASTORE_")}
        env["PYTHONPATH"] = str(tree)
        env["METASTORE_CHECK_INVARIANTS"] = "1"
        return env

    # -- processes --
    def start(self, node_id: int, release: str, *, bootstrap: bool = False) -> None:
        tree = self.old_tree if release == "old" else NEW_TREE
        log = open(self.work / f"node{node_id}.out", "ab")  # noqa: SIM115 - the child owns it
        log.write(f"---- starting {release} ({tree})\n".encode())
        log.flush()
        self.procs[node_id] = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "node", "start"]
            + ["--config", str(self.config_dir / "cluster.toml"), "--node-id", str(node_id)]
            + (["--bootstrap"] if bootstrap else []),
            cwd=tree,  # `-m` puts the working directory first on sys.path
            env=self._env(tree),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.release[node_id] = release
        self.release_of_pid[self.procs[node_id].pid] = release

    def stop(self, node_id: int, sig: int = signal.SIGTERM) -> int | None:
        """Stop the node by its PID (`sig`, then SIGKILL after STOP_WAIT_S); its exit code."""
        proc = self.procs.pop(node_id)
        self._drop_client(node_id)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            try:
                return proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=KILL_WAIT_S)
                return None
        return proc.returncode

    def stop_all(self) -> None:
        for node_id in list(self.procs):
            self.stop(node_id, signal.SIGINT)
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def new_log_problems(self) -> dict[str, list[str]]:
        """Error-level (and worse) records the nodes logged since the last call, by the
        release whose process wrote them (a record without a pid: a release from before pids
        were logged), and anything else a node printed that is not a log record (a traceback
        before its logging was set up)."""
        found: dict[str, list[str]] = {}
        files = sorted(self.config_dir.glob("data/*/node.log")) + sorted(
            self.work.glob("node*.out")
        )
        for path in files:
            with path.open("rb") as f:
                f.seek(self._log_offsets.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._log_offsets[path] = self._log_offsets.get(path, 0) + len(complete)
            for line in complete.decode(errors="replace").splitlines():
                if line.startswith("{"):
                    if path.suffix == ".out":
                        continue  # the node's stderr copy of its node.log records
                    record = json.loads(line)
                    if record.get("level") not in ("error", "critical"):
                        continue
                    release = self.release_of_pid.get(record.get("pid", -1), "old")
                    message = re.sub(
                        r" at 0x[0-9a-f]+", "", str(record.get("msg", "")).split("\n")[0]
                    )[:160]
                    found.setdefault(release, []).append(f"{path.parent.name}: {message}")
                elif line.strip() and not line.startswith("---- starting"):
                    found.setdefault("unknown", []).append(f"{path.name}: {line[:160]}")
        return found

    def snapshot_indexes(self, node_id: int) -> set[int]:
        """The indexes of the snapshots node `node_id`'s WAL holds (its `snap-<hex>.snap`)."""
        wal = self.config_dir / "data" / f"node-{node_id}" / "wal"
        return {
            int(p.name[len("snap-") : -len(".snap")], 16)
            for p in wal.glob("snap-*.snap")
            if re.fullmatch(r"snap-[0-9a-f]{16}\.snap", p.name)
        }

    def log_tail(self, node_id: int, lines: int = 12) -> str:
        path = self.work / f"node{node_id}.out"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # -- clients (this tree's library, one per node: no failover between nodes) --
    def client(self, node_id: int | None = None) -> SyncMetastoreClient:
        """A client of node `node_id` alone, or (None) of every node."""
        if node_id not in self._clients:
            endpoints = (
                list(self.endpoints.values()) if node_id is None else [self.endpoints[node_id]]
            )
            tls = ClientTls(ca_file=self.config_dir / "tls" / "ca.crt") if self.tls else None
            self._clients[node_id] = SyncMetastoreClient(
                endpoints,
                self.token(),
                timeout_ms=CALL_TIMEOUT_MS,
                client_name="upgrade-check",
                tls=tls,
            )
        return self._clients[node_id]

    def _drop_client(self, node_id: int) -> None:
        client = self._clients.pop(node_id, None)
        if client is not None:
            client.close()
        everyone = self._clients.pop(None, None)
        if everyone is not None:
            everyone.close()

    def statuses(self) -> dict[int, dict[str, Any] | None]:
        out: dict[int, dict[str, Any] | None] = {}
        for node_id in self.procs:
            try:
                out[node_id] = self.client(node_id).call(
                    "status", {}, self.endpoints[node_id], timeout_ms=3_000
                )
            except MetastoreError:
                out[node_id] = None
        return out

    def wait_ready(self) -> int:
        """Until every running node is ready and names one leader; that leader's id."""
        deadline = time.monotonic() + READY_WAIT_S
        last: dict[int, Any] = {}
        while time.monotonic() < deadline:
            for node_id, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"node {node_id} ({self.release[node_id]}) exited with "
                        f"{proc.returncode}:\n{self.log_tail(node_id)}"
                    )
            with contextlib.suppress(FileNotFoundError):
                last = self.statuses()
                if all(s and s["ready"] and s["initialized"] for s in last.values()):
                    leaders = {s["leader"] for s in last.values() if s}
                    if len(leaders) == 1 and 0 not in leaders:
                        return int(leaders.pop())
            time.sleep(POLL_S)
        raise TimeoutError(f"cluster not ready within {READY_WAIT_S:.0f} s: {last}")

    def describe_nodes(self, leader: int) -> str:
        return " ".join(
            f"{n}:{self.release[n]}{'*' if n == leader else ''}" for n in sorted(self.procs)
        )


# ---- the workload and the checks --------------------------------------------------------------


@dataclass(slots=True)
class Workload:
    """What was done, so far: the tables ever named and the timestamps to read at."""

    tables: set[str] = field(default_factory=set)
    stamps: list[tuple[str, int]] = field(default_factory=list)  # (what, ts)
    files_by_table: dict[str, list[str]] = field(default_factory=dict)
    counter: int = 0

    def note(self, what: str, ts: object) -> None:
        if isinstance(ts, int) and ts > 0:
            self.stamps.append((what, ts))

    def next_name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"


def _ddl(client: SyncMetastoreClient, work: Workload, sql: str) -> dict[str, Any]:
    result = client.ddl(sql)
    work.note(sql, result.get("tu", result.get("ts")))
    return result


def _commit(
    client: SyncMetastoreClient,
    work: Workload,
    tables: list[str],
    *,
    remove_one: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    writes = []
    for table in tables:
        schema = client.schema_at(table)
        added = [work.next_name("part-") + ".parquet" for _ in range(2)]
        write: dict[str, Any] = {
            "table": table,
            "schema_version": schema["version"],
            "add": [
                {"path": p, "size_bytes": 1000 + i, "row_count": 10 + i}
                for i, p in enumerate(added)
            ],
        }
        live = work.files_by_table.setdefault(table, [])
        if overwrite:
            write["overwrite"] = True
            live.clear()
        elif remove_one and live:
            write["remove"] = [live.pop(0)]
        live.extend(added)
        writes.append(write)
    result = client.commit(work.next_name("txn-"), writes)
    work.note(f"commit {tables}", result.get("ts"))
    return result


def _session(client: SyncMetastoreClient, work: Workload, session_id: str) -> None:
    """A batch's life through one node: open a session, pin with leases, protect a read,
    heartbeat, release the leases (with the pin's `lease_tm`), close (its protection goes)."""
    client.session_open(session_id, app_name="upgrade-check", ttl_ms=60_000)
    pinned = client.pin(["sales.events", "sales.orders"], session_id=session_id)
    work.note(f"pin {session_id}", pinned.get("ts"))
    leases = [
        {"table": t["table"], "table_id": t["table_id"], "version": t["version"]}
        for t in pinned["pins"]
    ]
    protected = client.protect(pinned["ts"], tables=["sales.events"], session_id=session_id)
    work.note(f"protect {session_id}", protected.get("tm"))
    client.session_heartbeat(session_id)
    client.lease_release(session_id, leases, known_tm=pinned.get("lease_tm"))
    client.session_close(session_id)


def _refused_from_9(
    client: SyncMetastoreClient, leader: SyncMetastoreClient, work: Workload
) -> None:
    """Input apply version 9 refuses (metastore.apply_version), through one node: a NUL in a
    namespace comment, a retry of a txn id asking for another ts, and a release of another
    client's protection sent through the leader's `_propose` (as the creator, naming another
    client). A node of this tree refuses each before proposing; an older one proposes it,
    and every node then applies it by the cluster's version, so the answers compared after
    the step must agree either way. Each must succeed or give its typed refusal."""
    try:
        _ddl(client, work, f"CREATE NAMESPACE {work.next_name('nul_')} COMMENT 'a\\0b'")
    except InvalidArgumentError as exc:
        if exc.details.get("reason") != "nul_character":
            raise
    table = "sales.events"
    path = work.next_name("part-") + ".parquet"
    writes = [
        {
            "table": table,
            "schema_version": client.schema_at(table)["version"],
            "add": [{"path": path, "size_bytes": 1000, "row_count": 10}],
        }
    ]
    txn_id = work.next_name("txn-")
    first = client.commit(txn_id, writes)
    work.note(f"commit {txn_id}", first.get("ts"))
    work.files_by_table.setdefault(table, []).append(path)
    with contextlib.suppress(TxnIdReusedError):
        client.commit(txn_id, writes, ts=int(first["ts"]) + (5 << 16))
    record = client.protect(int(first["ts"]), tables=[table])
    work.note("protect", record.get("tm"))
    cmd = ReleaseProtection(record_id=str(record["record_id"]), by="someone-else")
    # NotLeader: leadership moved since the step began; nothing was proposed.
    with contextlib.suppress(ForbiddenError, NotLeaderError):
        leader.call("_propose", {"command": encode_command(cmd)})


def initial_workload(client: SyncMetastoreClient, work: Workload) -> None:
    """On the old cluster: namespaces, tables, DDL of each kind, commits."""
    for sql in (
        "CREATE NAMESPACE sales",
        "CREATE NAMESPACE ops",
        "CREATE TABLE sales.orders (id BIGINT NOT NULL, amount DECIMAL(10,2), note STRING)",
        "CREATE TABLE sales.events (id INT, payload STRING, kind STRING)",
        "CREATE TABLE ops.audit (at TIMESTAMP, who STRING)",
    ):
        _ddl(client, work, sql)
    work.tables.update({"sales.orders", "sales.events", "ops.audit"})
    _commit(client, work, ["sales.orders", "sales.events"])
    _commit(client, work, ["ops.audit"])
    for sql in (
        "ALTER TABLE sales.orders ADD COLUMN channel STRING",
        "ALTER TABLE sales.orders RENAME COLUMN note TO memo",
        "ALTER TABLE sales.events ALTER COLUMN id TYPE BIGINT",
        "ALTER TABLE sales.orders SET TBLPROPERTIES ('gc.ttl' = '7d', 'team' = 'upgrade')",
    ):
        _ddl(client, work, sql)
    _commit(client, work, ["sales.orders", "sales.events"], remove_one=True)
    _commit(client, work, ["ops.audit"], overwrite=True)
    _ddl(client, work, "DROP TABLE ops.audit")
    _ddl(client, work, "CREATE TABLE ops.audit (at TIMESTAMP, who STRING, what STRING)")
    work.files_by_table["ops.audit"] = []
    _commit(client, work, ["ops.audit", "sales.orders"])
    # A schema change job, which the leader steps through versions.
    _ddl(client, work, "ALTER TABLE sales.events DROP COLUMN kind")
    wait_jobs_done(client)


def wait_jobs_done(client: SyncMetastoreClient) -> None:
    deadline = time.monotonic() + JOBS_WAIT_S
    while time.monotonic() < deadline:
        if not client.job_list().get("jobs"):
            return
        time.sleep(POLL_S * 3)
    raise TimeoutError(f"schema change jobs still running after {JOBS_WAIT_S:.0f} s")


def write_round(cluster: Cluster, work: Workload, step: str) -> tuple[str, list[str]]:
    """A DDL and a commit through each node (its own client: a follower forwards); the
    summary and the failures."""
    done, failures = 0, []
    leader = cluster.wait_ready()
    for node_id in sorted(cluster.procs):
        client = cluster.client(node_id)
        label = f"node {node_id} ({cluster.release[node_id]})"
        column = re.sub(r"\W", "_", f"c_{step}_{node_id}").lower()
        actions: list[tuple[str, Callable[[], object]]] = [
            (
                "ddl",
                lambda c=client, col=column: _ddl(
                    c, work, f"ALTER TABLE sales.orders ADD COLUMN {col} INT"
                ),
            ),
            (
                "commit",
                lambda c=client: _commit(
                    c, work, ["sales.orders", "sales.events"], remove_one=True
                ),
            ),
        ]
        actions.append(
            ("session", lambda c=client, sid=f"s-{step}-{node_id}": _session(c, work, sid))
        )
        # Older entries into manifests (the next removals then record delete entries), and a
        # GC run (threshold entries; the leader runs it, a follower forwards).
        actions.append(("compact", lambda c=client: compact_table(c, "sales.events", keep_loose=1)))
        actions.append(("gc run", lambda c=client: c.gc_run()))
        actions.append(
            ("refused from 9", lambda c=client: _refused_from_9(c, cluster.client(leader), work))
        )
        for what, action in actions:
            try:
                action()
                done += 1
            except Exception as exc:  # noqa: BLE001 - every failure is a finding to report
                failures.append(f"{what} through {label} failed: {type(exc).__name__}: {exc}")
    return f"{done}/{len(actions) * len(cluster.procs)} ok", failures


def cli_round(cluster: Cluster) -> tuple[str, list[str], list[str]]:
    """Each release's CLI (an operator's, during the upgrade) against each node: `table
    describe` (a read every node answers); and this tree's `cluster version` (asks every
    member). The summary, the failures and the expected refusals."""
    calls: list[tuple[str, Path, list[str], str]] = []
    for release, tree in (("old", cluster.old_tree), ("new", NEW_TREE)):
        for node_id in sorted(cluster.procs):
            label = f"{release} CLI via node {node_id} ({cluster.release[node_id]})"
            words = ["table", "describe", "sales.orders"]
            calls.append((label, tree, words, cluster.endpoints[node_id]))
    everyone = ",".join(cluster.endpoints[n] for n in sorted(cluster.procs))
    calls.append(("new CLI cluster version", NEW_TREE, ["cluster", "version"], everyone))
    failures: list[str] = []
    notes: list[str] = []
    for label, tree, words, endpoints in calls:
        env = {
            **Cluster._env(tree),
            "METASTORE_ENDPOINTS": endpoints,
            "METASTORE_TOKEN_FILE": str(cluster.config_dir / "secrets" / "admin.token"),
        }
        if cluster.tls:
            env["METASTORE_CACERT"] = str(cluster.config_dir / "tls" / "ca.crt")
        run = subprocess.run(
            [*_CLI, "-o", "json", *words],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            check=False,
        )
        if run.returncode != 0:
            said = (run.stderr.strip() or run.stdout.strip()).splitlines()[-1:] or [""]
            failure = f"{label}: `{' '.join(words)}` exit {run.returncode}: {said[0]}"
            # Expected while every node runs a release from before apply versions (it knows
            # no such op); the CLI must say so.
            expected = "release from before apply versions" in said[0]
            (notes if expected else failures).append(failure)
    return f"{len(calls) - len(failures) - len(notes)}/{len(calls)} ok", failures, notes


def _read(fn: Callable[[], dict[str, Any]]) -> Any:
    try:
        return fn()
    except MetastoreError as exc:
        return {"error": str(exc.code)}


def sampled_stamps(work: Workload, rng: random.Random) -> list[int]:
    """Some recorded timestamps (the newest always), each also read one below."""
    stamps = sorted({ts for _, ts in work.stamps})
    newest, older = stamps[-NEWEST_TS_ALWAYS:], stamps[:-NEWEST_TS_ALWAYS]
    chosen = set(newest) | set(rng.sample(older, min(len(older), SAMPLED_TS_MAX - len(newest))))
    return sorted(chosen | {ts - 1 for ts in chosen})


def read_everything(
    cluster: Cluster, work: Workload, stamps: list[int]
) -> dict[int, dict[str, Any]]:
    """Per node, every read of the check (by a key naming it) and its answer. The change feed
    is read from the newest position every node still has events after (a node that
    installed or loaded a snapshot has none before it: WATCH_START_COMPACTED)."""
    nodes = sorted(cluster.procs)
    watch_from = min(ts for _, ts in work.stamps) - 1
    for node_id in nodes:
        try:
            cluster.client(node_id).watch(watch_from, limit=1, wait_ms=0)
        except WatchStartCompactedError as exc:
            watch_from = max(watch_from, int(exc.details.get("oldest_ts", watch_from)))
    return {n: _reads_of(cluster.client(n), work, stamps, watch_from) for n in nodes}


def _reads_of(
    c: SyncMetastoreClient, work: Workload, stamps: list[int], watch_from: int
) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for ts in stamps:
        got[f"list_namespaces @ {ts}"] = _read(lambda t=ts: c.list_namespaces(as_of=t))
        got[f"list_tables @ {ts}"] = _read(lambda t=ts: c.list_tables(as_of=t))
        for table in sorted(work.tables):
            got[f"schema_at {table} @ {ts}"] = _read(lambda t=ts, tb=table: c.schema_at(tb, t))
            got[f"describe {table} @ {ts}"] = _read(lambda t=ts, tb=table: c.describe(tb, t))
            got[f"files {table} @ {ts}"] = _read(
                lambda t=ts, tb=table: c.files(tb, t, expand=False)
            )
    return {**got, **_current_reads_of(c, work, watch_from)}


def _current_reads_of(c: SyncMetastoreClient, work: Workload, watch_from: int) -> dict[str, Any]:
    """The reads of a node's current state (no AS OF): each node answers at its own applied
    position, so an entry applied between two nodes' reads (the leader's own: a job step, a
    protection released) makes them differ for a moment; `check` reads these again."""
    got: dict[str, Any] = {}
    for table in sorted(work.tables):
        got[f"history {table}"] = _read(lambda tb=table: c.history(tb))
    got["txn_log"] = _read(lambda: c.txn_log(limit=1000))
    got["session_list"] = _read(lambda: c.session_list(include_ended=True))
    got["lease_list"] = _read(lambda: c.lease_list())
    got["protections"] = _read(lambda: c.protections(include_released=True))
    got["job_list --all"] = _read(lambda: c.job_list(all=True))
    got["gc_status"] = _read(lambda: c.gc_status())
    got[f"watch (every event after {watch_from})"] = _read(lambda: _watch_all(c, watch_from))
    return got


def _watch_position(read: str) -> int:
    """The position a "watch (every event after N)" read started at."""
    return int(re.findall(r"\d+", read)[-1])


def _watch_all(c: SyncMetastoreClient, from_ts: int) -> dict[str, Any]:
    """Every change-feed event after `from_ts` (the first page's position), page by page."""
    events: list[Any] = []
    position, from_event = from_ts, 0
    for _ in range(WATCH_PAGES_MAX):
        page = c.watch(position, from_event=from_event, wait_ms=0)
        events.extend(page["events"])
        if not page["events"]:
            return {"events": events}
        position, from_event = page["next_from_ts"], page.get("next_from_event", 0)
    raise RuntimeError(f"the change feed has more than {WATCH_PAGES_MAX} pages")


def wait_applied(cluster: Cluster, ts: int) -> None:
    """Until every running node's safe time passed `ts` (the newest write)."""
    deadline = time.monotonic() + SAFE_TIME_WAIT_S
    while time.monotonic() < deadline:
        behind = {n: s for n, s in cluster.statuses().items() if not s or s["safe_time"] <= ts}
        if not behind:
            return
        time.sleep(POLL_S)
    raise TimeoutError(f"nodes' safe time did not pass {ts} within {SAFE_TIME_WAIT_S:.0f} s")


def check(cluster: Cluster, work: Workload, rng: random.Random, outcome: StepOutcome) -> None:
    wait_jobs_done(cluster.client())
    # At or above every entry applied when asked (linearizable, from the leader), so also the
    # entries of writes that stamped nothing here (a GC run's, a session's).
    newest = max(ts for _, ts in work.stamps)
    with contextlib.suppress(MetastoreError):  # (a release without `read_ts`: the stamps)
        newest = max(newest, int(cluster.client().read_ts()))
    wait_applied(cluster, newest)
    stamps = sampled_stamps(work, rng)
    answers = read_everything(cluster, work, stamps)
    diffs = differences(answers, dict(cluster.release))
    for attempt in range(2, CURRENT_READS_ATTEMPTS + 1):
        moving = [d.read for d in diffs if not d.shape_only and " @ " not in d.read]
        if not moving:
            break
        # Current-state reads differ: the state may have moved between the nodes' reads.
        time.sleep(CURRENT_READS_PAUSE_S)
        watch_from = next(r for r in answers[min(answers)] if r.startswith("watch"))
        again = {
            n: _current_reads_of(cluster.client(n), work, _watch_position(watch_from))
            for n in sorted(cluster.procs)
        }
        for node_id, got in again.items():
            answers[node_id].update(got)
        diffs = differences(answers, dict(cluster.release))
        outcome.notes.append(
            f" {', '.join(moving)} differed between nodes; read again (attempt {attempt}): "
            + ("still differ" if any(not d.shape_only for d in diffs) else "agree")
        )
    first = next(iter(answers.values()))
    refused = sum(1 for a in first.values() if isinstance(a, dict) and set(a) == {"error"})
    diverged = [d for d in diffs if not d.shape_only]
    outcome.reads = (
        f"{len(first)} x {len(answers)} nodes ({refused} refused), {len(stamps)} ts, "
        f"{len(diverged)} differ"
        + (f", {len(diffs) - len(diverged)} in shape only" if len(diffs) > len(diverged) else "")
    )
    outcome.notes.extend(d.describe() for d in diffs if d.shape_only)
    for diff in diverged[:DIFFS_QUOTED_MAX]:
        outcome.problems.append("answers differ\n" + diff.describe())
    if len(diverged) > DIFFS_QUOTED_MAX:
        outcome.problems.append(f"... and {len(diverged) - DIFFS_QUOTED_MAX} more reads differ")


def restart_behind_snapshot(
    cluster: Cluster, work: Workload, node_id: int, outcome: StepOutcome
) -> None:
    """Stop node `node_id` (SIGTERM), write until every other node's log starts past the
    node's last entry, restart the leader, start the node again on the same release: it can
    only catch up from the leader's snapshot (written by the other release when the leader runs
    it). Checked by the snapshot file the node then holds: one at an index of the leader's."""
    status = cluster.statuses()[node_id] or {}
    # (`last_index` is newer than some releases: their committed and applied positions then)
    last = max(status.get(k, 0) for k in ("last_index", "commit_index", "applied_index"))
    release = cluster.release[node_id]
    cluster.stop(node_id)
    deadline = time.monotonic() + BEHIND_SNAPSHOT_WAIT_S
    while True:
        cluster.wait_ready()
        starts = {n: (s or {}).get("log_start_index", 0) for n, s in cluster.statuses().items()}
        if min(starts.values()) > last:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the logs still start at or before {last}: {starts}")
        _, failures = write_round(cluster, work, f"gap{work.counter}")
        outcome.problems.extend(failures)
    # The leader's link queued the appends it sent the stopped node: they would catch it up
    # (same term) without a snapshot. Restarting the leader drops them (SIGTERM: it hands
    # leadership to the other node, which probes the stopped one afresh).
    leader = cluster.wait_ready()
    cluster.stop(leader)
    cluster.start(leader, cluster.release[leader])
    leader = cluster.wait_ready()
    cluster.start(node_id, release)
    cluster.wait_ready()
    deadline = time.monotonic() + SAFE_TIME_WAIT_S
    while time.monotonic() < deadline:
        installed = cluster.snapshot_indexes(node_id) & cluster.snapshot_indexes(leader)
        if any(index > last for index in installed):
            outcome.notes.append(
                f" node {node_id} stopped at index {last}; leader {leader}'s log started past "
                f"it; it installed the leader's snapshot at {max(installed)}"
            )
            return
        time.sleep(POLL_S)
    outcome.problems.append(
        f"node {node_id} ({release}, stopped at index {last}) holds no snapshot of leader "
        f"{leader} ({sorted(cluster.snapshot_indexes(leader))}) after {SAFE_TIME_WAIT_S:.0f} s: "
        f"{sorted(cluster.snapshot_indexes(node_id))}\n{cluster.log_tail(node_id)}"
    )


def apply_versions(cluster: Cluster) -> str:
    seen = {
        n: f"{s.get('apply_version', '-')}/{s.get('apply_version_supported', '-')}" if s else "?"
        for n, s in cluster.statuses().items()
    }
    values = set(seen.values())
    return (
        values.pop() if len(values) == 1 else " ".join(f"{n}:{v}" for n, v in sorted(seen.items()))
    )


# ---- the run ------------------------------------------------------------------------------


@contextlib.contextmanager
def recorded(steps: list[StepOutcome], name: str) -> Iterator[StepOutcome]:
    outcome = StepOutcome(step=name)
    steps.append(outcome)
    try:
        yield outcome
    except Exception as exc:  # the step failed: report it, stop the run
        outcome.problems.append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")
        raise StepFailed from exc


class StepFailed(Exception):
    pass


def step_checks(
    cluster: Cluster, work: Workload, rng: random.Random, outcome: StepOutcome, step: str
) -> None:
    leader = cluster.wait_ready()
    outcome.writes, failures = write_round(cluster, work, step)
    outcome.problems.extend(failures)
    outcome.cli, failures, notes = cli_round(cluster)
    outcome.problems.extend(failures)
    outcome.notes.extend(f" {note}" for note in notes)
    leader = cluster.wait_ready()
    outcome.nodes = cluster.describe_nodes(leader)
    outcome.apply_version = apply_versions(cluster)
    check(cluster, work, rng, outcome)
    note_log_problems(cluster, outcome)


def note_log_problems(cluster: Cluster, outcome: StepOutcome) -> None:
    """The nodes' error records since the previous step: problems when this tree's nodes
    wrote them (or a node printed something that is no log record), notes when an old
    release's did (its own bugs, fixed or not since)."""
    for release, lines in sorted(cluster.new_log_problems().items()):
        counted: dict[str, int] = {}
        for line in lines:
            counted[line] = counted.get(line, 0) + 1
        text = "; ".join(f"{n} x {line}" for line, n in sorted(counted.items()))
        if release == "old":
            outcome.notes.append(f" the old release logged errors: {text}")
        else:
            outcome.problems.append(f"{release} release logged errors: {text}")


def run(old_commit: str, work_dir: Path, seed: int, *, tls: bool = False) -> list[StepOutcome]:
    rng = random.Random(seed)
    old_tree = work_dir / "old-tree"
    export_tree(old_commit, old_tree)
    cluster = Cluster(work_dir, old_tree, tls=tls)
    work = Workload()
    steps: list[StepOutcome] = []
    try:
        with recorded(steps, "old cluster") as o:
            cluster.init()
            for node_id in NODE_IDS:
                cluster.start(node_id, "old", bootstrap=True)
            cluster.wait_ready()
            initial_workload(cluster.client(), work)
            step_checks(cluster, work, rng, o, "old")
        upgraded: list[int] = []
        leader = cluster.wait_ready()
        # Followers first, then the leader, as an operator would; leadership is then moved to
        # a new node once (a new leader with an old follower), if it is not there already.
        order = [n for n in NODE_IDS if n != leader] + [leader]
        for node_id in order:
            with recorded(steps, f"node {node_id} -> new") as o:
                exit_code = cluster.stop(node_id)
                if exit_code not in (0, None):
                    o.problems.append(f"node {node_id} exited with {exit_code} on SIGTERM")
                cluster.start(node_id, "new")
                upgraded.append(node_id)
                step_checks(cluster, work, rng, o, f"up{len(upgraded)}")
            if len(upgraded) == 1:
                # Before finalizing, an operator may go back: the first new node returns to
                # the old release (reading what the new one wrote) and is upgraded again.
                for release in ("old", "new"):
                    with recorded(steps, f"node {node_id} -> {release} again") as o:
                        cluster.stop(node_id)
                        cluster.start(node_id, release)
                        step_checks(cluster, work, rng, o, f"again{release}")
            leader = cluster.wait_ready()
            if len(upgraded) == 2 and cluster.release[leader] == "old":
                with recorded(steps, f"lead -> node {upgraded[0]} (new)") as o:
                    cluster.client(upgraded[0]).transfer_leader(upgraded[0])
                    step_checks(cluster, work, rng, o, "moved")
            if len(upgraded) == 2:
                (old_node,) = set(NODE_IDS) - set(upgraded)
                with recorded(steps, f"node {old_node} (old) behind a snapshot") as o:
                    restart_behind_snapshot(cluster, work, old_node, o)
                    step_checks(cluster, work, rng, o, "behind")
        with recorded(steps, "finalize") as o:
            result = cluster.client().finalize_apply_version()
            if result.get("apply_version") != APPLY_VERSION_SUPPORTED:
                o.problems.append(f"finalize did not reach {APPLY_VERSION_SUPPORTED}: {result}")
            step_checks(cluster, work, rng, o, "final")
        with recorded(steps, "restart all (new)") as o:
            for node_id in NODE_IDS:
                cluster.stop(node_id, signal.SIGINT)
            for node_id in NODE_IDS:
                cluster.start(node_id, "new")
            step_checks(cluster, work, rng, o, "restart")
    except StepFailed:
        pass
    finally:
        cluster.stop_all()
    if steps and cluster.config_dir.exists():
        note_log_problems(cluster, steps[-1])  # what the last stop logged
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make upgrade-check", description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="rev", required=True, help="the old release's git revision")
    parser.add_argument("--seed", type=int, default=1, help="picks the sampled timestamps")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--tls", action="store_true", help="the cluster with TLS (cluster init --tls)"
    )
    args = parser.parse_args(argv)
    try:
        commit = resolve_revision(args.rev)
    except RevisionMissing as exc:
        print(f"upgrade-check: {exc}", file=sys.stderr)
        return EXIT_NO_REVISION
    work_dir = Path(tempfile.mkdtemp(prefix="upgrade-check-"))
    print(f"upgrade-check: {args.rev} ({commit[:10]}) -> this tree; work dir {work_dir}")
    steps = run(commit, work_dir, args.seed, tls=args.tls)
    print(render_table(steps))
    failed = any(not s.ok for s in steps) or not steps or steps[-1].step != "restart all (new)"
    if failed or args.keep:
        print(f"\nnode logs kept in {work_dir}")
    else:
        shutil.rmtree(work_dir, ignore_errors=True)
    print("\nupgrade-check:", "DIVERGED or FAILED" if failed else "every step agreed")
    return EXIT_DIVERGED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
