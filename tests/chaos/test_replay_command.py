"""A failing chaos run prints the command that replays its fault schedule. The schedule depends
on the seed, the fault family and the duration (one extra fault per 5 s), and TLS changes the
cluster: the command must carry all four, in the form `make chaos` takes them (the Makefile
sets CHAOS_* itself, so `CHAOS_SEEDS=7 make chaos`, as the failure used to say, ran seeds
1,2,3 for 60 s instead). `make -n` only prints the recipe; nothing runs."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.chaos import test_chaos

ROOT = Path(__file__).resolve().parents[2]


def test_the_replay_command_a_failure_prints_runs_the_same_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(test_chaos, "FAULTS", "network")
    monkeypatch.setattr(test_chaos, "DURATION_S", 37.5)
    monkeypatch.setattr(test_chaos, "TLS", True)
    command = test_chaos.replay_command(7)
    words = shlex.split(command)
    assert words[:2] == ["make", "chaos"], command
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_")}
    done = subprocess.run(
        ["make", "-n", *words[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    recipe = next(line for line in done.stdout.splitlines() if "pytest tests/chaos" in line)
    for setting in ("CHAOS_SEEDS=7", "CHAOS_FAULTS=network", "CHAOS_DURATION_S=37.5"):
        assert f"{setting} " in recipe, recipe
    assert "CHAOS_TLS=1 " in recipe, recipe
