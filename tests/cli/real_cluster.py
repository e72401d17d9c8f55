"""A real 3-node cluster driven only through the `metastore` CLI.

`RealCluster.run` runs `python -m cli.main ...` as a subprocess from the repository root, the way
a user would, with the cluster's endpoints and admin token passed through `METASTORE_*`
environment variables (never the developer's `cluster_configs/local` defaults, and never a
`METASTORE_*` variable inherited from the shell running the tests). Every call has a timeout.
`RealCluster.call` runs the same command line in this process through click's CliRunner, with
the same environment and working directory: the same command tree, output and exit codes,
without the second or so a Python start and the CLI's imports cost per call. Tests use `run`
where the process itself is what is checked (the entry point, the exit status a shell sees,
starting and stopping the nodes), `call` for everything else.

Node processes are found only through their pid files; `kill_leftovers` signals a PID only if
its command line names this cluster's config directory, so a reused PID is never hit.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from metastore.daemon.config import ClusterConfig, load_cluster_config, node_layout
from tests.daemon.harness import run_cli

REPO: Final = Path(__file__).resolve().parents[2]
# One CLI call: a read or a DDL (DD + CSmax ~ 1 s) with room for a slow, loaded machine.
CALL_TIMEOUT_S: Final = 30.0
# `cluster up` waits for a ready leader; `cluster down` may wait its grace before SIGKILL.
LIFECYCLE_TIMEOUT_S: Final = 45.0
NODES: Final = 3
# Base ports are drawn below Linux's ephemeral range (32768+), where the kernel puts outgoing
# connections, so a chosen port is unlikely to be taken between the check and the start.
BASE_PORT_MIN: Final = 20_000
BASE_PORT_MAX: Final = 32_000
BASE_PORT_TRIES: Final = 50
PID_POLL_S: Final = 0.05


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port() -> int:
    """A base port P whose whole `cluster init` layout (Raft, client and metrics ports of
    every node) is free on loopback right now."""
    rng = random.Random()
    for _ in range(BASE_PORT_TRIES):
        base = rng.randrange(BASE_PORT_MIN, BASE_PORT_MAX)
        layout = node_layout(NODES, host="127.0.0.1", base_port=base)
        ports = [p for n in layout for p in (n.raft_port, n.client_port, n.metrics_port)]
        if all(port_is_free(p) for p in ports):
            return base
    raise RuntimeError(f"no free base port found in {BASE_PORT_TRIES} tries")


def unused_port() -> int:
    """A loopback port nothing listens on (the kernel's pick, released at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs. A zombie (killed, not yet reaped by its new parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # gone between the two checks
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def wait_pid_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(PID_POLL_S)
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Done:
    """One finished CLI call."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float

    def describe(self) -> str:
        return (
            f"metastore {' '.join(self.args)} -> exit {self.returncode} in {self.elapsed_s:.2f} s"
            f"\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"
        )

    def json(self) -> Any:
        """stdout as one JSON document (the call must have used `-o json`)."""
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"stdout is not valid JSON ({exc}):\n{self.describe()}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class RealCluster:
    """The CLI pointed at one cluster directory made by `cluster init`."""

    config_dir: Path
    base_port: int
    cluster_id: str

    @property
    def secrets_dir(self) -> Path:
        return self.config_dir / "secrets"

    def token_file(self, role: str = "admin") -> Path:
        return self.secrets_dir / f"{role}.token"

    def config(self) -> ClusterConfig:
        return load_cluster_config(self.config_dir / "cluster.toml")

    def endpoints(self) -> list[str]:
        return [
            n.client_address for n in node_layout(NODES, host="127.0.0.1", base_port=self.base_port)
        ]

    def endpoint(self, node_id: int) -> str:
        return self.endpoints()[node_id - 1]

    def run(
        self,
        *args: str,
        timeout_s: float = CALL_TIMEOUT_S,
        endpoints: list[str] | None = None,
    ) -> Done:
        """`metastore ARGS` from the repo root, with this cluster's endpoints (or `endpoints`)
        and admin token file in the environment; flags in ARGS override both."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("METASTORE_")}
        env.update(self._cli_env(endpoints))
        begin = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "cli.main", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        return Done(
            args=args,
            returncode=proc.returncode,
            stdout=proc.stdout,
            stderr=proc.stderr,
            elapsed_s=time.monotonic() - begin,
        )

    def _cli_env(self, endpoints: list[str] | None) -> dict[str, str]:
        return {
            "METASTORE_ENDPOINTS": ",".join(
                endpoints if endpoints is not None else self.endpoints()
            ),
            "METASTORE_TOKEN_FILE": str(self.token_file()),
        }

    def call(self, *args: str, endpoints: list[str] | None = None) -> Done:
        """`metastore ARGS` as `run` gives it, run in this process by click's CliRunner
        (tests.daemon.harness.run_cli: the same environment, inherited `METASTORE_*` variables
        unset, and working directory; an exception the CLI did not turn into an exit code is
        raised: from a subprocess it would be a traceback, which no test accepts)."""
        begin = time.monotonic()
        done = run_cli(*args, env=self._cli_env(endpoints))
        return Done(
            args=args,
            returncode=done.returncode,
            stdout=done.stdout,
            stderr=done.stderr,
            elapsed_s=time.monotonic() - begin,
        )

    def ok_json(self, *args: str, **kwargs: Any) -> Any:
        """`metastore -o json ARGS` (in this process, see `call`), which must exit 0 and print
        valid JSON."""
        done = self.call("-o", "json", *args, **kwargs)
        assert done.returncode == 0, done.describe()
        return done.json()

    def pid_file(self, node_id: int) -> Path:
        return self.config_dir / "data" / f"node-{node_id}" / "node.pid"

    def pid(self, node_id: int) -> int | None:
        try:
            return int(self.pid_file(node_id).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def kill_leftovers(self) -> list[int]:
        """SIGKILL every node PID from a pid file that is still this cluster's node; return
        those PIDs. Never by name: the command line must name this cluster's directory."""
        killed = []
        for node_id in range(1, NODES + 1):
            pid = self.pid(node_id)
            if pid is None or not pid_alive(pid):
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if str(self.config_dir).encode() not in cmdline:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        for pid in killed:
            wait_pid_gone(pid, 5.0)
        return killed


def kill_leftover_nodes(config_dir: Path) -> None:
    """SIGKILL each node PID of the cluster in `config_dir` whose pid file names a running node
    of that cluster (by PID only, and only if its command line names `config_dir`: see
    cli.processes `running_node_pid`). For teardowns of tests that start nodes with the CLI."""
    from cli import processes

    config = load_cluster_config(config_dir / "cluster.toml")
    for node in config.nodes:
        pid = processes.running_node_pid(config.node_pid_file(node.id), config_dir)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
