"""Apply is deterministic whatever Python's string hash seed: replicas run in processes with
different seeds, so a set of strings iterated into the state (or into which files GC queues
first) makes their states, and their snapshots, differ."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import hashlib
from tests.metastore.test_manifests import Store, add, command, ok, plan, ready

d, store = ready(), Store()
for i in range(8):
    ok(d, add(f"t{i}", f"f{i}", f"g{i}"))
p = plan(d, store, entries_max=2)
ok(d, command(d, store, p))
ok(d, add("rm", remove=tuple(f"f{i}" for i in range(8))))
p = plan(d, store)
assert p is not None and len(p.rewrites) == 8, p
ok(d, command(d, store, p))
print(hashlib.sha256(d.state.to_snapshot()).hexdigest())
"""


def _snapshot_digest(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_a_compaction_replacing_many_manifests_applies_the_same_under_any_hash_seed() -> None:
    digests = {_snapshot_digest(seed) for seed in ("1", "2")}
    assert len(digests) == 1, digests
    assert all(len(d) == len(hashlib.sha256().hexdigest()) for d in digests)
