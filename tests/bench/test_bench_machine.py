"""`bench.machine.machine_info`: the facts every benchmark's JSON records about the run."""

from __future__ import annotations

import json
import subprocess

from bench.machine import REPO_ROOT, machine_info


def test_machine_info_names_the_machine_the_packages_and_the_commit() -> None:
    info = machine_info(("msgpack", "no-such-distribution-xyz"))
    assert info["cpu_count"] >= 1
    assert 1 <= info["cpus_usable"] <= info["cpu_count"]
    assert len(info["loadavg_1_5_15_min"]) == 3
    assert info["python"].count(".") == 2
    assert isinstance(info["msgpack"], str)
    assert info["no-such-distribution-xyz"] is None
    head = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert info["git_commit"] == head
    assert isinstance(info["git_modified_files"], list)
    json.dumps(info)  # goes into the results file as is
