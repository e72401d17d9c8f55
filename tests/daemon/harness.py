"""Real metastore node processes on 127.0.0.1, and a raw protocol client for the API tests.

The raw client speaks docs/protocol.md directly (no client library), so bad-input tests can send
exactly the bytes they mean to.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from cli.main import cli
from metastore.daemon.certs import GeneratedCerts
from raft.framing import NEED_DATA, FrameDecoder, encode_frame
from raft.tls import client_context
from tests.raft.proc_cluster import free_ports

REPO = Path(__file__).resolve().parents[2]
# Every cluster the harness writes gets an id of its own (this prefix, the test process, a
# count): the client library keys the read positions a process shares by cluster id
# (metastore.client.floors), and a module's cluster keeps them from test to test
# (tests/conftest.py `_fresh_shared_floors`), as a driver process keeps them.
HARNESS_CLUSTER_ID_PREFIX = "test-"
_cluster_numbers = itertools.count(1)
FRAME_MAX = 4 * 1024 * 1024


def write_cluster(
    directory: Path,
    n: int = 3,
    *,
    dd_ms: int = 300,
    cs_max_ms: int = 100,
    cluster_id: str | None = None,
    **extra: Any,
) -> Path:
    # DD 300 ms and CSmax 100 ms (the product defaults are 500/500): every DDL waits DD + CSmax,
    # and the suite runs a few hundred; one machine has no clock skew, and the chaos test (clock
    # jumps included) runs with these values too.
    ports = free_ports(3 * n)
    # A restore must go to another cluster id than the saved cluster's: tests pass one.
    if cluster_id is None:
        cluster_id = f"{HARNESS_CLUSTER_ID_PREFIX}{os.getpid()}-{next(_cluster_numbers)}"
    lines = [f'cluster_id = "{cluster_id}"', f"dd_ms = {dd_ms}", f"cs_max_ms = {cs_max_ms}"]
    lines += [f"{k} = {v}" for k, v in extra.items()]
    for i in range(n):
        lines += [
            "[[nodes]]",
            f"id = {i + 1}",
            'host = "127.0.0.1"',
            f"raft_port = {ports[i]}",
            f"client_port = {ports[n + i]}",
            f"metrics_port = {ports[2 * n + i]}",
        ]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cli(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`metastore ARGS` as a subprocess from the repo root would give it (exit code, stdout,
    stderr), run in this process by click's CliRunner: the same command line, without a Python
    start and the CLI's imports per call (tests/cli keeps the real entry point tested). Every
    inherited METASTORE_* variable is unset for the call and `env` is added; an exception the
    CLI did not turn into an exit code is raised (a subprocess would print a traceback)."""
    environ: dict[str, str | None] = {k: None for k in os.environ if k.startswith("METASTORE_")}
    environ.update(env or {})
    with contextlib.chdir(REPO):
        result = CliRunner().invoke(cli, list(args), env=environ, prog_name="metastore")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


