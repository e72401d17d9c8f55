"""Real echo-node processes on 127.0.0.1 for the engine's multi-process tests.

Processes are started with subprocess, stopped and killed by PID only, and every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from bench.control import ControlClient, ControlError
from tests.ports import free_ports

__all__ = ["free_ports"]  # re-exported: the daemon tests take theirs from here

REPO = Path(__file__).resolve().parents[2]


class EchoCluster:
    def __init__(
        self,
        workdir: Path,
        n: int = 3,
        *,
        snapshot_every: int = 10_000,
        election_timeout_ms: int = 300,
        spares: int = 0,
    ) -> None:
        """`n` initial members; `spares` more nodes (ids n+1...) that get ports but are not
        members: `start` starts one with --join, to be added with the `add_node` op."""
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.ids = list(range(1, n + 1))
        self.spare_ids = list(range(n + 1, n + spares + 1))
        everyone = self.ids + self.spare_ids
        ports = free_ports(2 * len(everyone))
        self.raft_ports = dict(zip(everyone, ports[: len(everyone)], strict=True))
        self.control_ports = dict(zip(everyone, ports[len(everyone) :], strict=True))
        self.snapshot_every = snapshot_every
        self.election_timeout_ms = election_timeout_ms
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.secret_file = workdir / "secret"
        self.secret_file.write_text(os.urandom(32).hex())
        self.secret_file.chmod(0o600)

    def peers_arg(self, node_id: int) -> str:
        ids = [*self.ids, node_id] if node_id in self.spare_ids else self.ids
        return ",".join(f"{i}=127.0.0.1:{self.raft_ports[i]}" for i in ids)

    def start(self, node_id: int, *, secret_file: Path | None = None) -> None:
        log = open(self.workdir / f"node{node_id}.log", "ab")  # noqa: SIM115 - owned by the child
        cmd = [
            sys.executable,
            "-m",
            "raft.echo_node",
            "--node-id",
            str(node_id),
            "--peers",
            self.peers_arg(node_id),
            "--control-port",
            str(self.control_ports[node_id]),
            "--data-dir",
            str(self.workdir / f"data{node_id}"),
            "--secret-file",
            str(secret_file or self.secret_file),
            "--election-timeout-ms",
            str(self.election_timeout_ms),
            "--snapshot-every",
            str(self.snapshot_every),
            *(["--join"] if node_id in self.spare_ids else []),
        ]
        self.procs[node_id] = subprocess.Popen(
            cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ}
        )
        log.close()

    def start_all(self) -> None:
        for i in self.ids:
            self.start(i)

    def kill(self, node_id: int) -> None:
        p = self.procs.pop(node_id, None)
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)

    def pause(self, node_id: int) -> None:
        self.procs[node_id].send_signal(signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        self.procs[node_id].send_signal(signal.SIGCONT)

    def stop_all(self) -> None:
        for i in list(self.procs):
            p = self.procs[i]
            with suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)
            self.kill(i)

    def log_tail(self, node_id: int, lines: int = 30) -> str:
        path = self.workdir / f"node{node_id}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def call(self, node_id: int, req: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
        with ControlClient("127.0.0.1", self.control_ports[node_id], timeout_s) as c:
            return c.call(req)

    def try_call(
        self, node_id: int, req: dict[str, Any], timeout_s: float = 2.0
    ) -> dict[str, Any] | None:
        try:
            return self.call(node_id, req, timeout_s)
        except (ControlError, OSError):
            return None

    def wait_leader(self, timeout_s: float = 20.0, among: list[int] | None = None) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i in among or list(self.procs):
                st = self.try_call(i, {"op": "status"})
                if st and st.get("role") == "leader" and st.get("ready_to_serve"):
                    return i
            time.sleep(0.05)
        tails = "\n".join(self.log_tail(i, 10) for i in self.procs)
        raise TimeoutError(f"no leader within {timeout_s:.0f}s\n{tails}")

    def wait_converged(self, timeout_s: float = 30.0) -> dict[int, dict[str, Any]]:
        """Until every running node reports the same applied digest and is ready."""
        deadline = time.monotonic() + timeout_s
        last: dict[int, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            last = {}
            for i in self.procs:
                d = self.try_call(i, {"op": "applied_digest"})
                st = self.try_call(i, {"op": "status"})
                if d and st and st.get("ready_to_serve"):
                    last[i] = d
            if len(last) == len(self.procs) and len({d["sha256"] for d in last.values()}) == 1:
                return last
            time.sleep(0.1)
        raise TimeoutError(f"nodes did not converge: {last}")

    def applied_payloads(self, node_id: int) -> list[bytes]:
        out: list[bytes] = []
        for _ in range(10_000):
            r = self.call(node_id, {"op": "applied_payloads", "start": len(out), "limit": 20_000})
            out.extend(r["payloads"])
            if len(out) >= r["total"]:
                return out
        raise RuntimeError("paging did not finish")


class LoadClient:
    """Threads proposing unique payloads to whoever is leader, recording what was acknowledged."""

    def __init__(self, cluster: EchoCluster, threads: int = 4) -> None:
        self.cluster = cluster
        self.acked: list[bytes] = []
        self.errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(t,), daemon=True) for t in range(threads)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=15)

    def _run(self, tid: int) -> None:
        seq = 0
        target = self.cluster.ids[tid % len(self.cluster.ids)]
        while not self._stop.is_set():
            seq += 1
            payload = f"t{tid}-{seq}".encode()
            reply = self.cluster.try_call(
                target, {"op": "propose", "data": payload, "timeout_ms": 2000}, timeout_s=3.0
            )
            if reply and reply.get("ok"):
                with self._lock:
                    self.acked.append(payload)
                continue
            with self._lock:
                self.errors += 1
            if reply and reply.get("error") == "not_leader" and reply.get("leader"):
                target = reply["leader"]
            else:
                ids = self.cluster.ids
                target = ids[(ids.index(target) + 1) % len(ids)]
                time.sleep(0.02)


@contextmanager
def echo_cluster(workdir: Path, n: int = 3, **kw: Any) -> Iterator[EchoCluster]:
    c = EchoCluster(workdir, n, **kw)
    try:
        yield c
    finally:
        c.stop_all()
