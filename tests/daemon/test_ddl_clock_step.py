"""A DDL returns once its Tu + CSmax has passed by the true time, even when the node's wall
clock steps forward while the request runs (an NTP step, or chaos fault `skew_leader`) or a
little before it (metastore/daemon/clock_steps.py); a node fenced for its clock refuses DDL.

The node waits before replying so that every node's clock is past Tu (IEP-98: the client then
sees its own change on any node). Judged by a wall clock that had just jumped 2 s ahead, that
wait ended at once, and a read at now on a node with a right clock showed the old schema
(found by `make chaos FAULTS=skew_leader`, seed 331). The wait is now also measured from the
wall clock as it read when the request began, moved on by monotonic time."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hlc import physical_ms
from metastore.daemon.node import FAULT_CLOCK_OFFSET_ENV, FAULT_CLOCK_OFFSET_FILE_ENV
from tests.daemon.harness import MetastoreCluster, RawClient, metastore_cluster

pytestmark = pytest.mark.slow

# A long DD, so the clock steps well inside the DDL's wait whatever the machine's load.
DD_MS = 1_500
CS_MAX_MS = 100
STEP_MS = 2_000
# When the clock steps, after the DDL was sent (its wait lasts DD + CSmax).
STEP_AFTER_S = 0.5


def test_a_clock_stepped_forward_during_a_ddl_does_not_end_its_wait_early(tmp_path: Path) -> None:
    clock_file = tmp_path / "clock-offset"
    with metastore_cluster(tmp_path / "c", 1, dd_ms=DD_MS, cs_max_ms=CS_MAX_MS) as c:
        c.start(1, env={FAULT_CLOCK_OFFSET_FILE_ENV: str(clock_file)})
        c.wait_ready()
        admin = c.client(1)
        assert admin.call("ddl", sql="CREATE NAMESPACE s")["ok"]
        replies: list[dict[str, Any]] = []
        ddl = threading.Thread(
            target=lambda: replies.append(
                admin.call("ddl", sql="CREATE TABLE s.t (a INT)", timeout_ms=30_000)
            )
        )
        sent_s = time.monotonic()
        ddl.start()
        time.sleep(STEP_AFTER_S)  # positions the step inside the wait; proves nothing itself
        clock_file.write_text(f"{STEP_MS}\n")
        ddl.join(timeout=60)
        answered_ms = time.time() * 1000  # this process's clock is the true one
        assert not ddl.is_alive()
        reply = replies[0]
        assert reply["ok"], reply
        tu_ms = physical_ms(int(reply["result"]["tu"]))
        # The reply came after the true time passed Tu + CSmax: a node with a right clock
        # answers a read at its now with the new table.
        assert answered_ms >= tu_ms + CS_MAX_MS, (
            f"the DDL returned {tu_ms + CS_MAX_MS - answered_ms:.0f} ms before Tu + CSmax "
            f"(sent {time.monotonic() - sent_s:.2f} s ago)"
        )
        admin.close()


def _wait_for_clock_ahead(c: MetastoreCluster, node: int, ahead_ms: int) -> None:
    """Until node `node`'s clock (its `safe_time` op's now) is `ahead_ms` ahead of ours."""
    client = c.client(node)
    try:
        deadline = time.monotonic() + 10
        while True:
            now = client.call("safe_time")["result"]["now"]
            if physical_ms(int(now)) - time.time() * 1000 >= ahead_ms:
                return
            assert time.monotonic() < deadline, "the node's clock did not step"
            time.sleep(0.05)
    finally:
        client.close()


def test_a_clock_stepped_forward_just_before_a_ddl_is_not_believed(tmp_path: Path) -> None:
    """The step came before the request began (so the request's own reading is already wrong):
    the node saw its wall clock move against the monotonic one, and for a while vouches only
    for the clock as it read before. Its peers would fence it within seconds; until then a DDL
    through it must not reply early."""
    clock_file = tmp_path / "clock-offset"
    with metastore_cluster(tmp_path / "c", 1, dd_ms=300, cs_max_ms=CS_MAX_MS) as c:
        c.start(1, env={FAULT_CLOCK_OFFSET_FILE_ENV: str(clock_file)})
        c.wait_ready()
        admin = c.client(1)
        assert admin.call("ddl", sql="CREATE NAMESPACE s")["ok"]
        clock_file.write_text(f"{STEP_MS}\n")
        _wait_for_clock_ahead(c, 1, STEP_MS // 2)
        reply = admin.call("ddl", sql="CREATE TABLE s.t (a INT)", timeout_ms=30_000)
        answered_ms = time.time() * 1000
        assert reply["ok"], reply
        tu_ms = physical_ms(int(reply["result"]["tu"]))
        assert answered_ms >= tu_ms + CS_MAX_MS, (
            f"the DDL returned {tu_ms + CS_MAX_MS - answered_ms:.0f} ms before Tu + CSmax"
        )
        admin.close()


def test_a_node_fenced_for_its_clock_refuses_ddl(tmp_path: Path) -> None:
    """A follower 2 s ahead fences itself (reads: NOT_READY). A DDL sent to it was forwarded,
    applied, and answered by its clock at once, long before the true time passed Tu + CSmax.
    Now it is NOT_READY (retryable, the client asks another node) and nothing is done."""
    with metastore_cluster(tmp_path / "c", 3, dd_ms=300, cs_max_ms=CS_MAX_MS) as c:
        c.start_all()
        leader = c.wait_ready()
        skewed = next(i for i in c.ids if i != leader)
        c.kill(skewed)
        c.start(skewed, env={FAULT_CLOCK_OFFSET_ENV: str(STEP_MS)})
        deadline = time.monotonic() + 30
        while not ((st := c.try_status(skewed)) and st.get("clock_fenced")):
            assert time.monotonic() < deadline, f"node {skewed} did not fence itself: {st}"
            time.sleep(0.1)
        client: RawClient = c.client(skewed)
        reply = client.call("ddl", sql="CREATE NAMESPACE fenced", timeout_ms=5_000)
        client.close()
        assert not reply["ok"] and reply["error"]["code"] == "NOT_READY", reply
        assert "fenced itself for its clock" in reply["error"]["message"]
        other = c.client(leader)
        listed = other.call("list_namespaces")
        other.close()
        assert listed["ok"], listed
        assert "fenced" not in [n["name"] for n in listed["result"]["namespaces"]]


def test_a_node_started_with_its_clock_far_off_takes_no_ddl_before_its_clock_is_checked(
    tmp_path: Path,
) -> None:
    """A follower restarted with its clock 2 s ahead answers requests before its first round
    trip with the leader proves it off and it fences itself. A DDL sent to it meanwhile was
    forwarded, applied and answered by that clock at once. Now it is NOT_READY until a round
    trip has measured its clock, and then (fenced) NOT_READY too: no reply comes before the
    true time passed Tu + CSmax. DDL are sent to it from its spawn until it is fenced."""
    with metastore_cluster(tmp_path / "c", 3, dd_ms=300, cs_max_ms=CS_MAX_MS) as c:
        c.start_all()
        leader = c.wait_ready()
        skewed = next(i for i in c.ids if i != leader)
        c.kill(skewed)
        c.start(skewed, env={FAULT_CLOCK_OFFSET_ENV: str(STEP_MS)})
        answered: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        client: RawClient | None = None
        for n in range(2_000):  # bounded; ends at the fence or the deadline
            assert time.monotonic() < deadline, f"node {skewed} never fenced itself: {answered}"
            if client is None:
                try:
                    client = c.client(skewed)
                except (OSError, AssertionError):
                    time.sleep(0.02)
                    continue
            reply = client.call("ddl", sql=f"CREATE NAMESPACE early{n}", timeout_ms=5_000)
            answered_ms = time.time() * 1000
            answered.append(reply)
            if reply["ok"]:
                tu_ms = physical_ms(int(reply["result"]["tu"]))
                assert answered_ms >= tu_ms + CS_MAX_MS, (
                    f"DDL {n} to node {skewed} returned {tu_ms + CS_MAX_MS - answered_ms:.0f} "
                    "ms before Tu + CSmax"
                )
            else:
                # Nothing done: not ready, or no leader heard yet.
                assert reply["error"]["code"] in ("NOT_READY", "UNAVAILABLE"), reply
                if "fenced itself for its clock" in reply["error"]["message"]:
                    break
        assert client is not None
        client.close()
        assert answered, "the skewed node never answered"