class RawClient:
    def __init__(
        self, port: int, timeout_s: float = 10.0, *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        """`ssl_context`: speak TLS (for clusters whose client ports do)."""
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(sock, server_hostname="127.0.0.1")
        self.sock = sock
        self.decoder = FrameDecoder(max_frame_bytes=FRAME_MAX)
        self.next_id = 0

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> dict[str, Any] | None:
        """The next reply frame, or None when the server closed the connection."""
        while True:
            frame = self.decoder.next_frame()
            if frame is not NEED_DATA:
                assert isinstance(frame, dict)
                return frame
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.decoder.feed(data)

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        self.next_id += 1
        self.send_raw(
            encode_frame({"id": self.next_id, "op": op, "args": args}, max_frame_bytes=FRAME_MAX)
        )
        reply = self.recv()
        assert reply is not None, f"connection closed while waiting for {op}"
        return reply

    def is_closed(self, wait_s: float = 3.0) -> bool:
        self.sock.settimeout(wait_s)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False


class MetastoreCluster:
    def __init__(self, config: Path) -> None:
        self.config = config
        self.dir = config.parent
        text = config.read_text()
        self.client_ports: dict[int, int] = {}
        self.metrics_ports: dict[int, int] = {}
        node = 0
        for line in text.splitlines():
            if line.startswith("id = "):
                node = int(line.split("=")[1])
            elif line.startswith("client_port"):
                self.client_ports[node] = int(line.split("=")[1])
            elif line.startswith("metrics_port"):
                self.metrics_ports[node] = int(line.split("=")[1])
        self.ids = sorted(self.client_ports)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._bootstrapped: set[int] = set()
        # Set for a cluster whose client ports speak TLS: every harness client uses it.
        self.client_ssl: ssl.SSLContext | None = None

    def token(self, role: str = "admin") -> str:
        return (self.dir / "secrets" / f"{role}.token").read_text().strip()

    def start(
        self,
        node_id: int,
        *,
        bootstrap: bool | None = None,
        env: dict[str, str] | None = None,
        python_code: str | None = None,
    ) -> None:
        """Start node `node_id`; its first start by this harness bootstraps its identity (pass
        `bootstrap` to decide otherwise, e.g. to restart a node whose data was wiped). `env`
        adds environment variables (fault injection, e.g. a shifted clock). `python_code`
        runs instead of `-m metastore.daemon` (`python -c CODE ARGS`; e.g. a node of another
        release: the code patches a module, then runs metastore.daemon as __main__)."""
        if bootstrap is None:
            bootstrap = node_id not in self._bootstrapped
        self._bootstrapped.add(node_id)
        out = open(self.dir / f"stdout-{node_id}.log", "ab")  # noqa: SIM115 - child owns it
        self.procs[node_id] = subprocess.Popen(
            [
                sys.executable,
                *(["-m", "metastore.daemon"] if python_code is None else ["-c", python_code]),
                "--config",
                str(self.config),
                "--node-id",
                str(node_id),
                *(["--bootstrap"] if bootstrap else []),
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "METASTORE_CHECK_INVARIANTS": "1", **(env or {})},
        )
        out.close()

    def start_all(self) -> None:
        """Start every node at once, and return once the secrets (tokens) exist.

        The nodes share one secrets directory, and each creates what is missing at its start:
        creation is race-safe (metastore.daemon.secrets; tests/cli/test_secrets.py races
        processes on it), so no node waits for another. Starting the first node alone cost
        the suite about half a second per cluster."""
        for i in self.ids:
            self.start(i)
        deadline = time.monotonic() + 20
        while not (self.dir / "secrets" / "admin.token").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("secrets were not created")
            time.sleep(0.05)

    def kill(self, node_id: int) -> None:
        p = self.procs.pop(node_id, None)
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)

    def terminate(self, node_id: int) -> int:
        p = self.procs.pop(node_id)
        p.send_signal(signal.SIGTERM)
        return p.wait(timeout=15)

    def stop_all(self) -> None:
        for i in list(self.procs):
            self.kill(i)

    def client(self, node_id: int, role: str = "admin") -> RawClient:
        c = RawClient(self.client_ports[node_id], ssl_context=self.client_ssl)
        hello = c.call("hello", token=self.token(role), client="test")
        assert hello["ok"], hello
        return c

    def try_status(self, node_id: int) -> dict[str, Any] | None:
        try:
            c = self.client(node_id)
        except (OSError, AssertionError, FileNotFoundError):
            return None
        try:
            r = c.call("status")
            return r["result"] if r["ok"] else None
        except (OSError, AssertionError):
            return None
        finally:
            c.close()

    def wait_ready(self, timeout_s: float = 30.0, among: list[int] | None = None) -> int:
        """Until every (listed) running node is ready; returns the leader's id."""
        deadline = time.monotonic() + timeout_s
        last: dict[int, Any] = {}
        while time.monotonic() < deadline:
            last = {i: self.try_status(i) for i in (among or list(self.procs))}
            if all(s and s["ready"] and s["initialized"] for s in last.values()):
                leaders = {s["leader"] for s in last.values() if s}
                if len(leaders) == 1 and 0 not in leaders:
                    return leaders.pop()
            time.sleep(0.1)
        raise TimeoutError(f"cluster not ready: {last}\n{self.log_tails()}")

    def log_tails(self, lines: int = 15) -> str:
        out = []
        for i in self.ids:
            p = self.dir / f"stdout-{i}.log"
            if p.exists():
                out.append(f"--- node {i}")
                out.extend(p.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(out)


def tls_table(tls_dir: Path, *, client_cert_required: bool = False) -> str:
    return (
        "\n[tls]\n"
        f'ca_file = "{tls_dir}/ca.crt"\n'
        f'cert_file = "{tls_dir}/node-{{node_id}}.crt"\n'
        f'key_file = "{tls_dir}/node-{{node_id}}.key"\n'
        f"client_cert_required = {str(client_cert_required).lower()}\n"
    )


def tls_cluster(
    config: Path, certs: GeneratedCerts, *, client_cert_required: bool = False
) -> MetastoreCluster:
    """A MetastoreCluster (not started) whose config gets a [tls] table for the certificates
    `certs` made, and whose raw clients speak TLS (with the client certificate when the
    client ports require one)."""
    with config.open("a") as f:
        f.write(tls_table(certs.ca_cert.parent, client_cert_required=client_cert_required))
    c = MetastoreCluster(config)
    if client_cert_required:
        cert, key = certs.client_cert
        c.client_ssl = client_context(ca_file=certs.ca_cert, cert_file=cert, key_file=key)
    else:
        c.client_ssl = client_context(ca_file=certs.ca_cert)
    return c


@contextmanager
def metastore_cluster(directory: Path, n: int = 3, **kw: Any) -> Iterator[MetastoreCluster]:
    c = MetastoreCluster(write_cluster(directory, n, **kw))
    try:
        yield c
    finally:
        c.stop_all()


def until(what: str, cluster: MetastoreCluster, check: Callable[[], Any], timeout_s: float) -> Any:
    """`check()`'s first truthy value, polled every 50 ms for up to `timeout_s`; else an
    AssertionError naming `what` with the nodes' log tails."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}\n{cluster.log_tails(30)}")
