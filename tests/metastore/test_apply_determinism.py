"""Every replica applies one log alike, whatever its process and however it started.

Seeded random logs of realistic commands (`tests.metastore._determinism`) are generated here,
by a node in this process, and replayed in two fresh processes with other PYTHONHASHSEEDs:
one from the first entry, the other from the generating node's snapshot at a random index
(a follower that installed the leader's snapshot), restarting from its own snapshot at a later
index (a node restarted from its snapshot and WAL), with its wall clock years ahead. For every
entry each node's reply or error (message and details included), effects, change feed events
and state digest must be the same bytes, and so must the snapshots.

The logs are bounded (a few thousand entries in all) and the replays run in parallel, so the
test takes a few seconds.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack

from metastore.commands import decode_command
from tests.metastore._determinism import Program, generate, small_limits

ROOT = Path(__file__).resolve().parents[2]
# More for a deeper search: METASTORE_DETERMINISM_PROGRAMS=500 pytest this file.
PROGRAMS = int(os.environ.get("METASTORE_DETERMINISM_PROGRAMS", "12"))
STEPS = int(os.environ.get("METASTORE_DETERMINISM_STEPS", "400"))
REPLAY_TIMEOUT_S = 120 + PROGRAMS * STEPS // 1000
CLOCK_AHEAD_S = 10 * 365 * 86_400.0


def _other_seeds(count: int) -> list[str]:
    """Hash seeds for the replaying processes, none of them this process's."""
    own = os.environ.get("PYTHONHASHSEED")
    return [seed for seed in ("1", "2", "3", "4") if seed != own][:count]


def _start_replay(
    tmp: Path, name: str, spec: dict[str, Any], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    job_file, out_file = tmp / f"{name}.in", tmp / f"{name}.out"
    job_file.write_bytes(msgpack.packb(spec, use_bin_type=True))
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.metastore._determinism", str(job_file), str(out_file)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _finish_replay(proc: subprocess.Popen[bytes], tmp: Path, name: str) -> list[Any]:
    try:
        _, err = proc.communicate(timeout=REPLAY_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    traces: list[Any] = msgpack.unpackb(
        (tmp / f"{name}.out").read_bytes(), raw=False, strict_map_key=False
    )
    return traces


def _explain(program: Program, index: int, mine: bytes, theirs: bytes, who: str) -> str:
    """Both records of the first entry two nodes made different things of, readably."""
    item = program.log[index - 1]
    what = repr(decode_command(item[2])) if item[0] == 0 else f"entry kind {item[0]}"
    ours = msgpack.unpackb(mine, raw=False, strict_map_key=False)
    other = msgpack.unpackb(theirs, raw=False, strict_map_key=False)
    return (
        f"entry {index} ({what[:600]}) differs on {who}:\n  generating node: {ours}\n"
        f"  {who}: {other}"
    )


def _compare(program: Program, first_index: int, records: list[bytes], who: str) -> None:
    expected = program.trace.records[first_index - 1 :]
    assert len(records) == len(expected), who
    for offset, (mine, theirs) in enumerate(zip(expected, records, strict=True)):
        if mine != theirs:
            raise AssertionError(_explain(program, first_index + offset, mine, theirs, who))


def test_replicas_in_other_processes_and_from_snapshots_apply_every_entry_alike(
    tmp_path: Path,
) -> None:
    rng = random.Random(20261127 + PROGRAMS)
    programs: list[Program] = []
    cuts: list[tuple[int, int]] = []
    with small_limits():
        for seed in range(PROGRAMS):
            installed_at = rng.randrange(1, STEPS - 1)
            restarted_at = rng.randrange(installed_at + 1, STEPS)
            programs.append(generate(seed, STEPS, snapshot_at=(installed_at, restarted_at)))
            cuts.append((installed_at, restarted_at))
    straight_seed, restored_seed = _other_seeds(2)
    straight = {
        "clock_offset_s": 0.0,
        "jobs": [
            {"log": p.log, "snapshot": b"", "after": 0, "round_trips": [], "snapshot_at": [k2]}
            for p, (_, k2) in zip(programs, cuts, strict=True)
        ],
    }
    restored = {
        "clock_offset_s": CLOCK_AHEAD_S,
        "jobs": [
            {
                "log": p.log,
                "snapshot": p.trace.snapshots[k1],
                "after": k1,
                "round_trips": [k2],
                "snapshot_at": [k2],
            }
            for p, (k1, k2) in zip(programs, cuts, strict=True)
        ],
    }
    # The restored node also runs in another time zone: messages must not read it.
    elsewhere = {"PYTHONHASHSEED": restored_seed, "TZ": "Pacific/Chatham"}
    procs = {
        "straight": _start_replay(
            tmp_path, "straight", straight, {"PYTHONHASHSEED": straight_seed}
        ),
        "restored": _start_replay(tmp_path, "restored", restored, elsewhere),
    }
    results = {name: _finish_replay(proc, tmp_path, name) for name, proc in procs.items()}
    for n, (program, (k1, k2)) in enumerate(zip(programs, cuts, strict=True)):
        for name, traces in results.items():
            first_index, records, snapshots = traces[n]
            who = f"the {name} replay (program {n}, snapshot installed at {k1}, restart at {k2})"
            _compare(program, first_index, records, who)
            snapshots = dict(snapshots)
            assert snapshots[k2] == program.trace.snapshots[k2], who
            last = len(program.log)
            assert snapshots[last] == program.trace.snapshots[last], who
