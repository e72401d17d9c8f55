"""`job_show` says a job is `finished` (its last version in force on every node) only once the
true time has passed that version's Tu + CSmax, even when the answering node's wall clock has
just stepped forward (an NTP step, chaos fault `skew_leader`; until its peers prove the offset
and it fences itself).

`metastore job wait` (and `metastore sql` on an ALTER that starts a job) follows `job_show`
until `waiting_for.reason` is `finished` and then tells the user the change is in force on
every node. Judged by a clock that had just jumped 2 s ahead, the node said so at once, and a
read at now on a node with a right clock still showed the version before the job's last step
(the DDL reply had the same fault and was fixed with metastore/daemon/clock_steps.py: the node
vouches only for the clock as it read before a recent step)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hlc import physical_ms
from metastore.daemon.node import FAULT_CLOCK_OFFSET_ENV, FAULT_CLOCK_OFFSET_FILE_ENV
from tests.daemon.harness import RawClient, metastore_cluster
from tests.daemon.test_ddl_clock_step import _wait_for_clock_ahead

pytestmark = pytest.mark.slow

# A long DD, so the step and the reads fit well inside the last version's activation window
# whatever the machine's load.
DD_MS = 1_500
CS_MAX_MS = 100
STEP_MS = 2_000
WAIT_S = 30.0
# The clock of a node started far ahead (the second test): more than DD - CSmax short of DD.
SKEW_START_MS = 5_000


def _job(client: RawClient, job_id: int) -> dict[str, object]:
    reply = client.call("job_show", job_id=job_id)
    assert reply["ok"], reply
    result = reply["result"]
    assert isinstance(result, dict)
    return result


def _finished_drop_job(admin: RawClient, deadline: float) -> tuple[int, int]:
    """Create s.t and drop its column b with a schema change job; once the job has succeeded
    (the worker publishes the last step as soon as write-only is active), its id and the
    physical ms of its last version's Tu, which activates DD after it was published."""
    for sql in ("CREATE NAMESPACE s", "CREATE TABLE s.t (a INT, b INT)"):
        assert admin.call("ddl", sql=sql, timeout_ms=30_000)["ok"]
    started = admin.call("ddl", sql="ALTER TABLE s.t DROP COLUMN b", timeout_ms=30_000)
    assert started["ok"], started
    job_id = int(started["result"]["job_id"])
    while (job := _job(admin, job_id))["status"] != "succeeded":
        assert time.monotonic() < deadline, f"the job did not end: {job}"
        time.sleep(0.05)
    versions = job["versions"]
    assert isinstance(versions, list)
    history = admin.call("history", table="s.t")
    assert history["ok"], history
    last = next(v for v in history["result"]["versions"] if v["version"] == versions[-1])
    return job_id, physical_ms(int(last["tu"]))


def test_a_clock_stepped_forward_does_not_make_a_job_look_finished_early(tmp_path: Path) -> None:
    clock_file = tmp_path / "clock-offset"
    with metastore_cluster(tmp_path / "c", 1, dd_ms=DD_MS, cs_max_ms=CS_MAX_MS) as c:
        c.start(1, env={FAULT_CLOCK_OFFSET_FILE_ENV: str(clock_file)})
        c.wait_ready()
        admin = c.client(1)
        try:
            deadline = time.monotonic() + WAIT_S
            job_id, tu_ms = _finished_drop_job(admin, deadline)
            in_force_ms = tu_ms + CS_MAX_MS
            clock_file.write_text(f"{STEP_MS}\n")
            _wait_for_clock_ahead(c, 1, STEP_MS // 2)
            job = _job(admin, job_id)
            asked_ms = time.time() * 1000  # this process's clock is the true one
            waiting = job["waiting_for"]
            assert isinstance(waiting, dict)
            assert asked_ms < in_force_ms, "too slow to test: the version is in force already"
            assert waiting["reason"] == "activation", (
                f"job_show said {waiting['reason']!r} {in_force_ms - asked_ms:.0f} ms before "
                f"its last version's Tu + CSmax: {waiting}"
            )
            # It does get there, once the true time has passed Tu + CSmax.
            while (job := _job(admin, job_id))["waiting_for"]["reason"] != "finished":  # type: ignore[index]
                assert time.monotonic() < deadline, f"the job never finished: {job}"
                time.sleep(0.05)
            assert time.time() * 1000 >= in_force_ms
        finally:
            admin.close()


def test_a_node_started_with_its_clock_far_ahead_says_no_job_is_finished_before_it_is(
    tmp_path: Path,
) -> None:
    """A follower restarted with its clock 2 s ahead answers reads for a second or so before
    a round trip with its leader proves it off and it fences itself (the DDL refuses to judge
    by such a clock: RaftNode.clock_checked). Asked about a job whose last version activates
    2 s later by the true time, it must not say `finished` meanwhile. It is asked from its
    spawn until it fences itself or the version is in force by the true time.

    Its clock runs SKEW_START_MS ahead and DD is longer than that, so whenever it comes up
    (a daemon takes seconds to start on a loaded machine), its clock is past Tu + CSmax while
    the true time is not."""
    dd_ms = 6_000
    with metastore_cluster(tmp_path / "c", 3, dd_ms=dd_ms, cs_max_ms=CS_MAX_MS) as c:
        c.start_all()
        leader = c.wait_ready()
        skewed = next(i for i in c.ids if i != leader)
        admin = c.client(leader)
        try:
            deadline = time.monotonic() + WAIT_S
            job_id, tu_ms = _finished_drop_job(admin, deadline)
        finally:
            admin.close()
        in_force_ms = tu_ms + CS_MAX_MS
        c.kill(skewed)
        c.start(skewed, env={FAULT_CLOCK_OFFSET_ENV: str(SKEW_START_MS)})
        answers: list[tuple[float, str]] = []
        client: RawClient | None = None
        for _ in range(5_000):  # bounded: ends at the fence or once the version is in force
            asked_ms = time.time() * 1000
            if asked_ms >= in_force_ms or time.monotonic() > deadline:
                break
            if client is None:
                try:
                    client = c.client(skewed)
                except (OSError, AssertionError):
                    time.sleep(0.02)
                    continue
            reply = client.call("job_show", job_id=job_id)
            if not reply["ok"]:
                answers.append((asked_ms, reply["error"]["code"]))
                if "fenced itself for its clock" in reply["error"]["message"]:
                    break
                continue
            reason = reply["result"]["waiting_for"]["reason"]
            answers.append((asked_ms, reason))
            assert reason != "finished", (
                f"node {skewed} (clock {SKEW_START_MS} ms ahead) said the job was finished "
                f"{in_force_ms - asked_ms:.0f} ms before its last version's Tu + CSmax "
                f"(answers so far: {answers[-5:]})"
            )
        if client is not None:
            client.close()
        assert any(reason == "activation" for _, reason in answers), (
            f"node {skewed} never answered job_show before its fence: {answers[-5:]}"
        )
