"""What a benchmark's JSON says about the machine and the code it ran on.

Every benchmark records the same facts, so results from different runs and benchmarks can be
compared: platform, Python, CPUs (total and usable by this process), CPU model, memory, the
load average when the run began (the machine is shared: it says what else was running), the
versions of the packages that change what is measured, and the git commit plus the tracked
files that differ from it (the nodes run the working tree, which may not be the commit).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
GIT_TIMEOUT_S: Final = 5.0


def machine_info(packages: Sequence[str] = ("uvloop",)) -> dict[str, Any]:
    """The facts above; `packages` are distribution names whose versions are recorded (None
    when not installed)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_1_5_15_min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["mem_total_mib"] = int(line.split()[1]) // 1024
                break
    for package in packages:
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = None
    info.update(_git_state())
    return info


def _git_state() -> dict[str, Any]:
    try:
        commit = _git("rev-parse", "HEAD").strip()
        dirty = _git("status", "--porcelain", "--untracked-files=no").split("\n")
    except (OSError, subprocess.TimeoutExpired):
        return {"git_commit": None}
    return {
        "git_commit": commit or None,
        "git_modified_files": sorted(line[3:] for line in dirty if line.strip()),
    }


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO_ROOT), *args],
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    ).stdout
