"""The package reads time only through the injected PhysicalClock (DESIGN.md: `hlc/` must not
read anything but an injected physical clock). Checked on the source, so a stray `time.time()`
or `datetime.now()` fails here rather than as a flaky test elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

import hlc

PACKAGE_DIR = Path(hlc.__file__).parent
# The one sanctioned reading of the machine's clock.
ALLOWED_TIME_USE = {("physical.py", "time_ns")}
FORBIDDEN_ATTRS = {
    "now",
    "utcnow",
    "today",
    "time",
    "time_ns",
    "monotonic",
    "monotonic_ns",
    "perf_counter",
    "perf_counter_ns",
    "process_time",
    "clock_gettime",
    "get_event_loop",
    "get_running_loop",
}


def _sources() -> list[Path]:
    paths = sorted(PACKAGE_DIR.glob("*.py"))
    assert len(paths) >= 7, "the check must see the package's modules"
    return paths


def test_only_physical_py_imports_time() -> None:
    importers = set()
    for path in _sources():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name == "time" for a in node.names):
                importers.add(path.name)
            if isinstance(node, ast.ImportFrom) and node.module == "time":
                importers.add(f"{path.name} (from time import ...)")
    assert importers == {"physical.py"}


def test_no_clock_reading_calls_outside_system_clock() -> None:
    offenders = [
        f"{path.name}:{node.lineno} .{node.func.attr}()"
        for path in _sources()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in FORBIDDEN_ATTRS
        and (path.name, node.func.attr) not in ALLOWED_TIME_USE
    ]
    assert offenders == []
