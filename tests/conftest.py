"""Shared pytest configuration for the whole suite.

Keep this file small: options and fixtures that more than one package's tests need. Each block
is marked with who uses it.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

# ---- Hypothesis (every property test) ------------------------------------------------------
# No per-example deadline: Hypothesis fails an example that takes over 200 ms, which on a
# loaded 2-core CI machine is a stall of the machine, not of the code (a framing fuzz example
# took 288 ms once and 0.07 ms when replayed). Speed targets live in benchmarks.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# ---- Raft scenario files and seeded simulation (tests/raft) --------------------------------
# --rewrite         regenerate the expected output of tests/raft/testdata/*.txt in place
# --sim-seeds N     how many simulation seeds tests/raft/test_simulation.py runs (`make sim`)
# --sim-extended-seeds N   how many seeds it runs with the extended faults too (power loss,
#                   stale replays: tests/raft/simulation.py)
# --sim-seed-start  the first seed (a failing seed prints the command that replays it)

SIM_SEEDS_DEFAULT = 500
SIM_EXTENDED_SEEDS_DEFAULT = 100


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("raft", "Raft scenario files and simulation")
    group.addoption(
        "--rewrite",
        action="store_true",
        default=False,
        help="rewrite the expected output of datadriven scenario files instead of comparing",
    )
    group.addoption(
        "--sim-seeds",
        type=int,
        default=SIM_SEEDS_DEFAULT,
        help=f"number of Raft simulation seeds to run (default {SIM_SEEDS_DEFAULT})",
    )
    group.addoption(
        "--sim-extended-seeds",
        type=int,
        default=SIM_EXTENDED_SEEDS_DEFAULT,
        help="number of Raft simulation seeds also run with the extended faults "
        f"(default {SIM_EXTENDED_SEEDS_DEFAULT})",
    )
    group.addoption(
        "--sim-seed-start",
        type=int,
        default=0,
        help="first Raft simulation seed (default 0)",
    )


# ---- (other packages add their shared options and fixtures below) --------------------------


# ---- Shared read floors (metastore.client.floors; tests/client, tests/daemon, tests/spark) ----
# The client library shares read-your-writes and monotonic-read positions among the clients of
# a process, per cluster id. Fake nodes all say "test" (or an id a test picks), and in-process
# CLI clusters are named after their directories, so one test's positions would be floors of
# the next test's clients: forgotten before each test. Clusters of tests/daemon/harness.py have
# ids of their own (HARNESS_CLUSTER_ID_PREFIX) and keep theirs, as a driver process does: a
# module's cluster set up by DDL in its fixture must read that DDL's tables in every test (a
# read without a timestamp right after the DDL answered from a lagging node's applied state).


@pytest.fixture(autouse=True)
def _fresh_shared_floors() -> None:
    from metastore.client.floors import forget_shared_floors
    from tests.daemon.harness import HARNESS_CLUSTER_ID_PREFIX

    forget_shared_floors(keep_prefix=HARNESS_CLUSTER_ID_PREFIX)
